#include "sdk/runtime/signals.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

namespace {

/// Cancel hints are checked against the database at most once per k_cancel_check_gap, so a
/// flood of them costs O(1) statements per interval.
constexpr milliseconds k_cancel_check_gap{50};

}  // namespace

void signals::start() {
  if (port) thread = std::thread([this] { loop(); });
}

void signals::stop() {
  {
    std::lock_guard lock(stop_mu);
    stop_flag = true;
  }
  stop_cv.notify_all();
  if (thread.joinable()) thread.join();
}

/// A cancel notification named `a`. Any role can send one, so it only asks for a check: the
/// handler is cancelled once the database says the attempt is no longer live.
void signals::on_cancel_hint(const attempt_id& a) {
  auto it = table.in_flight.find(a);
  if (it == table.in_flight.end() || it->second->handler_done || it->second->is_cancelled()) return;
  cancel_hints.insert(a);
  check_cancel_hints();
}

/// Reads the evidence of every hinted attempt in one statement, at most once per
/// k_cancel_check_gap (longer after a failed read); hints that arrive meanwhile wait for the next.
void signals::check_cancel_hints() {
  if (cancel_check_running || cancel_check_armed || cancel_hints.empty()) return;
  const auto gap = std::max(k_cancel_check_gap, cancel_check_backoff);
  const auto since = core.now() - last_cancel_check;
  if (since < gap) {
    cancel_check_armed = true;
    core.at(cancel_check_timer, last_cancel_check + gap, [this](bool due) {
      cancel_check_armed = false;
      if (due) check_cancel_hints();
    });
    return;
  }
  std::vector<attempt_id> ids;
  std::vector<entry_ptr> entries;
  for (const auto& a : cancel_hints) {
    auto it = table.in_flight.find(a);
    if (it == table.in_flight.end() || it->second->handler_done || it->second->is_cancelled()) continue;
    ids.push_back(a);
    entries.push_back(it->second);
  }
  cancel_hints.clear();
  if (ids.empty()) return;
  cancel_check_running = true;
  m.cancel_checks.fetch_add(1, std::memory_order_relaxed);
  core.on_db([this, ids] { return core.store->reconcile(std::span<const attempt_id>{ids}); },
             [this, entries = std::move(entries)](result<std::vector<attempt_evidence>> r) {
               cancel_check_running = false;
               last_cancel_check = core.now();
               if (!r || r.value().size() != entries.size()) {
                 m.database_errors.fetch_add(1, std::memory_order_relaxed);
                 cancel_check_backoff = next_backoff(cancel_check_backoff);
                 tenure::logger()->warn("tenure: checking {} cancel notification(s) against the database failed ({}); retrying "
                              "in {} ms (the heartbeat also finds attempts no longer live)",
                              entries.size(), r ? std::string{"answer of the wrong size"} : r.error().message(),
                              std::max(k_cancel_check_gap, cancel_check_backoff).count());
                 for (const auto& e : entries) cancel_hints.insert(e->claim.attempt);
                 check_cancel_hints();
                 return;
               }
               cancel_check_backoff = milliseconds{0};
               for (std::size_t i = 0; i < entries.size(); ++i) {
                 const auto& e = entries[i];
                 const auto& c = e->claim;
                 if (r.value()[i] == attempt_evidence::open) {
                   tenure::logger()->debug("tenure: cancel notification for job {} lease {} queue {} ignored: the attempt is "
                                 "still live", c.attempt.job_id, c.attempt.run_lease, c.queue);
                   continue;
                 }
                 if (e->handler_done || e->is_cancelled() || !table.in_flight.contains(c.attempt)) continue;
                 tenure::logger()->info("tenure: job {} lease {} queue {} was cancelled or rescued; cancelling its handler",
                              c.attempt.job_id, c.attempt.run_lease, c.queue);
                 e->cancel();
               }
               check_cancel_hints();  // hints that arrived while this read was in flight
             });
}

bool signals::pause(milliseconds d) {
  // The wait sleeps in real time, in short steps; whether the pause is over is the runtime
  // clock's call (a manual clock in tests ends it when advanced).
  constexpr milliseconds k_step{50};
  const auto until = core.now() + d;
  std::unique_lock lock(stop_mu);
  for (auto now = core.now(); !stop_flag.load() && now < until; now = core.now()) {
    const auto left = std::chrono::duration_cast<milliseconds>(until - now) + milliseconds{1};
    stop_cv.wait_for(lock, std::min(left, k_step));
  }
  return !stop_flag.load();
}

void signals::loop() {
  milliseconds backoff{0};
  auto next_lead_try = core.now();
  while (!stop_flag.load()) {
    if (!port->connected()) {
      // The lease is not tied to this session: it stays usable until it expires by our clock.
      auto c = port->connect();
      if (!c) {
        backoff = next_backoff(backoff);
        tenure::logger()->warn("tenure: LISTEN connection failed ({}); polling meanwhile, retrying in {} ms",
                     c.error().message(), backoff.count());
        pause(backoff);
        continue;
      }
      if (backoff.count() > 0) tenure::logger()->info("tenure: LISTEN connection restored");
      backoff = milliseconds{0};
      // Notifications sent while we were away are lost: look at every queue once.
      core.on_ctl([this] {
        for (auto& q : table.queues) dispatch.on_wake(q->opt.name);
      });
    }
    if (cfg.maintenance && core.now() >= next_lead_try) {
      // Renewed every maintenance_interval, well within the ttl (at least 2 x that interval).
      const auto asked = core.now();
      auto l = port->try_lead(lead.holder, lead.lease_ttl());
      if (l && l.value()) {
        lead.hold(*l.value(), asked);
      } else if (l) {
        lead.drop(0, "another worker holds the lease");
      }
      // (A failed renewal keeps the lease until it expires by our clock: the pool may still work.)
      next_lead_try = asked + cfg.maintenance_interval;
    }
    const auto until_lead = std::chrono::duration_cast<milliseconds>(next_lead_try - core.now());
    auto r = port->wait(cfg.maintenance ? std::clamp(until_lead, milliseconds{1}, milliseconds{100})
                                           : milliseconds{100});
    if (!r) continue;
    if (r.value().empty()) continue;
    // Every notification is a hint (any role that can connect may send one): one batch of
    // them, duplicates merged, goes to the control thread as one task.
    std::set<std::string> wakes;
    std::set<attempt_id> cancels, resumes;
    for (auto& s : r.value()) {
      switch (s.what) {
        case signal::kind::wake: wakes.insert(std::move(s.queue)); break;
        case signal::kind::cancel: cancels.insert(s.attempt); break;
        case signal::kind::resume: resumes.insert(s.attempt); break;
      }
    }
    core.on_ctl([this, wakes = std::move(wakes), cancels = std::move(cancels), resumes = std::move(resumes)] {
      for (const auto& q : wakes) dispatch.on_wake(q);
      for (const auto& a : cancels) on_cancel_hint(a);
      for (const auto& a : resumes) {
        // A waiting handler polls its callback now (context.cpp bounds how often).
        auto it = table.in_flight.find(a);
        if (it != table.in_flight.end() && !it->second->handler_done) it->second->poke();
      }
    });
  }
  // A stopping leader ends its lease, so that the next worker need not wait for it to expire.
  const std::int64_t held = lead.give_up();
  if (held != 0 && port->connected()) port->resign(lead.holder, held);
}

}  // namespace tenure::detail
