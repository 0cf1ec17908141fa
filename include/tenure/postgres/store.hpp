#pragma once
/// \file
/// The PostgreSQL storage adapter: the real implementation of the storage port.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tenure/storage_port.hpp"
#include "tenure/log.hpp"
#include "tenure/result.hpp"

namespace tenure::postgres {

/// What the store's connections are on the server side.
enum class pool_mode {
  /// Decided by open(): `transaction` when a pooler sits between the store and PostgreSQL (the
  /// server's process id differs from the one the connection was given at connect: pgbouncer and
  /// other poolers hand out their own), else `session`.
  detect,
  /// Each connection is a server session of its own for its whole life: a direct connection, or
  /// a pooler in session mode. Statements are prepared once per connection by name, and
  /// lock_timeout and TimeZone are set once per session. The runtime's store.
  session,
  /// A pooler may serve every transaction from another server session (pgbouncer
  /// pool_mode=transaction or statement): nothing is left on a session. Every statement is sent
  /// unnamed, in one round trip together with a lock_timeout local to its own transaction; no
  /// startup `options`, no SET.
  transaction,
};

struct store_options {
  std::string dsn;                 ///< libpq connection string or URL
  std::string schema = "tenure";   ///< where `tenure migrate` installed the schema
  int pool_size = 4;               ///< connections kept open; each call borrows one
  std::chrono::milliseconds acquire_timeout{30'000};  ///< wait for a free connection
  std::string application_name = "tenure";  ///< names the sessions in pg_stat_activity
  /// Bounds every lock wait of the store's sessions, so a worker never waits without limit on a
  /// row another transaction holds (e.g. a caller's still-open transaction that ran
  /// complete_job): the call fails with errc::transient_conflict and is retried later.
  /// 0: no limit.
  std::chrono::milliseconds lock_timeout{5'000};
  /// When set, store::open() makes it tenure's logger (tenure::set_logger: process-wide).
  std::shared_ptr<spdlog::logger> logger;
  /// Named prepared statements and session settings, or none (see pool_mode). After open(),
  /// options().pool_mode says which one `detect` chose.
  postgres::pool_mode pool_mode = postgres::pool_mode::detect;
  /// enqueue_batch() of at least this many jobs, none with a unique key, runs as one transaction
  /// of COPY straight into `ready` (none scheduled) or into the session's stage and one move (as
  /// the libpq bridge does inside a caller's transaction; see sql_options::copy_threshold).
  /// 0: always one enqueue_batch statement.
  std::size_t copy_threshold = 1000;
};

/// Storage port over a small pool of libpq connections. Thread-safe: each call borrows one
/// connection and blocks until its single statement answered. A broken connection is reopened
/// on the next call. Every write is one autocommit statement (or, for a large batch over COPY, one
/// transaction); when the connection breaks after the statement (the COMMIT) was sent, the call
/// reports errc::commit_in_doubt (it may have been applied).
class store final : public storage_port {
 public:
  /// Opens the pool (every connection at once) and checks that the schema is installed at the
  /// version this binary knows (errc::schema_mismatch otherwise). With pool_mode::detect, the
  /// first connection decides the mode (see pool_mode).
  static result<std::unique_ptr<store>> open(store_options options);
  ~store() override;

  result<enqueue_result> try_enqueue(const new_job& job) override;
  result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs) override;
  result<std::vector<claimed_attempt>> claim(std::string_view queue, int max_jobs,
                                             std::string_view worker) override;
  result<std::vector<claimed_attempt>> claim(std::string_view queue, int max_jobs, std::string_view worker,
                                             bool going_to_sleep) override;
  result<std::vector<attempt_id>> heartbeat(
      std::span<const attempt_id> attempts,
      std::span<const std::optional<std::string>> progress = {}) override;
  result<std::vector<completion_result>> complete(std::span<const completion> batch) override;
  result<job_state> fail(attempt_id attempt, std::string_view error, fail_disposition disposition,
                         std::optional<std::chrono::microseconds> retry_after = std::nullopt) override;
  result<void> snooze(attempt_id attempt, std::chrono::microseconds delay) override;
  result<void> cancel_attempt(attempt_id attempt, std::string_view reason) override;
  result<std::optional<std::string>> checkpoint(attempt_id attempt) override;
  result<std::string> register_callback(attempt_id attempt, std::chrono::microseconds timeout) override;
  result<park_result> park_callback(attempt_id attempt, std::string_view callback_id) override;
  result<callback_poll> await_callback(attempt_id attempt, std::string_view callback_id) override;
  result<bool> resume_callback(std::string_view callback_id, std::string_view payload_json) override;
  result<bool> extend_callback(std::string_view callback_id, std::chrono::microseconds timeout) override;
  result<bool> complete_callback(std::string_view callback_id,
                                 std::optional<std::string> progress_json = std::nullopt) override;
  result<bool> fail_callback(std::string_view callback_id, std::string_view error, bool retry) override;
  result<bool> cancel_job(std::int64_t job_id) override;
  result<bool> retry_job(std::int64_t job_id) override;
  result<job_info> read_job(std::int64_t job_id) override;
  result<std::vector<rescued_attempt>> rescue_stale(std::chrono::microseconds stale_after) override;
  result<std::int64_t> promote_due() override;
  /// Runs `<schema>.maintain(holder, term, stale_after)`: errc::leadership_lost (SQLSTATE TN004)
  /// when `lease` is no longer the current, unexpired maintenance lease.
  result<std::vector<rescued_attempt>> maintain(const leader_lease& lease,
                                                     std::chrono::microseconds stale_after) override;
  result<attempt_evidence> reconcile(attempt_id attempt) override;
  result<std::vector<attempt_evidence>> reconcile(std::span<const attempt_id> attempts) override;

  result<void> configure_queue(std::string_view queue, const queue_settings& settings) override;
  result<bool> pause_queue(std::string_view queue) override;
  result<bool> resume_queue(std::string_view queue) override;
  result<void> update_queue(std::string_view queue, const queue_changes& changes) override;
  result<std::vector<queue_depth>> queue_depths() override;
  /// VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE false) of `ready` and `receipts` when
  /// pg_stat_user_tables counts at least `dead_rows` dead rows in them and the role owns them (or
  /// is a superuser); one statement reads the counts, one VACUUM lists the tables due.
  result<reclaim_result> reclaim_dead_rows(std::int64_t dead_rows) override;

  const store_options& options() const noexcept;

 private:
  result<std::optional<std::vector<enqueue_result>>> copy_enqueue(std::span<const new_job> jobs);
  struct impl;
  explicit store(std::unique_ptr<impl> p) noexcept;
  std::unique_ptr<impl> impl_;
};

}  // namespace tenure::postgres
