// `tenure bench --mode enqueue-single`: single-job transactional producers, undrained, drained by the runtime, and drained by the bare SQL loop.
#include "bench/common.hpp"
#include "bench/modes.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <libpq-fe.h>
#include <poll.h>

#include "tenure/libpq.hpp"

namespace tenure::bench {

using namespace std::chrono_literals;

namespace {

/// Counts the NOTIFYs sent on the schema's wake channel while it runs.
class notify_counter {
 public:
  notify_counter(const std::string& dsn, const std::string& schema) : conn_(PQconnectdb(dsn.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) throw std::runtime_error("bench: listener cannot connect");
    PQclear(PQexec(conn_, ("LISTEN " + schema + "_wake").c_str()));
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        pollfd pfd{PQsocket(conn_), POLLIN, 0};
        if (::poll(&pfd, 1, 50) > 0) {
          PQconsumeInput(conn_);
          while (PGnotify* n = PQnotifies(conn_)) {
            ++count_;
            PQfreemem(n);
          }
        }
      }
    });
  }
  ~notify_counter() {
    stop_ = true;
    thread_.join();
    PQfinish(conn_);
  }
  long count() const { return count_.load(); }

 private:
  PGconn* conn_;
  std::atomic<bool> stop_{false};
  std::atomic<long> count_{0};
  std::thread thread_;
};

struct producer_run {
  long jobs = 0;
  double seconds = 0;
  cpu_share cpu;                ///< while the producers ran
  std::vector<double> commit_ms;  ///< each COMMIT's round trip: one durable commit under this load
};

/// What web backends do on every request: `producers` connections each run BEGIN, a business
/// insert, enqueue into `queue`, COMMIT, in a loop for `seconds`. `on_commit(id, when)` sees each
/// job once its COMMIT returned. With a rate, each producer starts its requests on a fixed
/// schedule (rate / producers per second, staggered), the way independent requests arrive; a
/// producer that falls behind starts its next request at once and does not burst to catch up.
template <class OnCommit>
producer_run run_producers(const options& o, const std::string& schema, const std::string& queue,
                           OnCommit&& on_commit) {
  std::atomic<bool> stop{false};
  std::atomic<long> total{0};
  std::mutex err_mu;
  std::string error;
  std::vector<double> commit_ms;
  std::vector<std::thread> producers;
  const cpu_meter cpu;
  const auto t0 = clock::now();
  // Seconds between two requests of one producer (0: back to back).
  const double period = o.rate > 0 ? o.producers / o.rate : 0.0;
  for (int p = 0; p < o.producers; ++p) {
    producers.emplace_back([&, p] {
      // A web backend's request: its own connection, statements prepared once (as drivers with
      // a statement cache do), four round trips per job.
      PGconn* c = PQconnectdb(o.dsn.c_str());
      auto step = [&](const char* name) {
        PGresult* r = PQexecPrepared(c, name, 0, nullptr, nullptr, nullptr, 0);
        const auto st = PQresultStatus(r);
        std::string value = st == PGRES_TUPLES_OK && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "";
        PQclear(r);
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
          throw std::runtime_error(std::string{"bench: "} + name + ": " + PQerrorMessage(c));
        }
        return value;
      };
      try {
        if (PQstatus(c) != CONNECTION_OK) throw std::runtime_error("bench: producer cannot connect");
        const std::pair<const char*, std::string> statements[] = {
            {"b", "BEGIN"},
            {"i", "INSERT INTO " + schema + ".business (note) VALUES ('order')"},
            {"e", "SELECT " + schema + ".enqueue('noop', '{}', '" + queue + "')"},
            {"c", "COMMIT"}};
        for (const auto& [name, sql] : statements) PQclear(PQprepare(c, name, sql.c_str(), 0, nullptr));
        auto due = t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(period * p / o.producers));
        std::vector<double> mine;
        while (!stop.load()) {
          if (period > 0) {
            std::this_thread::sleep_until(due);
            due = std::max(due + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(period)),
                           clock::now());
          }
          step("b");
          step("i");
          const auto id = std::stoll(step("e"));
          const auto commit_sent = clock::now();
          step("c");
          const auto committed = clock::now();
          ++total;
          mine.push_back(std::chrono::duration<double, std::milli>(committed - commit_sent).count());
          on_commit(id, committed);
        }
        std::lock_guard lock(err_mu);
        commit_ms.insert(commit_ms.end(), mine.begin(), mine.end());
      } catch (const std::exception& e) {
        std::lock_guard lock(err_mu);
        error = e.what();
      }
      PQfinish(c);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop = true;
  for (auto& t : producers) t.join();
  producer_run out{total.load(), seconds_since(t0), cpu.share(), std::move(commit_ms)};
  if (!error.empty()) throw std::runtime_error(error);
  return out;
}

/// When each job's COMMIT returned (producers) and when its handler started (the drainer).
struct pickup_log {
  std::mutex mu;
  std::unordered_map<std::int64_t, clock::time_point> committed, started;

