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
          m.rescued.fetch_add(1, std::memory_order_relaxed);
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
        done();
      });
}

}  // namespace tenure::detail
