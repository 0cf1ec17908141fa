#pragma once
/// \file
/// Whether a connection string leads to a server session of its own, as the runtime needs
/// (LISTEN/NOTIFY, prepared statements), or through a pooler that moves transactions between
/// server sessions. For health checks; `postgres::make_runtime` runs the same probe at start.
#include <chrono>
#include <string_view>

#include "tenure/result.hpp"

namespace tenure::postgres {

/// What a connection made with a DSN is on the server side.
enum class session_kind {
  direct,                  ///< PostgreSQL's own session (the server's process id is the one given at connect)
  pooled_session,          ///< behind a pooler that keeps one server session per client (session mode)
  pooled_without_session,  ///< behind a pooler in transaction or statement mode: no session of its own
};

/// Probes `dsn` (blocking): a direct connection is recognized by its backend key in one round
/// trip; behind a pooler, a notification is sent on a fresh random channel to a connection that
/// LISTENs on it, and `pooled_without_session` is the answer when none arrives within `wait`.
/// Opens two short connections, takes no lock, logs nothing. errc::database_unavailable when the
/// server cannot be reached.
result<session_kind> probe_session(std::string_view dsn, std::chrono::milliseconds wait);

}  // namespace tenure::postgres
