// Long attempts in the SQL contract: progress checkpoints, external callbacks and
// their races, driven as any language would drive them: plain SQL over libpq, real concurrency
// on separate connections where the race is concurrent.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/pg.hpp"

using tenure::test::pg;
using tenure::test::scoped_schema;
using namespace std::chrono_literals;

namespace {

class callbacks : public ::testing::Test {
 protected:
  scoped_schema schema_{"cb"};
  pg db_{schema_.dsn()};
  std::string s(const std::string& fn) const { return schema_.name() + "." + fn; }

  struct attempt {
    std::string job_id, run_lease;
  };
  /// Enqueues one job and claims it.
  attempt start(int max_attempts = 25) {
    db_.exec("SELECT " + s("enqueue") + "('cb', '{}', 'default', 2, NULL, $1::int)",
             {std::to_string(max_attempts)});
    return claim();
  }
  attempt claim() {
    auto r = db_.exec("SELECT job_id, run_lease FROM " + s("claim") + "('default')");
    if (r.rows.size() != 1) throw std::runtime_error("expected one claimed job");
    return {r.at(0, 0), r.at(0, 1)};
  }
  std::string register_cb(const attempt& a, const std::string& timeout = "1 hour") {
    auto r = db_.query("SELECT " + s("register_callback") + "($1, $2, $3::interval)",
                       {a.job_id, a.run_lease, timeout});
    if (!r.ok) throw std::runtime_error(r.error);
    return r.rows.at(0).at(0).value_or("<null>");
  }
  /// await_callback's status ('waiting' / 'resumed:<payload>') or 'stale' when no row.
  std::string await(const attempt& a, const std::string& id) {
    auto r = db_.exec("SELECT status, payload::text FROM " + s("await_callback") + "($1, $2, $3::uuid)",
                      {a.job_id, a.run_lease, id});
    if (r.rows.empty()) return "stale";
    if (r.at(0, 0) == "resumed") return "resumed:" + r.rows[0][1].value_or("<null>");
    return r.at(0, 0);
  }
  std::string resume(const std::string& id, const std::string& payload = "{}") {
    return db_.scalar("SELECT " + s("resume_callback") + "($1::uuid, $2::jsonb)", {id, payload});
  }
  std::string state_of(const attempt& a) {
    return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {a.job_id});
  }
  std::string rescue(const std::string& stale_after) {
    return db_.scalar("SELECT " + s("rescue_stale") + "($1::interval)", {stale_after});
  }
  /// True once `listener` received a notification whose payload is `payload` (10 s at most).
  static bool notified(pg& listener, const std::string& payload) {
    bool got = false;
    return eventually([&] {
      PQconsumeInput(listener.native());
      while (PGnotify* n = PQnotifies(listener.native())) {
        got = got || std::string{n->extra} == payload;
        PQfreemem(n);
      }
      return got;
    });
  }
  template <class Cond>
  static bool eventually(Cond cond, std::chrono::milliseconds timeout = 10s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      if (cond()) return true;
      std::this_thread::sleep_for(5ms);
    }
    return cond();
  }
};

TEST_F(callbacks, checkpoint_is_the_progress_carried_in_and_is_guarded) {
  auto a = start();
  EXPECT_EQ(db_.exec("SELECT progress FROM " + s("attempt_checkpoint") + "($1, $2)", {a.job_id, a.run_lease})
                .rows.at(0).at(0),
            std::nullopt);
  db_.exec("SELECT * FROM " + s("heartbeat_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY['{\"n\":1}'::jsonb])",
           {a.job_id, a.run_lease});
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_attempt") + "($1, $2, 'again', false, '0 seconds')", {a.job_id, a.run_lease}),
            "retryable");
  db_.exec("SELECT " + s("promote_due") + "()");
  auto b = claim();
  EXPECT_EQ(b.job_id, a.job_id);
  EXPECT_GT(std::stoll(b.run_lease), std::stoll(a.run_lease));
  EXPECT_EQ(db_.scalar("SELECT progress::text FROM " + s("attempt_checkpoint") + "($1, $2)", {b.job_id, b.run_lease}),
            "{\"n\": 1}");
  // The old attempt is stale: no row.
  EXPECT_TRUE(db_.exec("SELECT * FROM " + s("attempt_checkpoint") + "($1, $2)", {a.job_id, a.run_lease}).rows.empty());
}

