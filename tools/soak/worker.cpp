// The soak's worker process (`tenure soak --worker NAME`): a PostgreSQL runtime with a handler for
// every kind of the workload. Each handler commits an execution row (job_id, run_lease, worker,
// outcome) in <rec>.executions before it returns its outcome; the caller-owned one writes its
// business row and completes its job in one transaction. Every session of the process is named
// tenure-soak-<NAME>, so the soak can terminate them. stdout says "ready" once started; the
// process runs until SIGTERM/SIGINT (or SIGKILL, which is the point).
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "soak/soak.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/runtime.hpp"

namespace tenure::soak {
namespace {

using namespace std::chrono_literals;

/// One libpq session per handler thread, reopened when it broke.
class session {
 public:
  session(std::string dsn, std::string app) : dsn_(std::move(dsn)), app_(std::move(app)) {}

  /// The thread's connection, connected; throws when the server cannot be reached.
  PGconn* conn() const {
    struct holder {
      PGconn* c = nullptr;
      ~holder() {
        if (c) PQfinish(c);
      }
    };
    thread_local holder h;
    if (h.c == nullptr || PQstatus(h.c) != CONNECTION_OK) {
      if (h.c) PQfinish(h.c);
      const char* keys[] = {"dbname", "application_name", nullptr};
      const char* vals[] = {dsn_.c_str(), app_.c_str(), nullptr};
      h.c = PQconnectdbParams(keys, vals, /*expand_dbname=*/1);
      if (PQstatus(h.c) != CONNECTION_OK) {
        std::string msg = PQerrorMessage(h.c);
        PQfinish(h.c);
        h.c = nullptr;
        throw std::runtime_error("soak worker: cannot connect: " + msg);
      }
    }
    return h.c;
  }

  /// Runs one statement; throws with the server's message when it failed.
  void exec(const std::string& sql, std::initializer_list<std::string> params) const {
    std::vector<const char*> values;
    for (const auto& p : params) values.push_back(p.c_str());
    PGresult* r = PQexecParams(conn(), sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                               nullptr, 0);
    const auto status = PQresultStatus(r);
    const bool ok = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
    std::string err = ok ? "" : PQresultErrorMessage(r);
    PQclear(r);
    if (!ok) throw std::runtime_error("soak worker: " + err);
  }

