#pragma once
/// \file
/// The dispatcher: per queue, takes free capacity permits and claims up to that many jobs in
/// one statement, polls (eagerly at first, then less and less often) or wakes on a hint, and
/// hands each claimed attempt to execution. Stands on control, in_flight and execution; a
/// permit freed below reaches it through in_flight_table::permit_freed. Private to the
/// runtime; control thread only, but for hand_over(), which runs where a claim was answered.
#include <string>

#include "sdk/runtime/execution.hpp"

namespace tenure::detail {

class dispatcher {
 public:
  dispatcher(control& core, in_flight_table& table, execution& exec);

  /// Claims on `q` now, if it has free permits and no claim is in flight.
  void pump(queue_state& q);
  /// A wake-up for `queue` (a NOTIFY, a rescue, a reconnect): a hint, coalesced.
  void on_wake(const std::string& queue);
  /// A claim statement is in flight on some queue: its answer may still start handlers.
  bool claiming() const;

 private:
  void schedule_pump(queue_state& q);
  void arm_queue_timer(queue_state& q, std::chrono::milliseconds d);
  void hand_over(queue_state& q, int asked, result<std::vector<claimed_attempt>> r);
  void on_claimed(queue_state& q, int asked, result<std::vector<entry_ptr>> r, bool launched);
  void give_back(claimed_attempt c);
  void claim_for_wake(queue_state& q);

  control& core;
  in_flight_table& table;
  execution& exec;
  const runtime_config& cfg;
  live_metrics& m;
};

}  // namespace tenure::detail
