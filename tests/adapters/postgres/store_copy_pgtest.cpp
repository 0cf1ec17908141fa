// postgres::store's enqueue_batch over COPY: a large keyless batch is one transaction of COPY
// straight into specs (no job scheduled) or into the session's stage and one move; smaller, keyed
// or with copy_threshold 0, one enqueue_batch statement.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "support/fault_proxy.hpp"
#include "support/pg.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/sql_text.hpp"
#include "tenure/postgres/store.hpp"

using namespace std::chrono_literals;
using tenure::errc;
using tenure::new_job;
using tenure::test::pg;
using tenure::test::scoped_schema;

namespace {

class store_copy : public ::testing::Test {
 protected:
  std::unique_ptr<tenure::postgres::store> open(std::size_t copy_threshold = 1000, std::string dsn = {}) {
    auto s = tenure::postgres::store::open({.dsn = dsn.empty() ? schema_.dsn() : dsn,
                                            .schema = schema_.name(),
                                            .pool_size = 1,
                                            .copy_threshold = copy_threshold});
    EXPECT_TRUE(s) << s.error().message();
    return std::move(s).value();
  }
  long count(const std::string& where = "true") {
    return std::stol(admin_.scalar("SELECT count(*) FROM " + schema_.name() + ".jobs WHERE " + where));
  }
  /// Server sessions that hold the COPY stage of this schema: the stage is made on first use.
  long stages() {
    return std::stol(admin_.scalar(
        "SELECT count(*) FROM pg_class WHERE relpersistence = 't' AND relname = 'tenure_enqueue_' || $1::regnamespace::oid",
        {schema_.name()}));
  }

