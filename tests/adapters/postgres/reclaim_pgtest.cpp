// store::reclaim_dead_rows: the claim path's dead rows, counted by pg_stat_user_tables, removed by
// a VACUUM when the role owns the tables; a role that does not own them reclaims nothing and is
// told so. Migration 19's autovacuum settings are on both tables.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "support/pg.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/store.hpp"

namespace {

using tenure::test::pg;

/// Each test in a database of its own: VACUUM removes only rows no snapshot can see, and a
/// snapshot of a test running beside it in the shared database would keep them.
class reclaim_pg : public ::testing::Test {
 protected:
  reclaim_pg() : admin_(tenure::test::test_dsn()), db_name_("tenure_rcl_" + tenure::test::random_suffix()) {
    admin_.exec("CREATE DATABASE " + db_name_);
    const auto shared = tenure::test::test_dsn();
    dsn_ = shared.substr(0, shared.rfind('/') + 1) + db_name_;
    auto m = tenure::postgres::migrate(dsn_, schema_);
    if (!m) throw std::runtime_error("migrate failed: " + m.error().message());
    db_ = std::make_unique<pg>(dsn_);
  }
  ~reclaim_pg() override {
    db_.reset();
    admin_.query("DROP DATABASE IF EXISTS " + db_name_ + " WITH (FORCE)");
  }
  std::string s(const std::string& name) const { return schema_ + "." + name; }

  std::unique_ptr<tenure::postgres::store> open(const std::string& dsn) {
    auto st = tenure::postgres::store::open({.dsn = dsn, .schema = schema_, .pool_size = 1});
    if (!st) ADD_FAILURE() << st.error().message();
    return st ? std::move(st).value() : nullptr;
  }

  /// `n` jobs enqueued, claimed (one per claim) and completed in this session, the closed claims
  /// swept from `open_claims` as the leader's pass does, and the table statistics flushed: `n`
  /// dead rows in `ready` and in `open_claims`. Returns how many completed.
  std::string drain(int n) {
    const std::string count = std::to_string(n);
    db_->exec("SELECT count(*) FROM " + s("enqueue_batch") + "(array_fill('k'::text, ARRAY[$1::int]), "
              "array_fill('{}'::jsonb, ARRAY[$1::int]), array_fill('default'::text, ARRAY[$1::int]), "
              "array_fill(2, ARRAY[$1::int]))",
              {count});
    db_->exec("CREATE TEMP TABLE claimed AS SELECT c.job_id, c.run_lease FROM generate_series(1, " + count +
              ") g CROSS JOIN LATERAL " + s("claim_attempts") + "('default', 1 + 0 * g) c");
    const auto completed = db_->scalar("SELECT count(*) FROM " + s("complete_batch") +
                                       "((SELECT array_agg(job_id) FROM claimed), (SELECT array_agg(run_lease) FROM claimed))");
    db_->exec("DELETE FROM " + s("open_claims"));
    db_->exec("SELECT pg_stat_force_next_flush()");
    db_->exec("SELECT 1");
    return completed;
  }
  /// Pages an empty claim's index scan of the default queue reads.
  long claim_scan_pages() {
    db_->exec("SET enable_seqscan = off");
    const auto plan = db_->scalar("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM " + s("ready") +
                                 " WHERE queue = 'default' ORDER BY priority, id LIMIT 1");
    db_->exec("RESET enable_seqscan");
    const auto at = plan.find("\"Shared Hit Blocks\": ");
    if (at == std::string::npos) return -1;
    return std::stol(plan.substr(at + 20));
  }
  long stat(const std::string& table, const std::string& column) {
    return std::stol(db_->scalar("SELECT " + column + " FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
                                {schema_, table}));
  }