  void commit(std::int64_t id, clock::time_point when) {
    std::lock_guard lock(mu);
    committed.emplace(id, when);
  }
  void start(std::int64_t id, clock::time_point when) {
    std::lock_guard lock(mu);
    started.emplace(id, when);
  }
  /// Milliseconds from COMMIT to handler start, for every job seen by both.
  std::vector<double> latencies() {
    std::lock_guard lock(mu);
    std::vector<double> lat;
    lat.reserve(committed.size());
    for (const auto& [id, c] : committed) {
      if (auto it = started.find(id); it != started.end()) {
        lat.push_back(std::max(0.0, std::chrono::duration<double, std::milli>(it->second - c).count()));
      }
    }
    return lat;
  }
};

/// The leanest drain on the same schema, for the pickup floor of a durable claim under this
/// load: one connection that claims (up to 1,000, as the runtime's drain), marks every claimed
/// job started the moment the claim returned, completes them with one guarded statement, and
/// claims again at once, busy-polling when the queue is empty. No threads, no batching delay.
class sql_drainer {
 public:
  sql_drainer(const std::string& dsn, const std::string& schema, pickup_log& log)
      : thread_([this, dsn, schema, &log] {
          try {
            pg_session s(dsn);
            while (!stop_.load()) {
              claim_and_complete(s, schema, 1000, completed_,
                                 [&](std::int64_t id, clock::time_point at) { log.start(id, at); }, &claim_ms_);
            }
          } catch (const std::exception& e) {
            std::lock_guard lock(err_mu_);
            error_ = e.what();
            failed_ = true;
          }
        }) {}
  ~sql_drainer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  long completed() const { return completed_.load(); }
  bool failed() const { return failed_.load(); }
  /// Round trips of the claims that took jobs; read after finish().
  const std::vector<double>& claim_ms() const { return claim_ms_; }
  /// Stops the loop; throws what made it fail, if anything did.
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    std::lock_guard lock(err_mu_);
    if (!error_.empty()) throw std::runtime_error(std::exchange(error_, {}));
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<long> completed_{0};
  std::vector<double> claim_ms_;  ///< written by the drain thread only
  std::mutex err_mu_;
  std::string error_;
  std::thread thread_;  ///< last: starts once everything above exists
};

}  // namespace