TEST_F(callbacks, register_materializes_the_lease_rotates_and_is_guarded) {
  auto a = start();
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("attempt_state")), "0") << "claim alone writes no lease row";
  const auto id1 = register_cb(a);
  EXPECT_EQ(id1.size(), 36u) << id1;
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("attempt_state") + " WHERE job_id = $1 AND run_lease = $2",
                       {a.job_id, a.run_lease}),
            "1");
  const auto id2 = register_cb(a);
  EXPECT_NE(id1, id2) << "registering again rotates the id";
  EXPECT_EQ(resume(id1), "f") << "the rotated-out id is unknown";
  EXPECT_EQ(await(a, id1), "stale");
  EXPECT_EQ(db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {a.job_id}), a.run_lease);
  EXPECT_EQ(state_of(a), "running");
  // A stale attempt registers nothing.
  EXPECT_EQ(register_cb({a.job_id, "99"}), "<null>");
  EXPECT_EQ(db_.query("SELECT " + s("register_callback") + "($1, $2, '0 seconds')", {a.job_id, a.run_lease}).sqlstate,
            "22023");
}

TEST_F(callbacks, waiting_attempt_shows_waiting_external_is_not_rescued_for_silence_and_resumes) {
  auto a = start();
  const auto id = register_cb(a);
  EXPECT_EQ(await(a, id), "waiting");
  EXPECT_EQ(state_of(a), "waiting_external");
  EXPECT_EQ(await(a, id), "waiting") << "polling is a read";
  // No heartbeat for a while: a running attempt would be rescued, a waiting one is not.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(rescue("1 millisecond"), "0");
  // Its own completion is refused while it waits (the callback owns it).
  EXPECT_TRUE(db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])",
                       {a.job_id, a.run_lease})
                  .rows.empty());
  EXPECT_EQ(resume(id, "{\"ok\": true}"), "t");
  EXPECT_EQ(state_of(a), "running");
  EXPECT_EQ(await(a, id), "resumed:{\"ok\": true}");
  EXPECT_EQ(resume(id), "f") << "already resolved";
  EXPECT_EQ(db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {a.job_id}), a.run_lease);
  // Resumed: heartbeat restarted, completion applies again under the same run lease.
  EXPECT_EQ(db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])",
                     {a.job_id, a.run_lease})
                .rows.size(),
            1u);
  EXPECT_EQ(state_of(a), "completed");
}

TEST_F(callbacks, the_hard_deadline_is_suspended_while_waiting_and_resumes_where_it_stopped) {
  auto a = start();
  const auto id = register_cb(a);
  EXPECT_EQ(await(a, id), "waiting");
  // The attempt had 10 minutes left when it parked an hour ago; the deadline passed meanwhile.
  db_.exec("UPDATE " + s("attempt_state") + " SET waiting_since = now() - interval '1 hour' WHERE job_id = $1",
           {a.job_id});
  db_.exec("UPDATE " + s("claims") + " SET deadline_at = now() - interval '50 minutes' WHERE job_ids @> ARRAY[$1::bigint]",
           {a.job_id});
  EXPECT_EQ(rescue("1 hour"), "0") << "no deadline rescue while waiting";
  EXPECT_EQ(resume(id), "t");
  EXPECT_EQ(db_.scalar("SELECT round(extract(epoch from deadline_at - now()) / 60) FROM " + s("receipts") +
                       " WHERE job_id = $1", {a.job_id}),
            "10")
      << "the remaining 10 minutes are kept";
  EXPECT_EQ(rescue("1 hour"), "0") << "the resumed attempt is not overdue";
  EXPECT_EQ(state_of(a), "running");
}