 private:
  std::string dsn_;
  std::string app_;
};

}  // namespace

int worker_main(const std::string& dsn, const std::string& tenure_schema, const std::string& name) {
  const names n = names_for(tenure_schema);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto log = spdlog::stderr_color_mt("soak-" + name);
  log->set_pattern("%H:%M:%S.%e [%n] %l %v");
  log->set_level(spdlog::level::warn);
  tenure::set_logger(log);

  postgres::runtime_options opt;
  opt.dsn = dsn;
  opt.schema = tenure_schema;
  opt.application_name = "tenure-soak-" + name;
  opt.pool_size = 6;
  auto& cfg = opt.runtime;
  cfg.queues = {{.name = "soak", .max_concurrency = 16, .backoff_base = 100ms, .backoff_cap = 1'000ms},
                {.name = "soak_deadline", .max_concurrency = 4, .hard_deadline = 2'000ms, .backoff_base = 100ms,
                 .backoff_cap = 1'000ms}};
  cfg.heartbeat_interval = 1'000ms;
  cfg.staleness = 6'000ms;
  cfg.maintenance_interval = 500ms;
  cfg.poll_interval = 500ms;
  cfg.shutdown_timeout = 5s;
  cfg.worker_id = "soak-" + name;
  cfg.max_caller_owned = 4;

  auto made = postgres::make_runtime(opt);
  if (!made) {
    std::fprintf(stderr, "soak worker %s: %s\n", name.c_str(), made.error().message().c_str());
    return 1;
  }
  auto rt = std::move(made).value();
  const session db{dsn, opt.application_name};
  const std::string exec_sql =
      "INSERT INTO " + n.rec + ".executions (job_id, run_lease, worker, outcome) VALUES ($1, $2, $3, $4)";
  const auto record = [&](const job_context& ctx, const std::string& outcome) {
    db.exec(exec_sql, {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease()), name, outcome});
  };
  const auto work = [] {
    thread_local std::mt19937 rng{std::random_device{}()};
    std::this_thread::sleep_for(std::chrono::microseconds{1'000 + rng() % 20'000});
  };
  // Registers a callback, records it with what the soak does with it, and parks on it.
  const std::string callback_sql = "INSERT INTO " + n.rec +
                                   ".callbacks (callback_id, job_id, run_lease, resolve) VALUES ($1, $2, $3, $4)";
  const auto park = [&](job_context& ctx, std::chrono::milliseconds timeout, const std::string& resolve) {
    auto id = ctx.register_callback(timeout);
    if (!id) return job_outcome::retry("register_callback: " + id.error().message());
    db.exec(callback_sql, {id.value(), std::to_string(ctx.job_id()), std::to_string(ctx.run_lease()), resolve});
    return job_outcome::park(id.value());
  };

  rt->handle("complete", [&](job_context& ctx) {
    record(ctx, "completed");
    work();
    return job_outcome::completed();
  });
  rt->handle("fail", [&](job_context& ctx) {
    record(ctx, "failed");
    return job_outcome::fail("failed as designed");
  });
  rt->handle("retry", [&](job_context& ctx) {
    if (ctx.attempt() < 3) {
      record(ctx, "retried");
      return job_outcome::retry_after(200ms, "retried as designed");
    }
    record(ctx, "completed");
    return job_outcome::completed();
  });
  rt->handle("snooze", [&](job_context& ctx) {
    if (ctx.run_lease() == 1) {
      record(ctx, "snoozed");
      return job_outcome::snooze(300ms);
    }
    record(ctx, "completed");
    return job_outcome::completed();
  });
  // Queue soak_deadline has a 2 s hard deadline: the first attempt outlives it and is rescued
  // (its late completion is stale); the next one completes.
  rt->handle("deadline", [&](job_context& ctx) {
    if (ctx.attempt() == 1) {
      record(ctx, "overran");
      ctx.wait_cancelled(20s);
      return job_outcome::completed();
    }
    record(ctx, "completed");
    return job_outcome::completed();
  });
  // Parks; the soak resumes the callback from outside and the continuation completes.
  rt->handle("park", [&](job_context& ctx) {
    if (auto payload = ctx.resumed_with()) {
      record(ctx, "resumed");
      return job_outcome::completed(*payload);
    }
    record(ctx, "parked");
    return park(ctx, 30s, "resume");
  });
  // Parks on a callback nobody answers: rescued when it times out, then completes.
  rt->handle("park_timeout", [&](job_context& ctx) {
    if (ctx.attempt() >= 2) {
      record(ctx, "completed");
      return job_outcome::completed();
    }
    record(ctx, "parked");
    return park(ctx, 2s, "timeout");
  });
  // Runs until the soak cancels it (or 20 s pass).
  rt->handle("cancel_running", [&](job_context& ctx) {
    record(ctx, "waiting_for_cancel");
    ctx.wait_cancelled(20s);
    return job_outcome::completed();
  });
  // Parks until the soak cancels it (or its callback times out; the next attempt completes).
  rt->handle("cancel_waiting", [&](job_context& ctx) {
    if (ctx.attempt() >= 2) {
      record(ctx, "completed");
      return job_outcome::completed();
    }
    record(ctx, "parked_for_cancel");
    return park(ctx, 20s, "cancel");
  });
  // Caller-owned: the business row and the completion commit together or not at all.
  const std::string business_sql =
      "INSERT INTO " + n.rec + ".business (job_id, run_lease, worker) VALUES ($1, $2, $3)";
  rt->handle_caller_owned("caller_owned", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    record(ctx, "completed_in_tx");
    work();
    PGconn* conn = db.conn();
    db.exec("BEGIN", {});
    try {
      db.exec(business_sql, {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease()), name});
    } catch (...) {
      PQclear(PQexec(conn, "ROLLBACK"));
      throw;
    }
    auto receipt = ctx.complete_in_tx(conn);
    if (!receipt) {
      PQclear(PQexec(conn, "ROLLBACK"));
      return receipt.error();
    }
    db.exec("COMMIT", {});  // a lost reply throws: the runtime reconciles with the database
    return receipt;
  });

  if (auto started = rt->start(); !started) {
    std::fprintf(stderr, "soak worker %s: start failed: %s\n", name.c_str(), started.error().message().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  rt->stop();
  rt.reset();
  return 0;
}

}  // namespace tenure::soak
