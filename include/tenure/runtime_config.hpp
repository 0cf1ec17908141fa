#pragma once
/// \file
/// What a runtime is configured with: its queues and its settings (checked by runtime::create()).
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tenure/clock.hpp"
#include "tenure/log.hpp"

namespace tenure {

/// One queue this runtime works on.
struct queue_options {
  std::string name = "default";
  int max_concurrency = 16;  ///< capacity permits: attempts of this queue in flight at once
  /// Settings stored with the queue in the database, shared by every worker of the queue. When
  /// given, start() writes them; when empty, whatever the database holds applies.
  std::optional<std::chrono::milliseconds> hard_deadline;  ///< an attempt running longer is rescued
  std::optional<bool> dead_letter;            ///< failed jobs go to the dead-letter table
  std::optional<std::chrono::milliseconds> backoff_base;   ///< retry backoff: base ...
  std::optional<std::chrono::milliseconds> backoff_cap;    ///< ... and cap
};

/// Runtime settings. Durations are validated by runtime::create().
struct runtime_config {
  std::vector<queue_options> queues{queue_options{}};
  std::chrono::milliseconds heartbeat_interval{5'000};
  /// An attempt without heartbeat for this long is rescued. Default 3 x heartbeat_interval;
  /// less than 2 x heartbeat_interval is refused.
  std::optional<std::chrono::milliseconds> staleness;
  int claim_batch = 128;        ///< most jobs one claim statement takes
  int completion_batch = 512;   ///< most completions one flush statement carries
  std::chrono::milliseconds flush_delay{2};  ///< a partial batch waits at most this long
  std::chrono::milliseconds poll_interval{1'000};  ///< fallback when no NOTIFY arrives (and the only path if LISTEN fails)
  std::chrono::milliseconds shutdown_timeout{30'000};
  /// How often the maintenance leader promotes and rescues, and how often every worker renews
  /// or asks for the maintenance lease.
  std::chrono::milliseconds maintenance_interval{1'000};
  /// How long a maintenance lease lasts unless renewed (by the database's clock). A leader that
  /// stops renewing (paused, partitioned, dead) loses it after at most this long, and stops
  /// acting as leader by its own steady clock by then. An attempt whose worker died is rescued
  /// within staleness + maintenance_lease + 3 x maintenance_interval of its last heartbeat, even
  /// when the leader froze. Default 3 x maintenance_interval; less than 2 x maintenance_interval,
  /// or more than one hour, is refused.
  std::optional<std::chrono::milliseconds> maintenance_lease;
  /// Run promotion and rescue when this process holds the maintenance lease (or always, when
  /// the storage has no signal port).
  bool maintenance = true;
  /// After each pass the maintenance leader reclaims the claim path's dead rows (storage_port::
  /// reclaim_dead_rows: on PostgreSQL a VACUUM of `ready`, `open_claims` and `runs`) once one
  /// holds at least this many, so claims after a large drain do not step over them. 0: never
  /// (autovacuum alone). Needs the tables' owner on PostgreSQL; another role leaves them to
  /// autovacuum.
  std::int64_t reclaim_dead_rows = 10'000;
  std::string worker_id;  ///< default "<hostname>:<pid>"
  int handler_threads = 0;  ///< default: the sum of max_concurrency
  // ---- caller-owned handlers (handle_caller_owned) -----------------------------------------
  /// The schema the finalization bridges call (`<schema>.complete_job`). postgres::make_runtime
  /// sets it to the store's schema.
  std::string sql_schema = "tenure";
  /// After a handler exits, reconciliation (and the outcome write that follows) retries with
  /// backoff while the database cannot answer. Once this budget has passed, or the attempt's
  /// rescue deadline (last heartbeat + staleness), the attempt's capacity permit is released so
  /// other jobs may run, while a light watcher keeps reconciling. Default: staleness.
  std::optional<std::chrono::milliseconds> reconcile_budget;
  /// Most caller-owned handlers running at once across all queues (each typically holds one of
  /// the application's own connections); an attempt over the cap waits, heartbeated, for a
  /// slot. 0: bounded only by the queues' max_concurrency.
  int max_caller_owned = 0;
  /// Most storage calls handlers make at once through their context (flush_progress,
  /// previous_progress, callbacks), so that heartbeats, flushes and reconciliation always find a
  /// free connection. 0: unlimited. postgres::make_runtime sets pool_size - reserved_connections.
  int handler_store_calls = 0;
  /// Serve Prometheus text at http://metrics_address:metrics_port/metrics when set.
  std::optional<std::uint16_t> metrics_port;
  std::string metrics_address = "127.0.0.1";
  /// The metrics port also answers GET /healthz: 503 once the database has not answered any of
  /// the runtime's own calls (claims, heartbeats, flushes, maintenance) for this long, else 200.
  /// An idle runtime still asks at least once per poll_interval. Default: 30 s, or 3 x
  /// poll_interval when that is longer; less than 2 x poll_interval is refused.
  std::optional<std::chrono::milliseconds> unhealthy_after;
  /// When set, runtime::create() makes it tenure's logger (tenure::set_logger: process-wide).
  /// Default: the logger named "tenure" on stderr, level info. The library never logs to the
  /// application's default spdlog logger nor to stdout.
  std::shared_ptr<spdlog::logger> logger;
  /// The clock every timing decision is taken on, by its steady_now(): staleness, the reconcile
  /// budget, backoffs, the maintenance lease's local expiry, the gaps that coalesce wake-ups and
  /// cancel checks, the shutdown deadlines. Timers still sleep in real time, then look at this
  /// clock. Default: the real clock. Tests pass a manual_clock and advance it (a backoff, or a
  /// stop() deadline, then passes only when the test advances the clock).
  std::shared_ptr<const clock_port> clock;
};

}  // namespace tenure
