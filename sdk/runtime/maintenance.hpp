#pragma once
/// \file
/// Maintenance: promote due deferred jobs and rescue stale attempts, every
/// maintenance_interval, only while this process leads (leadership.hpp); a pass is fenced by
/// the lease's term. After each pass the leader reclaims the claim path's dead rows once enough
/// wait, then counts the queues' depths for the gauges. Rescued jobs back in their queue wake
/// the dispatcher. Stands on control,
/// in_flight, leadership and the dispatcher. Private to the runtime; control thread only.
#include <chrono>
#include <functional>

#include "sdk/runtime/dispatcher.hpp"
#include "sdk/runtime/leadership.hpp"

namespace tenure::detail {

class maintenance {
 public:
  maintenance(control& core, in_flight_table& table, leadership& lead, dispatcher& dispatch, bool leased)
      : core(core), table(table), lead(lead), dispatch(dispatch), leased(leased), m(core.m), timer(core.ctl) {}

  void arm();
  /// One pass now (when this process leads and none is running); then `done`.
  void pass(std::function<void()> done);
  void cancel_timers() { timer.cancel(); }

 private:
  void read_depths(std::function<void()> done);
  void reclaim(std::function<void()> done);

  control& core;
  in_flight_table& table;
  leadership& lead;
  dispatcher& dispatch;
  const bool leased;  ///< a signal port runs the leadership lease
  live_metrics& m;
  asio::steady_timer timer;
  bool running = false;
  bool count_depths = true;   ///< the store counts queue depths (false once it said unsupported)
  /// A depth count that took d waits k_count_duty x d before the next one (see read_depths):
  /// counting takes at most 1% of a connection.
  static constexpr int k_count_duty = 100;
  steady_time_point next_count{};  ///< by the runtime's clock
  bool depths_shown = false;  ///< the depth gauges hold this process's last count
  bool may_reclaim = true;    ///< the store reclaims dead rows (false once it said unsupported)
  bool said_refused = false;  ///< the log has said once that the role may not reclaim
};

}  // namespace tenure::detail
