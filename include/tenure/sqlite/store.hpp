#pragma once
/// \file
/// `tenure::sqlite::store`: the storage port over SQLite (through SOCI), a fast, faithful fake of
/// the PostgreSQL store for unit tests.
///
/// It keeps the lifecycle layout of adapters/postgres/sql/0001_base.sql (ready, deferred,
/// receipts, attempt_state, done, dead_letter, queues and a `jobs` view) and gives every port
/// method the semantics of the matching SQL function. Timestamps are int64 microseconds read from
/// the injected clock, never the wall clock, so tests drive time with `manual_clock`.
///
/// Concurrency: one mutex serialises every call on a handle, and each call is one SQLite
/// transaction (BEGIN IMMEDIATE for writes). Several handles on the same file serialise on
/// SQLite's database write lock (waiting up to `options::busy_timeout`). Whole-database
/// serialisation is the fake's honest stand-in for PostgreSQL's row locks and
/// `FOR UPDATE SKIP LOCKED`: concurrent claimers never share a job, and a completion and a rescue
/// of one attempt can never both apply.
///
/// Queue limits and priority aging (`max_running`, `rate_per_second`, `rate_burst`,
/// `priority_aging`) exist only in PostgreSQL: this store has no `update_queue` (it answers
/// errc::unsupported, the port's default) and its `configure_queue` takes a `queue_settings`,
/// which carries none of them. So its claims are never limited and order by priority alone.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tenure/clock.hpp"
#include "tenure/storage_port.hpp"

namespace tenure::sqlite {

namespace detail {
struct store_state;
}

/// The SQLite store. See the file comment.
class store final : public storage_port {
 public:
  struct options {
    /// Seeds the backoff jitter; two stores with one seed and one history pick the same delays.
    std::uint64_t seed = 0x7e4e'57a7'e5eedULL;
    /// How long a call waits for another handle's write lock before `errc::transient_conflict`.
    std::chrono::milliseconds busy_timeout = std::chrono::seconds{60};
  };

  /// Opens (creating and migrating if needed) the database at `path`: a file, or ":memory:" for a
  /// private in-memory database that no other handle can see. `clock` must outlive the store.
  /// Errors: errc::database_unavailable when the file cannot be opened, errc::schema_mismatch for
  /// a database of an unknown schema version, errc::invalid_argument for a path containing '"'.
  /// Blocks; never throws.
  static result<std::unique_ptr<store>> open(std::string path, const clock_port& clock,
                                             options opts);
  static result<std::unique_ptr<store>> open(std::string path, const clock_port& clock) {
    return open(std::move(path), clock, options{});
  }

  ~store() override;
  store(const store&) = delete;
  store& operator=(const store&) = delete;

  /// Shorthand for the port's configure_queue (the `queues` table).
  result<void> configure_queue(std::string_view queue, bool dead_letter,
                               std::optional<std::chrono::microseconds> hard_deadline,
                               std::chrono::microseconds backoff_base = std::chrono::seconds{1},
                               std::chrono::microseconds backoff_cap = std::chrono::hours{1}) {
    return configure_queue(queue, queue_settings{dead_letter, hard_deadline, backoff_base,
                                                      backoff_cap});
  }

  // ---- storage_port (semantics: tenure/storage_port.hpp and 0001_base.sql) -------------------
  result<enqueue_result> try_enqueue(const new_job& job) override;
  result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs) override;

  /// errc::invalid_argument for max_jobs outside 1..10000 (as tenure.claim). Promotes at most
  /// 1000 due deferred jobs of the queue first. There is no wake-up channel, so the
  /// `going_to_sleep` overload is the port's default (no waiter bookkeeping).
  using storage_port::claim;
  result<std::vector<claimed_attempt>> claim(std::string_view queue, int max_jobs,
                                             std::string_view worker) override;
  /// Live attempts come back once each, ordered by (job_id, run_lease). errc::invalid_argument
  /// when `progress` is neither empty nor as long as `attempts`, or holds invalid JSON.
  result<std::vector<attempt_id>> heartbeat(
      std::span<const attempt_id> attempts,
      std::span<const std::optional<std::string>> progress = {}) override;
  /// One result per item, in input order. An attempt named twice in one batch is completed once:
  /// its first copy reports the outcome, a repeat is stale (as the Postgres adapter maps the
  /// set-based SQL); the first non-empty progress among the copies wins.
  /// errc::invalid_argument for invalid progress JSON.
  result<std::vector<completion_result>> complete(
      std::span<const completion> batch) override;
  result<job_state> fail(attempt_id attempt, std::string_view error,
                         fail_disposition disposition,
                         std::optional<std::chrono::microseconds> retry_after = std::nullopt) override;
  result<void> snooze(attempt_id attempt, std::chrono::microseconds delay) override;
  /// An empty reason keeps the job's last error (the Postgres adapter sends NULL for it).
  result<void> cancel_attempt(attempt_id attempt, std::string_view reason) override;
  result<std::optional<std::string>> checkpoint(attempt_id attempt) override;

  // External callbacks, as 0002_callbacks.sql and 0011_parked_callbacks.sql (without NOTIFY: a
  // blocking waiter polls). A closed attempt's callback is deleted with it.
  result<std::string> register_callback(attempt_id attempt, std::chrono::microseconds timeout) override;
  result<callback_poll> await_callback(attempt_id attempt, std::string_view callback_id) override;
  result<park_result> park_callback(attempt_id attempt, std::string_view callback_id) override;
  result<bool> resume_callback(std::string_view callback_id, std::string_view payload_json) override;
  result<bool> extend_callback(std::string_view callback_id, std::chrono::microseconds timeout) override;
  result<bool> complete_callback(std::string_view callback_id,
                                 std::optional<std::string> progress_json = std::nullopt) override;
  result<bool> fail_callback(std::string_view callback_id, std::string_view error, bool retry) override;

  result<bool> cancel_job(std::int64_t job_id) override;
  result<bool> retry_job(std::int64_t job_id) override;
  result<job_info> read_job(std::int64_t job_id) override;

  /// errc::invalid_argument for a negative `stale_after`.
  result<std::vector<rescued_attempt>> rescue_stale(std::chrono::microseconds stale_after) override;
  /// Moves at most 10000 due jobs per call (oldest run_at first), like the Postgres adapter.
  result<std::int64_t> promote_due() override;
  result<attempt_evidence> reconcile(attempt_id attempt) override;
  result<std::vector<queue_depth>> queue_depths() override;
  using storage_port::reconcile;
  /// errc::invalid_argument for a non-positive hard deadline, a negative backoff base or a cap
  /// below the base (the CHECKs of the queues table).
  result<void> configure_queue(std::string_view queue,
                               const queue_settings& settings) override;

 private:
  explicit store(std::unique_ptr<detail::store_state> state) noexcept;
  std::unique_ptr<detail::store_state> state_;
};

}  // namespace tenure::sqlite
