// Unique jobs through the public SQL contract: enqueue(..., unique_key) and
// enqueue_batch(..., unique_keys), driven over plain libpq from many connections.
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/pg.hpp"

using tenure::test::pg;
using tenure::test::scoped_schema;
using namespace std::chrono_literals;

namespace {

class unique_jobs : public ::testing::Test {
 protected:
  scoped_schema schema_{"uniq"};
  pg db_{schema_.dsn()};
  std::string s(const std::string& fn) const { return schema_.name() + "." + fn; }

  /// enqueue(kind, '{}', queue, unique_key => key) on `c`; the id it answers.
  std::string enqueue_keyed(pg& c, const std::string& key, const std::string& queue = "default",
                            const std::string& run_at = "NULL") {
    return c.scalar("SELECT " + s("enqueue") + "('k', '{}', $1, 2, " + run_at + ", 25, '{}', $2)", {queue, key});
  }
  std::string enqueue_keyed(const std::string& key, const std::string& queue = "default") {
    return enqueue_keyed(db_, key, queue);
  }
  std::string state_of(const std::string& id) {
    return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id});
  }
  /// Jobs of `queue` with `key` in a live state.
  std::string live_with_key(const std::string& key, const std::string& queue = "default") {
    return db_.scalar("SELECT count(*) FROM " + s("jobs") +
                          " WHERE queue = $1 AND unique_key = $2 AND state IN "
                          "('scheduled', 'available', 'running', 'waiting_external', 'retryable')",
                      {queue, key});
  }
  struct claimed {
    std::string job_id, run_lease, token;
  };
  claimed claim_one(const std::string& queue = "default") {
    auto r = db_.exec("SELECT job_id, run_lease, token FROM " + s("claim") + "($1)", {queue});
    if (r.rows.size() != 1) throw std::runtime_error("expected one claimed job");
    return {*r.rows[0][0], *r.rows[0][1], *r.rows[0][2]};
  }
  /// Runs enqueue_batch over `keys` (one job each, queue "default"); rows "id:inserted".
  std::vector<std::string> batch(const std::string& keys_literal) {
    auto r = db_.exec("SELECT job_id, inserted FROM " + s("enqueue_batch") +
                      "(array_fill('k'::text, ARRAY[cardinality($1::text[])]), "
                      "array_fill('{}'::jsonb, ARRAY[cardinality($1::text[])]), "
                      "array_fill('default'::text, ARRAY[cardinality($1::text[])]), "
                      "array_fill(2, ARRAY[cardinality($1::text[])]), unique_keys => $1::text[]) ORDER BY ord",
                      {keys_literal});
    std::vector<std::string> out;
    for (auto& row : r.rows) out.push_back(*row[0] + ":" + *row[1]);
    return out;
  }

  /// `producers` threads, each on its own connection and in its own transaction, enqueue `key`
  /// together and hold their transactions open a while after it; the ids they got.
  std::vector<std::string> race(const std::string& key, int producers) {
    std::barrier start(producers);
    std::mutex mu;
    std::vector<std::string> ids;
    std::vector<std::thread> threads;
    for (int t = 0; t < producers; ++t) {
      threads.emplace_back([&] {
        pg c{schema_.dsn()};
        c.exec("BEGIN");
        start.arrive_and_wait();
        const auto id = enqueue_keyed(c, key);
        std::this_thread::sleep_for(50ms);  // keep the transaction open: the others must wait for it
        c.exec("COMMIT");
        std::lock_guard lock(mu);
        ids.push_back(id);
      });
    }
    for (auto& t : threads) t.join();
    return ids;
  }
};

TEST_F(unique_jobs, concurrent_producers_in_open_transactions_get_one_job_and_all_its_id) {
  const auto ids = race("order-42", 8);
  ASSERT_EQ(ids.size(), 8u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u) << "every producer got the holder's id";
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "1");
  EXPECT_EQ(live_with_key("order-42"), "1");
}

TEST_F(unique_jobs, concurrent_producers_taking_over_a_freed_key_get_one_new_job) {
  const auto first = enqueue_keyed("k1");
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {claim_one().token});
  const auto ids = race("k1", 8);
  ASSERT_EQ(ids.size(), 8u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u);
  EXPECT_NE(ids.front(), first);
  EXPECT_EQ(live_with_key("k1"), "1");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "2");
}

TEST_F(unique_jobs, the_key_is_per_queue) {
  const auto a = enqueue_keyed("same", "qa");
  const auto b = enqueue_keyed("same", "qb");
  EXPECT_NE(a, b);
  EXPECT_EQ(enqueue_keyed("same", "qa"), a);
  EXPECT_EQ(enqueue_keyed("same", "qb"), b);
}

