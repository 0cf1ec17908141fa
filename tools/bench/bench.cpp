#include "bench/bench.hpp"
#include "bench/statement_wal.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <libpq-fe.h>
#include <poll.h>

#include "cli/pg_session.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/store.hpp"

namespace tenure::bench {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;
using cli::pg_session;

constexpr const char* k_queue = "bench";
constexpr const char* k_waiting_queue = "bench_waiting";  ///< runtime --waiting: never served

double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

double peak_rss_mb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

std::string random_hex() {
  std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  auto v = rng();
  for (int i = 0; i < 8; ++i, v >>= 4) s += hex[v & 0xf];
  return s;
}

/// WAL position and committed transactions of this database, read after a stats snapshot reset.
/// Backends flush their counters when they exit, so every measured phase closes its
/// connections before the reading that ends it.
struct db_counters {
  double wal_bytes = 0;
  double commits = 0;
};

db_counters read_counters(pg_session& s) {
  s.query("SELECT pg_stat_clear_snapshot()", {}, "bench: stats");
  auto rows = s.query(
      "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8, xact_commit::float8 "
      "FROM pg_stat_database WHERE datname = current_database()",
      {}, "bench: counters");
  return {std::stod(*rows.at(0).at(0)), std::stod(*rows.at(0).at(1))};
}

/// Lets exited backends publish their stats before a reading.
void settle() { std::this_thread::sleep_for(600ms); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto idx = static_cast<std::size_t>(std::min<double>(v.size() - 1, std::ceil(p * v.size()) - 1));
  return v[idx];
}

std::shared_ptr<postgres::store> open_store(const std::string& dsn, const std::string& schema, int pool = 4) {
  auto st = postgres::store::open({.dsn = dsn, .schema = schema, .pool_size = pool});
  if (!st) throw std::runtime_error("bench: cannot open the store: " + st.error().message());
  return std::shared_ptr<postgres::store>(std::move(st).value());
}

/// Enqueues `n` jobs of `kind` (no-op by default) in batches of one statement each; returns
/// jobs per second.
double enqueue_batches(const std::string& dsn, const std::string& schema, int n, const std::string& kind = "noop",
                       const nlohmann::json& metadata = nlohmann::json::object(), const std::string& queue = k_queue) {
  auto store = open_store(dsn, schema, 1);
  const auto t0 = clock::now();
  std::vector<new_job> chunk;
  for (int done = 0; done < n;) {
    const int k = std::min(5'000, n - done);
    chunk.assign(static_cast<std::size_t>(k), new_job{.kind = kind, .queue = queue, .metadata = metadata});
    auto ids = store->enqueue_batch(chunk);
    if (!ids) throw std::runtime_error("bench: enqueue failed: " + ids.error().message());
    done += k;
  }
  return n / seconds_since(t0);
}

runtime_config drain_config(const options& o) {
  runtime_config c;
  if (o.reclaim_dead_rows >= 0) c.reclaim_dead_rows = o.reclaim_dead_rows;
  c.queues = {{.name = k_queue, .max_concurrency = 2'048}};
  c.handler_threads = 2;
  c.claim_batch = 1'000;
  c.completion_batch = 2'000;
  c.flush_delay = 2ms;
  c.heartbeat_interval = 5s;
  c.poll_interval = 1s;
  c.maintenance_interval = 1s;
  return c;
}

std::unique_ptr<runtime> make_runtime(const std::string& dsn, const std::string& schema, runtime_config cfg) {
  auto rt = postgres::make_runtime({.dsn = dsn, .schema = schema, .pool_size = 4, .runtime = std::move(cfg)});
  if (!rt) throw std::runtime_error("bench: cannot create the runtime: " + rt.error().message());
  return std::move(rt).value();
}

void wait_for(const std::function<bool()>& done, std::chrono::seconds limit, const char* what) {
  const auto until = clock::now() + limit;
  while (!done()) {
    if (clock::now() > until) throw std::runtime_error(std::string{"bench: timed out waiting for "} + what);
    std::this_thread::sleep_for(200us);
  }
}

/// Rounds to `decimals` places, for printing.
double rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

/// Shares of the whole machine's CPU, in percent.
struct cpu_share {
  double busy_pct = 0;
  double steal_pct = 0;  ///< taken by the hypervisor: a phase with high steal is not comparable
};

/// Measures the machine's CPU (from /proc/stat) from its construction to share().
class cpu_meter {
 public:
  cpu_share share() const {
    const auto now = read();
    const double total = now.total - start_.total;
    if (total <= 0) return {};
    return {rounded((now.busy - start_.busy) / total * 100, 1), rounded((now.steal - start_.steal) / total * 100, 1)};
  }

 private:
  struct times {
    double busy = 0, steal = 0, total = 0;
  };
  static times read() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (cpu != "cpu") return {};
    const double busy = user + nice + system + irq + softirq;
    return {busy, steal, busy + idle + iowait + steal};
  }
  times start_ = read();
};

/// Low-load pickup: one job at a time into an idle worker; from the enqueue's COMMIT returning
/// to the handler starting.
std::vector<double> pickup_latencies(const std::string& dsn, const std::string& schema,
                                     std::atomic<std::int64_t>& last_start_ns, std::atomic<std::int64_t>& last_job,
                                     int samples) {
  pg_session producer(dsn);
  std::vector<double> out;
  std::mt19937 rng{42};
  for (int i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 30));  // an idle worker
    auto rows = producer.query("SELECT " + schema + ".enqueue('noop', '{}', '" + k_queue + "')", {}, "bench: enqueue");
    const auto committed = clock::now();
    const auto id = std::stoll(*rows.at(0).at(0));
    wait_for([&] { return last_job.load() == id; }, 30s, "a pickup");
    const auto started = clock::time_point{clock::duration{last_start_ns.load()}};
    out.push_back(std::max(0.0, std::chrono::duration<double, std::milli>(started - committed).count()));
  }
  return out;
}

nlohmann::json run_runtime(const options& o, const std::string& schema) {
  pg_session admin(o.dsn);
  // Jobs of another queue that nobody serves: they wait through the drain and the pickups, so the
  // claim path runs beside a large ready table.
  if (o.waiting > 0) enqueue_batches(o.dsn, schema, static_cast<int>(o.waiting), "noop", o.metadata, k_waiting_queue);
  const auto enqueue_before = read_counters(admin);
  const double enqueue_rate = enqueue_batches(o.dsn, schema, o.jobs, "noop", o.metadata);
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
  auto lat = pickup_latencies(o.dsn, schema, last_start_ns, last_job, o.pickup_samples);
  idle_rt->stop();

  return {{"scenario", "runtime"},
          {"jobs", o.jobs},
          {"waiting_jobs", o.waiting},
          {"enqueue_jobs_per_s", std::round(enqueue_rate)},
          {"drain_jobs_per_s", std::round(o.jobs / drain_s)},
          {"pickup_p50_ms", percentile(lat, 0.50)},
          {"pickup_p95_ms", percentile(lat, 0.95)},
          {"pickup_p99_ms", percentile(lat, 0.99)},
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
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)}};
}

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
    admin.query("VACUUM " + schema + ".receipts", {}, "bench: reset");
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
/// committed. Returns commits per second. The rows carry run lease 0, so they never count as a
/// caller-owned completion's row.
double bare_commits(const std::string& dsn, const std::string& schema, int connections, int total) {
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
  for (auto* c : conns) PQfinish(c);
  if (failed) throw std::runtime_error("bench: a bare business transaction failed");
  return total / s;
}

