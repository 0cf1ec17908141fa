#include "sdk/runtime/settlement.hpp"

#include <boost/asio/steady_timer.hpp>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

/// A completed outcome joins the batcher; it leaves it only once a flush has answered for it.
/// While stopping, it is flushed at once instead of after flush_delay.
void settlement::push_completion(pending_completion p) {
  m.pending_completions.fetch_add(1, std::memory_order_relaxed);
  completions.push(std::move(p), core.stopping);
}

void settlement::flush(std::vector<pending_completion> batch) {
  const auto n = batch.size();
  std::vector<completion> items;
  items.reserve(n);
  for (const auto& p : batch) items.push_back({p.entry->claim.attempt, p.progress, p.entry->claim.secret});
  const auto started_at = core.now();
  core.on_db([this, items = std::move(items)] { return core.store->complete(items); },
             [this, batch = std::move(batch), started_at](result<std::vector<completion_result>> r) mutable {
               on_flushed(std::move(batch), std::move(r), core.now() - started_at);
             });
}

void settlement::on_flushed(std::vector<pending_completion> batch, result<std::vector<completion_result>> r,
                steady_time_point::duration took) {
  if (!r && r.error() == errc::invalid_argument) {
    // Refused for good: the same statement would be refused on every retry, and every later
    // completion would wait behind it. Flush the items one by one to find the refused one;
    // a single refused item is not retried and its attempt is left to rescue.
    m.flush_failures.fetch_add(1, std::memory_order_relaxed);
    m.database_errors.fetch_add(1, std::memory_order_relaxed);
    if (batch.size() > 1) {
      tenure::logger()->warn("tenure: the database refused a completion flush of {} as invalid; flushing them one by one",
                   batch.size());
      completions.put_back_one_by_one(std::move(batch));
      completions.retry();
      return;
    }
    completions.answered();
    m.pending_completions.fetch_sub(1, std::memory_order_relaxed);
    const auto& c = batch.front().entry->claim;
    tenure::logger()->error("tenure: the database refused the completion of job {} lease {} queue {} as invalid; not retrying "
                  "it: the attempt stays open and is rescued after staleness",
                  c.attempt.job_id, c.attempt.run_lease, c.queue);
    table.release(batch.front().entry);
    completions.maybe(core.stopping);
    return;
  }
  if (!r) {
    // The attempts stay open (and heartbeated); the flush is retried. Never lost, never
    // double-completed: after an unknown outcome, a stale answer is checked against evidence.
    m.flush_failures.fetch_add(1, std::memory_order_relaxed);
    m.database_errors.fetch_add(1, std::memory_order_relaxed);
    const bool doubt = r.error() == errc::commit_in_doubt;
    for (auto& p : batch) {
      p.entry->in_doubt = p.entry->in_doubt || doubt;
      table.check_capacity(p.entry);
    }
    flush_backoff = next_backoff(flush_backoff);
    tenure::logger()->warn("tenure: completion flush of {} failed ({}); retrying in {} ms", batch.size(),
                 r.error().message(), flush_backoff.count());
    completions.put_back(std::move(batch));  // further flushes wait for the retry
    auto t = std::make_shared<asio::steady_timer>(core.ctl);
    core.at(*t, core.now() + flush_backoff, [this, t](bool) { completions.retry(); });
    return;
  }
  completions.answered();
  flush_backoff = milliseconds{0};
  const auto size = batch.size();
  m.pending_completions.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
  m.flushes.fetch_add(1, std::memory_order_relaxed);
  m.flushed_items.fetch_add(size, std::memory_order_relaxed);
  m.flush_latency_us_total.fetch_add(
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(took).count()),
      std::memory_order_relaxed);
  auto max = m.flush_max_size.load(std::memory_order_relaxed);
  while (size > max && !m.flush_max_size.compare_exchange_weak(max, size)) {
  }
  const auto& results = r.value();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto& entry = batch[i].entry;
    const bool applied = i < results.size() && results[i].applied;
    if (applied) {
      settled(entry, run_outcome::completed);
      core.emit(lifecycle_event::completed, entry->claim);
      table.release(entry);
    } else if (entry->in_doubt) {
      // An earlier flush of it had an unknown outcome: was this "stale" our own completion?
      auto exit = std::make_shared<handler_exit>();
      exit->what = handler_exit::how::flushed;
      exit->progress = batch[i].progress;
      queue_evidence(entry, std::move(exit));
    } else {
      discard_stale(entry);
    }
  }
  completions.maybe(core.stopping);
}

}  // namespace tenure::detail