  scoped_schema schema_{"stcopy"};
  pg admin_{schema_.dsn()};
};

TEST_F(store_copy, a_large_keyless_batch_goes_through_copy_with_ids_in_input_order_and_every_field) {
  auto store = open();
  std::vector<new_job> jobs;
  for (int i = 0; i < 1'500; ++i) {
    jobs.push_back({.kind = "k", .args = {{"i", i}, {"s", "tab\there \\ \"q\""}}, .queue = i % 2 ? "odd" : "even",
                    .priority = 1 + i % 4, .max_attempts = 1 + i % 5});
  }
  jobs[9].run_at = tenure::clock_type::now() + 1h;
  jobs[10].metadata = {{"tenant", "t1"}};
  EXPECT_EQ(stages(), 0);
  auto ids = store->enqueue_batch(jobs);
  ASSERT_TRUE(ids) << ids.error().message();
  ASSERT_EQ(ids.value().size(), jobs.size());
  EXPECT_EQ(stages(), 1) << "the batch went through the stage";
  EXPECT_TRUE(std::is_sorted(ids.value().begin(), ids.value().end()));
  EXPECT_EQ(count(), 1'500);
  for (std::size_t i = 0; i < jobs.size(); i += 149) {
    auto got = store->read_job(ids.value()[i]);
    ASSERT_TRUE(got) << i << ": " << got.error().message();
    const auto& j = got.value();
    EXPECT_EQ(j.kind, "k") << i;
    EXPECT_EQ(nlohmann::json::parse(j.args), jobs[i].args) << i;
    EXPECT_EQ(j.queue, jobs[i].queue) << i;
    EXPECT_EQ(j.priority, jobs[i].priority) << i;
    EXPECT_EQ(j.max_attempts, jobs[i].max_attempts) << i;
  }
  EXPECT_EQ(admin_.scalar("SELECT state FROM " + schema_.name() + ".jobs WHERE id = $1", {std::to_string(ids.value()[9])}),
            "scheduled");
  EXPECT_EQ(admin_.scalar("SELECT metadata->>'tenant' FROM " + schema_.name() + ".jobs WHERE id = $1",
                          {std::to_string(ids.value()[10])}),
            "t1");
  // The same session again: the stage is reused and holds only the new batch.
  auto again = store->enqueue_batch(jobs);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(count(), 3'000);
  EXPECT_EQ(stages(), 1);
}

TEST_F(store_copy, a_large_batch_of_jobs_to_run_now_is_copied_straight_into_specs_without_a_stage) {
  // The store's session counts its calls of tenure's functions.
  const std::string dsn = schema_.dsn();
  auto store = open(1000, dsn + (dsn.find('?') == std::string::npos ? "?" : "&") + "options=-c%20track_functions%3Dpl");
  std::vector<new_job> jobs;
  for (int i = 0; i < 1'500; ++i) jobs.push_back({.kind = "k", .args = {{"i", i}}, .queue = i % 2 ? "odd" : "even"});
  auto ids = store->enqueue_batch(jobs);
  store.reset();  // its session ends and reports what it called
  // A function's entry shows up with 0 calls when the session first calls it; its counts arrive
  // when the session reports them (at its end at the latest).
  const std::string expected = "enqueue_copied_ready 1, enqueue_copy_target 1";
  std::string called;
  for (int i = 0; i < 100 && called != expected; ++i) {
    admin_.exec("SELECT pg_stat_clear_snapshot()");
    called = admin_.scalar("SELECT coalesce(string_agg(funcname || ' ' || calls, ', ' ORDER BY funcname), '') FROM "
                           "pg_stat_user_functions WHERE schemaname = $1 AND funcname LIKE 'enqueue%'",
                           {schema_.name()});
    if (called != expected) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(called, expected);
  ASSERT_TRUE(ids) << ids.error().message();
  ASSERT_EQ(ids.value().size(), jobs.size());
  EXPECT_EQ(stages(), 0) << "no stage was made";
  EXPECT_TRUE(std::is_sorted(ids.value().begin(), ids.value().end()));
  EXPECT_EQ(admin_.scalar("SELECT count(*) FROM unnest($1::bigint[]) WITH ORDINALITY AS a(id, ord) JOIN " +
                              schema_.name() + ".specs r ON r.id = a.id WHERE (r.args->>'i')::bigint = a.ord - 1",
                          {tenure::postgres::int_array(ids.value())}),
            "1500")
      << "each id is the job at its position";
  EXPECT_EQ(count("state = 'available'"), 1'500);
}

TEST_F(store_copy, a_batch_below_the_threshold_with_a_key_or_with_copy_off_goes_over_arrays) {
  const std::vector<new_job> small(999, new_job{.kind = "k"});
  std::vector<new_job> keyed(1'500, new_job{.kind = "k"});
  keyed[7].unique_key = "one";
  const std::vector<new_job> large(1'500, new_job{.kind = "k"});
  ASSERT_TRUE(open()->enqueue_batch(small));
  auto out = open()->try_enqueue_batch(keyed);
  ASSERT_TRUE(out) << out.error().message();
  EXPECT_TRUE(out.value()[7].inserted);
  ASSERT_TRUE(open(0)->enqueue_batch(large));
  EXPECT_EQ(count(), 999 + 1'500 + 1'500);
  EXPECT_EQ(stages(), 0) << "no session made the stage";
}

TEST_F(store_copy, a_store_whose_sessions_are_not_utf8_enqueues_large_batches_over_arrays) {
  // COPY's text is escaped byte by byte; only a UTF-8 session gets it.
  const std::string latin1 = schema_.dsn() + (schema_.dsn().find('?') == std::string::npos ? "?" : "&") +
                             "client_encoding=LATIN1";
  auto store = open(1000, latin1);
  ASSERT_TRUE(store->enqueue_batch(std::vector<new_job>(1'500, new_job{.kind = "k"})));
  EXPECT_EQ(count(), 1'500);
  EXPECT_EQ(stages(), 0) << "no session made the stage";
}

TEST_F(store_copy, a_job_the_stage_refuses_writes_nothing_and_the_store_goes_on) {
  auto store = open();
  std::vector<new_job> jobs(1'200, new_job{.kind = "k"});
  // Within the limit as this process measures it, over it as PostgreSQL prints it.
  jobs[600].metadata = {{"n", 1e100}, {"pad", std::string(tenure::k_max_metadata_size - 40, 'x')}};
  auto refused = store->enqueue_batch(jobs);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), errc::invalid_argument) << refused.error().message();
  EXPECT_EQ(refused.error().sqlstate(), "23514");
  EXPECT_NE(refused.error().detail().find("metadata must be a JSON object of at most 8192 bytes"), std::string::npos)
      << refused.error().detail();
  EXPECT_EQ(count(), 0);
  jobs[600].metadata = nullptr;
  auto ids = store->enqueue_batch(jobs);
  ASSERT_TRUE(ids) << ids.error().message();
  EXPECT_EQ(count(), 1'200) << "the refused batch left nothing behind in the stage or the tables";
}

TEST_F(store_copy, a_lost_commit_reply_is_in_doubt_and_the_jobs_exist) {
  tenure::test::fault_proxy proxy{schema_.dsn()};
  auto store = open(1000, proxy.dsn(schema_.dsn()));
  const std::vector<new_job> jobs(1'300, new_job{.kind = "k", .queue = "doubt"});
  proxy.arm_drop_commit_reply();
  auto r = store->enqueue_batch(jobs);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::commit_in_doubt) << r.error().message();
  EXPECT_EQ(proxy.fired(), 1);
  EXPECT_EQ(count("queue = 'doubt'"), 1'300) << "the server committed before the reply was lost";
  // The store reconnects on its next call.
  auto next = store->enqueue_batch(jobs);
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(count("queue = 'doubt'"), 2'600);
}

TEST_F(store_copy, a_connection_lost_before_the_commit_writes_nothing) {
  tenure::test::fault_proxy proxy{schema_.dsn()};
  auto store = open(1000, proxy.dsn(schema_.dsn()));
  ASSERT_TRUE(store->enqueue_batch(std::vector<new_job>(1'000, new_job{.kind = "k", .queue = "warm"})));
  EXPECT_EQ(proxy.kill_all(), 1);
  auto r = store->enqueue_batch(std::vector<new_job>(1'000, new_job{.kind = "k", .queue = "lost"}));
  // The pooled connection was cut before BEGIN was sent: nothing in doubt, nothing written.
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::database_unavailable) << r.error().message();
  EXPECT_EQ(count("queue = 'lost'"), 0);
}

TEST(store_copy_without_temp, an_owner_that_may_not_create_temporary_tables_enqueues_large_batches_over_arrays) {
  // A database where PUBLIC lost TEMPORARY, and a schema owned by a role that is not superuser.
  const std::string admin_dsn = tenure::test::test_dsn();
  const std::string suffix = tenure::test::random_suffix();
  const std::string db = "notemp_" + suffix, owner = "notemp_owner_" + suffix, schema = "notemp";
  pg admin{admin_dsn};
  admin.exec("CREATE DATABASE " + db);
  admin.exec("CREATE ROLE " + owner + " LOGIN");
  struct drop_all {
    pg& admin;
    std::string db, owner;
    ~drop_all() {
      admin.query("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
      admin.query("DROP ROLE IF EXISTS " + owner);
    }
  } drop{admin, db, owner};
  admin.exec("REVOKE TEMPORARY ON DATABASE " + db + " FROM PUBLIC");
  admin.exec("GRANT CREATE ON DATABASE " + db + " TO " + owner);
  const std::string dsn = tenure::test::dsn_with_user(admin_dsn.substr(0, admin_dsn.rfind('/') + 1) + db, owner);
  auto installed = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(installed) << installed.error().message();

  pg as_owner{dsn};
  EXPECT_EQ(as_owner.query("CREATE TEMP TABLE t (x int)").sqlstate, "42501") << "the owner may not make one";
  EXPECT_EQ(as_owner.scalar("SELECT " + schema + ".enqueue_copy_stage() IS NULL"), "t") << "so no stage is offered";
  EXPECT_EQ(as_owner.scalar("SELECT " + schema + ".enqueue_copy_target(true) IS NULL"), "t");
  EXPECT_EQ(as_owner.scalar("SELECT " + schema + ".enqueue_copy_target(false)"), schema + ".specs")
      << "jobs to run now need no stage";

  // Batches holding a scheduled job, which would need the stage.
  const auto batch = [](const std::string& queue) {
    std::vector<new_job> jobs(1'500, new_job{.kind = "k", .queue = queue});
    jobs[3].run_at = tenure::clock_type::now() + 1h;
    return jobs;
  };
  auto st = tenure::postgres::store::open({.dsn = dsn, .schema = schema, .pool_size = 1});
  ASSERT_TRUE(st) << st.error().message();
  auto ids = st.value()->enqueue_batch(batch("store"));
  ASSERT_TRUE(ids) << ids.error().message();
  EXPECT_EQ(ids.value().size(), 1'500u);

  // The libpq bridge inside the caller's transaction: the transaction goes on after the fallback.
  as_owner.exec("BEGIN");
  auto bridged = tenure::enqueue_batch(as_owner.native(), batch("bridge"), {.schema = schema});
  ASSERT_TRUE(bridged) << bridged.error().message();
  auto now = tenure::enqueue_batch(as_owner.native(), std::vector<new_job>(1'500, new_job{.kind = "k", .queue = "now"}),
                                   {.schema = schema});
  ASSERT_TRUE(now) << now.error().message();
  as_owner.exec("COMMIT");
  EXPECT_EQ(as_owner.scalar("SELECT string_agg(queue || ' ' || n, ', ' ORDER BY queue) FROM (SELECT queue, count(*) AS n FROM " +
                            schema + ".jobs GROUP BY queue) q"),
            "bridge 1500, now 1500, store 1500");
}

}  // namespace