/// Caller-owned finalization next to the batched path, in one run: the same N jobs drained (a)
/// by an ordinary no-op handler whose completions the runtime batches, and (b) by a caller-owned
/// handler that, per job, opens its own transaction, writes one business row, calls
/// complete_in_tx and commits (one commit per job, by design).
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
  const double bare_rate = bare_commits(o.dsn, schema, o.producers, o.jobs);

  // (c) caller-owned: one business insert + complete_in_tx + COMMIT per job
  enqueue_batches(o.dsn, schema, o.jobs, "charge");
  settle();
  before = read_counters(admin);
  double owned_s = 0, owned_claims = 0, owned_evidence_reads = 0;
  std::atomic<long> failures{0};
  {
    auto cfg = drain_config(o);
    cfg.handler_threads = o.producers;
    cfg.queues[0].max_concurrency = o.producers * 2;
    auto rt = make_runtime(o.dsn, schema, cfg);
    const std::string insert = "INSERT INTO " + schema + ".bench_orders VALUES ($1, $2)";
    rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
      thread_local thread_conn own;
      PGconn* c = own.get(o.dsn);
      if (!c) return make_error_code(errc::database_unavailable);
      const std::string job = std::to_string(ctx.job_id()), lease = std::to_string(ctx.run_lease());
      const char* params[2] = {job.c_str(), lease.c_str()};
      exec_ok(c, "BEGIN");
      PGresult* r = PQexecParams(c, insert.c_str(), 2, nullptr, params, nullptr, nullptr, 0);
      const bool inserted = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
      auto receipt = inserted ? ctx.complete_in_tx(c) : result<finalization_receipt>{errc::database_error};
      if (!receipt || !exec_ok(c, "COMMIT")) {
        exec_ok(c, "ROLLBACK");
        ++failures;
        return receipt ? result<finalization_receipt>{errc::commit_in_doubt} : receipt;
      }
      return receipt;
    });
    const auto t0 = clock::now();
    if (!rt->start()) throw std::runtime_error("bench: runtime did not start");
    wait_for([&] { return rt->metrics().completed >= static_cast<std::uint64_t>(o.jobs); }, 600s,
             "the caller-owned drain");
    owned_s = seconds_since(t0);
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
          {"batched_drain_jobs_per_s", std::round(o.jobs / batched_s)},
          {"caller_owned_drain_jobs_per_s", std::round(o.jobs / owned_s)},
          {"caller_owned_vs_batched", rounded(batched_s / owned_s, 2)},
          {"bare_commits_per_s", std::round(bare_rate)},
          {"caller_owned_vs_bare", rounded(owned_rate / bare_rate, 2)},
          {"batched_wal_bytes_per_job", std::round(batched_wal)},
          {"caller_owned_wal_bytes_per_job", std::round(owned_wal)},
          {"batched_commits_per_job", rounded(batched_commits, 2)},
          {"caller_owned_commits_per_job", rounded(owned_commits, 2)},
          {"caller_owned_handler_failures", failures.load()},
          {"caller_owned_claims_per_job", rounded(owned_claims / o.jobs, 3)},
          {"caller_owned_evidence_reads_per_job", rounded(owned_evidence_reads / o.jobs, 3)},
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)}};
}

