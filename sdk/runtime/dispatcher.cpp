#include "sdk/runtime/dispatcher.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

namespace {

constexpr milliseconds k_first_idle_step{2};
constexpr milliseconds k_sleep_after_step{4};
/// Notifications are hints that any role able to connect can send: a wake-up starts a claim
/// no sooner than this after the queue's last claim answered, so a flood costs O(1) claims
/// per interval.
constexpr milliseconds k_wake_gap{20};

}  // namespace

dispatcher::dispatcher(control& c, in_flight_table& t, execution& e)
    : core(c), table(t), exec(e), cfg(c.cfg), m(c.m) {
  table.permit_freed = [this](queue_state& q) {
    if (!q.drained) schedule_pump(q);
  };
}

void dispatcher::schedule_pump(queue_state& q) {
  if (q.pump_posted) return;
  q.pump_posted = true;
  core.on_ctl([this, &q] {
    q.pump_posted = false;
    pump(q);
  });
}

void dispatcher::pump(queue_state& q) {
  if (core.stopping || q.claiming || q.free <= 0) return;
  const int n = std::min(q.free, cfg.claim_batch);
  q.free -= n;  // permits first, then one claim statement for up to that many jobs
  q.claiming = true;
  q.wake_pending = false;
  q.timer.cancel();
  q.series->claims.fetch_add(1, std::memory_order_relaxed);
  // Join the waiters (so producers NOTIFY) only once eager polling has found nothing for a
  // few milliseconds: while jobs keep coming, producers pay for no NOTIFY at all.
  const bool going_to_sleep = q.idle_step >= k_sleep_after_step;
  asio::post(core.db, [this, &q, n, going_to_sleep] {
    auto r = core.store->claim(q.opt.name, n, cfg.worker_id, going_to_sleep);
    if (database_answered(r)) core.note_db_answer();
    hand_over(q, n, std::move(r));
  });
}

/// On the database thread that answered the claim: the claimed attempts' handlers go to the pool
/// from here, right after the control thread's continuation (on_claimed) was posted, so the claim's
/// answer reaches a handler without waiting for the control thread (execution.hpp).
void dispatcher::hand_over(queue_state& q, int asked, result<std::vector<claimed_attempt>> r) {
  if (!r) {
    core.on_ctl([this, &q, asked, e = r.error()] {
      on_claimed(q, asked, e, false);
      core.check_waiters();
      core.check_idle();
    });
    return;
  }
  std::vector<entry_ptr> entries;
  std::vector<entry_ptr> to_run;
  entries.reserve(r.value().size());
  // Held until the handlers are posted: stop() closes the pool's door (and sets abandoning) under
  // it, so it never joins the pool between this decision and these posts.
  std::lock_guard lock(core.launch_mu);
  const bool launch = !core.launch_closed && !core.abandoning;
  for (auto& c : r.value()) {
    entries.push_back(exec.prepare(std::move(c)));
    if (launch && exec.has_handler(*entries.back())) to_run.push_back(entries.back());
  }
  core.on_ctl([this, &q, asked, entries = std::move(entries), launch]() mutable {
    on_claimed(q, asked, std::move(entries), launch);
    core.check_waiters();
    core.check_idle();
  });
  for (const auto& e : to_run) exec.run(e);
}

void dispatcher::arm_queue_timer(queue_state& q, milliseconds d) {
  q.timer.expires_after(d);
  q.timer.async_wait([this, &q](const boost::system::error_code& ec) {
    if (!ec) pump(q);
  });
}

