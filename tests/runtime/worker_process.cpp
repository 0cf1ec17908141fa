// worker_process DSN SCHEMA WORKER_NAME [no-maintenance]
//
// One tenure worker process for the multi-process tests (multiprocess_pgtest.cpp). It runs the
// PostgreSQL runtime on queue "default" with a handler for kind "exec" that records every
// execution in <schema>.executions (job_id, run_lease, worker) through its own libpq connection
// (one per handler thread), commits that row, works 1-3 ms, then reports the job completed.
// Kind "hold" records its execution the same way, then holds its first attempt (run lease 1) for
// up to 60 s or until it is cancelled; later attempts complete at once. Kind "span" works 20 ms,
// then records the span it ran in <schema>.spans (job_id, worker, started_at, ended_at; the
// database's clock, the start being the end minus the span measured here), then completes: the
// span lies inside the attempt's claim and completion. Kind "park" records its
// execution, then registers a callback (timeout 60 s) and parks on it (job_outcome::park); the
// continuation (resumed_with() set) records its execution again and completes with the payload
// as its progress. Kind "park_hold" parks as "park" does; its continuation records its execution,
// then holds for up to 60 s (or until cancelled) when it runs as the parked attempt (attempt 1),
// and completes with the payload as its progress when it runs as a later one. Kind "charge" is
// caller-owned: on a connection of its own it opens a transaction, inserts its business row into
// <schema>.orders (job_id, run_lease), completes the attempt in that transaction
// (complete_in_tx), works 1-3 ms, then commits; the first attempt of
// a job whose id is a multiple of 7 rolls back instead and reports an error (so it is retried);
// once a COMMIT was acknowledged it prints "acked <job_id> <run_lease>" on stdout.
// With "no-maintenance"
// the process never takes the maintenance lease. Every session of the process (runtime and
// handlers) is named tenure-mp-<WORKER_NAME>.
//
// stdout carries only the protocol with the test: "ready" once the runtime started, and
// "completed=<n> stale=<n>" after a SIGTERM/SIGINT made it stop (then it exits 0). Logs go to
// stderr. It never exits on its own otherwise.
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tenure/libpq.hpp"
#include "tenure/postgres/runtime.hpp"

namespace {

using namespace std::chrono_literals;

/// One libpq session per handler thread, reopened when it broke.
class exec_recorder {
 public:
  exec_recorder(std::string dsn, std::string schema, std::string worker, std::string application_name)
      : dsn_(std::move(dsn)), worker_(std::move(worker)), app_(std::move(application_name)),
        sql_("INSERT INTO " + schema + ".executions (job_id, run_lease, worker) VALUES ($1::bigint, $2::bigint, $3)"),
        span_sql_("INSERT INTO " + schema + ".spans (job_id, worker, started_at, ended_at) VALUES ($1::bigint, $3, "
                  "clock_timestamp() - $2::bigint * interval '1 microsecond', clock_timestamp())"),
        orders_sql_("INSERT INTO " + schema + ".orders (job_id, run_lease) VALUES ($1::bigint, $2::bigint)") {}

  /// Inserts and commits one execution row; throws when it could not (the runtime then retries
  /// the job, which is what a real handler failing its effect looks like).
  void record(std::int64_t job_id, std::int64_t run_lease) const { run(sql_, job_id, run_lease); }

