// `tenure bench --mode sql-limit`: the leanest plain-SQL drain on the same schema.
#include "bench/common.hpp"
#include "bench/modes.hpp"

#include <cmath>
#include <stdexcept>
#include <thread>

namespace tenure::bench {

using namespace std::chrono_literals;

/// The leanest plain-SQL loop on the same schema: claim 100, complete them with one guarded
/// statement, repeat, on several connections at once.
nlohmann::json run_sql_limit(const options& o, const std::string& schema) {
  pg_session admin(o.dsn);
  const double enqueue_rate = enqueue_batches(o.dsn, schema, o.jobs);
  settle();
  const auto before = read_counters(admin);
  std::atomic<long> done{0};
  std::vector<std::thread> threads;
  std::mutex err_mu;
  std::string error;
  const cpu_meter cpu;
  const auto t0 = clock::now();
  for (int w = 0; w < o.workers; ++w) {
    threads.emplace_back([&] {
      try {
        pg_session s(o.dsn);
        while (claim_and_complete(s, schema, 100, done, [](std::int64_t, clock::time_point) {}) > 0) {
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(err_mu);
        error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!error.empty()) throw std::runtime_error(error);
  const double drain_s = seconds_since(t0);
  const auto drain_cpu = cpu.share();
  settle();
  const auto after = read_counters(admin);
  return {{"scenario", "sql-limit"},
          {"jobs", o.jobs},
          {"completed", done.load()},
          {"enqueue_jobs_per_s", std::round(enqueue_rate)},
          {"drain_jobs_per_s", std::round(o.jobs / drain_s)},
          {"pickup_p50_ms", nullptr},
          {"pickup_p95_ms", nullptr},
          {"pickup_p99_ms", nullptr},
          {"wal_bytes_per_job", std::round((after.wal_bytes - before.wal_bytes) / o.jobs)},
          {"commits_per_job", (after.commits - before.commits) / o.jobs},
          {"cpu_busy_pct", drain_cpu.busy_pct},
          {"cpu_steal_pct", drain_cpu.steal_pct},
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)}};
}

}  // namespace tenure::bench
