#include <poll.h>

#include <cerrno>
#include <random>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"
#include "tenure/postgres/session_probe.hpp"

#include "connection.hpp"

namespace tenure::postgres::detail {
namespace {

std::string probe_channel() {
  std::random_device rd;
  std::mt19937_64 gen{(static_cast<std::uint64_t>(rd()) << 32) ^ rd()};
  static const char* hex = "0123456789abcdef";
  std::string s = "tenure_session_probe_";
  for (int i = 0; i < 16; ++i) s += hex[gen() % 16];
  return s;
}

/// Waits up to `wait` for a notification on `channel`; false when none came (or the connection broke).
bool notified(connection& c, const std::string& channel, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    if (PQconsumeInput(c.native()) == 0) return false;
    while (PGnotify* n = PQnotifies(c.native())) {
      const bool ours = channel == n->relname;
      PQfreemem(n);
      if (ours) return true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{PQsocket(c.native()), POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) return false;
  }
}

}  // namespace

result<postgres::session_kind> probe_session(const std::string& dsn, const std::string& application_name,
                                             std::chrono::milliseconds wait) {
  // Nothing is set on the sessions used here: they may be a pool's.
  TENURE_TRY(auto listener, connection::open(dsn, application_name, {}, session_use::none));
  TENURE_TRY(const bool pooled, listener->behind_pooler());
  if (!pooled) return postgres::session_kind::direct;  // the server's own session: nothing can move it

  // A pooler sits between. In session mode this connection keeps its server session, and a
  // notification sent to it arrives; in transaction mode the LISTEN stays on whichever server
  // session ran it, which the pooler has handed back to its pool, and nothing arrives.
  const std::string channel = probe_channel();
  TENURE_TRY(auto listened, listener->exec_script("LISTEN " + channel + "; SELECT pg_catalog.pg_backend_pid()",
                                                  effect::read));
  const std::int64_t listening_pid = listened.int64(0, 0);
  {
    TENURE_TRY(auto notifier, connection::open(dsn, application_name, {}, session_use::none));
    TENURE_TRYV(notifier->exec_script("SELECT pg_catalog.pg_notify(" + notifier->quote_literal(channel) + ", '')",
                                      effect::write));
  }
  if (notified(*listener, channel, wait)) {
    (void)listener->exec_script("UNLISTEN " + channel, effect::read);
    return postgres::session_kind::pooled_session;
  }
  // Take the LISTEN back off the server session that holds it, if the pooler hands that one
  // out again soon (a pool reuses its most recently released session first); otherwise it
  // stays on a random channel nobody notifies.
  for (int i = 0; i < 16 && listener->ok(); ++i) {
    auto unlistened = listener->exec_script("UNLISTEN " + channel + "; SELECT pg_catalog.pg_backend_pid()", effect::read);
    if (unlistened && unlistened.value().int64(0, 0) == listening_pid) break;
  }
  return postgres::session_kind::pooled_without_session;
}

result<void> require_session(const std::string& dsn, const std::string& application_name,
                             std::chrono::milliseconds wait) {
  TENURE_TRY(const auto kind, probe_session(dsn, application_name, wait));
  if (kind != postgres::session_kind::pooled_without_session) return success();
  const std::string why =
        "the runtime needs a database session of its own (LISTEN/NOTIFY for wake-ups, cancellations and "
        "callbacks), but its connection goes through a pooler that does not keep one: a notification sent to "
        "it did not arrive within " +
        std::to_string(wait.count()) +
        " ms, as behind a pooler in transaction or statement mode (e.g. pgbouncer pool_mode=transaction). "
        "Connect the runtime directly to PostgreSQL or through a session-mode pool; producers, finalizers "
        "and the tenure command work through transaction pooling";
  tenure::logger()->error("tenure.pg: {}", why);
  return error{errc::invalid_argument, why};
}

}  // namespace tenure::postgres::detail

namespace tenure::postgres {

result<session_kind> probe_session(std::string_view dsn, std::chrono::milliseconds wait) {
  return detail::probe_session(std::string{dsn}, {}, wait);
}

}  // namespace tenure::postgres