void dispatcher::on_claimed(queue_state& q, int asked, result<std::vector<entry_ptr>> r, bool launched) {
  if (!r) {
    q.claiming = false;
    q.free += asked;
    m.database_errors.fetch_add(1, std::memory_order_relaxed);
    q.error_backoff = next_backoff(q.error_backoff);
    tenure::logger()->warn("tenure: claim on queue {} failed ({}); retrying in {} ms", q.opt.name, r.error().message(),
                 q.error_backoff.count());
    if (!core.stopping) {
      core.at(q.timer, core.now() + std::min(q.error_backoff, cfg.poll_interval), [this, &q](bool due) {
        if (due) pump(q);
      });
    }
    return;
  }
  q.error_backoff = milliseconds{0};
  auto& got = r.value();
  if (!launched) {
    // Claimed while stop() was giving up on handlers: nothing will run them here, so they
    // go back at once, without spending an attempt (and without holding permits).
    q.claiming = false;
    q.free += asked;
    for (const auto& e : got) give_back(e->claim);
    return;
  }
  q.free += asked - static_cast<int>(got.size());
  for (const auto& e : got) {
    if (core.abandoning && !exec.has_handler(*e)) {
      // Launched just before stop() gave up on handlers and answered here after: no handler of
      // this kind runs it, so it goes back like the rest of a claim answered after the timeout.
      ++q.free;
      give_back(e->claim);
      continue;
    }
    exec.admit(e);
  }
  // Only now: until every attempt of the answer is admitted, the claim is what keeps wait_idle()
  // and stop() from taking the runtime for idle.
  q.claiming = false;
  if (static_cast<int>(got.size()) == asked) {
    q.drained = false;
    q.idle_step = milliseconds{0};
    pump(q);  // more may be waiting
    return;
  }
  q.drained = true;
  if (core.stopping) return;
  if (q.wake_pending) {
    // A wake-up arrived while this claim was in flight: its job may have committed after the
    // claim's snapshot, so one more claim runs (no sooner than k_wake_gap from now).
    claim_for_wake(q);
    return;
  }
  // Drained. Poll eagerly at first (2 ms, then 4 ms): under steady load the next jobs are
  // found this way and no producer pays for a NOTIFY. After that the claim joins the waiters
  // and the worker sleeps, woken by NOTIFY, polling less and less often (the doubling steps
  // also catch a wake-up that raced the registration) up to poll_interval.
  if (!got.empty() || q.idle_step.count() == 0) {
    q.idle_step = k_first_idle_step;
  } else {
    q.idle_step = std::min(cfg.poll_interval, q.idle_step * 2);
  }
  arm_queue_timer(q, std::min(q.idle_step, cfg.poll_interval));
}

/// Snoozes an attempt that will not run here back to its queue (no attempt spent).
void dispatcher::give_back(claimed_attempt c) {
  ++core.outstanding_ops;
  core.on_db([this, a = c.attempt] { return core.store->snooze(a, std::chrono::microseconds{0}); },
             [this, c = std::move(c)](result<void> r) {
               --core.outstanding_ops;
               if (r) {
                 tenure::logger()->info("tenure: job {} lease {} queue {} was claimed as the runtime stopped; given back",
                              c.attempt.job_id, c.attempt.run_lease, c.queue);
               } else {
                 tenure::logger()->warn("tenure: job {} lease {} queue {} was claimed as the runtime stopped and could not be "
                              "given back ({}); it stays open and is rescued after staleness",
                              c.attempt.job_id, c.attempt.run_lease, c.queue, r.error().message());
               }
               core.check_idle();
             });
}

bool dispatcher::claiming() const {
  return std::any_of(table.queues.begin(), table.queues.end(), [](const auto& q) { return q->claiming; });
}

/// A wake-up for `queue` (a NOTIFY, a rescue, a reconnect). NOTIFY needs no privilege, so a
/// wake-up is only a hint: it never resets the idle polling (a claim that finds jobs does),
/// and wake-ups start at most one claim per queue per k_wake_gap, however many arrive. The gap
/// runs from the last claim a wake-up started, not from the last claim: the first wake-up after
/// a quiet spell claims at once even when an idle poll has just answered.
void dispatcher::on_wake(const std::string& queue) {
  auto it = table.by_name.find(queue);
  if (it == table.by_name.end()) return;
  auto& q = *it->second;
  if (q.claiming) {
    q.wake_pending = true;
    return;
  }
  claim_for_wake(q);
}

void dispatcher::claim_for_wake(queue_state& q) {
  const auto now = core.now();
  if (!q.last_wake_claim || now - *q.last_wake_claim >= k_wake_gap) {
    q.last_wake_claim = now;
    pump(q);
    return;
  }
  q.wake_pending = true;
  if (q.wake_timer_armed) return;
  q.wake_timer_armed = true;
  core.at(q.wake_timer, *q.last_wake_claim + k_wake_gap, [this, &q](bool due) {
    q.wake_timer_armed = false;
    if (due && q.wake_pending && !q.claiming) {
      q.last_wake_claim = core.now();
      pump(q);
    }
  });
}

}  // namespace tenure::detail