TEST_F(callbacks, sequential_callbacks_in_one_attempt_each_park_and_resume) {
  auto a = start();
  const auto first = register_cb(a);
  ASSERT_EQ(await(a, first), "waiting");
  ASSERT_EQ(resume(first, "{\"step\": 1}"), "t");
  ASSERT_EQ(await(a, first), "resumed:{\"step\": 1}");
  const auto second = register_cb(a);
  EXPECT_NE(first, second);
  EXPECT_EQ(await(a, first), "stale") << "the first id is gone with the rotation";
  ASSERT_EQ(await(a, second), "waiting");
  EXPECT_EQ(state_of(a), "waiting_external");
  EXPECT_EQ(db_.query("SELECT " + s("register_callback") + "($1, $2, '1 hour')", {a.job_id, a.run_lease}).sqlstate,
            "22023")
      << "no rotation while parked";
  EXPECT_EQ(resume(first), "f");
  EXPECT_EQ(resume(second, "{\"step\": 2}"), "t");
  EXPECT_EQ(await(a, second), "resumed:{\"step\": 2}");
  EXPECT_EQ(db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {a.job_id}), a.run_lease);
}

TEST_F(callbacks, resume_arriving_before_the_handler_waits_is_kept) {
  auto a = start();
  const auto id = register_cb(a);
  EXPECT_EQ(resume(id, "{\"early\": 1}"), "t");
  EXPECT_EQ(state_of(a), "running") << "never parked";
  EXPECT_EQ(await(a, id), "resumed:{\"early\": 1}") << "the wait returns at once with the payload";
  EXPECT_EQ(state_of(a), "running");
  EXPECT_EQ(resume(id), "f");
}

TEST_F(callbacks, two_concurrent_resumes_exactly_one_wins) {
  for (int round = 0; round < 10; ++round) {
    auto a = start();
    const auto id = register_cb(a);
    ASSERT_EQ(await(a, id), "waiting");
    // A third session holds the attempt's lock (as a closer in a caller's transaction does) so
    // both resumes are in flight at once, then lets them race.
    pg holder{schema_.dsn()};
    holder.exec("BEGIN");
    holder.exec("SELECT pg_advisory_xact_lock(hashtext('" + s("attempt") + "'), " + s("attempt_lock_key") +
                    "($1::bigint, $2::bigint))",
                {a.job_id, a.run_lease});
    std::atomic<int> wins{0}, answered{0};
    auto racer = [&](const std::string& payload) {
      pg conn{schema_.dsn()};
      const auto r = conn.scalar("SELECT " + s("resume_callback") + "($1::uuid, $2::jsonb)", {id, payload});
      if (r == "t") ++wins;
      ++answered;
    };
    std::thread t1(racer, "{\"by\": 1}"), t2(racer, "{\"by\": 2}");
    const bool both_blocked = eventually([&] {
      return db_.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "
                        "'%resume_callback%'") == "2";
    });
    holder.exec("COMMIT");
    t1.join();
    t2.join();
    ASSERT_TRUE(both_blocked) << "round " << round;
    EXPECT_EQ(answered.load(), 2);
    EXPECT_EQ(wins.load(), 1) << "round " << round;
    const auto got = await(a, id);
    EXPECT_TRUE(got == "resumed:{\"by\": 1}" || got == "resumed:{\"by\": 2}") << got;
    db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])", {a.job_id, a.run_lease});
  }
}

