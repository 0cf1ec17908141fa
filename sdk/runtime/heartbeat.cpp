#include "sdk/runtime/heartbeat.hpp"

#include <set>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

void heartbeat::arm() {
  timer.expires_after(core.cfg.heartbeat_interval);
  timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    beat([] {});
    arm();
  });
}

void heartbeat::beat(std::function<void()> done) {
  if (running || table.in_flight.empty()) {
    done();
    return;
  }
  running = true;
  std::vector<attempt_id> attempts;
  std::vector<std::optional<std::string>> progress;
  std::vector<entry_ptr> entries;
  bool any_progress = false;
  for (const auto& [id, e] : table.in_flight) {
    attempts.push_back(id);
    progress.push_back(e->take_progress());
    any_progress = any_progress || progress.back().has_value();
    entries.push_back(e);
  }
  if (!any_progress) progress.clear();
  m.heartbeats.fetch_add(1, std::memory_order_relaxed);
  core.on_db([this, attempts, progress] { return core.store->heartbeat(attempts, progress); },
             [this, entries = std::move(entries), progress, done = std::move(done)](result<std::vector<attempt_id>> r) {
               running = false;
               if (!r) {
                 m.database_errors.fetch_add(1, std::memory_order_relaxed);
                 tenure::logger()->warn("tenure: heartbeat of {} attempts failed: {}", entries.size(), r.error().message());
                 if (r.error() == errc::invalid_argument && !progress.empty()) {
                   // Refused for good: the progress it carried would be refused again with every
                   // later heartbeat, so it is dropped; the next heartbeat goes without it.
                   tenure::logger()->error("tenure: the database refused the progress carried by a heartbeat as invalid; "
                                 "dropping it so heartbeats go on");
                   done();
                   return;
                 }
                 for (std::size_t i = 0; i < progress.size(); ++i) {
                   if (progress[i]) entries[i]->restore_progress(*progress[i]);
                 }
                 done();
                 return;
               }
               std::set<attempt_id> live(r.value().begin(), r.value().end());
               const auto now = core.now();
               for (const auto& e : entries) {
                 if (live.contains(e->claim.attempt)) e->last_live = now;
                 // An attempt whose handler already returned is settled by its own flush or write
                 // (which may just have closed it, racing this heartbeat): nothing to cancel.
                 if (e->handler_done || !table.in_flight.contains(e->claim.attempt)) continue;
                 if (!live.contains(e->claim.attempt) && !e->is_cancelled()) {
                   const auto& c = e->claim;
                   tenure::logger()->warn("tenure: job {} lease {} queue {} is no longer live (rescued or cancelled); "
                                "cancelling its handler",
                                c.attempt.job_id, c.attempt.run_lease, c.queue);
                   e->cancel();
                 }
               }
               done();
             });
}

}  // namespace tenure::detail
