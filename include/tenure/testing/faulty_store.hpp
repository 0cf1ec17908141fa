#pragma once
/// \file
/// `tenure::testing::faulty_store`: a storage port decorator that injects faults, so unit tests
/// can show what the engine does when the database refuses a call, loses a COMMIT
/// acknowledgement or goes away.
#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tenure/storage_port.hpp"

namespace tenure::testing {

/// One per storage_port method.
enum class op {
  enqueue,
  enqueue_batch,
  claim,
  heartbeat,
  complete,
  fail,
  snooze,
  cancel_attempt,
  cancel_job,
  retry_job,
  read_job,
  rescue_stale,
  promote_due,
  reconcile,
  checkpoint,
  register_callback,
  await_callback,
  park_callback,
  resume_callback,
  extend_callback,
  complete_callback,
  fail_callback,
  configure_queue,
  queue_depths,
  reclaim_dead_rows,
};
inline constexpr std::size_t k_op_count = static_cast<std::size_t>(op::reclaim_dead_rows) + 1;

std::string_view to_string(op o) noexcept;

/// Forwards every call to `inner` unless a fault is due. Thread-safe: the fault bookkeeping is
/// serialised by a mutex that is never held while the inner store runs, so concurrent calls
/// still reach `inner` concurrently. Never throws.
///
/// Rules count calls from the moment they are armed (n = 1 is the next call of that operation).
/// Every armed rule of an operation counts each of its calls made while connected; when several
/// come due on one call, the one armed first decides and all of them are spent.
class faulty_store final : public storage_port {
 public:
  /// `inner` must outlive this decorator.
  explicit faulty_store(storage_port& inner) noexcept : inner_(inner) {}

  /// The n-th call of `o` returns `code` without reaching the inner store (nothing is written).
  void fail_nth(op o, int n, errc code);
  /// The n-th call of `o` is forwarded; if the inner store applied it, the caller is told
  /// errc::commit_in_doubt anyway (the write landed, the acknowledgement was lost). If the inner
  /// store failed, its own error is reported.
  void fail_after_apply_nth(op o, int n);
  /// Until restore_connection(), every call returns errc::database_unavailable, unforwarded.
  void lose_connection() noexcept;
  void restore_connection() noexcept;
  /// Until release(o), every call of `o` waits inside the decorator (already counted in calls(),
  /// not yet forwarded): a race made exact, e.g. a claim still in flight when stop() begins.
  void hold(op o);
  void release(op o);
  /// Drops every armed rule (the connection state is kept).
  void clear_faults() noexcept;

  /// Calls of `o` made so far, whether forwarded, failed or refused.
  std::int64_t calls(op o) const noexcept;
  /// Calls of `o` that reached the inner store.
  std::int64_t forwarded(op o) const noexcept;
  /// Calls of `o` waiting inside the decorator for release(o) now. Each reaches the inner store
  /// only after the release, so it reads what was written before that.
  std::int64_t waiting(op o) const noexcept;

  // ---- storage_port ------------------------------------------------------------------------
  /// try_enqueue and enqueue count as op::enqueue; the batch forms as op::enqueue_batch.
  result<enqueue_result> try_enqueue(const new_job& job) override;
  result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs) override;
  result<std::int64_t> enqueue(const new_job& job) override;
  result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs) override;
  /// Both claim overloads count as op::claim; each forwards to the same overload of `inner`.
  result<std::vector<claimed_attempt>> claim(std::string_view queue, int max_jobs,
                                             std::string_view worker) override;
  result<std::vector<claimed_attempt>> claim(std::string_view queue, int max_jobs,
                                             std::string_view worker,
                                             bool going_to_sleep) override;
  result<std::vector<attempt_id>> heartbeat(
      std::span<const attempt_id> attempts,
      std::span<const std::optional<std::string>> progress = {}) override;
  result<std::vector<completion_result>> complete(
      std::span<const completion> batch) override;
  result<job_state> fail(attempt_id attempt, std::string_view error,
                         fail_disposition disposition,
                         std::optional<std::chrono::microseconds> retry_after = std::nullopt) override;
  result<void> snooze(attempt_id attempt, std::chrono::microseconds delay) override;
  result<void> cancel_attempt(attempt_id attempt, std::string_view reason) override;
  result<std::optional<std::string>> checkpoint(attempt_id attempt) override;
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
  result<std::vector<rescued_attempt>> rescue_stale(std::chrono::microseconds stale_after) override;
  result<std::int64_t> promote_due() override;
  result<attempt_evidence> reconcile(attempt_id attempt) override;
  using storage_port::reconcile;  // the batch form asks one at a time: each call counts
  result<void> configure_queue(std::string_view queue,
                               const queue_settings& settings) override;
  result<std::vector<queue_depth>> queue_depths() override;
  result<reclaim_result> reclaim_dead_rows(std::int64_t dead_rows) override;

 private:
  enum class fault { none, refuse, in_doubt };
  struct decision {
    fault kind = fault::none;
    errc code = errc::database_unavailable;
  };
  struct rule {
    op target;
    int remaining;  ///< calls until it fires; 1 = the next one
    fault kind;
    errc code;
  };

  decision decide(op o);
  template <class T, class Forward>
  result<T> call(op o, Forward&& forward);

  storage_port& inner_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::array<bool, k_op_count> held_{};
  std::vector<rule> rules_;
  std::array<std::int64_t, k_op_count> calls_{};
  std::array<std::int64_t, k_op_count> forwarded_{};
  std::array<std::int64_t, k_op_count> waiting_{};
  bool connected_ = true;
};

}  // namespace tenure::testing
