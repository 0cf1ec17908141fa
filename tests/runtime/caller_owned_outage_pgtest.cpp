// Outage after a caller-owned handler exits: the server is stopped right as the handler returns.
// With max concurrency 1 and a short reconcile budget, the runtime releases the permit after the
// budget while the attempt stays open in the database and no completion or retry is attempted;
// once the server is back, the attempt is resolved exactly once.
//
// Stops and starts the project's PostgreSQL ($TENURE_PG_SCRIPT, as scripts/test exports it): it
// is registered RUN_SERIAL and must never run beside other tests.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "tenure/testing/faulty_store.hpp"
#include "support/pg.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/store.hpp"

namespace tenure::test {
namespace {

using namespace std::chrono_literals;
using testing::op;

template <class Cond>
bool poll_until(Cond cond, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

int pg_script(const char* verb) {
  const char* script = std::getenv("TENURE_PG_SCRIPT");
  if (script == nullptr) return -1;
  return std::system((std::string{"'"} + script + "' " + verb + " >/dev/null 2>&1").c_str());
}

TEST(caller_owned_outage, permit_is_released_after_the_budget_without_any_write_and_resolved_once_when_back) {
  ASSERT_NE(std::getenv("TENURE_PG_SCRIPT"), nullptr)
      << "TENURE_PG_SCRIPT is not set: this test stops and starts the server through scripts/pg (run it via "
         "scripts/test)";
  scoped_schema schema{"outage"};
  {
    pg setup{schema.dsn()};
    setup.exec("CREATE TABLE " + schema.name() + ".orders (job_id bigint, run_lease bigint)");
  }
  auto opened = postgres::store::open({.dsn = schema.dsn(), .schema = schema.name(), .acquire_timeout = 2s});
  ASSERT_TRUE(opened) << opened.error().message();
  std::shared_ptr<postgres::store> inner{std::move(opened).value()};
  // A pass-through decorator (no faults armed) that counts every call the runtime makes.
  auto counted = std::make_shared<testing::faulty_store>(*inner);

  runtime_config cfg;
  cfg.queues = {{.name = "default", .max_concurrency = 1, .backoff_base = 1ms, .backoff_cap = 1ms}};
  cfg.heartbeat_interval = 200ms;
  cfg.poll_interval = 100ms;
  cfg.maintenance_interval = 100ms;
  cfg.staleness = 10s;  // the rescue deadline is far: the budget decides
  cfg.reconcile_budget = 300ms;
  cfg.sql_schema = schema.name();
  auto made = runtime::create(cfg, counted, postgres::make_signal_port(schema.dsn(), schema.name()));
  ASSERT_TRUE(made) << made.error().message();
  auto rt = std::move(made).value();

  std::atomic<int> stop_rc{-2};
  std::atomic<std::int64_t> stopped_ns{0};
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    if (ctx.attempt() == 1) {
      // The provider call failed; as the handler exits, the database goes down.
      const int rc = pg_script("stop");
      stopped_ns = std::chrono::steady_clock::now().time_since_epoch().count();
      stop_rc = rc;
      ctx.note_failure("provider unreachable");
      return make_error_code(errc::database_unavailable);
    }
    pg conn{schema.dsn()};
    conn.exec("BEGIN");
    conn.exec("INSERT INTO " + schema.name() + ".orders VALUES ($1, $2)",
              {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())});
    auto r = ctx.complete_in_tx(conn.native());
    conn.query(r ? "COMMIT" : "ROLLBACK");
    return r;
  });
  ASSERT_TRUE(rt->start());
  auto id = inner->enqueue({.kind = "charge"});
  ASSERT_TRUE(id);

  // Whatever fails below, the shared server is started again before the test returns: the
  // tests that run after this one need it.
  struct restart_guard {
    bool armed = true;
    ~restart_guard() {
      if (armed) pg_script("start");
    }
  } restart_on_exit;
  ASSERT_TRUE(poll_until([&] { return stop_rc.load() != -2; }, 20s));
  ASSERT_EQ(stop_rc.load(), 0) << "scripts/pg stop failed";
  const std::chrono::steady_clock::time_point stopped_at{std::chrono::steady_clock::duration{stopped_ns.load()}};
  ASSERT_TRUE(poll_until([&] { return rt->metrics().watching == 1; }, 10s)) << "permit never released";
  const auto released_after = std::chrono::steady_clock::now() - stopped_at;
  const auto m = rt->metrics();
  EXPECT_EQ(m.permits_held, 0) << "max concurrency 1: the only permit is free again";
  EXPECT_EQ(m.in_flight, 1) << "the watcher keeps the attempt";
  EXPECT_GE(released_after, 300ms) << "not before the budget (counted from the handler's exit)";
  EXPECT_GE(counted->calls(op::reconcile), 2) << "still reconciling";
  EXPECT_EQ(counted->calls(op::fail) + counted->calls(op::complete) + counted->calls(op::snooze) +
                counted->calls(op::cancel_attempt),
            0)
      << "no completion or retry is written without evidence";

  restart_on_exit.armed = false;
  ASSERT_EQ(pg_script("start"), 0) << "scripts/pg start failed";
  ASSERT_TRUE(poll_until([&] {
    auto j = inner->read_job(id.value());
    return j && j.value().state == job_state::completed;
  }, 60s)) << "the attempt was never resolved";
  ASSERT_TRUE(rt->wait_idle(10s));
  rt->stop();

  pg check{schema.dsn()};
  EXPECT_EQ(check.scalar("SELECT state || ' ' || attempt || ' ' || last_error FROM " + schema.name() +
                             ".jobs WHERE id = $1",
                         {std::to_string(id.value())}),
            "completed 2 provider unreachable")
      << "attempt 1 stayed open through the outage and was retried once by the policy";
  EXPECT_EQ(counted->forwarded(op::fail), 1) << "exactly one guarded retry write, after the server came back";
  EXPECT_EQ(check.scalar("SELECT count(*) FROM " + schema.name() + ".orders"), "1");
  EXPECT_EQ(check.scalar("SELECT count(*) FROM " + schema.name() + ".orders o JOIN " + schema.name() +
                         ".jobs j ON j.id = o.job_id AND j.run_lease = o.run_lease"),
            "1") << "the business row is the completing attempt's";
  EXPECT_EQ(rt->metrics().watching, 0);
  EXPECT_EQ(rt->metrics().completed, 1u);
}

}  // namespace
}  // namespace tenure::test