TEST_F(callbacks, a_resume_committed_while_a_slow_rescue_scans_is_never_also_rescued) {
  // Many stale attempts ahead of the target make the rescue statement slow; a resume of the
  // target's timed-out callback commits while it scans. Exactly one of them may win: the resume
  // (returns true, the attempt runs on) or the rescue (the resume returns false).
  db_.exec("SELECT count(*) FROM (SELECT " + s("enqueue") + "('filler', '{}', 'default', 2, NULL, 5) "
           "FROM generate_series(1, 20000)) x");
  while (db_.scalar("SELECT count(*) FROM " + s("claim") + "('default', 10000)") != "0") {
  }
  db_.exec("UPDATE " + s("claims") + " SET claimed_at = now() - interval '2 hours'");
  auto a = start();  // the newest job: rescue reaches it last
  const auto id = register_cb(a, "10 milliseconds");
  ASSERT_EQ(await(a, id), "waiting");
  std::this_thread::sleep_for(20ms);  // its callback timed out
  std::string rescued;
  std::thread rescuer([&] {
    pg conn{schema_.dsn()};
    rescued = conn.scalar("SELECT count(*) FROM " + s("rescue_attempts") + "('1 hour') WHERE job_id = $1",
                          {a.job_id});
  });
  ASSERT_TRUE(eventually([&] {
    return db_.scalar("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE "
                      "'%rescue_attempts%' AND pid <> pg_backend_pid()") == "1";
  }));
  pg other{schema_.dsn()};
  const auto resumed = other.scalar("SELECT " + s("resume_callback") + "($1::uuid, '{\"paid\": true}')", {id});
  rescuer.join();
  EXPECT_NE(resumed == "t", rescued == "1") << "resume returned " << resumed << ", rescue closed it: " << rescued;
  if (resumed == "t") {
    EXPECT_EQ(state_of(a), "running");
    EXPECT_EQ(await(a, id), "resumed:{\"paid\": true}");
  } else {
    EXPECT_EQ(state_of(a), "available");
  }
}

TEST_F(callbacks, resume_after_rescue_or_cancel_is_rejected) {
  // Rescued for its callback timeout.
  auto a = start();
  const auto id = register_cb(a, "20 milliseconds");
  ASSERT_EQ(await(a, id), "waiting");
  ASSERT_TRUE(eventually([&] { return rescue("1 hour") == "1"; }));
  EXPECT_EQ(resume(id), "f");
  EXPECT_EQ(await(a, id), "stale");
  // Rescued while registered but running (no heartbeat).
  db_.exec("SELECT " + s("cancel_job") + "($1)", {a.job_id});
  auto b = start();
  const auto id_b = register_cb(b);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(rescue("10 milliseconds"), "1");
  EXPECT_EQ(resume(id_b), "f");
  // Cancelled by an admin while waiting.
  db_.exec("SELECT " + s("cancel_job") + "($1)", {b.job_id});
  auto c = start();
  const auto id_c = register_cb(c);
  ASSERT_EQ(await(c, id_c), "waiting");
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {c.job_id}), "t");
  EXPECT_EQ(state_of(c), "cancelled");
  EXPECT_EQ(resume(id_c), "f");
  EXPECT_EQ(await(c, id_c), "stale");
}

TEST_F(callbacks, admin_cancel_while_waiting_notifies_the_cancel_channel) {
  pg listener{schema_.dsn()};
  listener.exec("LISTEN " + schema_.name() + "_cancel");
  auto a = start();
  const auto id = register_cb(a);
  ASSERT_EQ(await(a, id), "waiting");
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {a.job_id}), "t");
  EXPECT_TRUE(notified(listener, a.job_id + ":" + a.run_lease));
}

TEST_F(callbacks, resume_notifies_the_callback_channel) {
  pg listener{schema_.dsn()};
  listener.exec("LISTEN " + schema_.name() + "_callback");
  auto a = start();
  const auto id = register_cb(a);
  ASSERT_EQ(await(a, id), "waiting");
  ASSERT_EQ(resume(id), "t");
  EXPECT_TRUE(notified(listener, a.job_id + ":" + a.run_lease));
}

