#pragma once
/// \file
/// What the `tenure bench` scenarios share: the bench queue, clocks and percentiles, the
/// database's counters, batch enqueue, the drain runtime's settings, CPU shares, low-load pickups
/// and the leanest plain-SQL claim/complete round. Private to tools/bench.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "cli/pg_session.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/store.hpp"

namespace tenure::bench {

using clock = std::chrono::steady_clock;
using cli::pg_session;

inline constexpr const char* k_queue = "bench";
inline constexpr const char* k_waiting_queue = "bench_waiting";  ///< runtime --waiting: never served
inline constexpr const char* k_enqueue_queue = "bench_enqueue";  ///< runtime: the enqueue paths' jobs, never served

double seconds_since(clock::time_point t0);
/// This process's peak resident set (VmHWM), in MB.
double peak_rss_mb();
/// This process's resident set now, in MB, split into anonymous memory (heap, thread stacks,
/// malloc's per-thread arenas) and file-backed pages (the mapped code of the binary and its
/// libraries, and shared memory), with its peak so far (VmHWM), from one read.
struct rss_split {
  double anon_mb = 0;
  double file_mb = 0;
  double peak_mb = 0;
};
rss_split resident_now();
/// Eight random hex digits, for schema names.
std::string random_hex();

/// WAL position and committed transactions of this database, read after a stats snapshot reset.
/// Backends flush their counters when they exit, so every measured phase closes its
/// connections before the reading that ends it.
struct db_counters {
  double wal_bytes = 0;
  double commits = 0;
  /// Buffers written by checkpoints in the whole cluster (pg_stat_bgwriter.buffers_checkpoint,
  /// which a spread checkpoint reports as it goes): a phase during which it grew ran beside a
  /// checkpoint's writes.
  double checkpoint_buffers = 0;
};
db_counters read_counters(pg_session& s);
/// Lets exited backends publish their stats before a reading.
void settle();
double percentile(std::vector<double> v, double p);
/// Rounds to `decimals` places, for printing.
double rounded(double v, int decimals);

/// `copy_threshold`: the store's (0: every batch over arrays).
std::shared_ptr<postgres::store> open_store(const std::string& dsn, const std::string& schema, int pool = 4,
                                            std::size_t copy_threshold = postgres::store_options{}.copy_threshold);
/// Enqueues `n` jobs of `kind` (no-op by default) through the store's enqueue_batch, 5,000 per
/// transaction (over COPY; over arrays when `arrays`); returns jobs per second.
double enqueue_batches(const std::string& dsn, const std::string& schema, int n, const std::string& kind = "noop",
                       const nlohmann::json& metadata = nlohmann::json::object(), const std::string& queue = k_queue,
                       bool arrays = false);
/// Both bulk paths of the caller's connection (tenure/libpq.hpp's enqueue_batch over arrays, and
/// over COPY), `batch` jobs per transaction, batches alternating until each path enqueued `n`
/// jobs (after one uncounted batch each); each path's jobs per second. The jobs go to `queue` and stay there.
struct enqueue_path_rates {
  double array_jobs_per_s = 0;
  double copy_jobs_per_s = 0;
};
enqueue_path_rates enqueue_paths(const std::string& dsn, const std::string& schema, int n, int batch,
                                 const std::string& queue);
/// The runtime settings of every drain: one queue, large batches, short flush delay.
runtime_config drain_config(const options& o);
std::unique_ptr<runtime> make_runtime(const std::string& dsn, const std::string& schema, runtime_config cfg);
/// Polls `done` once a millisecond until it holds; throws "bench: timed out waiting for <what>" after `limit`.
void wait_for(const std::function<bool()>& done, std::chrono::seconds limit, const char* what);

/// Shares of the whole machine's CPU, in percent.
struct cpu_share {
  double busy_pct = 0;
  double steal_pct = 0;  ///< taken by the hypervisor: a phase with high steal is not comparable
  double context_switches = 0;  ///< the machine's, all processes (the `ctxt` line of /proc/stat)
};

/// Measures the machine's CPU and context switches (from /proc/stat) from its construction to share().
class cpu_meter {
 public:
  cpu_share share() const {
    const auto now = read();
    const double total = now.total - start_.total;
    if (total <= 0) return {};
    return {rounded((now.busy - start_.busy) / total * 100, 1), rounded((now.steal - start_.steal) / total * 100, 1),
            now.ctxt - start_.ctxt};
  }

 private:
  struct times {
    double busy = 0, steal = 0, total = 0, ctxt = 0;
  };
  static times read() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (cpu != "cpu") return {};
    const double busy = user + nice + system + irq + softirq;
    times t{busy, steal, busy + idle + iowait + steal, 0};
    for (std::string line; std::getline(stat, line);) {
      if (line.starts_with("ctxt ")) {
        t.ctxt = std::strtod(line.c_str() + 5, nullptr);
        break;
      }
    }
    return t;
  }
  times start_ = read();
};

/// Low-load pickup: one job at a time into an idle worker; from the enqueue's COMMIT returning
/// to the handler starting.
std::vector<double> pickup_latencies(const std::string& dsn, const std::string& schema,
                                     std::atomic<std::int64_t>& last_start_ns, std::atomic<std::int64_t>& last_job,
                                     int samples);

/// One round of the leanest plain-SQL drain: claim up to `batch` jobs, tell
/// `on_claimed(job_id, when the claim returned)` of each, complete them all with one guarded statement and add
/// the completions to `completed`. Returns how many were claimed (0: the queue was empty). With
/// `claim_ms`, the round trip of every claim that took jobs is added to it.
template <class OnClaimed>
std::size_t claim_and_complete(pg_session& s, const std::string& schema, int batch, std::atomic<long>& completed,
                               OnClaimed&& on_claimed, std::vector<double>* claim_ms = nullptr) {
  const auto sent = clock::now();
  auto rows = s.query("SELECT job_id, run_lease FROM " + schema + ".claim_attempts('" + k_queue + "', " +
                          std::to_string(batch) + ", NULL, NULL)",
                      {}, "bench: claim");
  const auto claimed_at = clock::now();
  if (rows.empty()) return 0;
  if (claim_ms) claim_ms->push_back(std::chrono::duration<double, std::milli>(claimed_at - sent).count());
  std::string ids = "{", leases = "{";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ids += (i ? "," : "") + *rows[i].at(0);
    leases += (i ? "," : "") + *rows[i].at(1);
    on_claimed(std::stoll(*rows[i].at(0)), claimed_at);
  }
  auto c = s.query("SELECT count(*) FROM " + schema + ".complete_batch($1::bigint[], $2::bigint[])",
                   {ids + "}", leases + "}"}, "bench: complete");
  completed += std::stol(*c.at(0).at(0));
  return rows.size();
}

}  // namespace tenure::bench
