#include <poll.h>

#include <cerrno>
#include <charconv>
#include <chrono>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "connection.hpp"
#include "tenure/signal_port.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::postgres {
namespace {

using detail::connection;
using detail::effect;

class pg_signal_port final : public signal_port {
 public:
  pg_signal_port(std::string dsn, std::string schema, std::string app)
      : dsn_(std::move(dsn)), schema_(std::move(schema)), app_(std::move(app)) {}

  result<void> connect() override {
    conn_.reset();
    auto c = connection::open(dsn_, app_);
    if (!c) {
      tenure::logger()->debug("tenure.pg: signal session: {}", c.error().message());
      return c.error();
    }
    conn_ = std::move(c).value();
    auto listened = bounded("LISTEN " + schema_ + "_wake; LISTEN " + schema_ + "_cancel; LISTEN " + schema_ + "_callback");
    if (!listened) {
      tenure::logger()->warn("tenure.pg: LISTEN failed: {}", listened.error().message());
      conn_.reset();
      return listened.error();
    }
    return success();
  }

  bool connected() const noexcept override { return conn_ && conn_->ok(); }

  result<std::vector<signal>> wait(std::chrono::milliseconds timeout) override {
    if (!connected()) return errc::database_unavailable;
    std::vector<signal> out;
    if (!drain(out)) return lost();
    if (!out.empty()) return out;
    pollfd pfd{PQsocket(conn_->native()), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    if (rc < 0 && errno != EINTR) return lost();
    if (rc > 0 && !drain(out)) return lost();
    return out;
  }

  result<std::optional<std::int64_t>> try_lead(const std::string& holder, std::chrono::milliseconds ttl) override {
    if (!connected()) return errc::database_unavailable;
    // A lease row with an expiry on the server's clock, not a session lock: a session outlives a
    // paused process (SIGSTOP, a debugger, a VM freeze) and a pooled server connection outlives
    // its client, and neither may keep leadership. Every call is a bounded round trip: a session
    // that gives no answer in time is dropped and reconnected.
    auto r = bounded("SELECT " + schema_ + ".acquire_leadership(" + conn_->quote_literal(holder) + ", " +
                     conn_->quote_literal(std::to_string(ttl.count()) + " milliseconds") + ")");
    if (!r) return r.error();
    std::optional<std::int64_t> term;
    if (!r.value().empty()) {
      std::int64_t t = 0;
      const auto& v = r.value();
      if (std::from_chars(v.data(), v.data() + v.size(), t).ec != std::errc{}) return errc::protocol_error;
      term = t;
    }
    leader_ = term.has_value();
    return term;
  }

  void resign(const std::string& holder, std::int64_t term) noexcept override {
    if (!connected()) return;
    try {
      auto r = bounded("SELECT " + schema_ + ".release_leadership(" + conn_->quote_literal(holder) + ", " +
                       std::to_string(term) + ")");
      if (r && r.value() == "t") tenure::logger()->info("tenure.pg: maintenance lease of term {} released", term);
    } catch (...) {
      // Best effort: a lease not released expires.
    }
    leader_ = false;
  }

 private:
  /// No statement of this session may take longer: past it, the session is considered dead.
  static constexpr std::chrono::milliseconds k_round_trip_limit{5'000};

  /// Runs `sql` and returns the first cell of its last result ("" when it has none), waiting at
  /// most k_round_trip_limit for the answer. A session that does not answer in time is dropped
  /// (and leadership with it) rather than blocking the signal thread, and with it stop().
  /// Notifications that arrive meanwhile stay queued for drain().
  result<std::string> bounded(const std::string& sql) {
    PGconn* c = conn_->native();
    if (PQsendQuery(c, sql.c_str()) == 0) return lost();
    const auto deadline = std::chrono::steady_clock::now() + k_round_trip_limit;
    std::string value, error;
    for (;;) {
      while (PQisBusy(c) == 0) {
        PGresult* r = PQgetResult(c);
        if (r == nullptr) {
          if (!error.empty()) {
            tenure::logger()->warn("tenure.pg: signal session statement failed: {}", error);
            return errc::database_error;
          }
          return value;
        }
        const auto st = PQresultStatus(r);
        if (st == PGRES_TUPLES_OK && PQntuples(r) > 0) value = PQgetvalue(r, 0, 0);
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) error = PQresultErrorMessage(r);
        PQclear(r);
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return lost("no answer within " + std::to_string(k_round_trip_limit.count()) +
                    " ms; dropping the session and reconnecting");
      }
      pollfd pfd{PQsocket(c), POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) return lost();
      if (PQconsumeInput(c) == 0) return lost();
    }
  }

  /// Reads whatever arrived; false when the connection broke.
  bool drain(std::vector<signal>& out) {
    PGconn* c = conn_->native();
    if (PQconsumeInput(c) == 0) return false;
    while (PGnotify* n = PQnotifies(c)) {
      const std::string channel = n->relname;
      const std::string payload = n->extra;
      PQfreemem(n);
      // Any role that can connect may NOTIFY these channels: a payload is a hint to check,
      // and one that does not parse is dropped.
      signal s;
      if (channel == schema_ + "_wake") {
        s.what = signal::kind::wake;
        s.queue = payload;
      } else if (channel == schema_ + "_cancel" || channel == schema_ + "_callback") {
        s.what = channel == schema_ + "_callback" ? signal::kind::resume : signal::kind::cancel;
        if (!parse_attempt(payload, s.attempt)) {
          tenure::logger()->debug("tenure.pg: ignoring a malformed notification on {} ({} bytes)", channel, payload.size());
          continue;
        }
      } else {
        continue;
      }
      out.push_back(std::move(s));
    }
    return PQstatus(c) == CONNECTION_OK;
  }

  /// "<job_id>:<run_lease>", both positive decimal integers, nothing else.
  static bool parse_attempt(const std::string& payload, attempt_id& out) {
    const auto colon = payload.find(':');
    if (colon == std::string::npos) return false;
    const char* const end = payload.data() + payload.size();
    auto [p1, e1] = std::from_chars(payload.data(), payload.data() + colon, out.job_id);
    if (e1 != std::errc{} || p1 != payload.data() + colon || out.job_id <= 0) return false;
    auto [p2, e2] = std::from_chars(payload.data() + colon + 1, end, out.run_lease);
    return e2 == std::errc{} && p2 == end && out.run_lease > 0;
  }

  std::error_code lost(std::string why = {}) {
    if (why.empty()) why = detail::one_line(PQerrorMessage(conn_->native()));
    tenure::logger()->warn("tenure.pg: signal session lost{}: {}", leader_ ? " (the maintenance lease is no longer renewed)" : "", why);
    conn_.reset();
    leader_ = false;
    return errc::database_unavailable;
  }

  std::string dsn_;
  std::string schema_;
  std::string app_;
  std::unique_ptr<connection> conn_;
  bool leader_ = false;
};

}  // namespace

std::shared_ptr<signal_port> make_signal_port(std::string dsn, std::string schema, std::string application_name) {
  return std::make_shared<pg_signal_port>(std::move(dsn), std::move(schema), std::move(application_name));
}

result<std::unique_ptr<runtime>> make_runtime(runtime_options options) {
  if (options.reserved_connections < 1 || options.pool_size <= options.reserved_connections) {
    return error{errc::invalid_argument, "pool_size (" + std::to_string(options.pool_size) +
                                             ") must exceed reserved_connections (" +
                                             std::to_string(options.reserved_connections) + ")"};
  }
  // Handlers' own store calls never take the connections kept for heartbeats, flushes and
  // reconciliation.
  if (options.runtime.handler_store_calls == 0 ||
      options.runtime.handler_store_calls > options.pool_size - options.reserved_connections) {
    options.runtime.handler_store_calls = options.pool_size - options.reserved_connections;
  }
  options.runtime.sql_schema = options.schema;
  // LISTEN/NOTIFY needs a session of its own: refuse a transaction-pooling pooler now, before
  // anything is claimed or locked, rather than run deaf. Once that holds, so do named statements.
  TENURE_TRYV(detail::require_session(options.dsn, options.application_name, std::chrono::seconds{5}));
  auto st = store::open({.dsn = options.dsn,
                         .schema = options.schema,
                         .pool_size = options.pool_size,
                         .application_name = options.application_name,
                         .lock_timeout = options.lock_timeout,
                         .pool_mode = pool_mode::session});
  if (!st) return st.error();
  std::shared_ptr<storage_port> shared{std::move(st).value()};
  return runtime::create(std::move(options.runtime), shared,
                         make_signal_port(options.dsn, options.schema, options.application_name));
}

}  // namespace tenure::postgres
