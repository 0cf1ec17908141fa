#include <poll.h>

#include <charconv>

#include <spdlog/spdlog.h>

#include "connection.hpp"
#include "sdk/signal_port.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::postgres {
namespace {

using detail::connection;
using detail::effect;

class pg_signal_port final : public sdk::signal_port {
 public:
  pg_signal_port(std::string dsn, std::string schema, std::string app)
      : dsn_(std::move(dsn)), schema_(std::move(schema)), app_(std::move(app)) {}

  result<void> connect() override {
    conn_.reset();
    std::string why;
    auto c = connection::open(dsn_, &why, app_);
    if (!c) {
      spdlog::debug("tenure.pg: signal session: {}", why);
      return c.error();
    }
    auto listened = c.value()->exec_script("LISTEN " + schema_ + "_wake; LISTEN " + schema_ + "_cancel; LISTEN " + schema_ + "_callback",
                                           effect::read, &why);
    if (!listened) {
      spdlog::warn("tenure.pg: LISTEN failed: {}", why);
      return listened.error();
    }
    conn_ = std::move(c).value();
    return success();
  }

  bool connected() const noexcept override { return conn_ && conn_->ok(); }

  result<std::vector<sdk::signal>> wait(std::chrono::milliseconds timeout) override {
    if (!connected()) return errc::database_unavailable;
    std::vector<sdk::signal> out;
    if (!drain(out)) return lost();
    if (!out.empty()) return out;
    pollfd pfd{PQsocket(conn_->native()), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    if (rc < 0 && errno != EINTR) return lost();
    if (rc > 0 && !drain(out)) return lost();
    return out;
  }

  result<bool> try_lead() override {
    if (!connected()) return errc::database_unavailable;
    if (leader_) return true;  // a session lock lasts as long as this connection
    auto r = conn_->exec_script("SELECT pg_try_advisory_lock(hashtext(" +
                                    conn_->quote_literal("tenure.maintenance:" + schema_) + "))",
                                effect::read);
    if (!r) return r.error();
    leader_ = r.value().boolean(0, 0);
    return leader_;
  }

 private:
  /// Reads whatever arrived; false when the connection broke.
  bool drain(std::vector<sdk::signal>& out) {
    PGconn* c = conn_->native();
    if (PQconsumeInput(c) == 0) return false;
    while (PGnotify* n = PQnotifies(c)) {
      const std::string channel = n->relname;
      const std::string payload = n->extra;
      PQfreemem(n);
      sdk::signal s;
      if (channel == schema_ + "_wake") {
        s.what = sdk::signal::kind::wake;
        s.queue = payload;
      } else {
        s.what = channel == schema_ + "_callback" ? sdk::signal::kind::resume : sdk::signal::kind::cancel;
        const auto colon = payload.find(':');
        if (colon == std::string::npos) continue;
        std::from_chars(payload.data(), payload.data() + colon, s.attempt.job_id);
        std::from_chars(payload.data() + colon + 1, payload.data() + payload.size(), s.attempt.run_lease);
      }
      out.push_back(std::move(s));
    }
    return PQstatus(c) == CONNECTION_OK;
  }

  std::error_code lost() {
    spdlog::warn("tenure.pg: signal session lost: {}", PQerrorMessage(conn_->native()));
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

std::shared_ptr<sdk::signal_port> make_signal_port(std::string dsn, std::string schema, std::string application_name) {
  return std::make_shared<pg_signal_port>(std::move(dsn), std::move(schema), std::move(application_name));
}

result<std::unique_ptr<runtime>> make_runtime(runtime_options options, std::string* detail) {
  if (options.reserved_connections < 1 || options.pool_size <= options.reserved_connections) {
    if (detail) {
      *detail = "pool_size (" + std::to_string(options.pool_size) + ") must exceed reserved_connections (" +
                std::to_string(options.reserved_connections) + ")";
    }
    return errc::invalid_argument;
  }
  // Handlers' own store calls never take the connections kept for heartbeats, flushes and
  // reconciliation.
  if (options.runtime.handler_store_calls == 0 ||
      options.runtime.handler_store_calls > options.pool_size - options.reserved_connections) {
    options.runtime.handler_store_calls = options.pool_size - options.reserved_connections;
  }
  options.runtime.sql_schema = options.schema;
  auto st = store::open({.dsn = options.dsn,
                         .schema = options.schema,
                         .pool_size = options.pool_size,
                         .application_name = options.application_name,
                         .lock_timeout = options.lock_timeout},
                        detail);
  if (!st) return st.error();
  std::shared_ptr<sdk::storage_port> shared{std::move(st).value()};
  return runtime::create(std::move(options.runtime), shared,
                         make_signal_port(options.dsn, options.schema, options.application_name), detail);
}

}  // namespace tenure::postgres