TEST_F(unique_jobs, a_scheduled_available_running_waiting_or_retryable_job_holds_its_key) {
  const auto scheduled = enqueue_keyed(db_, "s", "default", "now() + interval '1 hour'");
  EXPECT_EQ(state_of(scheduled), "scheduled");
  EXPECT_EQ(enqueue_keyed("s"), scheduled);

  const auto id = enqueue_keyed("k", "q");
  EXPECT_EQ(state_of(id), "available");
  EXPECT_EQ(enqueue_keyed("k", "q"), id);
  auto c = claim_one("q");
  EXPECT_EQ(state_of(id), "running");
  EXPECT_EQ(enqueue_keyed("k", "q"), id);
  const auto callback = db_.scalar("SELECT " + s("register_callback") + "($1, $2, '1 hour')", {c.job_id, c.run_lease});
  db_.exec("SELECT * FROM " + s("await_callback") + "($1, $2, $3::uuid)", {c.job_id, c.run_lease, callback});
  EXPECT_EQ(state_of(id), "waiting_external");
  EXPECT_EQ(enqueue_keyed("k", "q"), id);

  const auto r = enqueue_keyed("r", "q2");
  db_.exec("SELECT " + s("fail_job") + "($1, 'boom')", {claim_one("q2").token});
  EXPECT_EQ(state_of(r), "retryable");
  EXPECT_EQ(enqueue_keyed("r", "q2"), r);
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "3");
}

TEST_F(unique_jobs, the_key_is_free_again_once_the_job_completed_failed_or_was_cancelled) {
  const auto completed = enqueue_keyed("c");
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {claim_one().token});
  const auto after_completed = enqueue_keyed("c");
  EXPECT_NE(after_completed, completed);
  EXPECT_EQ(state_of(after_completed), "available");

  const auto failed = enqueue_keyed("f", "qf");
  db_.exec("SELECT " + s("fail_job") + "($1, 'no', false)", {claim_one("qf").token});
  EXPECT_EQ(state_of(failed), "failed");
  EXPECT_NE(enqueue_keyed("f", "qf"), failed);

  const auto cancelled = enqueue_keyed("x", "qx");
  db_.exec("SELECT " + s("cancel_job") + "($1)", {cancelled});
  EXPECT_NE(enqueue_keyed("x", "qx"), cancelled);
}

TEST_F(unique_jobs, a_rolled_back_producer_frees_the_key_for_the_next) {
  pg a{schema_.dsn()};
  a.exec("BEGIN");
  const auto rolled_back = enqueue_keyed(a, "rb");
  std::string waited;
  std::thread b([&] {
    pg c{schema_.dsn()};
    waited = enqueue_keyed(c, "rb");  // waits for a's transaction
  });
  std::this_thread::sleep_for(100ms);
  a.exec("ROLLBACK");
  b.join();
  EXPECT_NE(waited, rolled_back);
  EXPECT_EQ(state_of(waited), "available");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "1");
  EXPECT_EQ(enqueue_keyed("rb"), waited);
}

TEST_F(unique_jobs, a_producer_under_repeatable_read_racing_for_a_key_gets_a_serialization_failure) {
  pg rr{schema_.dsn()};
  rr.exec("BEGIN ISOLATION LEVEL REPEATABLE READ");
  rr.exec("SELECT 1");  // the snapshot is taken
  const auto holder = enqueue_keyed("rr");  // committed after rr's snapshot
  auto r = rr.query("SELECT " + s("enqueue") + "('k', '{}', 'default', 2, NULL, 25, '{}', 'rr')");
  EXPECT_EQ(r.sqlstate, "40001") << r.error;
  rr.exec("ROLLBACK");
  rr.exec("BEGIN ISOLATION LEVEL SERIALIZABLE");
  EXPECT_EQ(enqueue_keyed(rr, "rr"), holder) << "a key held before the snapshot answers its holder";
  rr.exec("COMMIT");
}

TEST_F(unique_jobs, enqueue_batch_answers_holders_ids_and_a_repeated_key_gets_the_first_ones_job) {
  const auto held = enqueue_keyed("a");
  const auto rows = batch("{a,b,NULL,b,c}");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0], held + ":f");
  const auto b = rows[1].substr(0, rows[1].find(':'));
  EXPECT_EQ(rows[1], b + ":t");
  EXPECT_EQ(rows[2].substr(rows[2].find(':')), ":t") << "a keyless job in a keyed batch";
  EXPECT_EQ(rows[3], b + ":f");
  EXPECT_EQ(rows[4].substr(rows[4].find(':')), ":t");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "4");
  EXPECT_EQ(db_.scalar("SELECT unique_key FROM " + s("jobs") + " WHERE id = $1", {b}), "b");
  // A keyless batch still answers inserted for every job.
  EXPECT_EQ(db_.scalar("SELECT bool_and(inserted) FROM " + s("enqueue_batch") +
                       "(ARRAY['k','k'], ARRAY['{}','{}']::jsonb[], ARRAY['default','default'], ARRAY[2,2])"),
            "t");
}

