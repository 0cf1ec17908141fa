#pragma once
// Shared fixture for runtime tests against the project's PostgreSQL.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "support/eventually.hpp"
#include "support/pg.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/store.hpp"

namespace tenure::test {

using namespace std::chrono_literals;

class runtime_pg : public ::testing::Test {
 protected:
  scoped_schema schema_{"rt"};
  pg db_{schema_.dsn()};

  std::string s(const std::string& name) const { return schema_.name() + "." + name; }

  /// A runtime on this test's schema with test-friendly defaults (fast flush, fast heartbeat).
  std::unique_ptr<runtime> make(runtime_config cfg = fast_config()) {
    auto r = postgres::make_runtime({.dsn = schema_.dsn(), .schema = schema_.name(), .runtime = std::move(cfg)});
    if (!r) throw std::runtime_error("make_runtime: " + r.error().message());
    return std::move(r).value();
  }
  static runtime_config fast_config() {
    runtime_config c;
    c.queues = {{.name = "default", .max_concurrency = 8}};
    c.heartbeat_interval = 200ms;
    c.poll_interval = 200ms;
    c.maintenance_interval = 100ms;
    c.flush_delay = 1ms;
    c.shutdown_timeout = 5s;
    return c;
  }
  std::shared_ptr<postgres::store> open_store() {
    auto st = postgres::store::open({.dsn = schema_.dsn(), .schema = schema_.name()});
    if (!st) throw std::runtime_error("store: " + st.error().message());
    return std::shared_ptr<postgres::store>(std::move(st).value());
  }
  std::string enqueue(const std::string& kind, const std::string& args = "{}", const std::string& queue = "default",
                      int max_attempts = 25) {
    return db_.scalar("SELECT " + s("enqueue") + "($1, $2::jsonb, $3, 2, NULL, $4::int)",
                      {kind, args, queue, std::to_string(max_attempts)});
  }
  void enqueue_many(int n, const std::string& kind = "noop", const std::string& queue = "default") {
    db_.exec("SELECT count(*) FROM " + s("enqueue_batch") +
                 "(array_fill($1::text, ARRAY[$3::int]), array_fill('{}'::jsonb, ARRAY[$3::int]), "
                 "array_fill($2::text, ARRAY[$3::int]), array_fill(2, ARRAY[$3::int]))",
             {kind, queue, std::to_string(n)});
  }
  long count(const std::string& where) {
    return std::stol(db_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE " + where));
  }
  std::string state_of(const std::string& id) {
    return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id});
  }
  /// Polls `cond` until true or `timeout` (a deadline on every wait, never a bare sleep).
  template <class Cond>
  static bool eventually(Cond cond, std::chrono::milliseconds timeout = std::chrono::seconds{20}) {
    return test::eventually(std::move(cond), timeout, std::chrono::milliseconds{2});
  }
};

}  // namespace tenure::test
