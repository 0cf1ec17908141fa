// Queue administration and retention against the real PostgreSQL: pause_queue / resume_queue
// (with a runtime draining the queue), configure_queue validation, the grant-admin slice, and the
// maintenance leader's pruning of expired finished jobs (bounded batches, the prune floor, live
// jobs untouched, a drain running beside it).
#include <atomic>
#include <future>
#include <mutex>
#include <set>

#include "runtime/runtime_fixture.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::test {
namespace {

class operators_pg : public runtime_pg {
 protected:
  /// The sqlstate of `sql` (empty when it succeeded).
  std::string state_of_sql(pg& session, const std::string& sql) { return session.query(sql).sqlstate; }
  std::string queue_row(const std::string& queue) {
    auto r = db_.query("SELECT row_to_json(q)::text FROM " + s("queues") + " q WHERE name = $1", {queue});
    return r.rows.empty() ? "(none)" : *r.rows[0][0];
  }
  long ready() { return std::stol(db_.scalar("SELECT count(*) FROM " + s("ready"))); }
  long receipts() { return std::stol(db_.scalar("SELECT count(*) FROM " + s("receipts"))); }
  /// `n` finished jobs, finished `age` ago, in `queue`: in `done` (with `state`: each a job's spec,
  /// a claim of it and that attempt's terminal closure), or in `dead_letter`.
  void finished(int n, const std::string& state, const std::string& age, const std::string& queue = "default",
                const std::string& table = "done") {
    if (table == "dead_letter") {
      db_.exec("INSERT INTO " + s(table) + " (id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, "
                   "created_at, finalized_at) SELECT nextval('" + s("job_id_seq") + "'), $1, 'k', '{}', 2, 1, 25, 1, now(), "
                   "now(), now() - $2::interval FROM generate_series(1, $3::int)",
               {queue, age, std::to_string(n)});
      return;
    }
    const std::string outcome = state == "completed" ? "c" : state == "failed" ? "f" : "x";
    db_.exec("WITH spec AS (INSERT INTO " + s("specs") + " (id, queue, kind, args, priority, max_attempts, metadata, "
                 "created_at) SELECT nextval('" + s("job_id_seq") + "'), $1, 'k', '{}', 2, 25, '{}', now() - $2::interval "
                 "FROM generate_series(1, $3::int) RETURNING id), "
                 "claim AS (INSERT INTO " + s("claims") + " (claim_id, queue, worker, claimed_at, lo, hi, job_ids, attempts, "
                 "secrets, run_ats) SELECT nextval('" + s("claim_id_seq") + "'), $1, 'test', now() - $2::interval, id, id, "
                 "ARRAY[id], ARRAY[1], ARRAY[gen_random_uuid()], ARRAY[now() - $2::interval] FROM spec RETURNING claim_id), "
                 "closure AS (INSERT INTO " + s("closures") + " (claim_id, pos, outcome, closed_at) "
                 "SELECT claim_id, 1, $4::\"char\", now() - $2::interval FROM claim) "
                 // settled as the leader's sweep settles a closed claim: ripe at its retention
                 "INSERT INTO " + s("settled_claims") + " (claim_id, queue, ripe_at) SELECT claim_id, $1, now() - $2::interval + "
                 "greatest('5 minutes', coalesce((SELECT CASE $4 WHEN 'c' THEN q.retain_completed WHEN 'x' THEN "
                 "q.retain_cancelled ELSE q.retain_failed END FROM " + s("queues") + " q WHERE q.name = $1), "
                 "CASE $4 WHEN 'f' THEN interval '7 days' ELSE interval '24 hours' END)) FROM claim",
             {queue, age, std::to_string(n), outcome});
  }
  long finished_count(const std::string& table = "done", const std::string& where = "true") {
    return std::stol(db_.scalar("SELECT count(*) FROM " + s(table) + " WHERE " + where));
  }
  /// One fenced maintenance pass as the holder of the lease.
  tenure::test::sql_result maintain_once(const std::string& stale_after = "30 seconds") {
    const auto term = db_.scalar("SELECT " + s("acquire_leadership") + "('test-leader', '1 hour')");
    return db_.query("SELECT * FROM " + s("maintain") + "('test-leader', $1::bigint, $2::interval)", {term, stale_after});
  }
};

// ---- pause and resume ------------------------------------------------------------------------

TEST_F(operators_pg, pause_waits_for_a_claim_in_progress_and_no_claim_commits_after_it_returned) {
  enqueue_many(10);
  pg claimer{schema_.dsn()};
  claimer.exec("BEGIN");
  ASSERT_EQ(claimer.exec("SELECT * FROM " + s("claim") + "('default', 2)").rows.size(), 2u);
  // The claim's transaction is open: pause waits for it (it holds the queue's lock FOR SHARE).
  auto pausing = std::async(std::launch::async, [&] {
    pg admin{schema_.dsn()};
    return admin.scalar("SELECT " + s("pause_queue") + "('default')");
  });
  EXPECT_EQ(pausing.wait_for(300ms), std::future_status::timeout) << "pause returned before the claim committed";
  claimer.exec("COMMIT");
  ASSERT_EQ(pausing.get(), "t");
  EXPECT_EQ(db_.query("SELECT * FROM " + s("claim") + "('default', 10)").rows.size(), 0u);
  EXPECT_EQ(db_.query("SELECT * FROM " + s("claim_attempts") + "('default', 10, 'w', 'sleep')").rows.size(), 0u);
  EXPECT_EQ(db_.scalar("SELECT " + s("pause_queue") + "('default')"), "f") << "already paused";
  // Other queues are not paused.
  enqueue("k", "{}", "other");
  EXPECT_EQ(db_.query("SELECT * FROM " + s("claim") + "('other', 10)").rows.size(), 1u);
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_queue") + "('default')"), "t");
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_queue") + "('default')"), "f") << "already running";
  EXPECT_EQ(db_.query("SELECT * FROM " + s("claim") + "('default', 100)").rows.size(), 8u);
}

TEST_F(operators_pg, pausing_a_queue_a_runtime_drains_stops_new_claims_while_running_attempts_finish_and_resume_restarts_at_once) {
  constexpr int k_jobs = 400;
  enqueue_many(k_jobs, "slow");
  auto cfg = fast_config();
  cfg.queues = {{.name = "default", .max_concurrency = 4}};
  cfg.poll_interval = 30s;  // after resume, only the NOTIFY can make the claims prompt
  auto rt = make(cfg);
  std::atomic<int> started{0};
  rt->handle("slow", [&](job_context&) {
    ++started;
    std::this_thread::sleep_for(20ms);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") >= 20; }));

  ASSERT_EQ(db_.scalar("SELECT " + s("pause_queue") + "('default')"), "t");
  const long left = ready();
  const int started_at_pause = started.load();
  ASSERT_GT(left, 0);
  // Running attempts finish (heartbeats and completions go on); nothing new is claimed.
  ASSERT_TRUE(eventually([&] { return receipts() == 0; }, 10s));
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(ready(), left) << "no claim committed after pause_queue returned";
  EXPECT_LE(started.load(), started_at_pause + 4) << "only attempts claimed before the pause ran";
  EXPECT_EQ(count("state = 'completed'"), k_jobs - left);

  const auto resumed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(db_.scalar("SELECT " + s("resume_queue") + "('default')"), "t");
  ASSERT_TRUE(eventually([&] { return ready() < left; }, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - resumed_at, 2s) << "woken by resume, not by a 30 s poll";
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == k_jobs; }, 60s));
  rt->stop();
  EXPECT_EQ(rt->metrics().stale_rejected, 0u);
}

// ---- configure_queue ---------------------------------------------------------------------------

TEST_F(operators_pg, configure_queue_refuses_unknown_keys_and_bad_values_with_22023_and_changes_nothing) {
  const auto set = db_.scalar("SELECT " + s("configure_queue") +
                              "('mail', '{\"retain_completed\": \"90s\", \"retain_failed\": \"1 day 2 hours\", "
                              "\"hard_deadline\": \"15m\", \"backoff_cap\": \"2h\", \"dead_letter\": true}')::text");
  EXPECT_EQ(set, R"({"rate_burst": null, "backoff_cap": "2h", "dead_letter": true, "max_running": null, )"
                 R"("backoff_base": "1s", "hard_deadline": "15m", "retain_failed": "26h", "priority_aging": null, )"
                 R"("rate_per_second": null, "retain_cancelled": "1d", "retain_completed": "90s"})");
  const auto before = queue_row("mail");
  for (const std::string bad : {
           R"({"retain_completed": "90s", "retain_forever": true})",  // an unknown key next to a good one
           R"({"retain_completed": 90})",                             // not a string
           R"({"retain_completed": "-1s"})",
           R"({"retain_completed": "1 month"})",
           R"({"retain_completed": "soon"})",
           R"({"retain_completed": "36501d"})",
           R"({"retain_completed": null})",
           R"({"hard_deadline": "0s"})",
           R"({"backoff_base": "3h"})",  // above the cap (2h)
           R"({"dead_letter": "yes"})",
           R"({"paused": true})",
           R"([1, 2])",
       }) {
    auto r = db_.query("SELECT " + s("configure_queue") + "('mail', $1::jsonb)", {bad});
    EXPECT_EQ(r.sqlstate, "22023") << bad << ": " << r.error;
    EXPECT_EQ(queue_row("mail"), before) << bad;
  }
  auto unknown = db_.query("SELECT " + s("configure_queue") + "('fresh', '{\"bogus\": 1}')");
  EXPECT_NE(unknown.error.find("unknown setting \"bogus\""), std::string::npos) << unknown.error;
  EXPECT_EQ(queue_row("fresh"), "(none)") << "a refused change does not even create the queue's row";
  for (const std::string& bad_queue : std::vector<std::string>{"", std::string(129, 'q'), "a\tb"}) {
    EXPECT_EQ(db_.query("SELECT " + s("configure_queue") + "($1, '{}')", {bad_queue}).sqlstate, "22023");
    EXPECT_EQ(db_.query("SELECT " + s("pause_queue") + "($1)", {bad_queue}).sqlstate, "22023");
  }
  // null clears the hard deadline; the store's typed call sets the same settings.
  db_.exec("SELECT " + s("configure_queue") + "('mail', '{\"hard_deadline\": null}')");
  EXPECT_EQ(db_.scalar("SELECT hard_deadline IS NULL FROM " + s("queues") + " WHERE name = 'mail'"), "t");
  auto store = open_store();
  ASSERT_TRUE(store->update_queue("mail", {.retain_cancelled = 45s}));
  EXPECT_EQ(db_.scalar("SELECT retain_cancelled FROM " + s("queues") + " WHERE name = 'mail'"), "00:00:45");
  EXPECT_TRUE(store->update_queue("mail", {.backoff_base = 5h}).error() == errc::invalid_argument);
  ASSERT_TRUE(store->pause_queue("mail").value());
  EXPECT_FALSE(store->pause_queue("mail").value());
  ASSERT_TRUE(store->resume_queue("mail").value());
  // The runtime's start-up configuration keeps the operator's pause and retentions.
  ASSERT_TRUE(store->pause_queue("mail").value());
  ASSERT_TRUE(store->configure_queue("mail", {.dead_letter = false}));
  EXPECT_EQ(db_.scalar("SELECT paused AND retain_cancelled = '45 seconds' FROM " + s("queues") + " WHERE name = 'mail'"),
            "t");
}

// ---- roles -------------------------------------------------------------------------------------

TEST_F(operators_pg, only_a_role_given_grant_admin_may_pause_resume_configure_or_list_queues) {
  pg owner{test_dsn()};
  std::vector<std::string> roles;
  auto make_role = [&](std::optional<postgres::grant_kind> kind) {
    const std::string role = "ops_role_" + random_suffix();
    owner.exec("CREATE ROLE " + role + " LOGIN");
    roles.push_back(role);
    if (kind) {
      auto g = postgres::grant(schema_.dsn(), *kind, role, schema_.name());
      EXPECT_TRUE(g) << g.error().message();
    }
    return role;
  };
  const auto admin = make_role(postgres::grant_kind::admin);
  const auto worker = make_role(postgres::grant_kind::worker);
  const auto finalizer = make_role(postgres::grant_kind::finalizer);
  const auto producer = make_role(postgres::grant_kind::producer);
  const auto nobody = make_role(std::nullopt);
  const std::vector<std::string> calls = {"SELECT " + s("pause_queue") + "('default')",
                                          "SELECT " + s("resume_queue") + "('default')",
                                          "SELECT " + s("configure_queue") + "('default', '{\"retain_completed\": \"0s\"}')",
                                          "SELECT * FROM " + s("list_queues") + "()"};
  for (const auto& role : {worker, finalizer, producer, nobody}) {
    pg as{dsn_with_user(schema_.dsn(), role)};
    for (const auto& call : calls) EXPECT_EQ(state_of_sql(as, call), "42501") << role << ": " << call;
  }
  {
    pg as{dsn_with_user(schema_.dsn(), admin)};
    for (const auto& call : calls) EXPECT_EQ(state_of_sql(as, call), "") << call;
    // Nothing else: no tables, no worker or maintenance functions.
    EXPECT_EQ(state_of_sql(as, "SELECT * FROM " + s("queues")), "42501");
    EXPECT_EQ(state_of_sql(as, "SELECT * FROM " + s("jobs")), "42501");
    EXPECT_EQ(state_of_sql(as, "SELECT * FROM " + s("claim") + "('default')"), "42501");
    EXPECT_EQ(state_of_sql(as, "SELECT " + s("prune_expired") + "()"), "42501");
    EXPECT_EQ(state_of_sql(as, "SELECT " + s("enqueue") + "('k')"), "42501");
  }
  {
    // The worker runs the leader's pass (which prunes) but cannot call prune_expired itself.
    pg as{dsn_with_user(schema_.dsn(), worker)};
    EXPECT_EQ(state_of_sql(as, "SELECT " + s("prune_expired") + "()"), "42501");
  }
  for (const auto& role : roles) {
    owner.query("DROP OWNED BY " + role + " CASCADE");
    owner.query("DROP ROLE IF EXISTS " + role);
  }
}

// ---- retention ---------------------------------------------------------------------------------

TEST_F(operators_pg, maintain_prunes_expired_finished_jobs_per_queue_and_state_and_leaves_the_rest) {
  db_.exec("SELECT " + s("configure_queue") + "('short', '{\"retain_completed\": \"1h\", \"retain_failed\": \"2h\", "
           "\"retain_cancelled\": \"10m\", \"dead_letter\": true}')");
  finished(3, "completed", "25 hours");              // default queue: 24h -> pruned
  finished(2, "completed", "23 hours");              // kept
  finished(3, "cancelled", "25 hours");              // pruned
  finished(2, "failed", "6 days");                   // kept (7d)
  finished(4, "failed", "8 days");                   // pruned
  finished(5, "completed", "61 minutes", "short");   // pruned (1h)
  finished(1, "completed", "59 minutes", "short");   // kept
  finished(2, "cancelled", "11 minutes", "short");   // pruned (10m)
  finished(3, "", "3 hours", "short", "dead_letter");   // pruned (2h)
  finished(1, "", "1 hour", "short", "dead_letter");    // kept
  // Live jobs of every kind, however old: never touched.
  const auto live = enqueue("k");
  const auto running = enqueue("k", "{}", "other");
  db_.exec("SELECT * FROM " + s("claim") + "('other', 1)");
  db_.exec("UPDATE " + s("specs") + " SET created_at = now() - interval '30 days' WHERE id IN (SELECT job_id FROM " + s("receipts") + ")");
  db_.exec("UPDATE " + s("ready") + " SET created_at = now() - interval '30 days'");
  // An attempt_state row left of a finished job goes with it.
  const auto old_id = db_.scalar("SELECT min(id) FROM " + s("done") + " WHERE state = 'completed'");
  db_.exec("INSERT INTO " + s("attempt_state") + " (job_id, run_lease, heartbeat_at) VALUES ($1::bigint, 1, now())",
           {old_id});

  auto r = maintain_once();
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(finished_count("done", "queue = 'default'"), 4);
  EXPECT_EQ(finished_count("done", "queue = 'default' AND state = 'failed'"), 2);
  EXPECT_EQ(finished_count("done", "queue = 'short'"), 1);
  EXPECT_EQ(finished_count("dead_letter"), 1);
  EXPECT_EQ(std::stol(db_.scalar("SELECT count(*) FROM " + s("attempt_state") + " WHERE job_id = $1::bigint", {old_id})), 0);
  EXPECT_EQ(state_of(live), "available");
  EXPECT_EQ(state_of(running), "running");
  // A pruned job's attempts read unknown_job; its id is simply gone.
  EXPECT_EQ(db_.scalar("SELECT " + s("attempt_evidence") + "($1::bigint, 1)", {old_id}), "unknown_job");
  EXPECT_EQ(db_.query("SELECT " + s("retry_job") + "($1::bigint)", {old_id}).sqlstate, "TN003");
}

TEST_F(operators_pg, maintain_never_prunes_a_job_finished_less_than_the_prune_floor_ago_even_with_retention_zero) {
  db_.exec("SELECT " + s("configure_queue") + "('default', '{\"retain_completed\": \"0s\"}')");
  // A caller-owned attempt that just completed is still being reconciled by its runtime, which
  // reads "completed by this run lease": the floor keeps that evidence readable.
  const auto id = enqueue("k");
  const auto claimed = db_.exec("SELECT job_id, run_lease, token FROM " + s("claim") + "('default')");
  db_.exec("BEGIN");
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {claimed.at(0, 2)});
  db_.exec("COMMIT");
  finished(2, "completed", "4 minutes");
  finished(3, "completed", "6 minutes");
  ASSERT_TRUE(maintain_once("30 seconds").ok);
  EXPECT_EQ(db_.scalar("SELECT " + s("attempt_evidence") + "($1::bigint, $2::bigint)", {id, claimed.at(0, 1)}),
            "completed");
  EXPECT_EQ(finished_count(), 3) << "inside the 5 minute floor: kept; past it: pruned at retention 0";
  // A longer staleness raises the floor with it.
  finished(4, "completed", "8 minutes");
  ASSERT_TRUE(maintain_once("10 minutes").ok);
  EXPECT_EQ(finished_count(), 7);
  ASSERT_TRUE(maintain_once("30 seconds").ok);
  EXPECT_EQ(finished_count(), 3);
}

