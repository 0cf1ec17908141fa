#pragma once
/// \file
/// A worker runtime over PostgreSQL: the store (pooled connections) plus a LISTEN/NOTIFY
/// signal session that also renews the maintenance leadership lease.
#include <memory>
#include <string>

#include "tenure/postgres/store.hpp"
#include "tenure/runtime.hpp"

namespace tenure::postgres {

struct runtime_options {
  std::string dsn;
  std::string schema = "tenure";
  int pool_size = 4;  ///< store connections (claims, flushes, heartbeats, maintenance run at once)
  /// Connections of the pool that handlers' own calls (flush_progress, callbacks) never take, so
  /// heartbeats, completion flushes and reconciliation always find one. Must be < pool_size;
  /// runtime.handler_store_calls is capped at pool_size - reserved_connections.
  int reserved_connections = 2;
  std::string application_name = "tenure";  ///< names every session in pg_stat_activity
  /// Bounds the store's lock waits (see store_options::lock_timeout); 0: no limit.
  std::chrono::milliseconds lock_timeout{5'000};
  runtime_config runtime;
};

/// Opens the store (checking the schema version), creates the signal session and the runtime
/// (runtime.sql_schema is set to `schema`).
/// Call handle() then start() on the result.
/// The runtime needs a database session of its own (LISTEN/NOTIFY, prepared statements): behind
/// a pooler (the server's process id is not the connection's own), a test NOTIFY must reach a
/// LISTENing connection within 5 s. Through a pooler in transaction or statement mode it does
/// not, and make_runtime returns errc::invalid_argument, naming the cause and the fix in
/// its detail, having taken no lock. Through session pooling the runtime runs as on a direct
/// connection.
result<std::unique_ptr<runtime>> make_runtime(runtime_options options);

/// The signal port over one libpq session: LISTEN <schema>_wake, <schema>_cancel and
/// <schema>_callback, and the maintenance lease (<schema>.acquire_leadership: a row with an
/// expiry, never a session lock, so neither a paused process nor a pooled connection keeps it).
std::shared_ptr<signal_port> make_signal_port(std::string dsn, std::string schema,
                                                   std::string application_name = "tenure");

}  // namespace tenure::postgres