/// Single-job transactional enqueue, three times in one run, with the same producers: first
/// with nothing draining (the machine's ceiling for this producer loop), then with a runtime
/// draining concurrently, then with the bare SQL drain (sql_drainer) in its place. Ratios
/// between the phases hold whatever the machine's speed at the moment; the third phase is the
/// pickup a durable claim can give at all under this load, so the runtime's pickup is read
/// against it.
nlohmann::json run_enqueue_single(const options& o, const std::string& schema) {
  pg_session admin(o.dsn);
  admin.query("CREATE TABLE " + schema + ".business (id bigserial PRIMARY KEY, note text)", {}, "bench: setup");
  if (o.notify_always) {
    // A waiter that never leaves: every enqueue now sends a NOTIFY.
    admin.query("INSERT INTO " + schema + ".waiters (queue, worker, since) VALUES ('" + k_queue +
                    "', 'bench-notify-always', 'infinity'), ('" + k_queue + "-undrained', 'bench-notify-always', 'infinity')",
                {}, "bench: setup");
  }
  auto reset = [&](const std::string& where) {
    admin.query("DELETE FROM " + schema + ".ready WHERE " + where, {}, "bench: reset");
    admin.query("VACUUM " + schema + ".ready", {}, "bench: reset");
    admin.query("VACUUM " + schema + ".open_claims", {}, "bench: reset");
    admin.query("VACUUM " + schema + ".business", {}, "bench: reset");
  };

  // Phase 1: the same producers into a queue nobody drains; then those rows go away again.
  const auto undrained = run_producers(o, schema, std::string{k_queue} + "-undrained", [](std::int64_t, clock::time_point) {});
  reset("queue = '" + std::string{k_queue} + "-undrained'");

  // Phase 2: a runtime drains while the producers run.
  notify_counter notifies(o.dsn, schema);
  pickup_log log;
  auto rt = make_runtime(o.dsn, schema, drain_config(o));
  rt->handle("noop", [&](job_context& ctx) {
    log.start(ctx.job_id(), clock::now());
    return job_outcome::completed();
  });
  if (!rt->start()) throw std::runtime_error("bench: runtime did not start");
  settle();  // the runtime is polling, and earlier backends have published their counters
  const auto before = read_counters(admin);
  const long notifies_before = notifies.count();
  const auto drained = run_producers(o, schema, k_queue, [&](std::int64_t id, clock::time_point when) { log.commit(id, when); });
  wait_for([&] { return rt->metrics().completed >= static_cast<std::uint64_t>(drained.jobs); }, 120s, "the drain");
  const auto m = rt->metrics();
  const long notifies_sent = notifies.count() - notifies_before;
  rt->stop();
  rt.reset();
  settle();
  const auto after = read_counters(admin);
  const auto lat = log.latencies();

  // Phase 3: the bare SQL drain in the runtime's place, same producers, same queue.
  reset("true");
  pickup_log bare_log;
  producer_run bare;
  std::vector<double> bare_claim_ms;
  {
    sql_drainer bare_drain(o.dsn, schema, bare_log);
    bare = run_producers(o, schema, k_queue, [&](std::int64_t id, clock::time_point when) { bare_log.commit(id, when); });
    wait_for([&] { return bare_drain.completed() >= bare.jobs || bare_drain.failed(); }, 120s, "the bare SQL drain");
    bare_drain.finish();
    bare_claim_ms = bare_drain.claim_ms();
  }
  const auto bare_lat = bare_log.latencies();

  const double rate = std::round(drained.jobs / drained.seconds);
  const double undrained_rate = std::round(undrained.jobs / undrained.seconds);
  const double bare_rate = std::round(bare.jobs / bare.seconds);
  const double jobs = drained.jobs ? static_cast<double>(drained.jobs) : 1.0;
  const double commits_per_job = (after.commits - before.commits) / jobs;
  // Jobs per second of CPU the machine actually got (busy time over both cores, steal excluded):
  // comparable between runs when the hypervisor takes a varying share.
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  auto per_cpu_s = [&](double r, const cpu_share& c) { return c.busy_pct > 0 ? std::round(r / (c.busy_pct / 100 * cores)) : 0.0; };
  const double p99 = percentile(lat, 0.99), bare_p99 = percentile(bare_lat, 0.99);
  return {{"scenario", o.notify_always ? "enqueue-single-notify-always" : "enqueue-single"},
          {"producers", o.producers},
          // Requests per second the producers aimed at (--rate), or null when they ran flat out.
          {"offered_jobs_per_s", o.rate > 0 ? nlohmann::json(o.rate) : nlohmann::json(nullptr)},
          {"notifies_per_job", static_cast<double>(notifies_sent) / jobs},
          {"jobs", drained.jobs},
          {"enqueue_jobs_per_s", rate},
          // The same producer loop with nothing draining, measured first in this run.
          {"undrained_enqueue_jobs_per_s", undrained_rate},
          {"ratio_to_undrained", undrained_rate > 0 ? rounded(rate / undrained_rate, 2) : 0.0},
          {"jobs_per_cpu_s", per_cpu_s(rate, drained.cpu)},
          {"undrained_jobs_per_cpu_s", per_cpu_s(undrained_rate, undrained.cpu)},
          {"drain_jobs_per_s", nullptr},
          {"pickup_p50_ms", percentile(lat, 0.50)},
          {"pickup_p95_ms", percentile(lat, 0.95)},
          {"pickup_p99_ms", p99},
          // The bare SQL drain (sql_drainer) under the same producers, measured last in this run.
          {"sql_limit_enqueue_jobs_per_s", bare_rate},
          {"sql_limit_pickup_p50_ms", percentile(bare_lat, 0.50)},
          {"sql_limit_pickup_p95_ms", percentile(bare_lat, 0.95)},
          {"sql_limit_pickup_p99_ms", bare_p99},
          {"pickup_p99_ratio_to_sql_limit", bare_p99 > 0 ? rounded(p99 / bare_p99, 2) : 0.0},
          // The load that floor was measured under: the bare drain claims again at once and
          // busy-polls, and on a small machine that spinning takes CPU from the producers. Its
          // pickup is the floor of the runtime's only when this ratio is near ratio_to_undrained.
          {"sql_limit_ratio_to_undrained", undrained_rate > 0 ? rounded(bare_rate / undrained_rate, 2) : 0.0},
          {"sql_limit_producer_commit_p50_ms", percentile(bare.commit_ms, 0.50)},
          {"sql_limit_producer_commit_p99_ms", percentile(bare.commit_ms, 0.99)},
          // What one durable commit takes under this load, in the same phases: the producers'
          // COMMIT round trip while the runtime drained, and the bare drain's claim round trip
          // (a claim that took jobs commits durably before any of them can start).
          {"producer_commit_p50_ms", percentile(drained.commit_ms, 0.50)},
          {"producer_commit_p99_ms", percentile(drained.commit_ms, 0.99)},
          {"sql_limit_claim_p50_ms", percentile(bare_claim_ms, 0.50)},
          {"sql_limit_claim_p99_ms", percentile(bare_claim_ms, 0.99)},
          {"sql_limit_cpu_steal_pct", bare.cpu.steal_pct},
          {"wal_bytes_per_job", std::round((after.wal_bytes - before.wal_bytes) / jobs)},
          // Every commit in the database, the producers' own one per job included; the drain's
          // share is what is left after that one.
          {"commits_per_job", rounded(commits_per_job, 3)},
          {"drain_commits_per_job", rounded(std::max(0.0, commits_per_job - 1), 3)},
          {"claims_per_job", rounded(static_cast<double>(m.claims) / jobs, 3)},
          {"flushes_per_job", rounded(static_cast<double>(m.flushes) / jobs, 3)},
          {"cpu_busy_pct", drained.cpu.busy_pct},
          {"cpu_steal_pct", drained.cpu.steal_pct},
          {"undrained_cpu_busy_pct", undrained.cpu.busy_pct},
          {"undrained_cpu_steal_pct", undrained.cpu.steal_pct},
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)}};
}

}  // namespace tenure::bench
