#include "sdk/runtime/maintenance.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

void maintenance::arm() {
  timer.expires_after(core.cfg.maintenance_interval);
  timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    pass([] {});
    arm();
  });
}

void maintenance::pass(std::function<void()> done) {
  if (running || !core.cfg.maintenance) {
    done();
    return;
  }
  std::optional<leader_lease> lease;
  if (leased) {
    const auto term = lead.term_for_pass();
    if (!term) {
      if (depths_shown) {
        m.queues.forget_depths();  // another process counts them now
        depths_shown = false;
      }
      done();
      return;
    }
    lease = leader_lease{lead.holder, *term};
  }
  running = true;
  const auto stale_after = std::chrono::duration_cast<std::chrono::microseconds>(core.staleness());
  // The leader knows its own running attempts are alive: it refreshes them right before the
  // rescue, so a slow heartbeat (a busy pool, a slow connect) never makes it rescue itself.
  std::vector<attempt_id> own;
  for (const auto& [id, e] : table.in_flight) {
    if (!e->handler_done) own.push_back(id);
  }
  core.on_db(
      [this, stale_after, own = std::move(own), lease]() -> result<std::vector<rescued_attempt>> {
        if (!own.empty()) {
          auto refreshed = core.store->heartbeat(own);
          if (!refreshed) return refreshed.error();
        }
        // With leadership, the pass is fenced: the database runs it only for the current term.
        if (lease) return core.store->maintain(*lease, stale_after);
        auto promoted = core.store->promote_due();
        if (!promoted) return promoted.error();
        return core.store->rescue_stale(stale_after);
      },
      [this, done = std::move(done), lease](result<std::vector<rescued_attempt>> r) {
        running = false;
        if (!r && r.error() == errc::leadership_lost) {
          m.leadership_lost.fetch_add(1, std::memory_order_relaxed);
          lead.drop(lease ? lease->term : 0,
                     "the database refused its maintenance pass: the lease expired or another worker took it "
                     "over; nothing was changed");
          done();
          return;
        }
        if (!r) {
          m.database_errors.fetch_add(1, std::memory_order_relaxed);
          tenure::logger()->warn("tenure: maintenance failed: {}", r.error().message());
          done();
          return;
        }
        for (const auto& res : r.value()) {
          m.queues.get(res.queue).rescued.fetch_add(1, std::memory_order_relaxed);
          tenure::logger()->warn("tenure: rescued job {} lease {} queue {} (no heartbeat for {} ms or past its deadline) "
                       "-> {}",
                       res.attempt.job_id, res.attempt.run_lease, res.queue, core.staleness().count(),
                       tenure::to_string(res.new_state));
          claimed_attempt c;
          c.attempt = res.attempt;
          c.queue = res.queue;
          if (auto it = table.in_flight.find(res.attempt); it != table.in_flight.end()) {
            c = it->second->claim;
            it->second->cancel();  // its late outcome will be stale
          }
          core.emit(lifecycle_event::rescued, c, std::string{tenure::to_string(res.new_state)});
          if (res.new_state == job_state::available) dispatch.on_wake(res.queue);
        }
        // The dead rows first: after a large drain a count over them would read every one.
        reclaim([this, done = std::move(done)]() mutable { read_depths(std::move(done)); });
      });
}

/// The leader counts every queue's unfinished jobs once per pass (one set-based statement) for
/// the depth gauges. A store that cannot count is not asked again.
void maintenance::read_depths(std::function<void()> done) {
  const auto now = core.now();
  if (!count_depths || now < next_count) {
    done();
    return;
  }
  running = true;
  core.on_db([this] { return core.store->queue_depths(); },
             [this, done = std::move(done), now](result<std::vector<queue_depth>> r) {
               running = false;
               // The count reads every unfinished job: with a large backlog it is the leader's
               // biggest statement. It may take at most 1/k_count_duty of the time, so the next
               // waits k_count_duty times as long as this one took (never less than a pass).
               next_count = now + (core.now() - now) * k_count_duty;
               if (!r) {
                 if (r.error() == errc::unsupported) {
                   count_depths = false;
                 } else {
                   m.database_errors.fetch_add(1, std::memory_order_relaxed);
                   tenure::logger()->warn("tenure: counting queue depths failed: {}", r.error().message());
                 }
                 done();
                 return;
               }
               std::vector<queue_series*> seen;
               seen.reserve(r.value().size());
               for (const auto& d : r.value()) {
                 auto& q = m.queues.get(d.queue);
                 q.available.store(d.available, std::memory_order_relaxed);
                 q.scheduled.store(d.scheduled, std::memory_order_relaxed);
                 q.retryable.store(d.retryable, std::memory_order_relaxed);
                 q.running.store(d.running, std::memory_order_relaxed);
                 q.waiting_external.store(d.waiting_external, std::memory_order_relaxed);
                 q.oldest_available_us.store(d.oldest_available.count(), std::memory_order_relaxed);
                 q.depth_known.store(true, std::memory_order_release);
                 seen.push_back(&q);
               }
               m.queues.zero_depths_except(seen);
               depths_shown = true;
               done();
             });
}

/// The leader reclaims the claim path's dead rows once a table holds reclaim_dead_rows of them:
/// after a large drain, claims would otherwise step over every claimed job's dead index entry
/// until autovacuum comes by.
void maintenance::reclaim(std::function<void()> done) {
  if (!may_reclaim || core.cfg.reclaim_dead_rows <= 0) {
    done();
    return;
  }
  running = true;
  core.on_db([this] { return core.store->reclaim_dead_rows(core.cfg.reclaim_dead_rows); },
             [this, done = std::move(done)](result<reclaim_result> r) {
               running = false;
               if (!r) {
                 if (r.error() == errc::unsupported) {
                   may_reclaim = false;
                 } else {
                   m.database_errors.fetch_add(1, std::memory_order_relaxed);
                   tenure::logger()->warn("tenure: reclaiming dead rows failed: {}", r.error().message());
                 }
               } else if (r.value().reclaimed > 0) {
                 m.reclaims.fetch_add(static_cast<std::uint64_t>(r.value().reclaimed), std::memory_order_relaxed);
                 tenure::logger()->debug("tenure: reclaimed the dead rows of {} claim-path table(s)", r.value().reclaimed);
               }
               if (r && r.value().due > r.value().reclaimed && !said_refused) {
                 said_refused = true;
                 tenure::logger()->info(
                     "tenure: {} claim-path table(s) hold at least {} dead rows, which this role may not VACUUM "
                     "(not their owner): autovacuum must keep up (see README, Flat cost as tables grow)",
                     r.value().due - r.value().reclaimed, core.cfg.reclaim_dead_rows);
               }
               done();
             });
}

}  // namespace tenure::detail