/// Expired finished jobs for the prune scenario: `n` completed jobs of the bench queue, finished
/// two days ago (past the default 24 h retention), inserted in one statement per 100,000.
void insert_expired(const std::string& dsn, const std::string& schema, long n) {
  pg_session s(dsn);
  for (long done = 0; done < n;) {
    const long k = std::min<long>(100'000, n - done);
    s.query("INSERT INTO " + schema + ".done (id, queue, kind, args, state, priority, attempt, max_attempts, "
            "run_lease, run_at, created_at, finalized_at) SELECT nextval('" + schema + ".job_id_seq'), '" + k_queue +
            "', 'noop', '{}', 'completed', 2, 1, 25, 1, now(), now(), now() - interval '2 days' "
            "FROM generate_series(1, " + std::to_string(k) + ")",
            {}, "bench: insert expired rows");
    done += k;
  }
  s.query("ANALYZE " + schema + ".done", {}, "bench: analyze");
}

/// One phase of the prune scenario: a runtime (maintenance off: the pruner is the only leader)
/// drains `jobs`, then `samples` low-load pickups are timed.
struct drain_phase {
  double drain_jobs_per_s = 0;
  std::vector<double> pickup_ms;
};

drain_phase measure_drain(const options& o, const std::string& schema) {
  enqueue_batches(o.dsn, schema, o.jobs);
  auto cfg = drain_config(o);
  cfg.maintenance = false;
  auto rt = make_runtime(o.dsn, schema, cfg);
  std::atomic<std::int64_t> last_start_ns{0}, last_job{0};
  rt->handle("noop", [&](job_context& ctx) {
    last_start_ns = clock::now().time_since_epoch().count();
    last_job = ctx.job_id();
    return job_outcome::completed();
  });
  const auto t0 = clock::now();
  if (!rt->start()) throw std::runtime_error("bench: runtime did not start");
  wait_for([&] { return rt->metrics().completed >= static_cast<std::uint64_t>(o.jobs); }, 600s, "the drain");
  drain_phase out;
  out.drain_jobs_per_s = std::round(o.jobs / seconds_since(t0));
  out.pickup_ms = pickup_latencies(o.dsn, schema, last_start_ns, last_job, o.pickup_samples);
  rt->stop();
  return out;
}

/// Retention under load: `prune_rows` expired finished jobs are deleted by back-to-back fenced
/// leader passes (maintain(), at most 50,000 per pass) while a runtime drains `jobs` and then
/// takes `pickup_samples` low-load pickups; the same drain and pickups without pruning first, for
/// comparison.
nlohmann::json run_prune(const options& o, const std::string& schema) {
  insert_expired(o.dsn, schema, o.prune_rows);
  const auto baseline = measure_drain(o, schema);
  // What the pruner's passes write (the drain beside them runs no leader of its own).
  auto by_statement = statement_wal::open(o.dsn, schema);
  const auto statements_before = by_statement ? by_statement->read({"maintain"}) : statement_wal::reading{};

  std::atomic<bool> stop{false};
  std::atomic<long> pruned{0};
  std::vector<double> pass_ms;
  double prune_s = 0;
  std::string error;
  std::thread pruner([&] {
    try {
      pg_session s(o.dsn);
      const auto t0 = clock::now();
      while (!stop.load()) {
        auto term = s.query("SELECT " + schema + ".acquire_leadership('bench-pruner', '1 minute')", {}, "bench: lease");
        if (!term.at(0).at(0)) throw std::runtime_error("bench: another leader holds the lease");
        const auto sent = clock::now();
        s.query("SELECT count(*) FROM " + schema + ".maintain('bench-pruner', " + *term.at(0).at(0) + ")", {},
                "bench: maintain");
        pass_ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - sent).count());
        const long left = std::stol(*s.query("SELECT count(*) FROM " + schema +
                                                 ".done WHERE finalized_at < now() - interval '1 day'",
                                             {}, "bench: left")
                                         .at(0)
                                         .at(0));
        pruned = o.prune_rows - left;
        if (left == 0) break;
      }
      prune_s = seconds_since(t0);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  drain_phase during;
  try {
    during = measure_drain(o, schema);
  } catch (...) {
    stop = true;
    pruner.join();
    throw;
  }
  const long pruned_during_drain = pruned.load();
  pruner.join();  // runs until every expired row is gone
  if (!error.empty()) throw std::runtime_error(error);
  nlohmann::json prune_wal = nullptr;
  if (by_statement) {
    prune_wal = std::round(wal_per_job(statements_before, by_statement->read({"maintain"}), "maintain",
                                       static_cast<double>(o.prune_rows)));
  }
  return {{"scenario", "prune"},
          {"jobs", o.jobs},
          {"prune_rows", o.prune_rows},
          {"pruned_while_measuring", pruned_during_drain},
          {"prune_seconds", rounded(prune_s, 2)},
          {"prune_rows_per_s", prune_s > 0 ? std::round(o.prune_rows / prune_s) : 0.0},
          {"prune_passes", pass_ms.size()},
          {"prune_pass_p50_ms", rounded(percentile(pass_ms, 0.50), 1)},
          {"prune_pass_max_ms", rounded(percentile(pass_ms, 1.0), 1)},
          // WAL of the pruner's passes per expired row (null without pg_stat_statements).
          {"prune_wal_bytes_per_row", prune_wal},
          {"baseline_drain_jobs_per_s", baseline.drain_jobs_per_s},
          {"baseline_pickup_p50_ms", percentile(baseline.pickup_ms, 0.50)},
          {"baseline_pickup_p99_ms", percentile(baseline.pickup_ms, 0.99)},
          {"pruning_drain_jobs_per_s", during.drain_jobs_per_s},
          {"pruning_pickup_p50_ms", percentile(during.pickup_ms, 0.50)},
          {"pruning_pickup_p99_ms", percentile(during.pickup_ms, 0.99)},
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)}};
}

}  // namespace

