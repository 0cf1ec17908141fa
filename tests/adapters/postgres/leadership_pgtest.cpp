// The maintenance lease in SQL, driven from several sessions: acquire_leadership (take, renew,
// take over after expiry, a newer term on every takeover), release_leadership, and the fenced
// maintenance pass maintain(), which changes nothing for a holder whose term is lost or expired.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "support/pg.hpp"

using tenure::test::cell;
using tenure::test::pg;
using tenure::test::scoped_schema;
using namespace std::chrono_literals;

namespace {

class leadership : public ::testing::Test {
 protected:
  scoped_schema schema_{"lead"};
  pg a_{schema_.dsn()};
  pg b_{schema_.dsn()};
  pg watch_{schema_.dsn()};  ///< never inside a transaction (pg_stat_activity is read fresh)
  std::string s(const std::string& name) const { return schema_.name() + "." + name; }

  /// The term `holder` gets, or nullopt when another holder's lease has not expired.
  cell acquire_as(pg& session, const std::string& holder, const std::string& ttl) {
    auto r = session.exec("SELECT " + s("acquire_leadership") + "($1, $2::interval)", {holder, ttl});
    return r.rows.at(0).at(0);
  }
  tenure::test::sql_result maintain(pg& session, const std::string& holder, const std::string& term,
                                    const std::string& stale_after = "0 seconds") {
    return session.query("SELECT * FROM " + s("maintain") + "($1, $2::bigint, $3::interval)", {holder, term, stale_after});
  }
  bool expired() { return watch_.scalar("SELECT expires_at <= clock_timestamp() FROM " + s("leadership")) == "t"; }
  void wait_expired() {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!expired() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    ASSERT_TRUE(expired());
  }
};

TEST_F(leadership, the_first_asker_takes_the_lease_and_renews_it_while_others_get_null) {
  EXPECT_EQ(acquire_as(a_, "a", "1 hour"), cell{"1"});
  EXPECT_EQ(acquire_as(b_, "b", "1 hour"), cell{}) << "a's lease has not expired";
  EXPECT_EQ(acquire_as(a_, "a", "1 hour"), cell{"1"}) << "a renews with the same term";
  EXPECT_EQ(acquire_as(b_, "b", "1 hour"), cell{});
  EXPECT_EQ(a_.scalar("SELECT holder || ' ' || term FROM " + s("leadership")), "a 1");
}

TEST_F(leadership, an_expired_lease_goes_to_the_next_asker_with_a_newer_term_and_its_old_holder_cannot_renew_it) {
  ASSERT_EQ(acquire_as(a_, "a", "200 milliseconds"), cell{"1"});
  EXPECT_EQ(acquire_as(b_, "b", "1 hour"), cell{});
  wait_expired();
  EXPECT_EQ(acquire_as(b_, "b", "1 hour"), cell{"2"});
  EXPECT_EQ(acquire_as(a_, "a", "1 hour"), cell{}) << "a's renewal comes too late: b holds the lease";
  EXPECT_EQ(a_.scalar("SELECT holder || ' ' || term FROM " + s("leadership")), "b 2");
}

TEST_F(leadership, the_same_holder_taking_back_its_expired_lease_gets_a_newer_term) {
  ASSERT_EQ(acquire_as(a_, "a", "50 milliseconds"), cell{"1"});
  wait_expired();
  EXPECT_EQ(acquire_as(a_, "a", "1 hour"), cell{"2"});
}

TEST_F(leadership, a_released_lease_is_taken_at_once) {
  ASSERT_EQ(acquire_as(a_, "a", "1 hour"), cell{"1"});
  EXPECT_EQ(b_.scalar("SELECT " + s("release_leadership") + "('b', 1)"), "f") << "only the holder releases";
  EXPECT_EQ(a_.scalar("SELECT " + s("release_leadership") + "('a', 1)"), "t");
  EXPECT_EQ(acquire_as(b_, "b", "1 hour"), cell{"2"});
  EXPECT_EQ(a_.scalar("SELECT " + s("release_leadership") + "('a', 1)"), "f") << "a no longer holds it";
  EXPECT_EQ(a_.scalar("SELECT holder || ' ' || term FROM " + s("leadership")), "b 2");
}

TEST_F(leadership, a_fenced_pass_of_a_lost_or_expired_term_raises_tn004_and_changes_nothing) {
  // A silent attempt (stale at once) and a deferred job that is due.
  a_.exec("SELECT " + s("enqueue") + "('k')");
  const auto claimed = a_.exec("SELECT job_id FROM " + s("claim") + "('default')");
  ASSERT_EQ(claimed.rows.size(), 1u);
  a_.exec("SELECT " + s("enqueue") + "('later', '{}', 'default', 2, clock_timestamp() + interval '50 milliseconds')");
  std::this_thread::sleep_for(100ms);
  const auto unchanged = [&] {
    EXPECT_EQ(a_.scalar("SELECT count(*) FROM " + s("receipts")), "1") << "the silent attempt stays open";
    EXPECT_EQ(a_.scalar("SELECT count(*) FROM " + s("deferred")), "1") << "the due job stays deferred";
  };

  // a leads with term 1, then loses it to b (term 2).
  ASSERT_EQ(acquire_as(a_, "a", "1 hour"), cell{"1"});
  ASSERT_EQ(a_.scalar("SELECT " + s("release_leadership") + "('a', 1)"), "t");
  ASSERT_EQ(acquire_as(b_, "b", "1 hour"), cell{"2"});

  for (const auto& [holder, term] : std::vector<std::pair<std::string, std::string>>{
           {"a", "1"},    // the old leader, waking up
           {"a", "2"},    // the current term under another name
           {"b", "1"},    // the current holder with an old term
           {"b", "3"}}) {  // a term that does not exist yet
    auto r = maintain(a_, holder, term);
    EXPECT_EQ(r.sqlstate, "TN004") << holder << " term " << term << ": " << r.error;
    unchanged();
  }

  // The current leader's pass does the work.
  auto r = maintain(b_, "b", "2");
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.at(0, 0), claimed.at(0, 0));
  EXPECT_EQ(r.at(0, 3), "available");
  EXPECT_EQ(a_.scalar("SELECT count(*) FROM " + s("receipts")), "0");
  EXPECT_EQ(a_.scalar("SELECT count(*) FROM " + s("deferred")), "0");
  EXPECT_EQ(a_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'available'"), "2");
}

TEST_F(leadership, a_holder_whose_lease_expired_is_fenced_even_when_nobody_took_it_over) {
  a_.exec("SELECT " + s("enqueue") + "('k')");
  a_.exec("SELECT * FROM " + s("claim") + "('default')");
  ASSERT_EQ(acquire_as(a_, "a", "100 milliseconds"), cell{"1"});
  wait_expired();
  EXPECT_EQ(maintain(a_, "a", "1").sqlstate, "TN004");
  EXPECT_EQ(a_.scalar("SELECT count(*) FROM " + s("receipts")), "1");
}

TEST_F(leadership, a_takeover_waits_for_the_pass_of_the_current_term_to_commit) {
  ASSERT_EQ(acquire_as(a_, "a", "300 milliseconds"), cell{"1"});
  // a's pass runs inside a longer transaction (it holds the lease row FOR SHARE until commit).
  a_.exec("BEGIN");
  ASSERT_TRUE(maintain(a_, "a", "1", "1 hour").ok);
  wait_expired();
  const auto b_pid = b_.scalar("SELECT pg_backend_pid()");
  std::atomic<bool> answered{false};
  cell b_term;
  std::thread taker([&] {
    b_term = acquire_as(b_, "b", "1 hour");
    answered = true;
  });
  // b waits on the row lock while a's pass is open...
  bool waiting = false;
  for (int i = 0; i < 500 && !waiting; ++i) {
    waiting = watch_.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                        {b_pid}) == "1";
    if (!waiting) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(waiting) << "the takeover did not wait for the pass of the current term";
  EXPECT_FALSE(answered.load());
  // ...and takes the lease once it committed.
  a_.exec("COMMIT");
  taker.join();
  EXPECT_EQ(b_term, cell{"2"});
}

TEST_F(leadership, the_holder_renews_its_lease_while_its_own_pass_is_open_without_waiting_for_it) {
  ASSERT_EQ(acquire_as(a_, "a", "1 hour"), cell{"1"});
  const auto expiry = [&] { return watch_.scalar("SELECT expires_at FROM " + s("leadership")); };
  // The pass runs on one session of the runtime (a pool connection), inside its transaction ...
  a_.exec("BEGIN");
  ASSERT_TRUE(maintain(a_, "a", "1", "1 hour").ok);
  const auto before = expiry();
  // ... and the renewal comes from another (the runtime's signal session).
  b_.exec("SET lock_timeout = '2s'");
  const auto t0 = std::chrono::steady_clock::now();
  auto renewed = b_.query("SELECT " + s("acquire_leadership") + "('a', '1 hour')");
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(renewed.ok) << renewed.sqlstate << ": " << renewed.error;
  EXPECT_EQ(renewed.rows.at(0).at(0), cell{"1"}) << "a renewal keeps the term";
  EXPECT_LT(took, 1s) << "the renewal waited for the pass";
  EXPECT_NE(expiry(), before) << "the lease was extended";
  EXPECT_EQ(acquire_as(watch_, "b", "1 hour"), cell{}) << "another holder still gets nothing";
  a_.exec("COMMIT");
  EXPECT_EQ(watch_.scalar("SELECT holder || ' ' || term FROM " + s("leadership")), "a 1");
}

TEST_F(leadership, a_release_does_not_wait_for_the_holders_pass_and_the_takeover_after_it_still_does) {
  ASSERT_EQ(acquire_as(a_, "a", "1 hour"), cell{"1"});
  a_.exec("BEGIN");
  ASSERT_TRUE(maintain(a_, "a", "1", "1 hour").ok);
  b_.exec("SET lock_timeout = '2s'");
  ASSERT_EQ(b_.scalar("SELECT " + s("release_leadership") + "('a', 1)"), "t");
  std::atomic<bool> answered{false};
  cell taken;
  pg taker_session{schema_.dsn()};
  const auto taker_pid = taker_session.scalar("SELECT pg_backend_pid()");
  std::thread taker([&] {
    taken = acquire_as(taker_session, "c", "1 hour");
    answered = true;
  });
  bool waiting = false;
  for (int i = 0; i < 500 && !waiting; ++i) {
    waiting = watch_.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                            {taker_pid}) == "1";
    if (!waiting) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(waiting) << "the takeover did not wait for the open pass of term 1";
  EXPECT_FALSE(answered.load());
  a_.exec("COMMIT");
  taker.join();
  EXPECT_EQ(taken, cell{"2"});
  EXPECT_EQ(watch_.scalar("SELECT holder || ' ' || term FROM " + s("leadership")), "c 2");
}

TEST_F(leadership, sessions_racing_for_an_expired_lease_never_both_win) {
  constexpr int k_sessions = 6;
  std::vector<std::unique_ptr<pg>> sessions;
  for (int i = 0; i < k_sessions; ++i) sessions.push_back(std::make_unique<pg>(schema_.dsn()));
  for (int round = 0; round < 20; ++round) {
    a_.exec("UPDATE " + s("leadership") + " SET expires_at = '-infinity'");
    std::atomic<int> ready{0}, winners{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < k_sessions; ++i) {
      threads.emplace_back([&, i] {
        ++ready;
        while (ready.load() < k_sessions) std::this_thread::yield();
        if (acquire_as(*sessions[i], "w" + std::to_string(i), "1 hour")) ++winners;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(winners.load(), 1) << "round " << round;
  }
  EXPECT_EQ(a_.scalar("SELECT term FROM " + s("leadership")), "20");
}

TEST_F(leadership, bad_arguments_raise_22023) {
  for (const std::string ttl : {"0 seconds", "-1 second", "61 minutes"}) {
    EXPECT_EQ(a_.query("SELECT " + s("acquire_leadership") + "('a', $1::interval)", {ttl}).sqlstate, "22023") << ttl;
  }
  EXPECT_EQ(a_.query("SELECT " + s("acquire_leadership") + "('a', NULL)").sqlstate, "22023");
  EXPECT_EQ(a_.query("SELECT " + s("acquire_leadership") + "('', '1 minute')").sqlstate, "22023");
  EXPECT_EQ(a_.query("SELECT " + s("acquire_leadership") + "(NULL, '1 minute')").sqlstate, "22023");
  EXPECT_EQ(a_.query("SELECT " + s("acquire_leadership") + "(repeat('x', 201), '1 minute')").sqlstate, "22023");
  EXPECT_EQ(a_.scalar("SELECT term FROM " + s("leadership")), "0") << "nothing was taken";
}

// Two attempts of one claim, each with an attempt_state row (x's written first), both closed by a
// completion while session a_ holds a REPEATABLE READ snapshot from before it: a heartbeat
// statement whose snapshot predates a completion that committed under it (a runtime's heartbeat
// of a batch that just flushed). The heartbeat locks y's row; the leader's sweep deletes x's.
TEST_F(leadership, the_maintenance_pass_never_waits_on_attempt_state_rows_a_heartbeat_holds_and_never_deadlocks_with_it) {
  a_.exec("SELECT " + s("enqueue") + "('k', '{}', 'q')");
  a_.exec("SELECT " + s("enqueue") + "('k', '{}', 'q')");
  const auto claimed = a_.exec("SELECT job_id, run_lease FROM " + s("claim_attempts") + "('q', 2, 'w') ORDER BY job_id");
  ASSERT_EQ(claimed.rows.size(), 2u);
  const struct {
    std::string x, x_lease, y, y_lease;
  } c{claimed.at(0, 0), claimed.at(0, 1), claimed.at(1, 0), claimed.at(1, 1)};
  const auto heartbeat = [&](pg& session, const std::string& job, const std::string& lease) {
    return session.query("SELECT * FROM " + s("heartbeat_batch") + "(ARRAY[$1]::bigint[], ARRAY[$2]::bigint[])",
                         {job, lease});
  };
  ASSERT_EQ(heartbeat(a_, c.x, c.x_lease).rows.size(), 1u);
  ASSERT_EQ(heartbeat(a_, c.y, c.y_lease).rows.size(), 1u);
  ASSERT_EQ(acquire_as(b_, "b", "1 hour"), cell{"1"});

  a_.exec("BEGIN ISOLATION LEVEL REPEATABLE READ");
  a_.exec("SELECT 1");  // the snapshot: both attempts open
  watch_.exec("SELECT " + s("complete_batch") + "(ARRAY[$1, $2]::bigint[], ARRAY[$3, $4]::bigint[])",
              {c.x, c.y, c.x_lease, c.y_lease});
  // a_'s heartbeat of y locks y's attempt_state row until a_ ends.
  auto first = heartbeat(a_, c.y, c.y_lease);
  ASSERT_TRUE(first.ok) << first.error;
  ASSERT_EQ(first.rows.size(), 1u);

  // The leader's pass sweeps the attempt_state of closed attempts: x's row now, y's (held) later.
  const auto b_pid = b_.scalar("SELECT pg_backend_pid()");
  std::atomic<bool> answered{false};
  tenure::test::sql_result pass;
  std::thread leader([&] {
    pass = maintain(b_, "b", "1", "1 hour");
    answered = true;
  });
  bool waiting = false;
  for (int i = 0; i < 300 && !answered && !waiting; ++i) {
    waiting = watch_.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                            {b_pid}) == "1";
    if (!answered && !waiting) std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(waiting) << "the maintenance pass waited for the heartbeat's transaction";

  // a_'s heartbeat of x, from the same snapshot: a pass that deleted x's row and waits for y's
  // would close a cycle here (40P01 after deadlock_timeout).
  auto second = heartbeat(a_, c.x, c.x_lease);
  EXPECT_NE(second.sqlstate, "40P01") << second.error;
  a_.query("ROLLBACK");
  leader.join();
  ASSERT_TRUE(pass.ok) << pass.sqlstate << ": " << pass.error;
  EXPECT_EQ(watch_.scalar("SELECT count(*) FROM " + s("attempt_state") + " WHERE job_id = $1", {c.x}), "0")
      << "the closed attempt's row is swept";

  // With the heartbeat gone, the next pass sweeps y's row too.
  ASSERT_TRUE(maintain(b_, "b", "1", "1 hour").ok);
  EXPECT_EQ(watch_.scalar("SELECT count(*) FROM " + s("attempt_state")), "0");
}

TEST_F(leadership, operators_can_still_rescue_and_promote_by_hand_beside_a_leader) {
  ASSERT_EQ(acquire_as(a_, "a", "1 hour"), cell{"1"});
  b_.exec("SELECT " + s("enqueue") + "('k')");
  b_.exec("SELECT * FROM " + s("claim") + "('default')");
  EXPECT_EQ(b_.scalar("SELECT " + s("rescue_stale") + "('0 seconds')"), "1");
  EXPECT_EQ(b_.scalar("SELECT " + s("promote_due") + "()"), "0");
}

}  // namespace
