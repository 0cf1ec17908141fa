#pragma once
/// \file
/// The signal thread and the hints it brings: it waits on the signal port (LISTEN/NOTIFY),
/// renews the maintenance lease, and posts each batch of hints to the control thread. Hints
/// are never trusted: a wake-up only makes a claim sooner (dispatcher), a cancel hint is checked
/// against the database before a handler is cancelled, a resume hint only makes a waiting
/// handler poll sooner. Stands on control, in_flight, leadership and the dispatcher. Private
/// to the runtime; start()/stop() from the runtime's lifecycle, the rest on the control thread.
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "sdk/runtime/dispatcher.hpp"
#include "sdk/runtime/leadership.hpp"
#include "tenure/signal_port.hpp"

namespace tenure::detail {

class signals {
 public:
  signals(control& core, in_flight_table& table, leadership& lead, dispatcher& dispatch,
          std::shared_ptr<signal_port> port)
      : port(std::move(port)),
        core(core),
        table(table),
        lead(lead),
        dispatch(dispatch),
        cfg(core.cfg),
        m(core.m),
        cancel_check_timer(core.ctl) {}

  const std::shared_ptr<signal_port> port;  ///< may be null: no signal thread then

  /// Starts the signal thread (with a port).
  void start();
  /// Stops and joins the signal thread; a leader resigns its lease.
  void stop();
  void cancel_timers() { cancel_check_timer.cancel(); }

 private:
  void loop();
  void on_cancel_hint(const attempt_id& a);
  void check_cancel_hints();

  control& core;
  in_flight_table& table;
  leadership& lead;
  dispatcher& dispatch;
  const runtime_config& cfg;
  live_metrics& m;

  /// Waits out `d` by the runtime's clock, or until stop(); false once stopping.
  bool pause(std::chrono::milliseconds d);

  std::thread thread;
  std::atomic<bool> stop_flag{false};
  std::mutex stop_mu;
  std::condition_variable stop_cv;  ///< woken by stop()

  /// Attempts in flight here that a cancel notification named, waiting for their liveness check.
  std::set<attempt_id> cancel_hints;
  asio::steady_timer cancel_check_timer;
  bool cancel_check_running = false;
  bool cancel_check_armed = false;
  steady_time_point last_cancel_check{};
  std::chrono::milliseconds cancel_check_backoff{0};
};

}  // namespace tenure::detail
