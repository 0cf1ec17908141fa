#include "sdk/runtime/settlement.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

namespace {

const char* to_text(handler_exit::how h) {
  switch (h) {
    case handler_exit::how::receipt: return "returned a receipt";
    case handler_exit::how::committed: return "returned a committed receipt";
    case handler_exit::how::error: return "returned an error";
    case handler_exit::how::threw: return "threw";
    case handler_exit::how::cancelled: return "was cancelled";
    case handler_exit::how::flushed: return "completed (flush outcome unknown)";
  }
  return "exited";
}

}  // namespace

/// set-based statement) and acted on (docs/design.md section 6, cases 1-4).
void settlement::queue_evidence(const entry_ptr& entry, std::shared_ptr<handler_exit> exit) {
  evidence.push({entry, std::move(exit)}, core.stopping);
}

void settlement::read_evidence(std::vector<pending_reconcile> batch) {
  const auto n = batch.size();
  std::vector<attempt_id> ids;
  ids.reserve(n);
  for (const auto& p : batch) ids.push_back(p.entry->claim.attempt);
  ++core.outstanding_ops;
  core.on_db([this, ids = std::move(ids)] { return core.store->reconcile(std::span<const attempt_id>{ids}); },
             [this, batch = std::move(batch)](result<std::vector<attempt_evidence>> r) mutable {
               --core.outstanding_ops;
               if (!r || r.value().size() != batch.size()) {
                 // Case 4: no evidence, so nothing is written. Keep asking with backoff; past the
                 // budget each attempt's permit goes back to its queue (the light watcher).
                 const auto why = r ? std::string{"answer of the wrong size"} : r.error().message();
                 m.database_errors.fetch_add(1, std::memory_order_relaxed);
                 reconcile_backoff = next_backoff(reconcile_backoff);
                 std::string jobs;
                 for (std::size_t i = 0; i < batch.size() && i < 5; ++i) {
                   const auto& a = batch[i].entry->claim.attempt;
                   jobs += (i ? ", " : "") + std::to_string(a.job_id) + "/" + std::to_string(a.run_lease);
                 }
                 if (batch.size() > 5) jobs += ", ...";
                 for (auto& p : batch) table.check_capacity(p.entry);
                 if (core.abandoning) {
                   tenure::logger()->error("tenure: no evidence before shutdown for {} attempt(s) (job/lease {}): {}; they are "
                                 "settled by their own transactions or by rescue",
                                 batch.size(), jobs, why);
                   evidence.answered();
                   for (auto& p : batch) table.release(p.entry);
                   return;
                 }
                 tenure::logger()->warn("tenure: reconciling {} attempt(s) (job/lease {}) failed ({}); retrying in {} ms",
                              batch.size(), jobs, why, reconcile_backoff.count());
                 evidence.put_back(std::move(batch));  // further reads wait for the retry
                 core.retry_later(reconcile_backoff, [this] { evidence.retry(); });
                 return;
               }
               evidence.answered();
               m.reconciliations.fetch_add(batch.size(), std::memory_order_relaxed);
               m.reconcile_reads.fetch_add(1, std::memory_order_relaxed);
               reconcile_backoff = milliseconds{0};
               for (std::size_t i = 0; i < batch.size(); ++i) on_evidence(batch[i].entry, *batch[i].exit, r.value()[i]);
               evidence.maybe(core.stopping);
             });
}

void settlement::on_evidence(const entry_ptr& entry, const handler_exit& exit, attempt_evidence evidence) {
  const auto& c = entry->claim;
  switch (evidence) {
    case attempt_evidence::completed_by_this:
      // Case 1: durable state wins, whatever the handler said.
      if (exit.what != handler_exit::how::receipt && exit.what != handler_exit::how::committed &&
          exit.what != handler_exit::how::flushed) {
        m.protocol_warnings.fetch_add(1, std::memory_order_relaxed);
        tenure::logger()->warn("tenure: protocol: job {} lease {} queue {} is durably completed by this attempt but its "
                     "handler {} ({}); accepting the completion",
                     c.attempt.job_id, c.attempt.run_lease, c.queue, to_text(exit.what), exit.message);
      }
      settled(entry, run_outcome::completed);
      core.emit(lifecycle_event::completed, c);
      table.release(entry);
      return;
    case attempt_evidence::open: {
      if (exit.what == handler_exit::how::flushed) {
        // The in-doubt completion did not land after all: flush it again.
        push_completion({entry, exit.progress});
        return;
      }
      // Case 2: rolled back or never finalized: the ordinary retry / fail policy.
      job_outcome outcome = job_outcome::retry(exit.message);
      if (exit.what == handler_exit::how::receipt) {
        m.protocol_warnings.fetch_add(1, std::memory_order_relaxed);
        tenure::logger()->error("tenure: protocol: job {} lease {} queue {}: the handler returned a receipt but the attempt "
                      "is still open (its transaction did not commit){}; retrying it",
                      c.attempt.job_id, c.attempt.run_lease, c.queue, exit.message.empty() ? "" : ", " + exit.message);
        outcome = job_outcome::retry("protocol error: receipt without a durable completion");
      } else if (exit.what == handler_exit::how::error && exit.code == errc::invalid_argument) {
        outcome = job_outcome::fail(exit.message);
      }
      apply_outcome(entry, std::move(outcome), milliseconds{0});
      return;
    }
    case attempt_evidence::closed_by_other:
    case attempt_evidence::unknown_job:
      // Case 3: rescued, cancelled or re-claimed: stale, change nothing.
      discard_stale(entry);
      return;
  }
}

}  // namespace tenure::detail
