#pragma once
/// \file
/// The storage port: everything the engine asks of a database, with no SQL dialect in sight.
///
/// Implementations: adapters/postgres (the real store) and adapters/sqlite (a fast fake for unit
/// tests). Both pass the same contract suite (tests/contract). Every method:
///  - blocks the calling thread until the database answered (call it off any event loop);
///  - is safe to call from several threads at once (implementations serialize or pool);
///  - never throws: expected failures are values. `errc::database_unavailable` means nothing is
///    known to be written; `errc::commit_in_doubt` means the write may have landed and the caller
///    must reconcile; `errc::transient_conflict` means the whole call may be retried.
///
/// The guard rule: every method that names an attempt matches (job_id, run_lease) and the live
/// state in one statement. Zero rows matched is `stale` (a value, never an error to retry).
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tenure/job.hpp"
#include "tenure/result.hpp"
#include "tenure/token.hpp"

namespace tenure {


/// A completed outcome waiting to be flushed.
struct completion {
  attempt_id attempt;
  std::optional<std::string> progress;  ///< final progress JSON text, if any
  /// The attempt's secret as its claim returned it. A store that keeps secrets completes the
  /// attempt only when it is the open attempt's secret (else stale): after a failover to an
  /// asynchronous standby the same (job_id, run_lease) may name another attempt. All zero
  /// (default): matched by (job_id, run_lease) alone.
  attempt_secret secret{};
};

/// Per-item answer of a completion flush.
struct completion_result {
  attempt_id attempt;
  bool applied = false;  ///< false = stale (the attempt was no longer live)
  std::optional<time_point> completed_at;
};

/// What a failed attempt became.
enum class fail_disposition {
  retry,      ///< use the queue's backoff policy if attempts remain, else fail
  permanent,  ///< fail now, whatever the remaining attempts
};

/// An attempt closed by `rescue_stale`.
struct rescued_attempt {
  attempt_id attempt;
  std::string queue;
  job_state new_state = job_state::available;  ///< available, or failed when attempts are spent
};

/// A maintenance lease as the leader names it in its fenced calls: who holds it and which term
/// (the term grows every time the lease changes hands).
struct leader_lease {
  std::string holder;
  std::int64_t term = 0;
};

/// Durable evidence about one attempt, read by reconciliation.
enum class attempt_evidence {
  open,                ///< the attempt is still live (running or waiting_external)
  completed_by_this,   ///< the job's terminal record is `completed` with this run lease
  closed_by_other,     ///< the job moved on: another lease, or closed as not completed
  unknown_job,         ///< no such job at all
};

/// What a waiting handler's poll of its callback found.
struct callback_poll {
  bool resumed = false;   ///< false: still waiting (the first poll parks the attempt)
  std::string payload;    ///< JSON text of the resume payload, when resumed
};

/// What parking an attempt on its callback did (`park_callback`).
enum class park_result {
  parked,   ///< waiting_external with no handler: a resume makes it claimable again
  resumed,  ///< the callback was resumed first: the attempt is claimable again at once
};

/// How many jobs of one queue are in each unfinished state, read by `queue_depths()`.
struct queue_depth {
  std::string queue;
  std::int64_t available = 0;
  std::int64_t scheduled = 0;         ///< waiting for a future run_at (first run or snooze)
  std::int64_t retryable = 0;         ///< waiting for a retry backoff
  std::int64_t running = 0;
  std::int64_t waiting_external = 0;  ///< running attempts parked on an external callback
  /// How long the oldest available job has been claimable (since its run_at, or its created_at
  /// when later), by the store's clock; zero when none is available.
  std::chrono::microseconds oldest_available{0};
};

/// What `reclaim_dead_rows()` found and did.
struct reclaim_result {
  int due = 0;        ///< tables of the claim path holding at least the threshold of dead rows
  int reclaimed = 0;  ///< of those, the ones cleaned now (the rest: the role may not, see there)
};

/// Per-queue settings kept in the database (every worker of the queue sees the same).
struct queue_settings {
  bool dead_letter = false;                    ///< failed jobs go to the dead-letter table
  std::optional<std::chrono::microseconds> hard_deadline;  ///< an attempt running longer is rescued
  std::chrono::microseconds backoff_base = std::chrono::seconds{1};
  std::chrono::microseconds backoff_cap = std::chrono::hours{1};
};

/// A change to some of a queue's settings, for operators (`update_queue`): a field left unset
/// keeps its value. Retentions: how long finished jobs of the queue are kept before the
/// maintenance leader deletes them (defaults: completed 24 h, cancelled 24 h, failed 7 days).
struct queue_changes {
  std::optional<bool> dead_letter;
  std::optional<std::optional<std::chrono::microseconds>> hard_deadline;  ///< inner nullopt: none
  std::optional<std::chrono::microseconds> backoff_base;
  std::optional<std::chrono::microseconds> backoff_cap;
  std::optional<std::chrono::microseconds> retain_completed;
  std::optional<std::chrono::microseconds> retain_cancelled;
  std::optional<std::chrono::microseconds> retain_failed;
  /// Limits and aging (PostgreSQL; README "Limits and priority aging"); inner nullopt clears.
  std::optional<std::optional<std::int32_t>> max_running;  ///< open attempts at once, all processes
  std::optional<std::optional<double>> rate_per_second;    ///< claims per second, all processes
  std::optional<std::optional<double>> rate_burst;         ///< the token bucket's size [max(1, rate)]
  std::optional<std::optional<std::chrono::microseconds>> priority_aging;  ///< one priority level per interval waited
};

/// The port. See the file comment for the rules every method follows.
class storage_port {
 public:
  virtual ~storage_port() = default;

