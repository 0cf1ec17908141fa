#pragma once
/// \file
/// The attempts this process holds and the capacity permits they hold: the in-flight table
/// keyed by (job_id, run_lease), each queue's free permits, releasing an entry once the
/// database answered for it, and releasing a permit early when the database cannot answer in
/// time (the capacity sweep). Stands on control only; a freed permit is reported through
/// permit_freed, set by the dispatcher above. Private to the runtime; control thread only, but
/// for make_entry(), which reads only what is fixed once the runtime started.
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdk/runtime/control.hpp"

namespace tenure::detail {

/// One queue: its capacity permits, and the state of its dispatcher (dispatcher.hpp).
struct queue_state {
  queue_state(asio::io_context& io, queue_options o)
      : opt(std::move(o)), free(opt.max_concurrency), timer(io), wake_timer(io) {}
  queue_options opt;
  queue_series* series = nullptr;  ///< this queue's metrics
  int free;               ///< capacity permits not held by an attempt or a claim in progress
  bool claiming = false;  ///< a claim statement is in flight
  bool drained = false;   ///< the last claim found fewer jobs than it asked for
  bool wake_pending = false;  ///< a wake-up is owed one claim (after the one in flight, or k_wake_gap)
  bool wake_timer_armed = false;
  bool pump_posted = false;
  std::chrono::milliseconds idle_step{0};
  std::chrono::milliseconds error_backoff{0};
  std::optional<steady_time_point> last_wake_claim;  ///< when a wake-up last started a claim (k_wake_gap)
  asio::steady_timer timer;
  asio::steady_timer wake_timer;
};

class in_flight_table {
 public:
  explicit in_flight_table(control& core);

  std::vector<std::unique_ptr<queue_state>> queues;
  std::unordered_map<std::string, queue_state*> by_name;
  std::map<attempt_id, entry_ptr> in_flight;
  /// A permit went back to `q` (set by the dispatcher: claim again).
  std::function<void(queue_state&)> permit_freed;

  /// The entry of a claimed attempt, not yet in the table. Any thread (reads only what is fixed
  /// once the runtime started).
  entry_ptr make_entry(claimed_attempt c) const;
  /// Adds the entry, holding one permit of its queue (counted as claimed).
  void admit(const entry_ptr& entry);
  /// The database answered for the attempt: drops its entry and its permit.
  void release(const entry_ptr& entry);
  void release_permit(const entry_ptr& entry);
  /// Releases the permit of a finished attempt the database has not answered for in time.
  void check_capacity(const entry_ptr& entry);
  /// Looks at every finished attempt still held, on a timer (see check_capacity).
  void arm_capacity_sweep();
  void cancel_timers() { capacity_timer.cancel(); }

 private:
  control& core;
  live_metrics& m;
  asio::steady_timer capacity_timer;
};

}  // namespace tenure::detail