TEST_F(callbacks, callback_timeout_retries_while_attempts_remain_then_fails) {
  auto a = start(2);
  const auto id = register_cb(a, "20 milliseconds");
  ASSERT_EQ(await(a, id), "waiting");
  ASSERT_TRUE(eventually([&] { return rescue("1 hour") == "1"; }));
  EXPECT_EQ(state_of(a), "available");
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {a.job_id}),
            "rescued: callback timed out");
  auto b = claim();
  EXPECT_EQ(b.job_id, a.job_id);
  EXPECT_GT(std::stoll(b.run_lease), std::stoll(a.run_lease));
  const auto id_b = register_cb(b, "20 milliseconds");
  ASSERT_EQ(await(b, id_b), "waiting");
  ASSERT_TRUE(eventually([&] { return rescue("1 hour") == "1"; }));
  EXPECT_EQ(state_of(b), "failed");
}

TEST_F(callbacks, extend_callback_moves_a_waiting_attempts_timeout) {
  auto a = start();
  const auto id = register_cb(a, "200 milliseconds");
  ASSERT_EQ(await(a, id), "waiting");
  EXPECT_EQ(db_.scalar("SELECT " + s("extend_callback") + "($1::uuid, '1 hour')", {id}), "t");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(rescue("1 hour"), "0") << "the extended timeout holds";
  EXPECT_EQ(state_of(a), "waiting_external");
  // Shortened again: it times out.
  EXPECT_EQ(db_.scalar("SELECT " + s("extend_callback") + "($1::uuid, '10 milliseconds')", {id}), "t");
  ASSERT_TRUE(eventually([&] { return rescue("1 hour") == "1"; }));
  EXPECT_EQ(db_.scalar("SELECT " + s("extend_callback") + "($1::uuid, '1 hour')", {id}), "f") << "stale";
  EXPECT_EQ(db_.scalar("SELECT " + s("extend_callback") + "(gen_random_uuid(), '1 hour')"), "f") << "unknown";
  EXPECT_EQ(db_.query("SELECT " + s("extend_callback") + "($1::uuid, '-1 second')", {id}).sqlstate, "22023");
}

TEST_F(callbacks, complete_and_fail_callback_finish_the_job_from_outside) {
  auto a = start();
  const auto id = register_cb(a);
  ASSERT_EQ(await(a, id), "waiting");
  EXPECT_EQ(db_.scalar("SELECT " + s("complete_callback") + "($1::uuid, '{\"final\": true}')", {id}), "t");
  EXPECT_EQ(state_of(a), "completed");
  EXPECT_EQ(db_.scalar("SELECT progress::text FROM " + s("jobs") + " WHERE id = $1", {a.job_id}), "{\"final\": true}");
  EXPECT_EQ(db_.scalar("SELECT " + s("complete_callback") + "($1::uuid)", {id}), "f");
  EXPECT_EQ(resume(id), "f");

  auto b = start(5);
  const auto id_b = register_cb(b);
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_callback") + "($1::uuid, 'provider said no', true)", {id_b}), "t");
  EXPECT_EQ(state_of(b), "retryable");
  auto c = start(5);
  const auto id_c = register_cb(c);
  ASSERT_EQ(await(c, id_c), "waiting");
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_callback") + "($1::uuid, 'provider said never')", {id_c}), "t");
  EXPECT_EQ(state_of(c), "failed");
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {c.job_id}), "provider said never");
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_callback") + "($1::uuid, 'again')", {id_c}), "f");
}

