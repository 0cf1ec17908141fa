#include "sdk/runtime/settlement.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "sdk/runtime/storable.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

namespace {

const char* to_text(job_outcome::kind k) {
  switch (k) {
    case job_outcome::kind::completed: return "completed";
    case job_outcome::kind::retry: return "retry";
    case job_outcome::kind::snooze: return "snooze";
    case job_outcome::kind::fail: return "fail";
    case job_outcome::kind::cancel: return "cancel";
    case job_outcome::kind::park: return "park";
  }
  return "unknown";
}

}  // namespace

settlement::settlement(control& c, in_flight_table& t)
    : core(c),
      table(t),
      cfg(c.cfg),
      m(c.m),
      completions(c.ctl, [this](std::vector<pending_completion> b) { flush(std::move(b)); }),
      evidence(c.ctl, [this](std::vector<pending_reconcile> b) { read_evidence(std::move(b)); }) {
  completions.configure(static_cast<std::size_t>(cfg.completion_batch), cfg.flush_delay);
  evidence.configure(static_cast<std::size_t>(cfg.completion_batch), cfg.flush_delay);
}

/// `progress`: a completed outcome's final progress, already storable JSON text.
void settlement::on_outcome(const entry_ptr& entry, job_outcome outcome, std::optional<std::string> progress) {
  --core.running_handlers;
  entry->handler_done = true;
  entry->done_at = core.now();
  const auto& a = entry->claim;
  if (core.abandoning) {
    tenure::logger()->warn("tenure: job {} lease {} queue {} finished after the shutdown timeout; its attempt stays "
                 "open for rescue",
                 a.attempt.job_id, a.attempt.run_lease, a.queue);
    table.release(entry);
    return;
  }
  if (outcome.what() == job_outcome::kind::completed) {
    push_completion({entry, std::move(progress)});
    return;
  }
  if (outcome.what() == job_outcome::kind::park && (outcome.callback_id().empty() || entry->was_delivered(outcome.callback_id()))) {
    // Parked on no callback, or on one whose resume the handler already received: nothing would
    // ever continue it as meant. A handler bug: retried by the queue's policy.
    outcome = job_outcome::retry(outcome.callback_id().empty()
                                     ? "job_outcome::park without a callback id"
                                     : "job_outcome::park on callback " + outcome.callback_id() +
                                           ", whose resume wait_for_callback already returned");
  }
  apply_outcome(entry, std::move(outcome), milliseconds{0});
}

void settlement::on_handler_exit(const entry_ptr& entry, handler_exit exit) {
  --core.running_handlers;
  entry->handler_done = true;
  entry->done_at = core.now();
  if (core.abandoning) {
    const auto& a = entry->claim;
    tenure::logger()->warn("tenure: job {} lease {} queue {} (caller-owned) exited after the shutdown timeout; not "
                 "reconciled here, its attempt is settled by its own transaction or by rescue",
                 a.attempt.job_id, a.attempt.run_lease, a.queue);
    table.release(entry);
    return;
  }
  if (exit.what == handler_exit::how::committed) {
    // complete_job accepted this attempt in a transaction whose COMMIT the server answered: that
    // answer is what an evidence read would return (case 1), so none is sent.
    on_evidence(entry, exit, attempt_evidence::completed_by_this);
    return;
  }
  queue_evidence(entry, std::make_shared<handler_exit>(std::move(exit)));
}

