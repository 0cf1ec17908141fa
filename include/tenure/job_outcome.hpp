#pragma once
/// \file
/// What an ordinary handler returns: completed, retry, snooze, fail or cancel.
#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tenure {

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
  static job_outcome retry_after(std::chrono::milliseconds delay, std::string error);
  /// Not now: run again after `delay` without consuming an attempt.
  static job_outcome snooze(std::chrono::milliseconds delay);
  /// Failed for good, whatever attempts remain.
  static job_outcome fail(std::string error);
  /// Cancel the job.
  static job_outcome cancel(std::string reason);

  enum kind what() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  std::optional<std::chrono::milliseconds> delay() const noexcept { return delay_; }
  const std::optional<nlohmann::json>& progress() const noexcept { return progress_; }

 private:
  enum kind kind_ = kind::completed;
  std::string message_;
  std::optional<std::chrono::milliseconds> delay_;
  std::optional<nlohmann::json> progress_;
};

}  // namespace tenure
