// Through a real PgBouncer with its default settings in transaction pooling mode
// (TENURE_TEST_POOLER_DSN, scripts/pgbouncer): what producers and tools do works, nothing is left
// on the pooled server sessions, and the runtime refuses to start, taking no lock. Through a
// session-mode pool (TENURE_TEST_SESSION_POOLER_DSN) the runtime runs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "support/pg.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/store.hpp"

using namespace std::chrono_literals;
using tenure::errc;
using tenure::postgres::store;
using tenure::test::pg;
using tenure::test::scoped_schema;

namespace {

class pooler : public ::testing::Test {
 protected:
  std::unique_ptr<store> open_store(const std::string& dsn, int pool_size = 2) {
    auto s = store::open({.dsn = dsn, .schema = schema_.name(), .pool_size = pool_size});
    EXPECT_TRUE(s) << s.error().message();
    return s ? std::move(s).value() : nullptr;
  }
  long count(const std::string& sql, const std::vector<tenure::test::cell>& params = {}) {
    return std::stol(direct_.scalar(sql, params));
  }
  std::string s(const std::string& name) const { return schema_.name() + "." + name; }

  scoped_schema schema_{"pool"};
  std::string pooled_ = tenure::test::pooler_dsn();
  pg direct_{schema_.dsn()};
};

TEST_F(pooler, several_store_clients_enqueue_claim_and_complete_repeatedly_through_transaction_pooling) {
  constexpr int k_clients = 4, k_rounds = 25;
  std::atomic<int> failures{0};
  std::vector<std::string> errors(k_clients);
  std::vector<std::thread> clients;
  for (int t = 0; t < k_clients; ++t) {
    clients.emplace_back([&, t] {
      auto opened = store::open({.dsn = pooled_, .schema = schema_.name(), .pool_size = 2});
      if (!opened) {
        errors[t] = "open: " + opened.error().message();
        ++failures;
        return;
      }
      auto& st = *opened.value();
      const std::string queue = "q" + std::to_string(t);
      for (int i = 0; i < k_rounds; ++i) {
        auto id = st.enqueue({.kind = "k", .args = {{"i", i}}, .queue = queue});
        if (!id) {
          errors[t] = "enqueue round " + std::to_string(i) + ": " + id.error().message();
          ++failures;
          return;
        }
        auto got = st.claim(queue, 1, "w" + std::to_string(t));
        if (!got || got.value().size() != 1 || got.value()[0].attempt.job_id != id.value()) {
          errors[t] = "enqueue/claim round " + std::to_string(i) + ": " + (got ? "wrong claim" : got.error().message());
          ++failures;
          return;
        }
        const tenure::completion done{got.value()[0].attempt, std::nullopt};
        auto completed = st.complete({&done, 1});
        auto job = st.read_job(id.value());
        if (!completed || !completed.value().at(0).applied || !job || job.value().state != tenure::job_state::completed) {
          errors[t] = "complete round " + std::to_string(i) + ": " + (completed ? "not applied" : completed.error().message());
          ++failures;
          return;
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(count("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'"), k_clients * k_rounds);
}

TEST_F(pooler, store_clients_enqueue_large_batches_over_copy_concurrently_through_transaction_pooling) {
  // Each batch is BEGIN, the stage, COPY, the move, COMMIT on whatever server session the pooler
  // gives that transaction: the stage is made where it is missing and holds one batch at a time.
  constexpr int k_clients = 3, k_rounds = 6;
  std::vector<std::future<std::string>> clients;  // each: what went wrong, or ""
  for (int t = 0; t < k_clients; ++t) {
    clients.push_back(std::async(std::launch::async, [&, t]() -> std::string {
      auto st = open_store(pooled_);
      if (!st) return "open failed";
      const std::string queue = "copy" + std::to_string(t);
      for (int i = 0; i < k_rounds; ++i) {
        const std::vector<tenure::new_job> jobs(1'000 + i, tenure::new_job{.kind = "k", .args = {{"round", i}}, .queue = queue});
        auto ids = st->enqueue_batch(jobs);
        if (!ids) return "round " + std::to_string(i) + ": " + ids.error().message();
        if (ids.value().size() != jobs.size()) return "round " + std::to_string(i) + ": wrong number of ids";
      }
      return "";
    }));
  }
  for (auto& c : clients) EXPECT_EQ(c.get(), "");
  for (int t = 0; t < k_clients; ++t) {
    for (int i = 0; i < k_rounds; ++i) {
      EXPECT_EQ(count("SELECT count(*) FROM " + s("jobs") + " WHERE queue = $1 AND args->>'round' = $2",
                      {"copy" + std::to_string(t), std::to_string(i)}),
                1'000 + i)
          << "client " << t << " round " << i;
    }
  }
}

TEST_F(pooler, a_store_detects_a_pooler_by_its_backend_key_and_keeps_named_statements_only_on_a_direct_session) {
  auto through = open_store(pooled_);
  auto direct = open_store(schema_.dsn());
  ASSERT_TRUE(through && direct);
  EXPECT_EQ(through->options().pool_mode, tenure::postgres::pool_mode::transaction);
  EXPECT_EQ(direct->options().pool_mode, tenure::postgres::pool_mode::session);
  // A direct session prepares by name; the pooled one never does (its server sessions show none).
  ASSERT_TRUE(direct->enqueue({.kind = "k"}));
  ASSERT_TRUE(through->enqueue({.kind = "k"}));
  EXPECT_EQ(count("SELECT count(*) FROM " + s("jobs")), 2);
}

TEST_F(pooler, lock_timeout_bounds_a_wait_through_transaction_pooling_and_stays_off_the_pooled_sessions) {
  auto opened = store::open(
      {.dsn = pooled_, .schema = schema_.name(), .pool_size = 2, .lock_timeout = 300ms});
  ASSERT_TRUE(opened) << opened.error().message();
  auto& st = *opened.value();
  ASSERT_TRUE(st.enqueue({.kind = "warm"}));

  pg locker{schema_.dsn()};
  locker.exec("BEGIN");
  locker.exec("LOCK TABLE " + s("ready") + " IN ACCESS EXCLUSIVE MODE");
  const auto t0 = std::chrono::steady_clock::now();
  auto blocked = st.enqueue({.kind = "k"});
  const auto waited = std::chrono::steady_clock::now() - t0;
  locker.exec("ROLLBACK");
  ASSERT_FALSE(blocked);
  EXPECT_EQ(blocked.error(), errc::transient_conflict) << blocked.error().message();
  EXPECT_LT(waited, 3s) << "the wait was bounded by the store's lock_timeout";

  // Pin several server sessions at once and look at each: none kept the store's setting (a SET
  // at connect would have stayed on the pooled session, for every later client).
  std::vector<std::unique_ptr<pg>> raw;
  for (int i = 0; i < 6; ++i) {
    raw.push_back(std::make_unique<pg>(pooled_, /*session_settings=*/false));
    raw.back()->exec("BEGIN");
    EXPECT_NE(raw.back()->scalar("SHOW lock_timeout"), "300ms")
        << "server session " << raw.back()->scalar("SELECT pg_backend_pid()");
  }
  for (auto& r : raw) r->exec("COMMIT");
}

TEST_F(pooler, producers_enqueue_in_their_own_transactions_concurrently_through_transaction_pooling) {
  direct_.exec("CREATE TABLE " + s("orders") + " (id serial PRIMARY KEY, producer int NOT NULL)");
  constexpr int k_rounds = 40;
  std::vector<std::string> errors(4);
  std::vector<std::thread> producers;
  // Two producers with plain SQL in their own transactions (any driver does this)...
  for (int t = 0; t < 2; ++t) {
    producers.emplace_back([&, t] {
      try {
        pg db{pooled_, /*session_settings=*/false};
        for (int i = 0; i < k_rounds; ++i) {
          db.exec("BEGIN");
          db.exec("INSERT INTO " + s("orders") + " (producer) VALUES ($1::int)", {std::to_string(t)});
          db.exec("SELECT " + s("enqueue") + "($1, $2::jsonb, 'sql')", {"charge", R"({"i":)" + std::to_string(i) + "}"});
          db.exec("COMMIT");
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  // ... and two through the store (single and batch enqueue).
  for (int t = 2; t < 4; ++t) {
    producers.emplace_back([&, t] {
      auto opened = store::open({.dsn = pooled_, .schema = schema_.name(), .pool_size = 1});
      if (!opened) {
        errors[t] = opened.error().message();
        return;
      }
      for (int i = 0; i < k_rounds / 2; ++i) {
        auto one = opened.value()->enqueue({.kind = "charge", .queue = "store"});
        if (!one) {
          errors[t] = one.error().message();
          return;
        }
        std::vector<tenure::new_job> two{{.kind = "charge", .queue = "store"}, {.kind = "charge", .queue = "store"}};
        auto batch = opened.value()->enqueue_batch(two);
        if (!batch) {
          errors[t] = batch.error().message();
          return;
        }
      }
    });
  }
  for (auto& p : producers) p.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(count("SELECT count(*) FROM " + s("orders")), 2 * k_rounds);
  EXPECT_EQ(count("SELECT count(*) FROM " + s("jobs") + " WHERE queue = 'sql'"), 2 * k_rounds);
  EXPECT_EQ(count("SELECT count(*) FROM " + s("jobs") + " WHERE queue = 'store'"), 2 * 3 * (k_rounds / 2));
}

TEST_F(pooler, the_runtime_refuses_transaction_pooling_at_start_naming_the_cause_and_the_fix_and_leaves_no_lock) {
  const std::string app = "tenure_refused_" + tenure::test::random_suffix();
  ASSERT_TRUE(direct_.exec("SELECT " + s("enqueue") + "('k')").ok);
  const auto t0 = std::chrono::steady_clock::now();
  auto rt = tenure::postgres::make_runtime(
      {.dsn = pooled_, .schema = schema_.name(), .application_name = app,
       .runtime = {.maintenance_interval = 50ms}});
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(rt) << "the runtime must not run without a session of its own";
  if (rt) {
    // What it did before: ran deaf, and its maintenance leadership stayed in the pool.
    rt.value()->handle("k", [](tenure::job_context&) { return tenure::job_outcome::completed(); });
    (void)rt.value()->start();
    rt.value()->maintenance_now();
    std::this_thread::sleep_for(500ms);
    rt.value()->stop();
    rt.value().reset();
  } else {
    EXPECT_EQ(rt.error(), errc::invalid_argument);
    for (const char* part : {"session of its own", "LISTEN/NOTIFY", "transaction", "pgbouncer",
                             "Connect the runtime directly", "session-mode pool"}) {
      EXPECT_NE(rt.error().message().find(part), std::string::npos) << "missing '" << part << "' in: " << rt.error().message();
    }
    EXPECT_LT(took, 15s);
  }
  // No advisory lock anywhere for this schema's maintenance, and none on a server session this
  // runtime's connections used.
  EXPECT_EQ(count("SELECT count(*) FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
                  "WHERE l.locktype = 'advisory' AND (a.application_name = $1 OR "
                  "((l.classid::bigint << 32) | l.objid::bigint) = hashtext('tenure.maintenance:' || $2)::bigint)",
                  {app, schema_.name()}),
            0);
  EXPECT_EQ(count("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'available'"), 1) << "nothing was claimed";
}

TEST_F(pooler, the_runtime_runs_through_a_session_mode_pool) {
  auto rt = tenure::postgres::make_runtime(
      {.dsn = tenure::test::session_pooler_dsn(), .schema = schema_.name()});
  ASSERT_TRUE(rt) << rt.error().message();
  std::atomic<int> ran{0};
  rt.value()->handle("k", [&](tenure::job_context&) {
    ++ran;
    return tenure::job_outcome::completed();
  });
  ASSERT_TRUE(rt.value()->start());
  for (int i = 0; i < 3; ++i) direct_.exec("SELECT " + s("enqueue") + "('k')");
  for (int i = 0; i < 400 && count("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'") < 3; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  rt.value()->stop();
  EXPECT_EQ(count("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'"), 3);
  EXPECT_EQ(ran.load(), 3);
}

}  // namespace