  // ---- producers --------------------------------------------------------------------------
  /// Enqueues one job in its own transaction, honouring its unique_key: while a live job of the
  /// queue holds the key, nothing is inserted and the answer is that job's id with `inserted`
  /// false. Concurrent callers with one key get one job. errc::invalid_argument for a bad job.
  virtual result<enqueue_result> try_enqueue(const new_job& job) = 0;
  /// Enqueues many jobs in one transaction, in input order; keyless batches in one set-based
  /// statement. A job whose key is held (by a live job, or by an earlier job of the batch)
  /// answers the holder's id, not inserted. All or nothing: one invalid job rejects the batch
  /// with errc::invalid_argument.
  virtual result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs) = 0;
  /// try_enqueue, answering only the id (the new job's or the key's holder's).
  virtual result<std::int64_t> enqueue(const new_job& job) {
    auto r = try_enqueue(job);
    if (!r) return r.error();
    return r.value().id;
  }
  /// try_enqueue_batch, answering only the ids.
  virtual result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs) {
    auto r = try_enqueue_batch(jobs);
    if (!r) return r.error();
    std::vector<std::int64_t> ids;
    ids.reserve(r.value().size());
    for (const auto& e : r.value()) ids.push_back(e.id);
    return ids;
  }

  // ---- workers ----------------------------------------------------------------------------
  /// Claims up to `max_jobs` available jobs of `queue` (priority, then FIFO), giving each a new
  /// run lease above every earlier one of its job (not necessarily one more: PostgreSQL's names
  /// the claim's record of the attempt) and advancing its attempt count by one, except a resumed
  /// parked attempt (`park_callback`), which keeps its attempt number (a new run lease all the
  /// same) and comes back with `resumed_with` set. Every claim draws a new secret. Due
  /// scheduled/retryable jobs of the queue are promoted first.
  /// Concurrent callers never receive the same job.
  virtual result<std::vector<claimed_attempt>> claim(std::string_view queue, int max_jobs,
                                                     std::string_view worker) = 0;
  /// The same claim, plus the wake-up bookkeeping of a named worker: a non-empty claim removes
  /// the worker from the queue's waiters; an empty claim with `going_to_sleep` adds it, so
  /// producers pay for a NOTIFY only while some worker sleeps. Stores without a wake-up channel
  /// ignore the bookkeeping (this default).
  virtual result<std::vector<claimed_attempt>> claim(std::string_view queue, int max_jobs,
                                                     std::string_view worker, bool going_to_sleep) {
    (void)going_to_sleep;
    return claim(queue, max_jobs, worker);
  }
  /// Records a heartbeat for every attempt in one statement; returns the attempts that were live
  /// (the others are stale). `progress[i]`, when set, is flushed with attempt i.
  virtual result<std::vector<attempt_id>> heartbeat(
      std::span<const attempt_id> attempts,
      std::span<const std::optional<std::string>> progress = {}) = 0;
  /// Completes a batch in one guarded statement. One result per input item, same order.
  virtual result<std::vector<completion_result>> complete(std::span<const completion> batch) = 0;
  /// Fails one attempt: retry with the queue's backoff (or `retry_after` when given) while
  /// attempts remain, else failed / dead-lettered. Returns the job's new state.
  /// errc::stale_attempt when the attempt is not live.
  virtual result<job_state> fail(attempt_id attempt, std::string_view error,
                                 fail_disposition disposition,
                                 std::optional<std::chrono::microseconds> retry_after = std::nullopt) = 0;
  /// Gives the attempt back without consuming an attempt; the job runs again after `delay`.
  /// errc::stale_attempt when the attempt is not live.
  virtual result<void> snooze(attempt_id attempt, std::chrono::microseconds delay) = 0;
  /// Cancels the live attempt itself (handler outcome). errc::stale_attempt when not live.
  virtual result<void> cancel_attempt(attempt_id attempt, std::string_view reason) = 0;
  /// The progress the live attempt carried in from earlier attempts of its job (its checkpoint;
  /// nullopt when none), never the attempt's own progress. errc::stale_attempt when not live.
  /// A store without checkpoints answers errc::unsupported (this default).
  virtual result<std::optional<std::string>> checkpoint(attempt_id attempt) {
    (void)attempt;
    return error{errc::unsupported, "this store keeps no progress checkpoints"};
  }

  // ---- external callbacks (stores without them answer errc::unsupported: the defaults) ------
  /// Registers (or rotates) the live attempt's callback; returns the fresh callback id (UUID
  /// text). `timeout`: how long the attempt may wait once parked. errc::stale_attempt when the
  /// attempt is not live.
  virtual result<std::string> register_callback(attempt_id attempt, std::chrono::microseconds timeout) {
    (void)attempt, (void)timeout;
    return no_callbacks();
  }
  /// Polls the callback, parking the attempt as waiting_external on the first call. Guarded by
  /// (job_id, run_lease, callback_id): errc::stale_attempt when the attempt is not live or the
  /// callback was rotated.
  virtual result<callback_poll> await_callback(attempt_id attempt, std::string_view callback_id) {
    (void)attempt, (void)callback_id;
    return no_callbacks();
  }
  /// Parks the live attempt on its current callback `callback_id` and lets its handler go: the
  /// attempt stays waiting_external (same run lease, callback timeout armed) with no handler.
  /// A resume then closes it and makes the job claimable again; its claim is the continuation
  /// (same attempt number, a new run lease and secret, claimed_attempt::resumed_with set);
  /// complete_callback, fail_callback, rescue (callback timeout) and cancel close it as they
  /// close a blocking waiter.
  /// park_result::resumed when the callback was resumed before it parked (already claimable).
  /// errc::stale_attempt when the attempt is not live or `callback_id` is not its current callback.
  virtual result<park_result> park_callback(attempt_id attempt, std::string_view callback_id) {
    (void)attempt, (void)callback_id;
    return no_callbacks();
  }
  /// Resumes a callback with a JSON payload. false: unknown, already resolved, or stale. A parked
  /// attempt becomes claimable again (its continuation gets the payload); a blocking waiter is
  /// woken.
  virtual result<bool> resume_callback(std::string_view callback_id, std::string_view payload_json) {
    (void)callback_id, (void)payload_json;
    return no_callbacks();
  }
  /// Sets a registered callback's timeout (counting from now when already waiting). false:
  /// unknown, resolved, or stale.
  virtual result<bool> extend_callback(std::string_view callback_id, std::chrono::microseconds timeout) {
    (void)callback_id, (void)timeout;
    return no_callbacks();
  }
  /// Completes the callback's job from outside (final progress optional). false as above.
  virtual result<bool> complete_callback(std::string_view callback_id,
                                         std::optional<std::string> progress_json = std::nullopt) {
    (void)callback_id, (void)progress_json;
    return no_callbacks();
  }
  /// Fails the callback's job from outside: retried while attempts remain when `retry`, else
  /// failed for good. false as above.
  virtual result<bool> fail_callback(std::string_view callback_id, std::string_view error, bool retry) {
    (void)callback_id, (void)error, (void)retry;
    return no_callbacks();
  }

  // ---- administration ---------------------------------------------------------------------
  /// Cancels a job that is not finished yet. false when it was already finished.
  /// errc::job_not_found for an unknown id.
  virtual result<bool> cancel_job(std::int64_t job_id) = 0;
  /// Makes a finished job runnable again (attempts reset; the run lease keeps counting up).
  /// false when the job is not finished. errc::job_not_found for an unknown id.
  virtual result<bool> retry_job(std::int64_t job_id) = 0;
  /// Reads one job. errc::job_not_found for an unknown id.
  virtual result<job_info> read_job(std::int64_t job_id) = 0;

  // ---- maintenance ------------------------------------------------------------------------
  /// Closes attempts whose last heartbeat (or claim, if never heartbeated) is at least
  /// `stale_after` old, or whose hard deadline passed: available again at once (the attempt
  /// counts, no backoff), or failed when attempts are spent. Serializes with `complete` on the
  /// same attempt: exactly one of them wins.
  virtual result<std::vector<rescued_attempt>> rescue_stale(std::chrono::microseconds stale_after) = 0;
  /// Moves due scheduled/retryable jobs to available; returns how many.
  virtual result<std::int64_t> promote_due() = 0;
  /// The maintenance pass of the leader holding `lease`: promote_due(), then
  /// rescue_stale(stale_after). A store that keeps leadership (PostgreSQL) runs it in one
  /// transaction and only while `lease` is its current, unexpired lease; otherwise it changes
  /// nothing and returns errc::leadership_lost. This default, for stores without leadership (the
  /// SQLite fake, where one process is the only worker), ignores `lease`.
  virtual result<std::vector<rescued_attempt>> maintain(const leader_lease& lease, std::chrono::microseconds stale_after) {
    (void)lease;
    TENURE_TRYV(promote_due());
    return rescue_stale(stale_after);
  }
  /// Reads durable evidence about one attempt (never writes).
  virtual result<attempt_evidence> reconcile(attempt_id attempt) = 0;
  /// The same for many attempts in one set-based statement; one answer per input, same order.
  /// This default asks one at a time (fine for fakes).
  virtual result<std::vector<attempt_evidence>> reconcile(std::span<const attempt_id> attempts) {
    std::vector<attempt_evidence> out;
    out.reserve(attempts.size());
    for (const auto& a : attempts) {
      TENURE_TRY(auto e, reconcile(a));
      out.push_back(e);
    }
    return out;
  }
  /// Removes the dead rows and index entries that finished work leaves on the claim path (the
  /// row of each claimed job among the available ones; on PostgreSQL also the entry of each
  /// fully closed claim in `open_claims`) from every such table holding at least `dead_rows` of
  /// them, so claims stop stepping over them. Changes no job. A store that leaves no such garbage
  /// answers errc::unsupported (this default). On PostgreSQL it is a VACUUM, which only the
  /// tables' owner (or a superuser) may run: a table the role may not clean counts in `due` but
  /// not in `reclaimed`, and is left to autovacuum.
  virtual result<reclaim_result> reclaim_dead_rows(std::int64_t dead_rows) {
    (void)dead_rows;
    return error{errc::unsupported, "this store leaves no dead rows to reclaim"};
  }
  /// Every queue holding an unfinished job (and every queue with stored settings), with its
  /// jobs per unfinished state, in one set-based statement; ordered by queue name. Reads only.
  /// A store that cannot count answers errc::unsupported (this default).
  virtual result<std::vector<queue_depth>> queue_depths() {
    return error{errc::unsupported, "this store does not count queue depths"};
  }
  /// Creates or replaces a queue's settings. errc::invalid_argument for a bad value.
  virtual result<void> configure_queue(std::string_view queue, const queue_settings& settings) = 0;

  // ---- operators (stores without them answer errc::unsupported: the defaults) ----------
  /// Pauses a queue: once this returns, no claim of it succeeds until `resume_queue` (claims in
  /// progress are waited for); running attempts go on. true when it was running, false when it
  /// was already paused.
  virtual result<bool> pause_queue(std::string_view queue) {
    (void)queue;
    return no_operators();
  }
  /// Resumes a paused queue and wakes its sleeping workers. true when it was paused.
  virtual result<bool> resume_queue(std::string_view queue) {
    (void)queue;
    return no_operators();
  }
  /// Changes the settings `changes` names, all or nothing. errc::invalid_argument for a bad value
  /// (e.g. a backoff cap below the base, a negative duration).
  virtual result<void> update_queue(std::string_view queue, const queue_changes& changes) {
    (void)queue, (void)changes;
    return no_operators();
  }
 protected:
  /// What the callback defaults answer.
  static error no_callbacks() { return error{errc::unsupported, "this store has no external callbacks"}; }
  /// What the operator defaults answer.
  static error no_operators() { return error{errc::unsupported, "this store has no queue administration"}; }
};

}  // namespace tenure
