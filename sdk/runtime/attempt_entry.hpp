#pragma once
/// \file
/// One attempt held by this process, keyed by (job_id, run_lease). Private to the runtime.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "sdk/runtime/metrics.hpp"
#include "sdk/runtime/storable.hpp"
#include "tenure/clock.hpp"
#include "tenure/job.hpp"
#include "tenure/storage_port.hpp"

namespace tenure::detail {

/// A counting gate: at most `n` holders at once; the rest wait. Any thread.
class call_gate {
 public:
  explicit call_gate(int n) : free_(n) {}
  void acquire() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    {
      std::lock_guard lock(mu_);
      ++free_;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};

/// Holds a gate (when there is one) for a scope.
class gate_hold {
 public:
  explicit gate_hold(call_gate* g) : g_(g) {
    if (g_) g_->acquire();
  }
  ~gate_hold() {
    if (g_) g_->release();
  }
  gate_hold(const gate_hold&) = delete;
  gate_hold& operator=(const gate_hold&) = delete;

 private:
  call_gate* g_;
};

struct attempt_entry {
  explicit attempt_entry(claimed_attempt c) : claim(std::move(c)) {}

  const claimed_attempt claim;

  /// Sets the cancel flag and wakes wait_cancelled(). Any thread.
  void cancel() noexcept {
    {
      std::lock_guard lock(mu);
      cancelled.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
  /// A resume NOTIFY arrived for this attempt: wake wait_for_callback() to poll now. Any thread.
  void poke() noexcept {
    {
      std::lock_guard lock(mu);
      pokes.fetch_add(1, std::memory_order_acq_rel);
    }
    cv.notify_all();
  }
  bool is_cancelled() const noexcept { return cancelled.load(std::memory_order_acquire); }

  /// Progress the handler buffered since the last heartbeat took it (JSON text).
  void put_progress(std::string json) {
    std::lock_guard lock(mu);
    progress = std::move(json);
  }
  std::optional<std::string> take_progress() {
    std::lock_guard lock(mu);
    return std::exchange(progress, std::nullopt);
  }
  /// The buffered progress, left buffered (a heartbeat still flushes it).
  std::optional<std::string> peek_progress() {
    std::lock_guard lock(mu);
    return progress;
  }
  /// Puts back progress a failed heartbeat took, unless the handler wrote newer progress.
  void restore_progress(std::string json) {
    std::lock_guard lock(mu);
    if (!progress) progress = std::move(json);
  }

  /// `v` as JSON text PostgreSQL can store (storable_json_text), with a warning naming this
  /// attempt when something had to be replaced. `what` names the value in that warning.
  std::string storable_progress(const nlohmann::json& v, const char* what) const {
    bool replaced = false;
    auto text = storable_json_text(v, &replaced);
    if (replaced) {
      tenure::logger()->warn("tenure: {} of job {} lease {} queue {} held NUL characters or invalid UTF-8; stored with U+FFFD "
                   "in their place (PostgreSQL cannot store them)",
                   what, claim.attempt.job_id, claim.attempt.run_lease, claim.queue);
    }
    return text;
  }

  /// The claimed args, parsed once (on the handler's thread). `{}` when they could not be parsed:
  /// the runtime then fails the job instead of running its handler (args_problem()).
  const nlohmann::json& args() const {
    std::call_once(args_once, [this] {
      try {
        args_json = nlohmann::json::parse(claim.args);
      } catch (const nlohmann::json::exception& e) {
        // what() is "[json.exception.out_of_range.406] number overflow parsing '1e1000'"; the
        // bracketed id means nothing to a reader of last_error.
        std::string message = e.what();
        if (const auto end = message.find("] "); message.starts_with("[json.exception") && end != std::string::npos) {
          message.erase(0, end + 2);
        }
        // The number's literal comes quoted in full: jsonb writes 1e1000 as 1001 digits.
        if (message.size() > 120) message = message.substr(0, 100) + "...'";
        args_error = std::move(message);
        args_json = nlohmann::json::object();
      }
    });
    return args_json;
  }
  /// Why the claimed args cannot be handed to a handler, or nullopt. Valid jsonb can hold what
  /// this process cannot represent (a number beyond a double's range, such as 1e1000): every
  /// attempt would see the same args, so such a job fails at once instead of being retried.
  std::optional<std::string> args_problem() const {
    (void)args();
    if (!args_error) return std::nullopt;
    return "args cannot be read by this process (" + *args_error + "); the job failed without running its "
           "handler, as every attempt would read the same args";
  }

  /// The claimed metadata, parsed once; `{}` when empty or unreadable (with a warning: metadata
  /// never decides whether a job runs).
  const nlohmann::json& metadata() const {
    std::call_once(metadata_once, [this] {
      metadata_json = nlohmann::json::object();
      if (claim.metadata.empty()) return;
      auto parsed = nlohmann::json::parse(claim.metadata, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object()) {
        metadata_json = std::move(parsed);
      } else {
        tenure::logger()->warn("tenure: the metadata of job {} lease {} queue {} cannot be read by this process; "
                               "handlers see {{}}",
                               claim.attempt.job_id, claim.attempt.run_lease, claim.queue);
      }
    });
    return metadata_json;
  }

  /// The store, for the handler's own guarded calls (flush_progress, previous_progress).
  std::shared_ptr<storage_port> store;
  /// The runtime's clock (runtime_config::clock), for the handler-side waits' pacing.
  std::shared_ptr<const clock_port> clock;
  const clock_port& time() const noexcept { return clock ? *clock : system_clock::instance(); }
  /// Caps the store calls handlers make at once (keeps connections for heartbeats); may be null.
  std::shared_ptr<call_gate> store_gate;
  /// Runs a handler-side store call `fn(store)` through the gate.
  template <class Fn>
  auto with_store(Fn&& fn) {
    gate_hold hold{store_gate.get()};
    return fn(*store);
  }
  /// The metrics of the attempt's queue (set when the entry is made; never null once admitted).
  queue_series* series = nullptr;
  /// When its handler started (set on the handler's thread, read on the control thread after
  /// the handler's exit was posted there); unset when no handler ran.
  std::optional<steady_time_point> started_at;
  /// The handler is about to run (its thread): notes the start and the pickup latency, from
  /// the job becoming available (the store's clock) to now (the runtime's wall reading).
  void starting() noexcept {
    started_at = time().steady_now();
    if (series && claim.available_at) series->pickup.observe(time().now() - *claim.available_at);
  }
  /// How long the handler ran (zero when none ran); on the control thread once it exited.
  std::chrono::nanoseconds run_time() const noexcept {
    if (!started_at || !done_at) return std::chrono::nanoseconds{0};
    return std::chrono::duration_cast<std::chrono::nanoseconds>(*done_at - *started_at);
  }

  /// wait_for_callback() handed the handler the resume payload of `callback_id`: parking on that
  /// callback afterwards would deliver it a second time, so the runtime refuses it. Any thread.
  void delivered(const std::string& callback_id) {
    std::lock_guard lock(mu);
    delivered_callback = callback_id;
  }
  bool was_delivered(const std::string& callback_id) {
    std::lock_guard lock(mu);
    return !callback_id.empty() && delivered_callback == callback_id;
  }

  /// previous_progress(), once read (guarded by mu).
  bool checkpoint_read = false;
  std::optional<std::string> checkpoint;

  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> cancelled{false};
  std::atomic<std::uint64_t> pokes{0};
  std::optional<std::string> progress;

  /// What a caller-owned handler asked to record if it returns an error (guarded by mu).
  std::string failure_note;
  /// The last callback whose resume wait_for_callback() returned (guarded by mu).
  std::string delivered_callback;

  // Control-thread state (last_live and caller_owned are first set where the entry is
  // made, on the database thread that received the claim, before its admission is posted).
  bool in_doubt = false;       ///< a flush carrying this completion had an unknown outcome
  bool handler_done = false;   ///< the handler returned; the outcome is being recorded
  /// Its queue's capacity permit is still taken by this attempt. False while the entry is held
  /// means it is being watched: released for capacity while the database could not answer.
  bool permit_held = true;
  /// When the database last confirmed the attempt live (claim or heartbeat): with staleness,
  /// the attempt's rescue deadline.
  steady_time_point last_live{};
  bool caller_owned = false;   ///< finished by its handler's own transaction (complete_in_tx)
  /// When the handler returned: the reconcile budget counts from here.
  std::optional<steady_time_point> done_at;

 private:
  mutable std::once_flag args_once;
  mutable nlohmann::json args_json;
  mutable std::optional<std::string> args_error;  ///< set once, under args_once
  mutable std::once_flag metadata_once;
  mutable nlohmann::json metadata_json;
};

}  // namespace tenure::detail
