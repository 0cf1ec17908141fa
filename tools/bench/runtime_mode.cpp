// `tenure bench --mode runtime`: the batched drain, its WAL split, then low-load pickups.
#include "bench/common.hpp"
#include "bench/modes.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "bench/statement_wal.hpp"

namespace tenure::bench {

using namespace std::chrono_literals;

nlohmann::json run_runtime(const options& o, const std::string& schema) {
  pg_session admin(o.dsn);
  // A 1,000,000-job run writes ~800 MB of WAL, past the default max_wal_size, so the checkpoint
  // it sets off is spread over minutes and may still be writing through the next run.
  if (o.checkpoint_first) admin.query("CHECKPOINT", {}, "bench: --checkpoint-first");
  // Jobs of another queue that nobody serves: they wait through the drain and the pickups, so the
  // claim path runs beside a large ready table.
  if (o.waiting > 0) enqueue_batches(o.dsn, schema, static_cast<int>(o.waiting), "noop", o.metadata, k_waiting_queue);
  const auto enqueue_before = read_counters(admin);
  const double enqueue_rate =
      enqueue_batches(o.dsn, schema, o.jobs, "noop", o.metadata, k_queue, o.drain_enqueue == "arrays");
  const auto enqueue_after = read_counters(admin);
  settle();
  const auto before = read_counters(admin);
  // The drain's WAL split by statement: what the claims wrote, what the completion flushes wrote.
  auto by_statement = statement_wal::open(o.dsn, schema);
  const auto statements_before = by_statement ? by_statement->read({"claim_attempts", "complete_batch"})
                                              : statement_wal::reading{};

  auto rt = make_runtime(o.dsn, schema, drain_config(o));
  std::atomic<std::int64_t> last_start_ns{0}, last_job{0};
  rt->handle("noop", [&](job_context& ctx) {
    last_start_ns = clock::now().time_since_epoch().count();
    last_job = ctx.job_id();
    return job_outcome::completed();
  });
  const cpu_meter cpu;
  const auto t0 = clock::now();
  if (!rt->start()) throw std::runtime_error("bench: runtime did not start");
  wait_for([&] { return rt->metrics().completed >= static_cast<std::uint64_t>(o.jobs); }, 600s, "the drain");
  const double drain_s = seconds_since(t0);
  const auto drain_cpu = cpu.share();
  const auto drained = rt->metrics();
  rt->stop();
  rt.reset();
  settle();
  const auto after = read_counters(admin);
  const auto statements_after = by_statement ? by_statement->read({"claim_attempts", "complete_batch"})
                                             : statement_wal::reading{};
  const double drain_wal = (after.wal_bytes - before.wal_bytes) / o.jobs;
  nlohmann::json claim_wal = nullptr, completion_wal = nullptr, other_wal = nullptr;
  if (by_statement) {
    const double claim = wal_per_job(statements_before, statements_after, "claim_attempts", o.jobs);
    const double completion = wal_per_job(statements_before, statements_after, "complete_batch", o.jobs);
    claim_wal = std::round(claim);
    completion_wal = std::round(completion);
    // Heartbeats, the leader's passes, vacuum, commit records: everything else in the drain.
    other_wal = std::round(std::max(0.0, drain_wal - claim - completion));
  }

  // Pickup latency at low load, with a fresh runtime whose worker is idle.
  auto idle_rt = make_runtime(o.dsn, schema, drain_config(o));
  idle_rt->handle("noop", [&](job_context& ctx) {
    last_start_ns = clock::now().time_since_epoch().count();
    last_job = ctx.job_id();
    return job_outcome::completed();
  });
  if (!idle_rt->start()) throw std::runtime_error("bench: runtime did not start");
  const auto pickups_before = read_counters(admin);
  auto lat = pickup_latencies(o.dsn, schema, last_start_ns, last_job, o.pickup_samples);
  const auto pickups_after = read_counters(admin);
  const auto resident = resident_now();  // after the drain and the pickups, before the enqueue paths
  idle_rt->stop();
  idle_rt.reset();

  // The caller's bulk paths side by side, into a queue nobody serves: arrays and COPY, taking turns
  // (--enqueue-batch jobs per transaction, at least four batches each).
  const auto paths = enqueue_paths(o.dsn, schema, std::max(std::clamp(o.jobs, 20'000, 100'000), 4 * o.enqueue_batch),
                                   o.enqueue_batch, k_enqueue_queue);

  return {{"scenario", "runtime"},
          {"jobs", o.jobs},
          {"waiting_jobs", o.waiting},
          {"drain_enqueue", o.drain_enqueue},
          {"enqueue_jobs_per_s", std::round(enqueue_rate)},
          {"enqueue_copy_jobs_per_s", std::round(paths.copy_jobs_per_s)},
          {"enqueue_array_jobs_per_s_beside_copy", std::round(paths.array_jobs_per_s)},
          {"enqueue_copy_vs_array", rounded(paths.copy_jobs_per_s / paths.array_jobs_per_s, 2)},
          {"enqueue_batch", o.enqueue_batch},
          {"drain_jobs_per_s", std::round(o.jobs / drain_s)},
          {"pickup_p50_ms", percentile(lat, 0.50)},
          {"pickup_p95_ms", percentile(lat, 0.95)},
          {"pickup_p99_ms", percentile(lat, 0.99)},
          // Buffers checkpoints wrote from the drain's start to the first pickup, and while the
          // pickups were timed: a checkpoint's writes slow every durable commit, the claims that
          // start jobs too.
          {"checkpoint_first", o.checkpoint_first},
          {"drain_checkpoint_buffers", std::round(pickups_before.checkpoint_buffers - before.checkpoint_buffers)},
          {"pickup_checkpoint_buffers", std::round(pickups_after.checkpoint_buffers - pickups_before.checkpoint_buffers)},
          // The drain's WAL (claims, completions and the rest, enqueue excluded), then its split;
          // the split is null where the server does not load pg_stat_statements.
          {"wal_bytes_per_job", std::round(drain_wal)},
          {"claim_wal_bytes_per_job", claim_wal},
          {"completion_wal_bytes_per_job", completion_wal},
          {"drain_other_wal_bytes_per_job", other_wal},
          {"enqueue_wal_bytes_per_job", std::round((enqueue_after.wal_bytes - enqueue_before.wal_bytes) / o.jobs)},
          {"commits_per_job", (after.commits - before.commits) / o.jobs},
          {"claims", drained.claims},
          {"flushes", drained.flushes},
          {"flush_max_size", drained.flush_max_size},
          {"cpu_busy_pct", drain_cpu.busy_pct},
          {"cpu_steal_pct", drain_cpu.steal_pct},
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)},
          // The peak up to the end of the pickups: the enqueue, the drain and the pickups, without
          // the enqueue paths' comparison that runs last (its 5,000-job batches hold their arrays
          // and COPY text at once).
          {"peak_rss_mb_through_pickups", rounded(resident.peak_mb, 1)},
          // The resident set right after the drain and the pickups: what the process allocated
          // (anon) apart from the code it maps (file).
          {"rss_anon_mb_after_pickups", rounded(resident.anon_mb, 1)},
          {"rss_file_mb_after_pickups", rounded(resident.file_mb, 1)}};
}

}  // namespace tenure::bench
