// `tenure bench --mode caller-owned`: finalization inside the caller's transaction, against the batched path and the bare commit.
#include "bench/common.hpp"
#include "bench/modes.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <libpq-fe.h>

#include "tenure/libpq.hpp"

namespace tenure::bench {

using namespace std::chrono_literals;

namespace {

/// One libpq connection per handler thread, for the caller's own transactions.
class thread_conn {
 public:
  ~thread_conn() {
    if (conn_) PQfinish(conn_);
  }
  PGconn* get(const std::string& dsn) {
    if (conn_ && PQstatus(conn_) != CONNECTION_OK) {
      PQfinish(conn_);
      conn_ = nullptr;
    }
    if (!conn_) conn_ = PQconnectdb(dsn.c_str());
    return PQstatus(conn_) == CONNECTION_OK ? conn_ : nullptr;
  }

 private:
  PGconn* conn_ = nullptr;
};

bool exec_ok(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
  PQclear(r);
  return ok;
}

/// The business transaction of the caller-owned scenario without tenure: `connections` threads,
/// each on its own connection, run BEGIN; INSERT one business row; COMMIT until `total` rows are
/// committed. Returns commits per second and the CPU they took. The rows carry run lease 0, so they never count as a
/// caller-owned completion's row.
struct phase_rate {
  double per_s = 0;
  cpu_share cpu;  ///< the machine's CPU while the phase ran
};

phase_rate bare_commits(const std::string& dsn, const std::string& schema, int connections, int total) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  const std::string insert = "INSERT INTO " + schema + ".bench_orders VALUES ($1, 0)";
  std::vector<std::thread> threads;
  std::vector<PGconn*> conns;
  for (int i = 0; i < connections; ++i) {
    PGconn* c = PQconnectdb(dsn.c_str());
    if (PQstatus(c) != CONNECTION_OK) {
      PQfinish(c);
      for (auto* open : conns) PQfinish(open);
      throw std::runtime_error("bench: the bare phase cannot connect");
    }
    conns.push_back(c);
  }
  const cpu_meter cpu;
  const auto t0 = clock::now();
  for (auto* c : conns) {
    threads.emplace_back([&, c] {
      for (int i = next++; i < total && !failed; i = next++) {
        const std::string id = std::to_string(i);
        const char* params[1] = {id.c_str()};
        exec_ok(c, "BEGIN");
        PGresult* r = PQexecParams(c, insert.c_str(), 1, nullptr, params, nullptr, nullptr, 0);
        const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok || !exec_ok(c, "COMMIT")) failed = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double s = seconds_since(t0);
  const auto used = cpu.share();
  for (auto* c : conns) PQfinish(c);
  if (failed) throw std::runtime_error("bench: a bare business transaction failed");
  return {total / s, used};
}

/// Milliseconds of busy CPU (over all cores) per job at `per_s` jobs a second.
double cpu_ms_per_job(const cpu_share& c, double per_s) {
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  return per_s > 0 ? rounded(c.busy_pct / 100 * cores * 1000 / per_s, 3) : 0.0;
}

/// The caller-owned queue's permits: --max-concurrency, or six per handler thread. With two per
/// thread, the threads waited for the next claim a quarter of their time (bench/RESULTS.md).
int caller_owned_permits(const options& o) { return o.max_concurrency > 0 ? o.max_concurrency : o.producers * 6; }

}  // namespace

/// Caller-owned finalization next to the batched path, in one run: the same N jobs drained (a)
/// by an ordinary no-op handler whose completions the runtime batches, and (b) by a caller-owned
/// handler that, per job, opens its own transaction, writes one business row and calls
/// complete_and_commit (complete_in_tx, then COMMIT, with --separate-commit): one commit per job,
/// by design.
nlohmann::json run_caller_owned(const options& o, const std::string& schema) {
  pg_session admin(o.dsn);
  admin.query("CREATE TABLE " + schema + ".bench_orders (job_id bigint, run_lease bigint)", {}, "bench: setup");

  // (a) the batched path
  enqueue_batches(o.dsn, schema, o.jobs);
  settle();
  auto before = read_counters(admin);
  double batched_s = 0;
  {
    auto rt = make_runtime(o.dsn, schema, drain_config(o));
    rt->handle("noop", [](job_context&) { return job_outcome::completed(); });
    const auto t0 = clock::now();
    if (!rt->start()) throw std::runtime_error("bench: runtime did not start");
    wait_for([&] { return rt->metrics().completed >= static_cast<std::uint64_t>(o.jobs); }, 600s, "the batched drain");
    batched_s = seconds_since(t0);
    rt->stop();
  }
  settle();
  auto after = read_counters(admin);
  const double batched_wal = (after.wal_bytes - before.wal_bytes) / o.jobs;
  const double batched_commits = (after.commits - before.commits) / o.jobs;

  // (b) the same business transaction without tenure, the limit the caller-owned path is held to
  const auto bare = bare_commits(o.dsn, schema, o.producers, o.jobs);
  const double bare_rate = bare.per_s;

  // (c) caller-owned: one business insert + complete_in_tx + COMMIT per job
  enqueue_batches(o.dsn, schema, o.jobs, "charge");
  settle();
  before = read_counters(admin);
  double owned_s = 0, owned_claims = 0, owned_evidence_reads = 0;
  std::atomic<long> failures{0};
  std::atomic<std::int64_t> handler_ns{0};  // summed time the handlers spent in their transactions
  cpu_share owned_cpu;
  {
    auto cfg = drain_config(o);
    cfg.handler_threads = o.producers;
    cfg.queues[0].max_concurrency = caller_owned_permits(o);
    auto rt = make_runtime(o.dsn, schema, cfg);
    const std::string insert = "INSERT INTO " + schema + ".bench_orders VALUES ($1, $2)";
    rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
      const auto began = clock::now();
      struct timed {
        std::atomic<std::int64_t>& sum;
        clock::time_point began;
        ~timed() { sum += std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - began).count(); }
      } counted{handler_ns, began};
      thread_local thread_conn own;
      PGconn* c = own.get(o.dsn);
      if (!c) return make_error_code(errc::database_unavailable);
      const std::string job = std::to_string(ctx.job_id()), lease = std::to_string(ctx.run_lease());
      const char* params[2] = {job.c_str(), lease.c_str()};
      exec_ok(c, "BEGIN");
      PGresult* r = PQexecParams(c, insert.c_str(), 2, nullptr, params, nullptr, nullptr, 0);
      const bool inserted = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
      if (!inserted) {
        exec_ok(c, "ROLLBACK");
        ++failures;
        return errc::database_error;
      }
      if (!o.separate_commit) {
        auto receipt = ctx.complete_and_commit(c);  // ends the transaction either way
        if (!receipt) ++failures;
        return receipt;
      }
      auto receipt = ctx.complete_in_tx(c);
      if (!receipt || !exec_ok(c, "COMMIT")) {
        exec_ok(c, "ROLLBACK");
        ++failures;
        return receipt ? result<finalization_receipt>{errc::commit_in_doubt} : receipt;
      }
      return receipt;
    });
    const cpu_meter cpu;
    const auto t0 = clock::now();
    if (!rt->start()) throw std::runtime_error("bench: runtime did not start");
    wait_for([&] { return rt->metrics().completed >= static_cast<std::uint64_t>(o.jobs); }, 600s,
             "the caller-owned drain");
    owned_s = seconds_since(t0);
    owned_cpu = cpu.share();
    const auto m = rt->metrics();
    owned_claims = static_cast<double>(m.claims);
    owned_evidence_reads = static_cast<double>(m.reconcile_reads);
    rt->stop();
  }
  settle();
  after = read_counters(admin);
  const double owned_wal = (after.wal_bytes - before.wal_bytes) / o.jobs;
  const double owned_commits = (after.commits - before.commits) / o.jobs;
  auto rows = admin.query("SELECT count(*) FROM " + schema + ".bench_orders WHERE run_lease > 0", {}, "bench: check");
  if (std::stol(*rows.at(0).at(0)) != o.jobs) throw std::runtime_error("bench: business rows != jobs");
  const double owned_rate = o.jobs / owned_s;

