// Database trouble mid-run: the runtime's backends are terminated (pg_terminate_backend), then
// the server is restarted. The runtime logs, reconnects with backoff and finishes every job,
// each completed once.
//
// This test restarts the project's PostgreSQL ($TENURE_PG_SCRIPT restart, as scripts/test
// exports it): it is registered RUN_SERIAL and must never run beside other tests.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "support/pg.hpp"
#include "tenure/postgres/runtime.hpp"

namespace tenure::test {
namespace {

using namespace std::chrono_literals;
using std::chrono::steady_clock;

constexpr int k_jobs = 5'000;
constexpr long k_terminate_after = 1'000;
constexpr long k_restart_after = 2'500;
constexpr auto k_finish_deadline = 120s;

template <class Cond>
bool poll_until(Cond cond, std::chrono::milliseconds timeout, std::chrono::milliseconds every = 5ms) {
  const auto until = steady_clock::now() + timeout;
  while (steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(every);
  }
  return cond();
}

/// Counts what the runtime logged at warning level or above (it must say what went wrong).
class warning_counter final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::atomic<long> warnings{0};
  std::atomic<long> retry_notes{0};  ///< "retrying in <n> ms": the backoff is visible

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn) return;
    ++warnings;
    if (std::string_view{msg.payload.data(), msg.payload.size()}.find("retrying in") != std::string_view::npos) {
      ++retry_notes;
    }
  }
  void flush_() override {}
};

/// The test's own session, reopened when the server went away (after the restart).
class admin_session {
 public:
  explicit admin_session(std::string dsn) : dsn_(std::move(dsn)) { conn_ = std::make_unique<pg>(dsn_); }

  /// Runs `sql` (one row, one column); on a broken session reconnects and retries until
  /// `timeout`. Throws when the server stays unreachable or the statement fails for real.
  std::string scalar(const std::string& sql, const std::vector<cell>& params = {},
                     std::chrono::milliseconds timeout = 60s) {
    const auto until = steady_clock::now() + timeout;
    std::string last_error;
    for (;;) {
      if (conn_ && PQstatus(conn_->native()) == CONNECTION_OK) {
        auto r = conn_->query(sql, params);
        if (r.ok) {
          if (r.rows.empty() || r.rows[0].empty()) throw std::runtime_error("no rows from: " + sql);
          return r.rows[0][0].value_or("<NULL>");
        }
        last_error = "SQLSTATE " + r.sqlstate + ": " + r.error;
        if (PQstatus(conn_->native()) == CONNECTION_OK && !r.sqlstate.starts_with("57P") &&
            !r.sqlstate.starts_with("08")) {
          throw std::runtime_error(last_error + " in: " + sql);
        }
      }
      if (steady_clock::now() >= until) throw std::runtime_error("admin session: gave up: " + last_error);
      conn_.reset();
      try {
        conn_ = std::make_unique<pg>(dsn_);
        ++reconnects_;
      } catch (const std::exception& e) {
        last_error = e.what();
        std::this_thread::sleep_for(50ms);  // server still down: poll again
      }
    }
  }
  long count(const std::string& sql, const std::vector<cell>& params = {}) { return std::stol(scalar(sql, params)); }
  int reconnects() const noexcept { return reconnects_; }

 private:
  std::string dsn_;
  std::unique_ptr<pg> conn_;
  int reconnects_ = 0;
};

class db_trouble_pg : public ::testing::Test {
 protected:
  scoped_schema schema_{"trouble"};
  admin_session admin_{schema_.dsn()};
  std::atomic<long> ran_{0};  // handler runs (outlives the runtime, which is declared after it)
  std::unique_ptr<runtime> rt_;

  std::string s(const std::string& name) const { return schema_.name() + "." + name; }

  std::shared_ptr<warning_counter> log_ = std::make_shared<warning_counter>();

  void SetUp() override {
    spdlog::set_level(spdlog::level::info);
    tenure::logger()->sinks().push_back(log_);  // before any runtime thread logs
  }
  void TearDown() override {
    if (rt_) rt_->stop();
    rt_.reset();
    auto& sinks = tenure::logger()->sinks();
    std::erase(sinks, std::static_pointer_cast<spdlog::sinks::sink>(log_));
  }
};

