#pragma once
/// \file
/// The heartbeat: one batched, guarded statement per interval for every attempt in flight here
/// (carrying progress), which also tells which attempts are no longer live (their handlers are
/// cancelled). Stands on control and in_flight. Private to the runtime; control thread only.
#include <functional>

#include "sdk/runtime/in_flight.hpp"

namespace tenure::detail {

class heartbeat {
 public:
  heartbeat(control& core, in_flight_table& table) : core(core), table(table), m(core.m), timer(core.ctl) {}

  void arm();
  /// One heartbeat now (unless one is running or nothing is in flight); then `done`.
  void beat(std::function<void()> done);
  void cancel_timers() { timer.cancel(); }

 private:
  control& core;
  in_flight_table& table;
  live_metrics& m;
  asio::steady_timer timer;
  bool running = false;
};

}  // namespace tenure::detail