TEST_F(callbacks, a_heartbeat_that_arrives_after_the_park_leaves_the_parked_attempt_unbeaten) {
  // A runtime's heartbeat collected while the handler was still parking can reach the server after
  // the park committed: it must not make the parked attempt look held, yet its progress is kept.
  db_.exec("SELECT " + s("enqueue") + "('cb', '{}', 'default', 2, NULL, 5)");
  const auto claimed = db_.exec("SELECT job_id, run_lease, token FROM " + s("claim") + "('default')");
  ASSERT_EQ(claimed.rows.size(), 1u);
  const attempt a{claimed.at(0, 0), claimed.at(0, 1)};
  const std::string token = claimed.at(0, 2);
  const auto id = register_cb(a);
  EXPECT_EQ(db_.scalar("SELECT " + s("heartbeat") + "($1)", {token}), "t") << "held by its handler";
  ASSERT_EQ(db_.scalar("SELECT " + s("park_callback") + "($1, $2, $3::uuid)", {a.job_id, a.run_lease, id}), "parked");
  const auto beat_at = [&] {
    return db_.scalar("SELECT heartbeat_at FROM " + s("attempt_state") + " WHERE job_id = $1 AND run_lease = $2",
                      {a.job_id, a.run_lease});
  };
  const auto before = beat_at();
  std::this_thread::sleep_for(20ms);
  const auto late = db_.exec("SELECT * FROM " + s("heartbeat_batch") +
                                 "(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY['{\"last\": 7}'::jsonb])",
                             {a.job_id, a.run_lease});
  EXPECT_TRUE(late.rows.empty()) << "a parked attempt is not answered live";
  EXPECT_EQ(beat_at(), before);
  EXPECT_EQ(db_.scalar("SELECT progress->>'last' FROM " + s("attempt_state") + " WHERE job_id = $1", {a.job_id}), "7");
  EXPECT_EQ(db_.scalar("SELECT " + s("heartbeat") + "($1)", {token}), "f") << "no handler holds a parked attempt";
  EXPECT_EQ(beat_at(), before);
  EXPECT_EQ(state_of(a), "waiting_external");
  // Resumed and continued: the continuation is beaten again, and starts from the kept progress.
  EXPECT_EQ(resume(id, "{}"), "t");
  auto b = claim();
  EXPECT_EQ(db_.scalar("SELECT progress->>'last' FROM " + s("attempt_checkpoint") + "($1, $2)", {b.job_id, b.run_lease}),
            "7");
  EXPECT_EQ(db_.exec("SELECT * FROM " + s("heartbeat_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])",
                     {b.job_id, b.run_lease})
                .rows.size(),
            1u);
}

TEST_F(callbacks, a_token_from_before_a_park_never_closes_the_continuation_claimed_during_its_call) {
  // The holder of the token an attempt had before it parked calls complete_job / fail_job while the
  // attempt is resumed and continued by a new claim (same run lease, new secret). The exclusive
  // lock on attempt_state holds the call's write back (its statements read that table) until the
  // resume and the claim have committed, or given up. Whatever the order, the continuation is
  // never closed through the old token: the write acts only on the receipt whose secret it checked.
  for (const std::string fn : {"complete_job", "fail_job"}) {
    SCOPED_TRACE(fn);
    db_.exec("SELECT " + s("enqueue") + "('cb', '{}', 'default', 2, NULL, 5)");
    auto r = db_.exec("SELECT job_id, run_lease, token FROM " + s("claim") + "('default')");
    ASSERT_EQ(r.rows.size(), 1u);
    const attempt a{r.at(0, 0), r.at(0, 1)};
    const std::string old_token = r.at(0, 2);
    const auto id = register_cb(a);
    ASSERT_EQ(db_.scalar("SELECT " + s("park_callback") + "($1, $2, $3::uuid)", {a.job_id, a.run_lease, id}),
              "parked");

    pg locker{schema_.dsn()};
    locker.exec("BEGIN");
    locker.exec("LOCK TABLE " + s("attempt_state") + " IN ACCESS EXCLUSIVE MODE");
    tenure::test::sql_result old;
    std::thread holder([&] {
      pg conn{schema_.dsn()};
      old = conn.query(fn == "complete_job" ? "SELECT * FROM " + s("complete_job") + "($1)"
                                            : "SELECT " + s("fail_job") + "($1, 'late', false)",
                       {old_token});
    });
    ASSERT_TRUE(eventually([&] {
      return db_.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%" +
                        fn + "%' AND pid <> pg_backend_pid()") == "1";
    }));
    locker.exec("SET LOCAL lock_timeout = '200ms'");
    std::string new_token;
    const auto resumed = locker.query("SELECT " + s("resume_callback") + "($1::uuid, '{}')", {id});
    if (resumed.ok) {
      auto c = locker.exec("SELECT job_id, run_lease, token FROM " + s("claim") + "('default')");
      ASSERT_EQ(c.rows.size(), 1u);
      EXPECT_EQ(c.at(0, 1), a.run_lease) << "a continuation keeps its run lease";
      new_token = c.at(0, 2);
      locker.exec("COMMIT");
    } else {
      // The old token's call holds the receipt: the resume waited for it and gave up.
      EXPECT_EQ(resumed.sqlstate, "55P03") << resumed.error;
      locker.query("ROLLBACK");
    }
    holder.join();
    if (!new_token.empty()) {
      EXPECT_FALSE(old.ok) << "the old token closed the continuation";
      EXPECT_EQ(state_of(a), "running");
      const auto by_new = db_.query("SELECT * FROM " + s("complete_job") + "($1)", {new_token});
      EXPECT_TRUE(by_new.ok && by_new.rows.size() == 1) << "its own token is refused: " << by_new.error;
    } else if (fn == "complete_job") {
      EXPECT_EQ(old.sqlstate, "TN001") << "a parked attempt is not completed: " << old.error;
      EXPECT_EQ(state_of(a), "waiting_external");
      EXPECT_EQ(resume(id), "t");
      db_.exec("SELECT * FROM " + s("claim") + "('default')");
    } else {
      EXPECT_TRUE(old.ok) << "its holder may fail its own parked attempt: " << old.error;
      EXPECT_EQ(state_of(a), "failed");
    }
  }
}

