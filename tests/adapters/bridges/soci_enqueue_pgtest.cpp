// Transactional enqueue from C++ through the caller's own SOCI session and transaction.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <soci/postgresql/soci-postgresql.h>

#include "support/pg.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/soci.hpp"

using tenure::test::pg;
using tenure::test::scoped_schema;

namespace {

class soci_enqueue : public ::testing::Test {
 protected:
  void SetUp() override {
    session_.open(soci::postgresql, tenure::test::keyword_dsn(schema_.dsn()));
    session_ << "CREATE TABLE " + schema_.name() + ".orders (id serial PRIMARY KEY, note text)";
  }
  long count(const std::string& sql) { return std::stol(check_.scalar(sql)); }

  scoped_schema schema_{"soci"};
  soci::session session_;
  pg check_{schema_.dsn()};
  tenure::sql_options opts_{.schema = schema_.name()};
};

TEST_F(soci_enqueue, commit_makes_the_business_row_and_the_job_exist_together) {
  soci::transaction tx(session_);
  session_ << "INSERT INTO " + schema_.name() + ".orders (note) VALUES ('paid')";
  auto id = tenure::enqueue(session_, {.kind = "charge", .args = {{"order", 1}}}, opts_);
  ASSERT_TRUE(id) << id.error().message();
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".jobs"), 0) << "invisible before commit";
  tx.commit();
  EXPECT_EQ(check_.scalar("SELECT kind || ' ' || state || ' ' || (args->>'order') FROM " + schema_.name() +
                          ".jobs WHERE id = $1", {std::to_string(id.value())}),
            "charge available 1");
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".orders"), 1);
}

TEST_F(soci_enqueue, producers_enqueue_concurrently_through_transaction_pooling) {
  // Two producers, each with its own SOCI session through a PgBouncer in transaction mode with
  // default settings, each enqueueing in its own transactions, single and batch.
  const std::string pooled = tenure::test::keyword_dsn(tenure::test::pooler_dsn());
  constexpr int k_rounds = 30;
  std::vector<std::string> errors(2);
  std::vector<std::thread> producers;
  for (int t = 0; t < 2; ++t) {
    producers.emplace_back([&, t] {
      try {
        soci::session db(soci::postgresql, pooled);
        for (int i = 0; i < k_rounds; ++i) {
          soci::transaction tx(db);
          db << "INSERT INTO " + schema_.name() + ".orders (note) VALUES ('p" + std::to_string(t) + "')";
          auto one = tenure::enqueue(db, {.kind = "charge", .args = {{"i", i}}}, opts_);
          std::vector<tenure::new_job> two{{.kind = "charge"}, {.kind = "charge"}};
          auto batch = tenure::enqueue_batch(db, two, opts_);
          if (!one || !batch) {
            errors[t] = "round " + std::to_string(i) + ": " + (!one ? one.error() : batch.error()).message();
            return;
          }
          tx.commit();
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& p : producers) p.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".orders"), 2 * k_rounds);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".jobs"), 2 * 3 * k_rounds);
}

TEST_F(soci_enqueue, rollback_leaves_neither_the_business_row_nor_the_job) {
  {
    soci::transaction tx(session_);
    session_ << "INSERT INTO " + schema_.name() + ".orders (note) VALUES ('abandoned')";
    ASSERT_TRUE(tenure::enqueue(session_, {.kind = "charge"}, opts_));
    tx.rollback();
  }
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".jobs"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".orders"), 0);
}

TEST_F(soci_enqueue, invalid_job_is_rejected_before_anything_is_sent) {
  soci::transaction tx(session_);
  auto r = tenure::enqueue(session_, {.kind = "k", .priority = 9}, opts_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), tenure::errc::invalid_argument);
  // The caller's transaction is still usable: nothing was sent.
  session_ << "INSERT INTO " + schema_.name() + ".orders (note) VALUES ('still fine')";
  tx.commit();
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".orders"), 1);
}

