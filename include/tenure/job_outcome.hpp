#pragma once
/// \file
/// What an ordinary handler returns: completed, retry, snooze, fail, cancel or park.
#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tenure {

/// What a handler decided. Build with the static functions.
class job_outcome {
 public:
  enum class kind { completed, retry, snooze, fail, cancel, park };

  /// Done. `progress` (JSON), when given, is stored as the job's final progress (NUL characters
  /// and invalid UTF-8, which PostgreSQL cannot store, become U+FFFD, with a warning logged).
  static job_outcome completed(std::optional<nlohmann::json> progress = std::nullopt);
  /// Failed this attempt; retried with the queue's backoff while attempts remain, else failed.
  static job_outcome retry(std::string error);
  /// Failed this attempt; retried after `delay` while attempts remain, else failed.
  static job_outcome retry_after(std::chrono::milliseconds delay, std::string error);
  /// Not now: run again after `delay` without consuming an attempt.
  static job_outcome snooze(std::chrono::milliseconds delay);
  /// Failed for good, whatever attempts remain.
  static job_outcome fail(std::string error);
  /// Cancel the job.
  static job_outcome cancel(std::string reason);
  /// Wait for the callback `callback_id` (from job_context::register_callback, the attempt's
  /// current one) without keeping a thread: the attempt is parked as waiting_external (same run
  /// lease, the callback timeout armed) and the handler's thread and capacity permit are freed;
  /// nothing heartbeats it. tenure.resume_callback then makes it runnable again: a worker of any
  /// process calls the handler again for the same attempt (same job_id, run_lease and attempt
  /// number; a new token) with job_context::resumed_with() set to the payload. complete_callback
  /// and fail_callback finish it from outside; the callback timeout rescues it. An attempt that
  /// cannot be parked (no such current callback, or its resume was already consumed by
  /// wait_for_callback) is retried with an error.
  static job_outcome park(std::string callback_id);

  enum kind what() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  std::optional<std::chrono::milliseconds> delay() const noexcept { return delay_; }
  const std::optional<nlohmann::json>& progress() const noexcept { return progress_; }
  /// park: the callback the attempt waits for.
  const std::string& callback_id() const noexcept { return callback_id_; }

 private:
  enum kind kind_ = kind::completed;
  std::string message_;
  std::optional<std::chrono::milliseconds> delay_;
  std::optional<nlohmann::json> progress_;
  std::string callback_id_;
};

}  // namespace tenure