  /// The caller-owned transaction of kind "charge": BEGIN, the business row, complete_in_tx, a
  /// little work, then COMMIT (or ROLLBACK when `commit` is false). Returns complete_in_tx's answer,
  /// or database_unavailable when the connection failed.
  tenure::result<tenure::finalization_receipt> charge(tenure::caller_owned_context& ctx, bool commit) const {
    PGconn* c = connection();
    const auto ok = [&](const std::string& sql, std::vector<std::string> params = {}) {
      std::vector<const char*> values;
      for (const auto& p : params) values.push_back(p.c_str());
      PGresult* r = PQexecParams(c, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0);
      const bool good = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
      PQclear(r);
      return good;
    };
    if (!ok("BEGIN") ||
        !ok(orders_sql_, {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())})) {
      ok("ROLLBACK");
      return tenure::error{tenure::errc::database_unavailable, "orders: " + std::string{PQerrorMessage(c)}};
    }
    auto receipt = ctx.complete_in_tx(c);
    thread_local std::mt19937 rng{std::random_device{}()};
    std::this_thread::sleep_for(std::chrono::microseconds{1000 + rng() % 2000});
    if (!receipt || !commit) {
      ok("ROLLBACK");
      if (!receipt) return receipt;
      return tenure::error{tenure::errc::database_unavailable, "the provider said no: rolled back"};
    }
    if (!ok("COMMIT")) return tenure::error{tenure::errc::commit_in_doubt, PQerrorMessage(c)};
    // The test reads which commits were acknowledged (the failover tests: none of them is lost).
    static std::mutex out;
    const std::lock_guard lock{out};
    std::printf("acked %lld %lld\n", static_cast<long long>(ctx.job_id()), static_cast<long long>(ctx.run_lease()));
    std::fflush(stdout);
    return receipt;
  }

  /// Inserts and commits one span row: it ended now and lasted `us` microseconds.
  void span(std::int64_t job_id, std::int64_t us) const { run(span_sql_, job_id, us); }

 private:
  /// This thread's session, (re)opened when needed; throws when it cannot connect.
  PGconn* connection() const {
    struct conn_holder {
      PGconn* c = nullptr;
      ~conn_holder() {
        if (c) PQfinish(c);
      }
    };
    thread_local conn_holder conn;
    if (conn.c == nullptr || PQstatus(conn.c) != CONNECTION_OK) {
      if (conn.c) PQfinish(conn.c);
      // Named like the runtime's own sessions, so the test sees every session of this process.
      const char* keys[] = {"dbname", "application_name", nullptr};
      const char* vals[] = {dsn_.c_str(), app_.c_str(), nullptr};
      conn.c = PQconnectdbParams(keys, vals, /*expand_dbname=*/1);
      if (PQstatus(conn.c) != CONNECTION_OK) {
        std::string msg = PQerrorMessage(conn.c);
        PQfinish(conn.c);
        conn.c = nullptr;
        throw std::runtime_error("executions: cannot connect: " + msg);
      }
    }
    return conn.c;
  }

  void run(const std::string& sql, std::int64_t a, std::int64_t b) const {
    PGconn* c = connection();
    const std::string first = std::to_string(a), second = std::to_string(b);
    const char* values[] = {first.c_str(), second.c_str(), worker_.c_str()};
    // BEGIN; INSERT; COMMIT as one autocommit statement: the row is durable when this returns.
    PGresult* r = PQexecParams(c, sql.c_str(), 3, nullptr, values, nullptr, nullptr, 0);
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    std::string err = ok ? "" : PQresultErrorMessage(r);
    PQclear(r);
    if (!ok) throw std::runtime_error("insert failed: " + err);
  }