/// A parked attempt resumed with `payload`, then continued by a claim: the continuation's
/// attempt, its number and the payload the claim handed over.
struct continuation {
  std::string job_id, run_lease, attempt, payload;
};

class continuations : public callbacks {
 protected:
  continuation claim_continuation() {
    auto r = db_.exec("SELECT job_id, run_lease, attempt, resume_payload::text FROM " + s("claim_attempts") +
                      "('default', 1)");
    if (r.rows.size() != 1) throw std::runtime_error("expected one claimed job");
    return {r.at(0, 0), r.at(0, 1), r.at(0, 2), r.rows[0][3].value_or("<null>")};
  }
  /// Enqueues, claims, parks on a callback, resumes it with {"approved": "yes"}, claims the
  /// continuation.
  continuation parked_and_resumed(int max_attempts = 5) {
    auto a = start(max_attempts);
    const auto id = register_cb(a);
    if (db_.scalar("SELECT " + s("park_callback") + "($1, $2, $3::uuid)", {a.job_id, a.run_lease, id}) != "parked") {
      throw std::runtime_error("not parked");
    }
    if (resume(id, R"({"approved": "yes"})") != "t") throw std::runtime_error("not resumed");
    return claim_continuation();
  }
  /// True once `job_id` waits in ready, or in deferred with its time come (10 s at most).
  bool due(const std::string& job_id) {
    return eventually([&] {
      return db_.scalar("SELECT coalesce((SELECT d.run_at <= now() FROM " + s("deferred") + " d WHERE d.id = $1), true)",
                        {job_id}) == "t";
    });
  }
};