  pg admin_;
  std::string db_name_;
  std::string dsn_;
  std::string schema_ = "rcl";
  std::unique_ptr<pg> db_;
};

TEST_F(reclaim_pg, reclaim_dead_rows_vacuums_ready_and_open_claims_once_enough_dead_rows_wait) {
  ASSERT_EQ(drain(1'500), "1500");
  ASSERT_GE(stat("ready", "n_dead_tup"), 1500);
  ASSERT_GE(stat("open_claims", "n_dead_tup"), 1500);
  const long pages_before = claim_scan_pages();
  const long ready_vacuums = stat("ready", "vacuum_count");
  const long open_claims_vacuums = stat("open_claims", "vacuum_count");

  auto st = open(dsn_);
  ASSERT_TRUE(st);
  // Below the threshold: nothing is due, nothing runs.
  auto none = st->reclaim_dead_rows(1'000'000);
  ASSERT_TRUE(none) << none.error().message();
  EXPECT_EQ(none.value().due, 0);
  EXPECT_EQ(none.value().reclaimed, 0);
  EXPECT_EQ(stat("ready", "vacuum_count"), ready_vacuums);

  auto r = st->reclaim_dead_rows(1'000);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value().due, 2);
  EXPECT_EQ(r.value().reclaimed, 2);
  EXPECT_EQ(stat("ready", "vacuum_count"), ready_vacuums + 1);
  EXPECT_EQ(stat("open_claims", "vacuum_count"), open_claims_vacuums + 1);
  EXPECT_LT(stat("ready", "n_dead_tup"), 1'000) << "the dead rows are gone";
  // The claim index lost the dead entries an empty claim stepped over.
  const long pages_after = claim_scan_pages();
  EXPECT_GT(pages_before, 2);
  EXPECT_LT(pages_after, pages_before);
  EXPECT_EQ(db_->scalar("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'"), "1500")
      << "reclaiming changed no job";
}

TEST_F(reclaim_pg, a_claim_after_the_drained_queue_is_vacuumed_and_refilled_reads_only_the_rows_it_takes) {
  // Statistics stay as the leader's VACUUM leaves them: no autovacuum or autoanalyze mends them.
  db_->exec("ALTER TABLE " + s("ready") + " SET (autovacuum_enabled = false)");
  ASSERT_EQ(drain(10'000), "10000");
  {
    auto st = open(dsn_);
    ASSERT_TRUE(st);
    auto r = st->reclaim_dead_rows(1'000);  // the leader's vacuum after a drain
    ASSERT_TRUE(r) << r.error().message();
    ASSERT_EQ(r.value().reclaimed, 2);
  }
  // The table the vacuum saw: pages, and no live row in them.
  ASSERT_EQ(db_->scalar("SELECT reltuples::bigint FROM pg_class WHERE oid = $1::regclass", {s("ready")}), "0");
  ASSERT_GT(std::stol(db_->scalar("SELECT relpages FROM pg_class WHERE oid = $1::regclass", {s("ready")})), 0);
  // A burst refills the queue before anything analyzes it again.
  db_->exec("SELECT count(*) FROM " + s("enqueue_batch") + "(array_fill('k'::text, ARRAY[200000]), "
            "array_fill('{}'::jsonb, ARRAY[200000]), array_fill('default'::text, ARRAY[200000]), "
            "array_fill(2, ARRAY[200000]))");
  // Buffer accesses to the claim index (pg_statio: pages, whatever each scan returned).
  const auto claim_index_pages = [&] {
    return std::stol(db_->scalar("SELECT idx_blks_read + idx_blks_hit FROM pg_statio_user_indexes "
                                 "WHERE schemaname = $1 AND indexrelname = 'ready_claim_idx'",
                                 {schema_}));
  };
  const long before = claim_index_pages();
  {
    pg worker{dsn_};  // a new connection: the claim's plan is made now, from these statistics
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(worker.scalar("SELECT count(*) FROM " + s("claim_attempts") + "('default', 8)"), "8");
    }
    worker.exec("SELECT pg_stat_force_next_flush()");
    worker.exec("SELECT 1");
  }
  const long pages = claim_index_pages() - before;
  // Each claim descends the claim index to its 8 jobs and deletes them by their address. A delete
  // that looked its rows up by id chose, on these statistics (from ~150,000 waiting jobs up), a
  // scan of the whole claim index (id is its last column): ~700 pages for every claim.
  EXPECT_GE(pages, 5);
  EXPECT_LT(pages, 200) << "claim index pages read by 5 claims of 8 jobs";
}

TEST_F(reclaim_pg, a_promotion_after_the_deferred_table_is_vacuumed_and_refilled_reads_only_the_rows_it_moves) {
  // Statistics stay as a VACUUM of the emptied table leaves them: no autoanalyze mends them.
  db_->exec("ALTER TABLE " + s("deferred") + " SET (autovacuum_enabled = false)");
  const auto enqueue_due_soon = [&](int n) {
    const std::string count = std::to_string(n);
    db_->exec("SELECT count(*) FROM " + s("enqueue_batch") + "(array_fill('k'::text, ARRAY[$1::int]), "
              "array_fill('{}'::jsonb, ARRAY[$1::int]), array_fill('default'::text, ARRAY[$1::int]), "
              "array_fill(2, ARRAY[$1::int]), array_fill(now() + interval '1 second', ARRAY[$1::int]))",
              {count});
    db_->exec("SELECT pg_sleep(1.1)");  // all of them due
  };
  enqueue_due_soon(10'000);
  ASSERT_EQ(db_->scalar("SELECT " + s("promote_due") + "(NULL, 100000)"), "10000");
  db_->exec("VACUUM " + s("deferred"));
  ASSERT_EQ(db_->scalar("SELECT reltuples::bigint FROM pg_class WHERE oid = $1::regclass", {s("deferred")}), "0");
  // A burst of scheduled jobs falls due together before anything analyzes the table again.
  enqueue_due_soon(200'000);
  // Rows and index entries the scans of `deferred` returned (a sequential scan's rows, every
  // index's entries; a bitmap scan counts its entries too).
  const auto tuples_read = [&] {
    return std::stol(db_->scalar(
        "SELECT (SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relid = $1::regclass) + "
        "(SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE relid = $1::regclass)",
        {s("deferred")}));
  };
  const long before = tuples_read();
  {
    pg leader{dsn_};  // a new connection: the plans are made now, from these statistics
    for (int i = 0; i < 7; ++i) {  // past plpgsql's five custom plans, into its generic one
      EXPECT_EQ(leader.scalar("SELECT " + s("promote_due") + "(NULL, 1000)"), "1000");
    }
    leader.exec("SELECT pg_stat_force_next_flush()");
    leader.exec("SELECT 1");
  }
  const long read = tuples_read() - before;
  // Each promotion walks the due index to its 1,000 jobs and deletes them by their address. Until
  // a vacuum, the index keeps the entries of the rows earlier promotions deleted, and a scan steps
  // over them unless an earlier one could mark them dead: at most 1,000 + 2,000 + ... + 7,000 =
  // 28,000 in all. The plans these statistics used to get read all 200,000 due rows for every
  // promotion (over 1,000,000 in all): a bitmap scan and a sort to pick, a hash join over the
  // whole primary key to delete.
  EXPECT_GE(read, 7'000);
  EXPECT_LE(read, 30'000) << "entries of deferred read by 7 promotions of 1,000 jobs";
  EXPECT_EQ(db_->scalar("SELECT count(*) FROM " + s("ready")), "17000") << "every promoted job is ready";
  EXPECT_EQ(db_->scalar("SELECT count(*) FROM " + s("deferred")), "193000");
}

TEST_F(reclaim_pg, a_role_that_does_not_own_the_tables_reclaims_nothing_and_says_they_are_due) {
  const std::string role = "tenure_rcl_" + tenure::test::random_suffix();
  db_->exec("CREATE ROLE " + role + " LOGIN");
  auto granted = tenure::postgres::grant(dsn_, tenure::postgres::grant_kind::worker, role, schema_);
  ASSERT_TRUE(granted) << granted.error().message();
  ASSERT_EQ(drain(1'200), "1200");
  const long vacuums = stat("ready", "vacuum_count");
  {
    auto st = open(tenure::test::dsn_with_user(dsn_, role));
    ASSERT_TRUE(st);
    auto r = st->reclaim_dead_rows(1'000);
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(r.value().due, 2);
    EXPECT_EQ(r.value().reclaimed, 0) << "only the owner may VACUUM";
  }
  EXPECT_EQ(stat("ready", "vacuum_count"), vacuums);
  db_->query("DROP OWNED BY " + role + " CASCADE");
  db_->query("DROP ROLE IF EXISTS " + role);
}

TEST_F(reclaim_pg, migration_19_sets_autovacuum_for_the_claim_path_tables) {
  for (const std::string table : {"ready", "open_claims"}) {
    const auto options = db_->scalar(
        "SELECT array_to_string(reloptions, ',') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relname = $2",
        {schema_, table});
    EXPECT_NE(options.find("autovacuum_vacuum_scale_factor=0"), std::string::npos) << table << ": " << options;
    EXPECT_NE(options.find("autovacuum_vacuum_threshold=10000"), std::string::npos) << table << ": " << options;
    EXPECT_NE(options.find("autovacuum_vacuum_cost_delay=0"), std::string::npos) << table << ": " << options;
    EXPECT_NE(options.find("vacuum_truncate=false"), std::string::npos) << table << ": " << options;
  }
}

}  // namespace