TEST_F(soci_enqueue, metadata_enqueued_in_the_callers_transaction_reaches_the_handler) {
  const nlohmann::json m{{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
  soci::transaction tx(session_);
  auto one = tenure::enqueue(session_, {.kind = "charge", .metadata = m}, opts_);
  ASSERT_TRUE(one) << one.error().message();
  const std::vector<tenure::new_job> jobs{{.kind = "charge", .metadata = m}, {.kind = "charge"}};
  auto many = tenure::enqueue_batch(session_, jobs, opts_);
  ASSERT_TRUE(many) << many.error().message();
  tx.commit();

  tenure::runtime_config cfg;
  cfg.poll_interval = std::chrono::milliseconds{20};
  cfg.flush_delay = std::chrono::milliseconds{1};
  auto rt = tenure::postgres::make_runtime({.dsn = schema_.dsn(), .schema = schema_.name(), .runtime = cfg});
  ASSERT_TRUE(rt) << rt.error().message();
  std::mutex mu;
  std::map<std::int64_t, nlohmann::json> seen;
  rt.value()->handle("charge", [&](tenure::job_context& ctx) {
    std::lock_guard lock(mu);
    seen[ctx.job_id()] = ctx.metadata();
    return tenure::job_outcome::completed();
  });
  ASSERT_TRUE(rt.value()->start());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds{20};
  while (count("SELECT count(*) FROM " + schema_.name() + ".jobs WHERE state = 'completed'") < 3 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  }
  rt.value()->stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[one.value()], m);
  EXPECT_EQ(seen[many.value()[0]], m);
  EXPECT_EQ(seen[many.value()[1]], nlohmann::json::object());
}

TEST_F(soci_enqueue, invalid_metadata_is_refused_naming_it_before_anything_is_sent) {
  soci::transaction tx(session_);
  auto r = tenure::enqueue(session_, {.kind = "k", .metadata = nlohmann::json::array({1})}, opts_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), tenure::errc::invalid_argument);
  EXPECT_EQ(r.error().detail(), "metadata must be a JSON object, not array");
  const std::vector<tenure::new_job> jobs{{.kind = "k", .metadata = {{"k", std::string(10'000, 'x')}}}};
  auto batch = tenure::enqueue_batch(session_, jobs, opts_);
  ASSERT_FALSE(batch);
  EXPECT_EQ(batch.error().detail(), "metadata is 10009 bytes as JSON text, more than 8192");
  session_ << "INSERT INTO " + schema_.name() + ".orders (note) VALUES ('still fine')";  // nothing was sent
  tx.commit();
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".jobs"), 0);
}

TEST_F(soci_enqueue, batch_is_one_statement_with_ids_in_input_order) {
  std::vector<tenure::new_job> jobs;
  for (int i = 0; i < 2000; ++i) {
    jobs.push_back({.kind = "k", .args = {{"i", i}, {"quote", "a\"b\\c'd"}}, .queue = i % 2 ? "odd" : "even"});
  }
  jobs[7].run_at = tenure::clock_type::now() + std::chrono::hours(1);
  // Over arrays: the COPY path (taken from 1,000 jobs on) is tested with the other bridges'.
  tenure::sql_options arrays = opts_;
  arrays.copy_threshold = 0;
  soci::transaction tx(session_);
  session_ << "SET LOCAL track_functions = 'pl'";
  auto ids = tenure::enqueue_batch(session_, jobs, arrays);
  ASSERT_TRUE(ids) << ids.error().message();
  ASSERT_EQ(ids.value().size(), jobs.size());
  // Counted inside this transaction by the server: one call of enqueue_batch, none of enqueue.
  long batch_calls = -1, single_calls = -1;
  session_ << "SELECT coalesce(pg_stat_get_xact_function_calls('" + schema_.name() +
                  ".enqueue_batch'::regproc), 0)",
      soci::into(batch_calls);
  session_ << "SELECT coalesce(pg_stat_get_xact_function_calls('" + schema_.name() +
                  ".enqueue(text,jsonb,text,int,timestamptz,int,jsonb,text)'::regprocedure), 0)",
      soci::into(single_calls);
  EXPECT_EQ(batch_calls, 1);
  EXPECT_EQ(single_calls, 0);
  tx.commit();
  for (std::size_t i = 0; i < jobs.size(); i += 333) {
    EXPECT_EQ(check_.scalar("SELECT (args->>'i') || queue || (args->>'quote') FROM " + schema_.name() +
                            ".jobs WHERE id = $1", {std::to_string(ids.value()[i])}),
              std::to_string(i) + (i % 2 ? "odd" : "even") + "a\"b\\c'd");
  }
  EXPECT_EQ(check_.scalar("SELECT state FROM " + schema_.name() + ".jobs WHERE id = $1",
                          {std::to_string(ids.value()[7])}),
            "scheduled");
}

TEST_F(soci_enqueue, batch_with_one_invalid_job_writes_nothing) {
  std::vector<tenure::new_job> jobs(10, tenure::new_job{.kind = "k"});
  jobs[5].kind.clear();
  auto ids = tenure::enqueue_batch(session_, jobs, opts_);
  ASSERT_FALSE(ids);
  EXPECT_EQ(ids.error(), tenure::errc::invalid_argument);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".jobs"), 0);
}

TEST_F(soci_enqueue, a_connection_lost_inside_the_callers_transaction_is_unavailable_not_a_permanent_error) {
  auto* be = static_cast<soci::postgresql_session_backend*>(session_.get_backend());
  // Once with a word from the server (its backend terminated), once without (the socket breaks).
  for (const bool terminate : {true, false}) {
    SCOPED_TRACE(terminate ? "backend terminated" : "socket broken");
    session_.reconnect();
    be = static_cast<soci::postgresql_session_backend*>(session_.get_backend());
    soci::transaction tx(session_);
    session_ << "INSERT INTO " + schema_.name() + ".orders (note) VALUES ('paid')";
    if (terminate) {
      ASSERT_EQ(check_.scalar("SELECT pg_terminate_backend($1)", {std::to_string(PQbackendPID(be->conn_))}), "t");
    } else {
      ASSERT_EQ(::shutdown(PQsocket(be->conn_), SHUT_RDWR), 0);
    }
    auto id = tenure::enqueue(session_, {.kind = "charge"}, opts_);
    ASSERT_FALSE(id);
    EXPECT_EQ(id.error(), tenure::errc::database_unavailable) << id.error().message();
    std::vector<tenure::new_job> two{{.kind = "a"}, {.kind = "b"}};
    auto batch = tenure::enqueue_batch(session_, two, opts_);
    ASSERT_FALSE(batch);
    EXPECT_EQ(batch.error(), tenure::errc::database_unavailable) << batch.error().message();
    try {
      tx.rollback();
    } catch (const soci::soci_error&) {
      // The transaction went with the connection.
    }
  }
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".jobs"), 0);
  EXPECT_EQ(count("SELECT count(*) FROM " + schema_.name() + ".orders"), 0);
}

}  // namespace