TEST_F(continuations, a_rescued_continuation_is_claimed_again_with_its_payload_as_the_next_attempt) {
  const auto c = parked_and_resumed();
  EXPECT_EQ(c.attempt, "1") << "a continuation runs as the parked attempt";
  EXPECT_EQ(c.payload, R"({"approved": "yes"})");
  // Its worker died: nothing heartbeats it, and rescue puts it back.
  EXPECT_EQ(rescue("0 seconds"), "1");
  EXPECT_EQ(db_.scalar("SELECT state || ':' || attempt FROM " + s("jobs") + " WHERE id = $1", {c.job_id}),
            "available:2");
  const auto again = claim_continuation();
  EXPECT_EQ(again.job_id, c.job_id);
  EXPECT_EQ(again.attempt, "2") << "the rescued attempt counts";
  EXPECT_EQ(again.payload, R"({"approved": "yes"})") << "the callback's answer survives the rescue";
  // The rescued lease is stale; the new one completes the job.
  EXPECT_TRUE(db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])",
                       {c.job_id, c.run_lease})
                  .rows.empty());
  EXPECT_EQ(db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])",
                     {again.job_id, again.run_lease})
                .rows.size(),
            1u);
  EXPECT_EQ(db_.scalar("SELECT state || ':' || attempt FROM " + s("jobs") + " WHERE id = $1", {c.job_id}),
            "completed:2");
}

TEST_F(continuations, a_continuation_rescued_on_its_last_attempt_fails_and_its_payload_ends_with_it) {
  const auto c = parked_and_resumed(1);
  EXPECT_EQ(rescue("0 seconds"), "1");
  EXPECT_EQ(db_.scalar("SELECT state || ':' || attempt FROM " + s("jobs") + " WHERE id = $1", {c.job_id}), "failed:1");
  EXPECT_TRUE(db_.exec("SELECT * FROM " + s("claim_attempts") + "('default', 1)").rows.empty());
}

TEST_F(continuations, a_snoozed_continuation_is_claimed_again_with_its_payload_as_the_same_attempt) {
  for (const std::string delay : {"0 seconds", "10 milliseconds"}) {
    SCOPED_TRACE(delay);
    const auto c = parked_and_resumed();
    // A stopping runtime gives the continuation back (no attempt spent), at once or later.
    EXPECT_EQ(db_.scalar("SELECT " + s("snooze_attempt") + "($1, $2, $3::interval)", {c.job_id, c.run_lease, delay}),
              "t");
    EXPECT_EQ(db_.scalar("SELECT attempt FROM " + s("jobs") + " WHERE id = $1", {c.job_id}), "1");
    ASSERT_TRUE(due(c.job_id));
    const auto again = claim_continuation();
    EXPECT_EQ(again.job_id, c.job_id);
    EXPECT_EQ(again.attempt, "1");
    EXPECT_EQ(again.payload, R"({"approved": "yes"})");
    EXPECT_EQ(db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])",
                       {again.job_id, again.run_lease})
                  .rows.size(),
              1u);
  }
}

TEST_F(continuations, a_failed_continuation_is_retried_with_its_payload_as_the_next_attempt) {
  const auto c = parked_and_resumed();
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_attempt") + "($1, $2, 'boom', false, '10 milliseconds')",
                       {c.job_id, c.run_lease}),
            "retryable");
  EXPECT_EQ(db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {c.job_id}), "retryable");
  ASSERT_TRUE(due(c.job_id));
  const auto again = claim_continuation();  // the claim promotes the due retry first
  EXPECT_EQ(again.job_id, c.job_id);
  EXPECT_EQ(again.attempt, "2");
  EXPECT_EQ(again.payload, R"({"approved": "yes"})") << "the callback's answer survives the retry";
  // An ordinary attempt's retry still carries no payload.
  auto plain = start();
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_attempt") + "($1, $2, 'boom', false, '0 seconds')",
                       {plain.job_id, plain.run_lease}),
            "retryable");
  const auto retried = claim_continuation();
  EXPECT_EQ(retried.job_id, plain.job_id);
  EXPECT_EQ(retried.attempt, "2");
  EXPECT_EQ(retried.payload, "<null>");
}

}  // namespace