TEST_F(db_trouble_pg, terminated_backends_and_a_server_restart_mid_run_lose_no_job) {
  const char* script = std::getenv("TENURE_PG_SCRIPT");
  ASSERT_TRUE(script != nullptr && *script != '\0')
      << "TENURE_PG_SCRIPT is not set: this test restarts the server through scripts/pg (run it via "
         "scripts/test, or export TENURE_PG_SCRIPT=<abs path of scripts/pg> with the same TENURE_PG_DIR as the "
         "server behind TENURE_TEST_DSN)";

  admin_.scalar("SELECT count(*) FROM " + s("enqueue_batch") +
                "(array_fill('work'::text, ARRAY[$1::int]), array_fill('{}'::jsonb, ARRAY[$1::int]), "
                "array_fill('default'::text, ARRAY[$1::int]), array_fill(2, ARRAY[$1::int]))",
                {std::to_string(k_jobs)});
  ASSERT_EQ(admin_.count("SELECT count(*) FROM " + s("ready")), k_jobs);

  const std::string app = "tenure-trouble-" + random_suffix();
  postgres::runtime_options opt;
  opt.dsn = schema_.dsn();
  opt.schema = schema_.name();
  opt.application_name = app;
  opt.runtime.queues = {{.name = "default", .max_concurrency = 4}};
  opt.runtime.heartbeat_interval = 200ms;
  opt.runtime.poll_interval = 100ms;
  opt.runtime.maintenance_interval = 100ms;
  opt.runtime.flush_delay = 1ms;
  opt.runtime.shutdown_timeout = 10s;
  auto made = postgres::make_runtime(opt);
  ASSERT_TRUE(made) << made.error().message();
  rt_ = std::move(made).value();
  rt_->handle("work", [this](job_context&) {
    std::this_thread::sleep_for(1ms);
    ++ran_;
    return job_outcome::completed();
  });
  const auto t0 = steady_clock::now();
  ASSERT_TRUE(rt_->start());
  const auto applied = [&] { return static_cast<long>(rt_->metrics().completed); };

  // 1. Terminate every backend of the runtime (pool and LISTEN session) mid-run.
  ASSERT_TRUE(poll_until([&] { return applied() >= k_terminate_after; }, 60s))
      << "the runtime did not complete " << k_terminate_after << " jobs (completed " << applied() << ")";
  const long at_terminate = applied();
  const long terminated = admin_.count(
      "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
      {app});
  EXPECT_GE(terminated, 2) << "expected the runtime's pool and signal sessions to be terminated";
  ASSERT_LT(at_terminate, k_jobs) << "the run finished before the trouble: make the handler slower";
  const auto t_terminate = steady_clock::now();

  // 2. Restart the server once the runtime is back at work.
  ASSERT_TRUE(poll_until([&] { return applied() >= k_restart_after; }, 60s))
      << "the runtime did not recover from the terminated backends: completed " << applied() << " of " << k_jobs;
  const long at_restart = applied();
  const auto errors_before_restart = rt_->metrics().database_errors;
  const std::string started_before = admin_.scalar("SELECT pg_postmaster_start_time()::text");
  const auto t_restart = steady_clock::now();
  const std::string cmd = std::string{"'"} + script + "' restart >/dev/null";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "'" << script << " restart' failed (status " << rc << ")";
  const auto t_restarted = steady_clock::now();
  const std::string started_after = admin_.scalar("SELECT pg_postmaster_start_time()::text");
  ASSERT_NE(started_before, started_after) << "the server behind TENURE_TEST_DSN was not restarted by " << script;
  const long at_back = admin_.count("SELECT count(*) FROM " + s("done"));
  EXPECT_LT(at_back, k_jobs) << "all jobs were done before the server came back: the restart proves little";

  // 3. Everything finishes.
  long completed = 0;
  ASSERT_TRUE(poll_until(
      [&] {
        completed = admin_.count("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'");
        return completed == k_jobs;
      },
      k_finish_deadline, 50ms))
      << "only " << completed << " of " << k_jobs << " completed "
      << std::chrono::duration_cast<std::chrono::seconds>(k_finish_deadline).count()
      << " s after the restart; states: "
      << admin_.scalar("SELECT coalesce(string_agg(state || '=' || n, ', '), 'none') FROM (SELECT state, count(*) n "
                       "FROM " + s("jobs") + " GROUP BY state) x");
  const auto t_done = steady_clock::now();

  EXPECT_EQ(admin_.count("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'"), k_jobs);
  EXPECT_EQ(admin_.count("SELECT count(*) FROM " + s("jobs") + " WHERE state <> 'completed'"), 0);
  EXPECT_EQ(admin_.count("SELECT count(*) FROM " + s("jobs")), k_jobs);
  EXPECT_EQ(admin_.count("SELECT count(*) FROM " + s("done")), k_jobs);
  EXPECT_EQ(admin_.count("SELECT count(DISTINCT id) FROM " + s("done") + " WHERE state = 'completed'"), k_jobs);

  ASSERT_TRUE(rt_->wait_idle(30s)) << "the runtime still holds attempts after every job completed";
  rt_->stop();
  const auto m = rt_->metrics();
  EXPECT_GT(m.database_errors, 0u) << "the runtime never saw the trouble";
  EXPECT_GT(m.database_errors, errors_before_restart) << "the runtime never saw the restart";
  EXPECT_GT(log_->warnings.load(), 0) << "the runtime logged nothing about the trouble";
  EXPECT_GT(log_->retry_notes.load(), 0) << "the runtime never logged a retry with backoff";
  EXPECT_EQ(m.in_flight, 0);
  EXPECT_LE(m.completed, static_cast<std::uint64_t>(k_jobs));
  EXPECT_GE(static_cast<long>(ran_.load()), k_jobs);

  const auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
  std::cout << "db_trouble: terminated " << terminated << " backends at " << at_terminate << " applied ("
            << secs(t_terminate - t0) << " s); restart at " << at_restart << " applied ("
            << secs(t_restart - t0) << " s), server down/up for " << secs(t_restarted - t_restart)
            << " s, " << at_back << " done when it was back; all " << k_jobs << " completed "
            << secs(t_done - t_restarted) << " s after the restart (total " << secs(t_done - t0) << " s)\n"
            << "  handler runs " << ran_.load() << " (re-runs " << ran_.load() - k_jobs << "), applied " << m.completed
            << ", stale " << m.stale_rejected << ", rescued " << m.rescued << ", database_errors "
            << m.database_errors << " (" << errors_before_restart << " before the restart), flush_failures "
            << m.flush_failures << "; admin reconnects " << admin_.reconnects() << "; warnings logged "
            << log_->warnings.load() << " (" << log_->retry_notes.load() << " retry notes)\n";
}

}  // namespace
}  // namespace tenure::test