TEST_F(unique_jobs, a_key_that_is_empty_too_long_or_has_control_characters_is_refused_with_22023_naming_it) {
  for (const std::string& key : {std::string{}, std::string(256, 'x'), std::string{"a\nb"}, std::string{"a\x7f"}}) {
    auto one = db_.query("SELECT " + s("enqueue") + "('k', unique_key => $1)", {key});
    EXPECT_EQ(one.sqlstate, "22023") << key.size();
    EXPECT_NE(one.error.find("unique_key"), std::string::npos) << one.error;
    auto many = db_.query("SELECT * FROM " + s("enqueue_batch") +
                              "(ARRAY['k','k'], ARRAY['{}','{}']::jsonb[], ARRAY['default','default'], ARRAY[2,2], "
                              "unique_keys => ARRAY['fine', $1])",
                          {key});
    EXPECT_EQ(many.sqlstate, "22023");
    EXPECT_NE(many.error.find("job 2: unique_key"), std::string::npos) << many.error;
  }
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "0");
  const std::string longest(255, 'x');
  EXPECT_EQ(enqueue_keyed(longest), enqueue_keyed(longest));
}

TEST_F(unique_jobs, the_jobs_view_shows_the_key_in_every_state) {
  const auto keyed = enqueue_keyed("shown");
  const auto plain = db_.scalar("SELECT " + s("enqueue") + "('k')");
  EXPECT_EQ(db_.scalar("SELECT unique_key FROM " + s("jobs") + " WHERE id = $1", {keyed}), "shown");
  EXPECT_FALSE(db_.exec("SELECT unique_key FROM " + s("jobs") + " WHERE id = $1", {plain}).rows[0][0].has_value());
  db_.exec("SELECT " + s("cancel_job") + "($1)", {keyed});
  EXPECT_EQ(db_.scalar("SELECT unique_key FROM " + s("jobs") + " WHERE id = $1", {keyed}), "shown")
      << "a terminal job keeps showing its key";
}

TEST_F(unique_jobs, retry_job_of_a_terminal_job_takes_its_key_back_or_is_refused_while_another_live_job_holds_it) {
  const auto first = enqueue_keyed("again");
  db_.exec("SELECT " + s("cancel_job") + "($1)", {first});
  EXPECT_EQ(db_.scalar("SELECT " + s("retry_job") + "($1)", {first}), "t") << "the key was free";
  EXPECT_EQ(enqueue_keyed("again"), first) << "the retried job holds its key again";

  db_.exec("SELECT " + s("cancel_job") + "($1)", {first});
  const auto second = enqueue_keyed("again");
  ASSERT_NE(second, first);
  auto refused = db_.query("SELECT " + s("retry_job") + "($1)", {first});
  EXPECT_EQ(refused.sqlstate, "23505");
  EXPECT_NE(refused.error.find("held by live job " + second), std::string::npos) << refused.error;
  EXPECT_EQ(state_of(first), "cancelled");
}

TEST_F(unique_jobs, prune_expired_deletes_the_keys_of_the_jobs_it_deletes) {
  const auto old_job = enqueue_keyed("p");
  db_.exec("SELECT " + s("cancel_job") + "($1)", {old_job});
  const auto live = enqueue_keyed("q");
  // Thirty days pass: the cancelled job's record is past its retention.
  db_.exec("UPDATE " + s("closures") + " SET closed_at = now() - interval '30 days'");
  db_.exec("UPDATE " + s("settled_claims") + " SET ripe_at = ripe_at - interval '30 days'");
  EXPECT_EQ(db_.scalar("SELECT " + s("prune_expired") + "()"), "1");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("job_keys") + " WHERE job_id = $1", {old_job}), "0");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("key_holders") + " WHERE job_id = $1", {old_job}), "0");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("key_holders") + " WHERE job_id = $1", {live}), "1");
  EXPECT_NE(enqueue_keyed("p"), old_job);
}

TEST_F(unique_jobs, keyless_enqueues_never_touch_the_key_tables) {
  db_.exec("BEGIN");
  db_.exec("SELECT " + s("enqueue") + "('k')");
  db_.exec("SELECT * FROM " + s("enqueue_batch") +
           "(ARRAY['k','k'], ARRAY['{}','{}']::jsonb[], ARRAY['default','default'], ARRAY[2,2])");
  db_.exec("SELECT * FROM " + s("enqueue_batch") +
           "(ARRAY['k'], ARRAY['{}']::jsonb[], ARRAY['default'], ARRAY[2], unique_keys => ARRAY[NULL]::text[])");
  const auto touched = db_.scalar(
      "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0) + n_tup_ins + n_tup_upd), 0) "
      "FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname IN ('key_holders', 'job_keys')",
      {schema_.name()});
  db_.exec("COMMIT");
  EXPECT_EQ(touched, "0");
}

}  // namespace
