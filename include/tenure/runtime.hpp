#pragma once
/// \file
/// The worker runtime: claims jobs, runs handlers, heartbeats, flushes completions in batches,
/// rescues stale attempts (when it is the maintenance leader), honours cancellation, drains on
/// shutdown. Built on Boost.Asio: one control thread owns all runtime state; blocking database
/// calls run on a small pool; handlers run on their own pool.
///
/// Construct it over ports (any storage adapter), or use tenure::postgres::make_runtime().
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "tenure/finalization.hpp"
#include "tenure/job.hpp"
#include "tenure/log.hpp"
#include "tenure/result.hpp"
#include "tenure/token.hpp"

namespace tenure {

class storage_port;
class signal_port;

using std::chrono::milliseconds;

/// One queue this runtime works on.
struct queue_options {
  std::string name = "default";
  int max_concurrency = 16;  ///< capacity permits: attempts of this queue in flight at once
  /// Settings stored with the queue in the database, shared by every worker of the queue. When
  /// given, start() writes them; when empty, whatever the database holds applies.
  std::optional<milliseconds> hard_deadline;  ///< an attempt running longer is rescued
  std::optional<bool> dead_letter;            ///< failed jobs go to the dead-letter table
  std::optional<milliseconds> backoff_base;   ///< retry backoff: base ...
  std::optional<milliseconds> backoff_cap;    ///< ... and cap
};

/// Runtime settings. Durations are validated by runtime::create().
struct runtime_config {
  std::vector<queue_options> queues{queue_options{}};
  milliseconds heartbeat_interval{5'000};
  /// An attempt without heartbeat for this long is rescued. Default 3 x heartbeat_interval;
  /// less than 2 x heartbeat_interval is refused.
  std::optional<milliseconds> staleness;
  int claim_batch = 128;        ///< most jobs one claim statement takes
  int completion_batch = 512;   ///< most completions one flush statement carries
  milliseconds flush_delay{2};  ///< a partial batch waits at most this long
  milliseconds poll_interval{1'000};  ///< fallback when no NOTIFY arrives (and the only path if LISTEN fails)
  milliseconds shutdown_timeout{30'000};
  /// How often the maintenance leader promotes and rescues, and how often every worker renews
  /// or asks for the maintenance lease.
  milliseconds maintenance_interval{1'000};
  /// How long a maintenance lease lasts unless renewed (by the database's clock). A leader that
  /// stops renewing (paused, partitioned, dead) loses it after at most this long, and stops
  /// acting as leader by its own steady clock by then. An attempt whose worker died is rescued
  /// within staleness + maintenance_lease + 3 x maintenance_interval of its last heartbeat, even
  /// when the leader froze. Default 3 x maintenance_interval; less than 2 x maintenance_interval,
  /// or more than one hour, is refused.
  std::optional<milliseconds> maintenance_lease;
  /// Run promotion and rescue when this process holds the maintenance lease (or always, when
  /// the storage has no signal port).
  bool maintenance = true;
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
  std::optional<milliseconds> reconcile_budget;
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
  /// When set, runtime::create() makes it tenure's logger (tenure::set_logger: process-wide).
  /// Default: the logger named "tenure" on stderr, level info. The library never logs to the
  /// application's default spdlog logger nor to stdout.
  std::shared_ptr<spdlog::logger> logger;
};

/// What a handler decided. Build with the static functions.
class job_outcome {
 public:
  enum class kind { completed, retry, snooze, fail, cancel };

  /// Done. `progress` (JSON), when given, is stored as the job's final progress (NUL characters
  /// and invalid UTF-8, which PostgreSQL cannot store, become U+FFFD, with a warning logged).
  static job_outcome completed(std::optional<nlohmann::json> progress = std::nullopt);
  /// Failed this attempt; retried with the queue's backoff while attempts remain, else failed.
  static job_outcome retry(std::string error);
  /// Failed this attempt; retried after `delay` while attempts remain, else failed.
  static job_outcome retry_after(milliseconds delay, std::string error);
  /// Not now: run again after `delay` without consuming an attempt.
  static job_outcome snooze(milliseconds delay);
  /// Failed for good, whatever attempts remain.
  static job_outcome fail(std::string error);
  /// Cancel the job.
  static job_outcome cancel(std::string reason);

  enum kind what() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  std::optional<milliseconds> delay() const noexcept { return delay_; }
  const std::optional<nlohmann::json>& progress() const noexcept { return progress_; }

 private:
  enum kind kind_ = kind::completed;
  std::string message_;
  std::optional<milliseconds> delay_;
  std::optional<nlohmann::json> progress_;
};

namespace detail {
struct attempt_entry;
}

/// What a handler sees of its attempt. Valid for the duration of the handler call only.
/// Thread-safe: `is_cancelled` and `set_progress` may be called from any thread.
class job_context {
 public:
  explicit job_context(std::shared_ptr<detail::attempt_entry> entry);
  std::int64_t job_id() const noexcept;
  std::int64_t run_lease() const noexcept;
  int attempt() const noexcept;  ///< executions so far, this one included
  int max_attempts() const noexcept;
  const std::string& kind() const noexcept;
  const std::string& queue() const noexcept;
  /// The job's args (parsed once).
  const nlohmann::json& args() const;
  finalization_token token() const noexcept;
  /// True once the attempt was cancelled by an admin, rescued, found stale by a heartbeat, or the
  /// runtime is shutting down past its timeout. A handler should stop soon after.
  bool is_cancelled() const noexcept;
  /// Sleeps up to `d`, returning early (true) when the attempt is cancelled.
  bool wait_cancelled(milliseconds d) const;
  /// Buffers progress locally; the next heartbeat flushes it, guarded by (job_id, run_lease).
  /// Progress is stored as {"percent": n, "message": "...", "metadata": ...} (empty message and
  /// null metadata left out). It is visible in tenure.jobs / `tenure job show`, and kept with the
  /// job when the attempt retries, snoozes or is rescued (see previous_progress()). NUL characters
  /// and invalid UTF-8 become U+FFFD (with a warning logged): PostgreSQL cannot store them.
  void set_progress(int percent, std::string message = {}, nlohmann::json metadata = nullptr);
  /// Flushes buffered progress now, with a heartbeat, in one statement guarded by
  /// (job_id, run_lease); blocks on the database (call it from the handler). true: applied.
  /// false: the attempt is stale (rescued, cancelled or finished elsewhere); the context is then
  /// cancelled. A database error is returned as is and the progress stays buffered for the next
  /// heartbeat.
  result<bool> flush_progress();
  /// The progress the job's earlier attempts left behind (the checkpoint to resume from), or
  /// nullopt on a first run or when no earlier attempt reported progress. Never this attempt's
  /// own progress. Read from the database on first call, then cached. errc::stale_attempt when
  /// the attempt is no longer live.
  result<std::optional<nlohmann::json>> previous_progress();

  // ---- external callbacks (sequential: register, hand the id out, wait; repeat if needed) ----
  /// Registers a callback for an external system, guarded by (job_id, run_lease), and returns
  /// its fresh id (a UUID) to hand out. Registering again rotates the id (the old one becomes
  /// unknown). `timeout`: how long the attempt may wait for it once parked (then it is rescued:
  /// retried while attempts remain, else failed). errc::stale_attempt when the attempt is no
  /// longer live (the context is then cancelled).
  result<std::string> register_callback(milliseconds timeout);
  /// Parks the attempt as waiting_external (same run lease; heartbeat staleness and the hard
  /// deadline suspended; the callback timeout armed) and blocks until tenure.resume_callback
  /// resumes it, returning the payload. A resume that arrived before this call returns at once.
  /// The handler keeps its capacity permit meanwhile. Wakes on the resume NOTIFY, and polls with
  /// backoff (20 ms .. 1 s) in case a NOTIFY is lost. errc::stale_attempt when the attempt was
  /// cancelled, rescued (callback timeout), finished from outside (complete/fail_callback) or
  /// the id was rotated; the context is then cancelled and the handler's outcome is discarded.
  /// errc::shutting_down when the runtime's shutdown timeout cancelled the handler while the
  /// attempt was still parked (it stays open until resumed or timed out). After a resume the
  /// attempt's original hard deadline, if any, applies again.
  result<nlohmann::json> wait_for_callback(const std::string& callback_id);

 protected:
  std::shared_ptr<detail::attempt_entry> entry_;
};

/// Each bridge header specializes this for its transaction type (see tenure/finalization.hpp).
template <class Tx, class = void>
struct tx_bridge {
  static_assert(sizeof(Tx) == 0,
                "complete_in_tx: no bridge for this transaction type; include tenure/soci.hpp "
                "(soci::session&), tenure/libpq.hpp (PGconn*) or tenure/pqxx.hpp (pqxx::work&) and "
                "link the matching tenure:: target");
};

/// The context of a caller-owned handler: everything a job_context has, plus complete_in_tx.
class caller_owned_context : public job_context {
 public:
  caller_owned_context(std::shared_ptr<detail::attempt_entry> entry, std::string sql_schema);
  /// The schema the bridges call.
  const std::string& sql_schema() const noexcept { return schema_; }

  /// Completes this attempt inside the caller's open transaction `tx` (a soci::session&, a
  /// PGconn* or a pqxx transaction, with its bridge header included): runs the guarded
  /// `<schema>.complete_job(token, progress)` on it, never begins, commits or rolls back.
  /// `progress`, when given, is the job's final progress; else progress buffered with
  /// set_progress() and not yet flushed is used, else the last flushed one is kept.
  /// errc::stale_attempt when the attempt is no longer live: the server raised TN001 and the
  /// caller's transaction is aborted (roll it back). errc::protocol_error when `tx` has no
  /// open transaction (or an aborted one). The receipt only proves the statement ran: the caller must still COMMIT,
  /// and the runtime checks durable evidence after the handler returns either way.
  template <class Tx>
  result<finalization_receipt> complete_in_tx(Tx&& tx, std::optional<nlohmann::json> progress = std::nullopt) {
    return tx_bridge<std::remove_cvref_t<Tx>>::complete(std::forward<Tx>(tx), token(),
                                                        finalize_options_for(std::move(progress)));
  }

  /// The error text recorded with the retry or failure when the handler returns an error (and
  /// the attempt turns out to be still open). Default: the error code's message.
  void note_failure(std::string why);

  /// The options complete_in_tx passes to a bridge (schema and final progress).
  finalize_options finalize_options_for(std::optional<nlohmann::json> progress);

 private:
  std::string schema_;
};

/// Lifecycle events, reported after the transition was durably applied (never for stale results).
enum class lifecycle_event { started, completed, retried, failed, cancelled, snoozed, rescued };
std::string_view to_string(lifecycle_event e) noexcept;

struct job_event {
  lifecycle_event event;
  attempt_id attempt;
  std::string queue;
  std::string kind;
  std::string message;  ///< error text, reason, or empty
};

/// Counters and gauges. Monotonic counters never go down while the runtime lives.
/// Every runtime metric, in one list: X(kind, type, field, prometheus name, help). `kind` is
/// counter (a running total), gauge (a level), or state (computed when read: leadership). The
/// runtime_metrics fields, the engine's counters and prometheus_text() (in this order) all come
/// from this list, so a new metric is one line here.
#define TENURE_RUNTIME_METRICS(X)                                                                             \
  X(counter, std::uint64_t, claimed, "claimed_total", "Attempts claimed.")                                   \
  X(counter, std::uint64_t, completed, "completed_total", "Completions durably applied.")                    \
  X(counter, std::uint64_t, stale_rejected, "stale_rejected_total",                                          \
    "Outcomes discarded because the attempt was no longer live.")                                             \
  X(counter, std::uint64_t, retried, "retried_total", "Attempts that failed and will retry.")                \
  X(counter, std::uint64_t, failed, "failed_total", "Jobs failed for good.")                                 \
  X(counter, std::uint64_t, cancelled, "cancelled_total", "Jobs cancelled by their handler.")                \
  X(counter, std::uint64_t, snoozed, "snoozed_total", "Attempts snoozed.")                                   \
  X(counter, std::uint64_t, rescued, "rescued_total", "Attempts rescued by this process as maintenance leader.") \
  X(counter, std::uint64_t, claims, "claims_total", "Claim statements.")                                     \
  X(counter, std::uint64_t, flushes, "flushes_total", "Completion flush statements answered.")               \
  X(counter, std::uint64_t, flushed_items, "flushed_items_total", "Completions carried by answered flushes.") \
  X(counter, std::uint64_t, flush_failures, "flush_failures_total",                                          \
    "Completion flushes that failed and were retried.")                                                       \
  X(counter, std::uint64_t, flush_latency_us_total, "flush_latency_microseconds_total",                      \
    "Summed latency of answered flushes.")                                                                    \
  X(counter, std::uint64_t, heartbeats, "heartbeats_total", "Heartbeat statements.")                         \
  X(counter, std::uint64_t, database_errors, "database_errors_total", "Database calls that failed.")         \
  X(counter, std::uint64_t, reconciliations, "reconciliations_total",                                        \
    "Durable-evidence reads after a caller-owned exit or an unknown outcome.")                                \
  X(counter, std::uint64_t, reconcile_reads, "reconcile_reads_total",                                        \
    "Set-based evidence statements (caller-owned exits, in-doubt flushes).")                                  \
  X(counter, std::uint64_t, protocol_warnings, "protocol_warnings_total",                                    \
    "Handler exits contradicted by durable evidence.")                                                        \
  X(counter, std::uint64_t, cancel_checks, "cancel_checks_total",                                            \
    "Liveness reads for cancel notifications (one per coalesced batch).")                                     \
  X(counter, std::uint64_t, capacity_released, "capacity_released_total",                                    \
    "Permits released while the database could not answer for an attempt.")                                  \
  X(gauge, std::uint64_t, flush_max_size, "flush_max_size", "Largest flush so far.")                         \
  X(gauge, std::int64_t, in_flight, "in_flight", "Attempts held by this process.")                           \
  X(gauge, std::int64_t, permits_held, "permits_held", "Capacity permits held by attempts.")                 \
  X(gauge, std::int64_t, watching, "watching", "Attempts whose permit was released while still reconciling.") \
  X(gauge, std::int64_t, pending_completions, "pending_completions",                                         \
    "Completed outcomes waiting for (or in) a completion flush.")                                             \
  X(state, bool, leader, "leader", "1 when this process runs maintenance.")                                  \
  X(state, std::int64_t, leader_term, "leader_term",                                                         \
    "Term of the maintenance lease this process holds (0 when it holds none).")                              \
  X(counter, std::uint64_t, leadership_lost, "leadership_lost_total",                                        \
    "Maintenance passes the database refused because the lease was lost.")

/// A snapshot of the runtime's metrics (see TENURE_RUNTIME_METRICS for what each one counts).
/// pending_completions after stop(): the completions it could not flush (their attempts stay
/// open for rescue). watching: attempts past their reconcile budget, permit released, still
/// reconciling.
struct runtime_metrics {
#define TENURE_RUNTIME_METRIC_FIELD(kind, type, field, name, help) type field{};
  TENURE_RUNTIME_METRICS(TENURE_RUNTIME_METRIC_FIELD)
#undef TENURE_RUNTIME_METRIC_FIELD
};

class runtime {
 public:
  using handler = std::function<job_outcome(job_context&)>;
  /// A caller-owned handler: finishes its job itself with ctx.complete_in_tx(tx) and returns the
  /// receipt, or returns an error (errc::invalid_argument: fail for good; anything else: retry
  /// with the queue's backoff, when the durable evidence shows the attempt still open).
  using caller_owned_handler = std::function<result<finalization_receipt>(caller_owned_context&)>;
  using event_hook = std::function<void(const job_event&)>;

  /// Validates the config: errc::invalid_argument, naming the bad setting, for a bad one.
  static result<std::unique_ptr<runtime>> create(runtime_config config,
                                                 std::shared_ptr<storage_port> store,
                                                 std::shared_ptr<signal_port> signals = nullptr);
  ~runtime();  ///< stop()s
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  /// Registers the handler for a job kind (replacing any handler of that kind). Call before
  /// start(): later registrations are ignored, with an error logged.
  void handle(std::string kind, handler fn);
  /// Registers a handler with typed args (nlohmann::json from_json). Args that do not convert
  /// fail the job permanently: they can never succeed.
  template <class Args, class Fn>
  void handle(std::string kind, Fn fn) {
    handle(std::move(kind), handler{[fn = std::move(fn)](job_context& ctx) -> job_outcome {
             Args args;
             try {
               args = ctx.args().get<Args>();
             } catch (const std::exception& e) {
               return job_outcome::fail(std::string{"bad args: "} + e.what());
             }
             return fn(args, ctx);
           }});
  }
  /// Registers a caller-owned handler for a job kind (replacing any handler of that kind); call
  /// before start() (later registrations are ignored, with an error logged). After
  /// every exit (receipt, error, exception, cancellation) the runtime reads the attempt's durable
  /// evidence before it releases anything:
  ///  1. completed by this attempt: accepted (a handler that reported an error anyway gets one
  ///     warn-level protocol event);
  ///  2. still open (rolled back, never finalized): the handler's error goes through the retry /
  ///     fail policy; a receipt without evidence is a protocol error, retried likewise;
  ///  3. closed by something else (rescued, cancelled, re-claimed): stale, nothing written;
  ///  4. database unreachable: reconciliation retries with backoff; past reconcile_budget the
  ///     permit is released and a watcher keeps reconciling. Nothing is written without evidence.
  void handle_caller_owned(std::string kind, caller_owned_handler fn);
  /// The same with typed args; args that do not convert fail the job permanently.
  template <class Args, class Fn>
  void handle_caller_owned(std::string kind, Fn fn) {
    handle_caller_owned(std::move(kind),
                        caller_owned_handler{[fn = std::move(fn)](caller_owned_context& ctx) -> result<finalization_receipt> {
                          Args args;
                          try {
                            args = ctx.args().get<Args>();
                          } catch (const std::exception& e) {
                            ctx.note_failure(std::string{"bad args: "} + e.what());
                            return make_error_code(errc::invalid_argument);
                          }
                          return fn(args, ctx);
                        }});
  }
  /// Called after each durably applied transition, on the control thread: keep it short. What
  /// a hook throws is logged and swallowed. Register hooks before start(); later calls are
  /// ignored (with an error logged).
  void on_event(event_hook hook);

  /// Writes the queue settings given in the config, then starts claiming.
  /// errc::invalid_argument when no handler is registered; the storage's error when the queue
  /// settings cannot be written.
  result<void> start();
  /// Graceful shutdown (idempotent, noexcept): stop claiming, let handlers finish within
  /// shutdown_timeout while heartbeats continue, flush every pending completion, then return.
  void stop() noexcept;

  runtime_metrics metrics() const;
  /// The metrics in Prometheus text exposition format.
  std::string prometheus_text() const;
  /// The bound metrics port (when metrics_port was 0, the one the OS picked).
  std::optional<std::uint16_t> metrics_port() const;
  const runtime_config& config() const noexcept;

  // ---- drivable loops (tests, tools): run one step now on the control thread and wait -----
  void heartbeat_now();
  void flush_now();
  void maintenance_now();
  /// Blocks until nothing is in flight and no completion is pending, or `timeout` passes.
  bool wait_idle(milliseconds timeout);

  struct impl;

 private:
  explicit runtime(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tenure