  return {{"scenario", "caller-owned"},
          {"jobs", o.jobs},
          {"handler_threads", o.producers},
          {"max_concurrency", caller_owned_permits(o)},
          // complete_and_commit (one round trip) or complete_in_tx then COMMIT (--separate-commit)
          {"caller_owned_commit", o.separate_commit ? "separate" : "with-completion"},
          {"batched_drain_jobs_per_s", std::round(o.jobs / batched_s)},
          {"caller_owned_drain_jobs_per_s", std::round(o.jobs / owned_s)},
          {"caller_owned_vs_batched", rounded(batched_s / owned_s, 2)},
          {"bare_commits_per_s", std::round(bare_rate)},
          {"caller_owned_vs_bare", rounded(owned_rate / bare_rate, 2)},
          // Where the caller-owned path's time goes: the machine's busy CPU per job in each
          // phase (both cores, client and server together; steal excluded), and the share of
          // the handler threads' time spent inside their transactions (the rest they waited for
          // work: claims, and permits held until the evidence read answers).
          {"bare_cpu_ms_per_job", cpu_ms_per_job(bare.cpu, bare_rate)},
          {"caller_owned_cpu_ms_per_job", cpu_ms_per_job(owned_cpu, owned_rate)},
          // The machine's context switches per job (every process): each round trip to the
          // server and each hand-off between threads costs some on both sides.
          {"bare_context_switches_per_job", rounded(bare.cpu.context_switches / o.jobs, 1)},
          {"caller_owned_context_switches_per_job", rounded(owned_cpu.context_switches / o.jobs, 1)},
          {"bare_cpu_busy_pct", bare.cpu.busy_pct},
          {"caller_owned_cpu_busy_pct", owned_cpu.busy_pct},
          {"caller_owned_cpu_steal_pct", owned_cpu.steal_pct},
          {"caller_owned_handler_busy", rounded(static_cast<double>(handler_ns.load()) / 1e9 / (o.producers * owned_s), 2)},
          {"caller_owned_handler_ms", rounded(static_cast<double>(handler_ns.load()) / 1e6 / o.jobs, 2)},
          {"batched_wal_bytes_per_job", std::round(batched_wal)},
          {"caller_owned_wal_bytes_per_job", std::round(owned_wal)},
          {"batched_commits_per_job", rounded(batched_commits, 2)},
          {"caller_owned_commits_per_job", rounded(owned_commits, 2)},
          {"caller_owned_handler_failures", failures.load()},
          {"caller_owned_claims_per_job", rounded(owned_claims / o.jobs, 3)},
          {"caller_owned_evidence_reads_per_job", rounded(owned_evidence_reads / o.jobs, 3)},
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)}};
}

}  // namespace tenure::bench
