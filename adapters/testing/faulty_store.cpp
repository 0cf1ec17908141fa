#include "tenure/testing/faulty_store.hpp"

#include <algorithm>
#include <array>
#include <utility>

namespace tenure::testing {

std::string_view to_string(op o) noexcept {
  static constexpr std::array<std::string_view, k_op_count> names{
      "enqueue",    "enqueue_batch", "claim",     "heartbeat",    "complete",
      "fail",       "snooze",        "cancel_attempt", "cancel_job", "retry_job",
      "read_job",   "rescue_stale",  "promote_due", "reconcile",  "checkpoint",
      "register_callback", "await_callback", "park_callback", "resume_callback", "extend_callback", "complete_callback",
      "fail_callback", "configure_queue", "queue_depths", "reclaim_dead_rows"};
  const auto i = static_cast<std::size_t>(o);
  return i < names.size() ? names[i] : "unknown";
}

void faulty_store::fail_nth(op o, int n, errc code) {
  std::lock_guard lock(mutex_);
  rules_.push_back({o, std::max(n, 1), fault::refuse, code});
}

void faulty_store::fail_after_apply_nth(op o, int n) {
  std::lock_guard lock(mutex_);
  rules_.push_back({o, std::max(n, 1), fault::in_doubt, errc::commit_in_doubt});
}

void faulty_store::lose_connection() noexcept {
  std::lock_guard lock(mutex_);
  connected_ = false;
}

void faulty_store::restore_connection() noexcept {
  std::lock_guard lock(mutex_);
  connected_ = true;
}

void faulty_store::hold(op o) {
  std::lock_guard lock(mutex_);
  held_[static_cast<std::size_t>(o)] = true;
}

void faulty_store::release(op o) {
  {
    std::lock_guard lock(mutex_);
    held_[static_cast<std::size_t>(o)] = false;
  }
  released_.notify_all();
}

void faulty_store::clear_faults() noexcept {
  std::lock_guard lock(mutex_);
  rules_.clear();
}

std::int64_t faulty_store::calls(op o) const noexcept {
  std::lock_guard lock(mutex_);
  return calls_[static_cast<std::size_t>(o)];
}

std::int64_t faulty_store::forwarded(op o) const noexcept {
  std::lock_guard lock(mutex_);
  return forwarded_[static_cast<std::size_t>(o)];
}

std::int64_t faulty_store::waiting(op o) const noexcept {
  std::lock_guard lock(mutex_);
  return waiting_[static_cast<std::size_t>(o)];
}

faulty_store::decision faulty_store::decide(op o) {
  std::lock_guard lock(mutex_);
  const auto i = static_cast<std::size_t>(o);
  ++calls_[i];
  if (!connected_) return {fault::refuse, errc::database_unavailable};
  decision d;
  bool decided = false;
  for (auto& r : rules_) {
    if (r.target != o || --r.remaining > 0) continue;
    if (!decided) d = {r.kind, r.code};
    decided = true;
  }
  std::erase_if(rules_, [](const rule& r) { return r.remaining <= 0; });
  if (d.kind != fault::refuse) ++forwarded_[i];
  return d;
}

template <class T, class Forward>
result<T> faulty_store::call(op o, Forward&& forward) {
  const decision d = decide(o);
  {
    std::unique_lock lock(mutex_);
    const auto i = static_cast<std::size_t>(o);
    if (held_[i]) {
      ++waiting_[i];
      released_.wait(lock, [&] { return !held_[i]; });
      --waiting_[i];
    }
  }
  if (d.kind == fault::refuse) return d.code;
  result<T> r = std::forward<Forward>(forward)();
  if (d.kind == fault::in_doubt && r) return errc::commit_in_doubt;
  return r;
}

result<enqueue_result> faulty_store::try_enqueue(const new_job& job) {
  return call<enqueue_result>(op::enqueue, [&] { return inner_.try_enqueue(job); });
}

result<std::vector<enqueue_result>> faulty_store::try_enqueue_batch(std::span<const new_job> jobs) {
  return call<std::vector<enqueue_result>>(op::enqueue_batch, [&] { return inner_.try_enqueue_batch(jobs); });
}

result<std::int64_t> faulty_store::enqueue(const new_job& job) {
  return call<std::int64_t>(op::enqueue, [&] { return inner_.enqueue(job); });
}

result<std::vector<std::int64_t>> faulty_store::enqueue_batch(std::span<const new_job> jobs) {
  return call<std::vector<std::int64_t>>(op::enqueue_batch,
                                         [&] { return inner_.enqueue_batch(jobs); });
}

result<std::vector<claimed_attempt>> faulty_store::claim(std::string_view queue, int max_jobs,
                                                         std::string_view worker) {
  return call<std::vector<claimed_attempt>>(
      op::claim, [&] { return inner_.claim(queue, max_jobs, worker); });
}

result<std::vector<claimed_attempt>> faulty_store::claim(std::string_view queue, int max_jobs,
                                                         std::string_view worker,
                                                         bool going_to_sleep) {
  return call<std::vector<claimed_attempt>>(
      op::claim, [&] { return inner_.claim(queue, max_jobs, worker, going_to_sleep); });
}

result<std::vector<attempt_id>> faulty_store::heartbeat(
    std::span<const attempt_id> attempts, std::span<const std::optional<std::string>> progress) {
  return call<std::vector<attempt_id>>(op::heartbeat,
                                       [&] { return inner_.heartbeat(attempts, progress); });
}

result<std::vector<completion_result>> faulty_store::complete(
    std::span<const completion> batch) {
  return call<std::vector<completion_result>>(op::complete,
                                                   [&] { return inner_.complete(batch); });
}

result<job_state> faulty_store::fail(attempt_id attempt, std::string_view error,
                                     fail_disposition disposition,
                                     std::optional<std::chrono::microseconds> retry_after) {
  return call<job_state>(op::fail,
                         [&] { return inner_.fail(attempt, error, disposition, retry_after); });
}

result<void> faulty_store::snooze(attempt_id attempt, std::chrono::microseconds delay) {
  return call<void>(op::snooze, [&] { return inner_.snooze(attempt, delay); });
}

result<void> faulty_store::cancel_attempt(attempt_id attempt, std::string_view reason) {
  return call<void>(op::cancel_attempt, [&] { return inner_.cancel_attempt(attempt, reason); });
}

result<std::optional<std::string>> faulty_store::checkpoint(attempt_id attempt) {
  return call<std::optional<std::string>>(op::checkpoint, [&] { return inner_.checkpoint(attempt); });
}

result<std::string> faulty_store::register_callback(attempt_id attempt, std::chrono::microseconds timeout) {
  return call<std::string>(op::register_callback, [&] { return inner_.register_callback(attempt, timeout); });
}

result<callback_poll> faulty_store::await_callback(attempt_id attempt, std::string_view callback_id) {
  return call<callback_poll>(op::await_callback, [&] { return inner_.await_callback(attempt, callback_id); });
}

result<park_result> faulty_store::park_callback(attempt_id attempt, std::string_view callback_id) {
  return call<park_result>(op::park_callback, [&] { return inner_.park_callback(attempt, callback_id); });
}

result<bool> faulty_store::resume_callback(std::string_view callback_id, std::string_view payload_json) {
  return call<bool>(op::resume_callback, [&] { return inner_.resume_callback(callback_id, payload_json); });
}

result<bool> faulty_store::extend_callback(std::string_view callback_id, std::chrono::microseconds timeout) {
  return call<bool>(op::extend_callback, [&] { return inner_.extend_callback(callback_id, timeout); });
}

result<bool> faulty_store::complete_callback(std::string_view callback_id,
                                             std::optional<std::string> progress_json) {
  return call<bool>(op::complete_callback, [&] { return inner_.complete_callback(callback_id, progress_json); });
}

result<bool> faulty_store::fail_callback(std::string_view callback_id, std::string_view error, bool retry) {
  return call<bool>(op::fail_callback, [&] { return inner_.fail_callback(callback_id, error, retry); });
}

result<bool> faulty_store::cancel_job(std::int64_t job_id) {
  return call<bool>(op::cancel_job, [&] { return inner_.cancel_job(job_id); });
}

result<bool> faulty_store::retry_job(std::int64_t job_id) {
  return call<bool>(op::retry_job, [&] { return inner_.retry_job(job_id); });
}

result<job_info> faulty_store::read_job(std::int64_t job_id) {
  return call<job_info>(op::read_job, [&] { return inner_.read_job(job_id); });
}

result<std::vector<rescued_attempt>> faulty_store::rescue_stale(
    std::chrono::microseconds stale_after) {
  return call<std::vector<rescued_attempt>>(op::rescue_stale,
                                                 [&] { return inner_.rescue_stale(stale_after); });
}

result<std::int64_t> faulty_store::promote_due() {
  return call<std::int64_t>(op::promote_due, [&] { return inner_.promote_due(); });
}

result<attempt_evidence> faulty_store::reconcile(attempt_id attempt) {
  return call<attempt_evidence>(op::reconcile, [&] { return inner_.reconcile(attempt); });
}

result<void> faulty_store::configure_queue(std::string_view queue,
                                           const queue_settings& settings) {
  return call<void>(op::configure_queue, [&] { return inner_.configure_queue(queue, settings); });
}

result<std::vector<queue_depth>> faulty_store::queue_depths() {
  return call<std::vector<queue_depth>>(op::queue_depths, [&] { return inner_.queue_depths(); });
}

result<reclaim_result> faulty_store::reclaim_dead_rows(std::int64_t dead_rows) {
  return call<reclaim_result>(op::reclaim_dead_rows, [&] { return inner_.reclaim_dead_rows(dead_rows); });
}

}  // namespace tenure::testing