/// Fail / retry / snooze / cancel: one guarded statement each. The entry is held until the
/// database answered; on a database error the call is retried with backoff until staleness
/// has passed (after that, rescue owns the attempt).
void settlement::apply_outcome(const entry_ptr& entry, job_outcome outcome, milliseconds backoff) {
  ++core.outstanding_ops;
  const auto a = entry->claim.attempt;
  const auto kind = outcome.what();
  core.on_db(
      [this, a, outcome, message = detail::storable_text(outcome.message())]() -> result<job_state> {
        switch (outcome.what()) {
          case job_outcome::kind::retry: {
            std::optional<std::chrono::microseconds> after;
            if (outcome.delay()) after = std::chrono::duration_cast<std::chrono::microseconds>(*outcome.delay());
            return core.store->fail(a, message, fail_disposition::retry, after);
          }
          case job_outcome::kind::fail:
            return core.store->fail(a, message, fail_disposition::permanent);
          case job_outcome::kind::snooze: {
            auto r = core.store->snooze(a, std::chrono::duration_cast<std::chrono::microseconds>(*outcome.delay()));
            if (!r) return r.error();
            return job_state::scheduled;
          }
          case job_outcome::kind::cancel: {
            auto r = core.store->cancel_attempt(a, message);
            if (!r) return r.error();
            return job_state::cancelled;
          }
          case job_outcome::kind::park: {
            auto r = core.store->park_callback(a, outcome.callback_id());
            if (!r) return r.error();
            // resumed: the callback was resumed before the attempt parked; it is claimable again.
            return r.value() == park_result::parked ? job_state::waiting_external : job_state::available;
          }
          case job_outcome::kind::completed: break;
        }
        return errc::protocol_error;
      },
      [this, entry, outcome, backoff, kind](result<job_state> r) mutable {
        --core.outstanding_ops;
        const auto& c = entry->claim;
        if (r) {
          switch (r.value()) {
            case job_state::retryable:
              settled(entry, run_outcome::retried);
              core.emit(lifecycle_event::retried, c, outcome.message());
              tenure::logger()->info("tenure: job {} lease {} queue {} will retry: {}", c.attempt.job_id,
                           c.attempt.run_lease, c.queue, outcome.message());
              break;
            case job_state::failed:
              settled(entry, run_outcome::failed);
              core.emit(lifecycle_event::failed, c, outcome.message());
              tenure::logger()->warn("tenure: job {} lease {} queue {} failed: {}", c.attempt.job_id, c.attempt.run_lease,
                           c.queue, outcome.message());
              break;
            case job_state::scheduled:
              settled(entry, run_outcome::snoozed);
              core.emit(lifecycle_event::snoozed, c);
              break;
            case job_state::cancelled:
              settled(entry, run_outcome::cancelled);
              core.emit(lifecycle_event::cancelled, c, outcome.message());
              break;
            case job_state::waiting_external:
            case job_state::available:
              // Parked: not settled (the attempt goes on); releasing the entry frees its permit
              // and stops its heartbeat.
              core.emit(lifecycle_event::parked, c, outcome.callback_id());
              tenure::logger()->debug("tenure: job {} lease {} queue {} parked on callback {}", c.attempt.job_id,
                                      c.attempt.run_lease, c.queue, outcome.callback_id());
              break;
            default: break;
          }
          table.release(entry);
          return;
        }
        if (r.error() == errc::stale_attempt && entry->caller_owned) {
          // The attempt was open when its evidence was read, and closed before this write: by
          // rescue or cancel (stale), or by the caller's own transaction committing late
          // (completed). Only the evidence can tell.
          auto exit = std::make_shared<handler_exit>();
          exit->what = handler_exit::how::error;
          exit->message = "the attempt closed while its outcome was being recorded";
          queue_evidence(entry, std::move(exit));
          return;
        }
        if (r.error() == errc::stale_attempt) {
          settled(entry, run_outcome::stale);
          tenure::logger()->debug("tenure: stale outcome discarded for job {} lease {} queue {}", c.attempt.job_id,
                        c.attempt.run_lease, c.queue);
          table.release(entry);
          return;
        }
        m.database_errors.fetch_add(1, std::memory_order_relaxed);
        if (r.error() == errc::invalid_argument) {
          // Refused for good (the same write would be refused on every retry): nothing is
          // written, and the attempt is left to rescue, which retries it by the queue's policy.
          tenure::logger()->error("tenure: the database refused the {} outcome of job {} lease {} queue {} as invalid; not "
                        "retrying it: the attempt stays open and is rescued after staleness",
                        to_text(kind), c.attempt.job_id, c.attempt.run_lease, c.queue);
          table.release(entry);
          return;
        }
        const auto next = next_backoff(backoff);
        // Keep the entry and retry: the attempt stays ours until the database answers. An
        // unknown outcome is retried too; if the first call had landed, the retry is stale.
        if (r.error() == errc::commit_in_doubt) entry->in_doubt = true;
        table.check_capacity(entry);
        if (core.abandoning) {
          tenure::logger()->error("tenure: could not record the {} outcome of job {} lease {} queue {} before shutdown "
                        "({}); the attempt stays open for rescue",
                        kind == job_outcome::kind::retry ? "retry" : "final", c.attempt.job_id,
                        c.attempt.run_lease, c.queue, r.error().message());
          table.release(entry);
          return;
        }
        tenure::logger()->warn("tenure: recording outcome of job {} lease {} queue {} failed ({}); retrying in {} ms",
                               c.attempt.job_id, c.attempt.run_lease, c.queue, r.error().message(), next.count());
        core.retry_later(next,
                         [this, entry, outcome, next]() mutable { apply_outcome(entry, std::move(outcome), next); });
      });
}

void settlement::settled(const entry_ptr& entry, run_outcome o) {
  auto& q = *entry->series;
  switch (o) {
    case run_outcome::completed: q.completed.fetch_add(1, std::memory_order_relaxed); break;
    case run_outcome::retried: q.retried.fetch_add(1, std::memory_order_relaxed); break;
    case run_outcome::failed: q.failed.fetch_add(1, std::memory_order_relaxed); break;
    case run_outcome::cancelled: q.cancelled.fetch_add(1, std::memory_order_relaxed); break;
    case run_outcome::snoozed: q.snoozed.fetch_add(1, std::memory_order_relaxed); break;
    case run_outcome::stale: q.stale_rejected.fetch_add(1, std::memory_order_relaxed); break;
  }
  q.observe_run(o, entry->run_time());
}

void settlement::discard_stale(const entry_ptr& entry) {
  const auto& c = entry->claim;
  settled(entry, run_outcome::stale);
  tenure::logger()->debug("tenure: stale completion discarded for job {} lease {} queue {}", c.attempt.job_id,
                c.attempt.run_lease, c.queue);
  table.release(entry);
}

}  // namespace tenure::detail
