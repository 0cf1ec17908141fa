#pragma once
/// \file
/// The ground every other piece of the runtime stands on: the config, the storage port, the
/// control thread's io_context (which owns all mutable runtime state), the database pool, the
/// handler pool, the live metrics, the lifecycle hooks and the shutdown flags, plus idle
/// tracking. Private to the runtime; everything here but the metrics is control-thread only
/// once started.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "sdk/runtime/attempt_entry.hpp"
#include "sdk/runtime/metrics.hpp"
#include "tenure/clock.hpp"
#include "tenure/storage_port.hpp"
#include "tenure/runtime.hpp"

namespace tenure::detail {

namespace asio = boost::asio;
using entry_ptr = std::shared_ptr<attempt_entry>;

/// Whether the database answered a call (a refusal is an answer too): anything but a failure to
/// reach it, an unknown commit outcome, or a store shutting down.
template <class T>
bool database_answered(const result<T>& r) noexcept {
  return r || (r.error() != errc::database_unavailable && r.error() != errc::commit_in_doubt &&
               r.error() != errc::shutting_down);
}

/// Exponential backoff for retrying database work: 50 ms doubling to 5 s.
inline std::chrono::milliseconds next_backoff(std::chrono::milliseconds current) {
  if (current.count() == 0) return std::chrono::milliseconds{50};
  return std::min(std::chrono::milliseconds{5'000}, current * 2);
}

class control {
 public:
  control(runtime_config c, std::shared_ptr<storage_port> s) : cfg(std::move(c)), store(std::move(s)), db(4) {
    // The process-wide real clock, not owned.
    if (!cfg.clock) cfg.clock = std::shared_ptr<const clock_port>(std::shared_ptr<void>{}, &system_clock::instance());
  }

  runtime_config cfg;
  std::shared_ptr<storage_port> store;
  /// The time every decision is taken on (cfg.clock's monotonic reading).
  steady_time_point now() const noexcept { return cfg.clock->steady_now(); }
  std::vector<runtime::event_hook> hooks;
  live_metrics m;
  /// When the database last answered one of the engine's calls (steady_now ticks); any thread.
  std::atomic<steady_time_point::rep> last_db_answer{0};
  void note_db_answer() noexcept { last_db_answer.store(now().time_since_epoch().count(), std::memory_order_relaxed); }
  steady_time_point db_answered_at() const noexcept {
    return steady_time_point{steady_time_point::duration{last_db_answer.load(std::memory_order_relaxed)}};
  }

  asio::io_context ctl;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> ctl_guard;
  std::thread ctl_thread;
  asio::thread_pool db;
  std::unique_ptr<asio::thread_pool> workers;

  // ---- control-thread state ----
  int running_handlers = 0;
  int outstanding_ops = 0;  ///< fail/snooze/cancel/reconcile calls not answered yet
  bool stopping = false;    ///< no new claims
  /// Past the shutdown timeout: late outcomes are left for rescue. Set on the control thread;
  /// also read by the database thread that answers a claim (it then launches no handler).
  std::atomic<bool> abandoning{false};
  /// Whether a claim's answer may still hand handlers to the pool. A claim's database thread
  /// decides under launch_mu; stop() closes it (under the same lock) before joining the pool,
  /// after which a claim's answer gives its attempts back instead.
  std::mutex launch_mu;
  bool launch_closed = false;
  /// Whether nothing is held or pending (set by the runtime, which sees every piece).
  std::function<bool()> idle_now;
  std::vector<std::function<void()>> idle_waiters;
  /// Callers waiting for a condition on this state (stop()): `then` runs once `ready` holds.
  struct waiter {
    std::function<bool()> ready;
    std::function<void()> then;
  };
  std::vector<waiter> waiters;

  std::chrono::milliseconds staleness() const { return cfg.staleness.value_or(cfg.heartbeat_interval * 3); }
  std::chrono::milliseconds reconcile_budget() const { return cfg.reconcile_budget.value_or(staleness()); }

  template <class Fn>
  void on_ctl(Fn&& fn) {
    asio::post(ctl, std::forward<Fn>(fn));
  }

  /// Runs `call` on the database pool and `done(result)` back on the control thread.
  template <class Call, class Done>
  void on_db(Call&& call, Done&& done) {
    asio::post(db, [this, call = std::forward<Call>(call), done = std::forward<Done>(done)]() mutable {
      auto r = call();
      if (database_answered(r)) note_db_answer();
      asio::post(ctl, [this, r = std::move(r), done = std::move(done)]() mutable {
        done(std::move(r));
        check_waiters();
      });
    });
  }

  /// Runs `fn` on the control thread after `d`, counted as outstanding work.
  void retry_later(std::chrono::milliseconds d, std::function<void()> fn);

  /// Calls `fn(true)` once the runtime's clock reaches `due`, or `fn(false)` when `t` is
  /// cancelled first. The timer sleeps in real time (in steps of at most 100 ms) and the clock
  /// decides, so a manual clock in tests makes a backoff due when it is advanced.
  void at(asio::steady_timer& t, steady_time_point due, std::function<void(bool)> fn);

  /// Calls the lifecycle hooks (control thread), logging any that throws.
  void emit(lifecycle_event e, const claimed_attempt& c, std::string message = {});

  /// Wakes the wait_idle() callers once nothing is held or pending.
  void check_idle();

  /// Runs `then` as soon as `ready()` holds: now, or after the database answer or handler exit
  /// that makes it hold (control thread).
  void when(std::function<bool()> ready, std::function<void()> then);
  /// Runs the waiters whose condition holds now; called after every database answer and
  /// handler exit, the only events that settle anything.
  void check_waiters();

  /// Runs `fn` on the control thread and waits for it to call its completion, or until
  /// `timeout` has passed by the runtime's clock.
  bool run_and_wait_until_due(std::function<void(std::function<void()>)> fn, std::chrono::milliseconds timeout);

  /// Runs `fn` on the control thread and waits for it to call its completion, or `timeout`.
  bool run_and_wait(std::function<void(std::function<void()>)> fn, std::chrono::milliseconds timeout);
};

}  // namespace tenure::detail