  std::string dsn_;
  std::string worker_;
  std::string app_;
  std::string sql_;
  std::string span_sql_;
  std::string orders_sql_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 5 && std::string{argv[4]} == "no-maintenance")) {
    std::fprintf(stderr, "usage: %s DSN SCHEMA WORKER_NAME [no-maintenance]\n", argv[0]);
    return 2;
  }
  const std::string dsn = argv[1], schema = argv[2], name = argv[3];

  // Block the stop signals in every thread (threads inherit the mask); main waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Logs to stderr: stdout is the protocol with the test.
  spdlog::set_default_logger(spdlog::stderr_color_mt("tenure-" + name));
  spdlog::set_pattern("%H:%M:%S.%e [%n] %l %v");
  spdlog::set_level(spdlog::level::info);
  tenure::set_logger(spdlog::default_logger());  // tenure's own lines, the same way

  tenure::postgres::runtime_options opt;
  opt.dsn = dsn;
  opt.schema = schema;
  opt.application_name = "tenure-mp-" + name;
  auto& cfg = opt.runtime;
  // TENURE_MP_CONCURRENCY: the process's capacity (default 16), so a test can make a per-queue
  // limit reachable only by several processes together.
  const char* concurrency = std::getenv("TENURE_MP_CONCURRENCY");
  cfg.queues = {{.name = "default", .max_concurrency = concurrency ? std::atoi(concurrency) : 16}};
  cfg.heartbeat_interval = 200ms;
  // Not 3 x heartbeat: at start-up three processes open ~60 sessions at once, and on a loaded
  // 2-core machine a session takes up to ~1 s to open. The runtime opens its pool lazily, so the
  // first heartbeats wait for that; with 600 ms the leader rescued live attempts of a survivor.
  cfg.staleness = 2'000ms;
  cfg.maintenance_interval = 100ms;
  cfg.poll_interval = 100ms;
  cfg.flush_delay = 2ms;
  cfg.shutdown_timeout = 10s;
  cfg.worker_id = "mp-" + name;
  cfg.maintenance = argc == 4;

  auto made = tenure::postgres::make_runtime(opt);
  if (!made) {
    std::fprintf(stderr, "worker %s: make_runtime failed: %s: %s\n", name.c_str(), made.error().message().c_str(),
                 made.error().message().c_str());
    return 1;
  }
  auto rt = std::move(made).value();

  const exec_recorder recorder{dsn, schema, name, opt.application_name};
  rt->handle("exec", [&recorder](tenure::job_context& ctx) {
    recorder.record(ctx.job_id(), ctx.run_lease());
    // Then a little more work (1-3 ms): at any moment this process holds attempts that have
    // executed (their row is committed) but are not completed yet, which a crash makes run again.
    thread_local std::mt19937 rng{std::random_device{}()};
    std::this_thread::sleep_for(std::chrono::microseconds{1000 + rng() % 2000});
    return tenure::job_outcome::completed();
  });

  rt->handle("span", [&recorder](tenure::job_context& ctx) {
    const auto began = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(20ms);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - began);
    recorder.span(ctx.job_id(), us.count());
    return tenure::job_outcome::completed();
  });

  rt->handle("hold", [&recorder](tenure::job_context& ctx) {
    recorder.record(ctx.job_id(), ctx.run_lease());
    if (ctx.attempt() == 1) ctx.wait_cancelled(60s);
    return tenure::job_outcome::completed();
  });

  rt->handle("park", [&recorder](tenure::job_context& ctx) {
    recorder.record(ctx.job_id(), ctx.run_lease());
    if (auto payload = ctx.resumed_with()) return tenure::job_outcome::completed(*payload);
    auto cb = ctx.register_callback(60s);
    if (!cb) return tenure::job_outcome::retry("register_callback: " + cb.error().message());
    return tenure::job_outcome::park(cb.value());
  });

  rt->handle("park_hold", [&recorder](tenure::job_context& ctx) {
    recorder.record(ctx.job_id(), ctx.run_lease());
    if (auto payload = ctx.resumed_with()) {
      if (ctx.attempt() == 1) ctx.wait_cancelled(60s);
      return tenure::job_outcome::completed(*payload);
    }
    auto cb = ctx.register_callback(60s);
    if (!cb) return tenure::job_outcome::retry("register_callback: " + cb.error().message());
    return tenure::job_outcome::park(cb.value());
  });

  rt->handle_caller_owned("charge", [&recorder](tenure::caller_owned_context& ctx) {
    return recorder.charge(ctx, !(ctx.job_id() % 7 == 0 && ctx.attempt() == 1));
  });

  std::atomic<std::uint64_t> completed{0};
  rt->on_event([&completed](const tenure::job_event& e) {
    if (e.event == tenure::lifecycle_event::completed) completed.fetch_add(1, std::memory_order_relaxed);
  });

  if (auto started = rt->start(); !started) {
    std::fprintf(stderr, "worker %s: start failed: %s\n", name.c_str(), started.error().message().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  spdlog::info("worker {}: signal {}, stopping", name, sig);
  rt->stop();
  const auto m = rt->metrics();
  std::printf("completed=%llu stale=%llu\n", static_cast<unsigned long long>(completed.load()),
              static_cast<unsigned long long>(m.stale_rejected));
  std::fflush(stdout);
  spdlog::info("worker {}: completed={} stale={} claimed={} rescued={} database_errors={}", name, completed.load(),
               m.stale_rejected, m.claimed, m.rescued, m.database_errors);
  rt.reset();
  return 0;
}
