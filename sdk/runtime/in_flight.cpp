#include "sdk/runtime/in_flight.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

in_flight_table::in_flight_table(control& c) : core(c), m(c.m), capacity_timer(c.ctl) {
  for (const auto& q : core.cfg.queues) {
    queues.push_back(std::make_unique<queue_state>(core.ctl, q));
    queues.back()->series = &m.queues.get(q.name);
    by_name[q.name] = queues.back().get();
  }
}

entry_ptr in_flight_table::make_entry(claimed_attempt c) const {
  auto entry = std::make_shared<attempt_entry>(std::move(c));
  entry->store = core.store;
  entry->clock = core.cfg.clock;
  entry->last_live = core.now();  // the claim just confirmed it live
  const auto q = by_name.find(entry->claim.queue);
  entry->series = q != by_name.end() ? q->second->series : &m.queues.get(entry->claim.queue);
  return entry;
}

void in_flight_table::admit(const entry_ptr& entry) {
  if (auto old = in_flight.find(entry->claim.attempt); old != in_flight.end()) {
    // The continuation of an attempt this process parked, claimed before the park's answer was
    // handled here: the parked call is over (the database moved it on), so it goes first.
    release(old->second);
  }
  in_flight.emplace(entry->claim.attempt, entry);
  entry->series->claimed.fetch_add(1, std::memory_order_relaxed);
  entry->series->in_flight.fetch_add(1, std::memory_order_relaxed);
  entry->series->permits_held.fetch_add(1, std::memory_order_relaxed);
}

/// An attempt whose handler returned holds its permit until the database answered for it. Past
/// the reconcile budget (counted from the handler's exit), or past the attempt's rescue
/// deadline (after which another worker may rightly run the job), the permit is released so
/// other jobs can run; the entry stays (heartbeated, still reconciling or flushing). Nothing
/// is written without evidence. Called on every failed answer and by the capacity sweep, so a
/// read that hangs does not keep the permit either.
void in_flight_table::check_capacity(const entry_ptr& entry) {
  if (!entry->permit_held || !entry->handler_done || !entry->done_at) return;
  const auto now = core.now();
  const auto budget = core.reconcile_budget();
  const auto staleness = core.staleness();
  if (now - *entry->done_at < budget && now - entry->last_live < staleness) return;
  const auto& c = entry->claim;
  const auto ms = [](steady_time_point::duration d) { return std::chrono::duration_cast<milliseconds>(d).count(); };
  // Two reasons, worded apart: the database took longer than the reconcile budget to answer
  // for the outcome, or the attempt was last confirmed live longer ago than the staleness
  // (its rescue deadline), however recently its handler returned (a process that was paused).
  const std::string why =
      now - *entry->done_at >= budget
          ? fmt::format("the database has not answered for its outcome in the {} ms since its handler returned "
                        "(reconcile budget {} ms)",
                        ms(now - *entry->done_at), ms(budget))
          : fmt::format("the database last confirmed it live {} ms ago, past its staleness of {} ms (another "
                        "worker may rescue it now); its handler returned {} ms ago",
                        ms(now - entry->last_live), ms(staleness), ms(now - *entry->done_at));
  tenure::logger()->warn("tenure: job {} lease {} queue {}: {}; releasing its capacity permit, still {} (nothing is "
               "written without evidence)",
               c.attempt.job_id, c.attempt.run_lease, c.queue, why, entry->caller_owned ? "reconciling" : "retrying");
  m.watching.fetch_add(1, std::memory_order_relaxed);
  m.capacity_released.fetch_add(1, std::memory_order_relaxed);
  release_permit(entry);
}

void in_flight_table::arm_capacity_sweep() {
  const auto every = std::clamp(core.reconcile_budget() / 4, milliseconds{10}, milliseconds{1'000});
  capacity_timer.expires_after(every);
  capacity_timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    std::vector<entry_ptr> done;
    for (const auto& [id, e] : in_flight) {
      if (e->handler_done && e->permit_held) done.push_back(e);
    }
    for (const auto& e : done) check_capacity(e);
    arm_capacity_sweep();
  });
}

void in_flight_table::release_permit(const entry_ptr& entry) {
  if (!entry->permit_held) return;
  entry->permit_held = false;
  entry->series->permits_held.fetch_sub(1, std::memory_order_relaxed);
  if (auto it = by_name.find(entry->claim.queue); it != by_name.end()) {
    auto& q = *it->second;
    ++q.free;
    if (permit_freed) permit_freed(q);
  }
}

void in_flight_table::release(const entry_ptr& entry) {
  const auto& c = entry->claim;
  // Only this entry: a continuation of the same attempt may hold the key now (admit()).
  const auto it = in_flight.find(c.attempt);
  if (it == in_flight.end() || it->second != entry) return;
  in_flight.erase(it);
  entry->series->in_flight.fetch_sub(1, std::memory_order_relaxed);
  if (entry->permit_held) {
    release_permit(entry);
  } else {
    m.watching.fetch_sub(1, std::memory_order_relaxed);  // its permit went earlier (check_capacity)
  }
  core.check_idle();
}

}  // namespace tenure::detail