TEST_F(operators_pg, maintain_prunes_at_most_50000_jobs_per_pass_in_bounded_statements) {
  finished(60'000, "completed", "2 days");
  auto first = maintain_once();
  ASSERT_TRUE(first.ok) << first.error;
  EXPECT_EQ(finished_count(), 10'000) << "one pass prunes at most 50,000 jobs";
  ASSERT_TRUE(maintain_once().ok);
  EXPECT_EQ(finished_count(), 0);
  // The statement limit: prune_expired's own bounds, as the owner calls it.
  finished(10, "completed", "2 days");
  EXPECT_EQ(db_.scalar("SELECT " + s("prune_expired") + "('30 seconds', 7, 3)"), "7");
  EXPECT_EQ(finished_count(), 3);
  EXPECT_EQ(db_.query("SELECT " + s("prune_expired") + "('30 seconds', 7, 0)").sqlstate, "22023");
}

TEST_F(operators_pg, the_prune_scan_uses_the_retention_index) {
  finished(20'000, "completed", "2 days");
  finished(20'000, "completed", "1 hour", "other");
  db_.exec("ANALYZE " + s("settled_claims"));
  db_.exec("SET enable_seqscan = off");
  // Retention takes the ripe settled claims oldest first: an index range, never a sort.
  const auto plan = db_.exec("EXPLAIN SELECT c.claim_id FROM " + s("settled_claims") + " c WHERE c.retired_at IS NULL "
                             "AND c.ripe_at <= now() ORDER BY c.ripe_at LIMIT 5000");
  std::string text;
  for (const auto& row : plan.rows) text += *row[0] + "\n";
  EXPECT_NE(text.find("settled_claims_ripe_idx"), std::string::npos) << text;
  EXPECT_EQ(text.find("Sort"), std::string::npos) << text;
  // And a pass over the 20,000 expired of them leaves the 20,000 kept.
  ASSERT_TRUE(maintain_once().ok);
  EXPECT_EQ(finished_count(), 20'000);
}

TEST_F(operators_pg, a_runtime_drains_while_the_leader_prunes_and_no_live_job_is_touched) {
  finished(60'000, "completed", "2 days");
  enqueue_many(3000);
  auto rt = make();
  std::atomic<int> ran{0};
  rt->handle("noop", [&](job_context&) {
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  // The runtime leads maintenance too; this test's own passes run between its passes.
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == 3000 && finished_count("done", "finalized_at < now() - interval '1 day'") == 0; }, 60s))
      << count("state = 'completed'") << " completed, " << finished_count() << " in done";
  rt->stop();
  EXPECT_EQ(ran.load(), 3000);
  EXPECT_EQ(rt->metrics().stale_rejected, 0u);
  EXPECT_EQ(finished_count(), 3000) << "every drained job is kept (finished just now)";
}

}  // namespace
}  // namespace tenure::test