nlohmann::json run(const options& o) {
  if (o.jobs < 1) throw std::runtime_error("bench: --jobs must be at least 1");
  if (o.producers < 1) throw std::runtime_error("bench: --producers must be at least 1");
  const std::string schema = "bench_" + random_hex();
  auto migrated = postgres::migrate(o.dsn, schema);
  if (!migrated) throw std::runtime_error("bench: migrate failed: " + migrated.error().message());
  nlohmann::json result;
  try {
    if (o.mode == "runtime") {
      result = run_runtime(o, schema);
    } else if (o.mode == "sql-limit") {
      result = run_sql_limit(o, schema);
    } else if (o.mode == "enqueue-single") {
      result = run_enqueue_single(o, schema);
    } else if (o.mode == "caller-owned") {
      result = run_caller_owned(o, schema);
    } else if (o.mode == "prune") {
      result = run_prune(o, schema);
    } else {
      throw std::runtime_error("bench: unknown mode '" + o.mode +
                               "' (runtime, sql-limit, enqueue-single, caller-owned, prune)");
    }
  } catch (...) {
    if (!o.keep_schema) {
      try {
        pg_session(o.dsn).query("DROP SCHEMA " + schema + " CASCADE", {}, "bench: cleanup");
      } catch (...) {
      }
    }
    throw;
  }
  if (!o.keep_schema) pg_session(o.dsn).query("DROP SCHEMA " + schema + " CASCADE", {}, "bench: cleanup");
  // Which schema the run used: the one to inspect with --keep-schema (dropped otherwise).
  result["schema"] = schema;
  result["schema_kept"] = o.keep_schema;
  return result;
}

}  // namespace tenure::bench
