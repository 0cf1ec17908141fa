// Queue limits and priority aging against the real PostgreSQL: configure_queue's validation of
// max_running, rate_per_second, rate_burst and priority_aging; what a claim takes under each (in
// SQL, deterministically); and a runtime starved by a constant stream of urgent jobs, with and
// without aging. The races between worker processes are in multiprocess_pgtest.cpp.
#include <atomic>
#include <limits>
#include <optional>
#include <thread>

#include "runtime/runtime_fixture.hpp"

namespace tenure::test {
namespace {

using std::chrono::steady_clock;

class queue_limits_pg : public runtime_pg {
 protected:
  std::string configure(const std::string& queue, const std::string& settings) {
    return db_.scalar("SELECT " + s("configure_queue") + "($1, $2::jsonb)::text", {queue, settings});
  }
  std::string queue_row(const std::string& queue) {
    auto r = db_.query("SELECT row_to_json(q)::text FROM " + s("queues") + " q WHERE name = $1", {queue});
    return r.rows.empty() ? "(none)" : *r.rows[0][0];
  }
  std::string enqueue_at(int priority, const std::string& queue = "default", const std::string& kind = "k") {
    return db_.scalar("SELECT " + s("enqueue") + "($1, '{}', $2, $3::int)", {kind, queue, std::to_string(priority)});
  }
  /// One claim of `queue` for up to `n` jobs: the claimed ids, in the order returned.
  std::vector<std::string> claim(const std::string& queue, int n) {
    std::vector<std::string> ids;
    for (const auto& row : db_.exec("SELECT job_id FROM " + s("claim_attempts") + "($1, $2::int, 'w')",
                                    {queue, std::to_string(n)})
                               .rows) {
      ids.push_back(*row[0]);
    }
    return ids;
  }
  sql_result claim_rows(const std::string& queue, int n) {
    return db_.exec("SELECT job_id, run_lease FROM " + s("claim_attempts") + "($1, $2::int, 'w')",
                    {queue, std::to_string(n)});
  }
};

// ---- configure_queue ---------------------------------------------------------------------------

TEST_F(queue_limits_pg, configure_queue_sets_limits_and_aging_refuses_bad_values_with_22023_naming_them_and_null_clears) {
  const auto set = nlohmann::json::parse(configure(
      "mail", R"({"max_running": 5, "rate_per_second": 0.5, "rate_burst": 3, "priority_aging": "90s"})"));
  EXPECT_EQ(set["max_running"], 5);
  EXPECT_EQ(set["rate_per_second"], 0.5);
  EXPECT_EQ(set["rate_burst"], 3);
  EXPECT_EQ(set["priority_aging"], "90s");
  const auto before = queue_row("mail");
  for (const auto& [bad, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"max_running": 0})", "max_running"},
           {R"({"max_running": -3})", "max_running"},
           {R"({"max_running": 2.5})", "max_running"},
           {R"({"max_running": "5"})", "max_running"},
           {R"({"max_running": 2147483648})", "max_running"},
           {R"({"max_running": true})", "max_running"},
           {R"({"rate_per_second": 0})", "rate_per_second"},
           {R"({"rate_per_second": -1})", "rate_per_second"},
           {R"({"rate_per_second": "fast"})", "rate_per_second"},
           {R"({"rate_per_second": 1e7})", "rate_per_second"},
           {R"({"rate_per_second": 1e1000})", "rate_per_second"},
           {R"({"rate_burst": 0.5})", "rate_burst"},
           {R"({"rate_burst": "3"})", "rate_burst"},
           {R"({"priority_aging": "0s"})", "priority_aging"},
           {R"({"priority_aging": "-1s"})", "priority_aging"},
           {R"({"priority_aging": 60})", "priority_aging"},
           {R"({"priority_aging": "1 month"})", "priority_aging"},
           {R"({"max_running": 2, "rate_per_second": 0})", "rate_per_second"},  // all or nothing
       }) {
    auto r = db_.query("SELECT " + s("configure_queue") + "('mail', $1::jsonb)", {bad});
    EXPECT_EQ(r.sqlstate, "22023") << bad << ": " << r.error;
    EXPECT_NE(r.error.find(named), std::string::npos) << bad << ": " << r.error;
    EXPECT_EQ(queue_row("mail"), before) << bad;
  }
  // null clears each; the other settings keep their value.
  const auto cleared = nlohmann::json::parse(
      configure("mail", R"({"max_running": null, "rate_per_second": null, "rate_burst": null, "priority_aging": null})"));
  for (const char* key : {"max_running", "rate_per_second", "rate_burst", "priority_aging"}) {
    EXPECT_TRUE(cleared[key].is_null()) << key;
  }
  // The store's typed call: set, then clear (inner nullopt); NaN is refused before it is sent.
  auto store = open_store();
  ASSERT_TRUE(store->update_queue("mail", {.max_running = 7, .rate_per_second = 2.5, .priority_aging = 30s}));
  EXPECT_EQ(db_.scalar("SELECT format('%s %s %s', max_running, rate_per_second, priority_aging) FROM " + s("queues") +
                       " WHERE name = 'mail'"),
            "7 2.5 00:00:30");
  ASSERT_TRUE(store->update_queue("mail", {.max_running = std::optional<std::int32_t>{}, .priority_aging = std::optional<std::chrono::microseconds>{}}));
  EXPECT_EQ(db_.scalar("SELECT format('%s %s %s', max_running IS NULL, rate_per_second, priority_aging IS NULL) FROM " +
                       s("queues") + " WHERE name = 'mail'"),
            "t 2.5 t");
  EXPECT_TRUE(store->update_queue("mail", {.rate_per_second = std::numeric_limits<double>::quiet_NaN()}).error() ==
              errc::invalid_argument);
  EXPECT_TRUE(store->update_queue("mail", {.max_running = 0}).error() == errc::invalid_argument);
  // list_queues shows them, also for a queue that has jobs but no settings row.
  enqueue("k", "{}", "plain");
  const auto listed = db_.exec("SELECT queue, settings::text FROM " + s("list_queues") + "() ORDER BY queue");
  ASSERT_EQ(listed.rows.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(*listed.rows[0][1])["rate_per_second"], 2.5);
  EXPECT_TRUE(nlohmann::json::parse(*listed.rows[1][1])["max_running"].is_null());
  EXPECT_TRUE(nlohmann::json::parse(*listed.rows[1][1]).contains("priority_aging"));
}

// ---- the claim under each limit (one session: deterministic) ------------------------------------

TEST_F(queue_limits_pg, max_running_caps_what_claims_take_and_a_parked_waiting_external_attempt_counts) {
  for (int i = 0; i < 6; ++i) enqueue("k");
  configure("default", R"({"max_running": 2})");
  const auto first = claim_rows("default", 10);
  ASSERT_EQ(first.rows.size(), 2u) << "capped at max_running";
  EXPECT_TRUE(claim("default", 10).empty()) << "both slots are taken";
  // Park one attempt on a callback (waiting_external): it keeps its receipt, and its slot.
  const std::string job = first.at(0, 0), lease = first.at(0, 1);
  const auto cb = db_.scalar("SELECT " + s("register_callback") + "($1::bigint, $2::bigint, '1 hour')", {job, lease});
  db_.exec("SELECT * FROM " + s("await_callback") + "($1::bigint, $2::bigint, $3::uuid)", {job, lease, cb});
  ASSERT_EQ(state_of(job), "waiting_external");
  // Close the other one: one slot frees.
  ASSERT_EQ(db_.scalar("SELECT " + s("snooze_attempt") + "($1::bigint, $2::bigint, '0')",
                       {first.at(1, 0), first.at(1, 1)}),
            "t");
  EXPECT_EQ(claim("default", 10).size(), 1u) << "one slot free: the parked attempt still counts";
  EXPECT_TRUE(claim("default", 10).empty());
  // Other queues are not limited; clearing the limit lifts it.
  for (int i = 0; i < 3; ++i) enqueue("k", "{}", "other");
  EXPECT_EQ(claim("other", 10).size(), 3u);
  configure("default", R"({"max_running": null})");
  EXPECT_EQ(claim("default", 10).size(), 4u);
}

TEST_F(queue_limits_pg, rate_per_second_spends_a_token_bucket_of_burst_size_that_refills_from_elapsed_time) {
  for (int i = 0; i < 20; ++i) enqueue("k");
  configure("default", R"({"rate_per_second": 0.5, "rate_burst": 3})");
  EXPECT_EQ(claim("default", 10).size(), 3u) << "a full bucket: the burst";
  EXPECT_TRUE(claim("default", 10).empty()) << "empty: one token per 2 s";
  // 5 s pass (moved back by hand): 2.5 tokens, so 2 jobs, and half a token stays.
  db_.exec("UPDATE " + s("queues") + " SET rate_refilled_at = rate_refilled_at - interval '5 seconds'");
  EXPECT_EQ(claim("default", 10).size(), 2u);
  const double left = std::stod(db_.scalar("SELECT rate_tokens FROM " + s("queues")));
  EXPECT_GE(left, 0.5);  // plus what the real time between the statements added
  EXPECT_LT(left, 1.0);
  // A claim that finds fewer jobs than tokens spends only what it took.
  db_.exec("UPDATE " + s("queues") + " SET rate_refilled_at = rate_refilled_at - interval '1 hour'");
  db_.exec("DELETE FROM " + s("ready") + " WHERE id NOT IN (SELECT id FROM " + s("ready") + " ORDER BY id LIMIT 1)");
  EXPECT_EQ(claim("default", 10).size(), 1u);
  EXPECT_NEAR(std::stod(db_.scalar("SELECT rate_tokens FROM " + s("queues"))), 2.0, 0.01) << "capped at the burst, 1 spent";
  // Without rate_burst the bucket holds max(1, rate): at 0.5/s, one.
  for (int i = 0; i < 5; ++i) enqueue("k");
  configure("default", R"({"rate_burst": null})");
  EXPECT_EQ(claim("default", 10).size(), 1u);
  EXPECT_TRUE(claim("default", 10).empty());
  configure("default", R"({"rate_per_second": null})");
  EXPECT_EQ(claim("default", 10).size(), 4u) << "no rate: no limit";
}

TEST_F(queue_limits_pg, priority_aging_raises_a_waiting_jobs_priority_one_level_per_interval_never_past_1) {
  configure("default", R"({"priority_aging": "1m"})");
  const auto p1 = enqueue_at(1), p2 = enqueue_at(2), p3 = enqueue_at(3), p4 = enqueue_at(4), p4b = enqueue_at(4);
  // Available for a while (moved back by hand): p3 one interval (-> 2), p4 three (-> 1), p4b ten (-> 1, not below).
  auto age = [&](const std::string& id, const std::string& by) {
    db_.exec("UPDATE " + s("ready") + " SET created_at = created_at - $2::interval, run_at = run_at - $2::interval "
             "WHERE id = $1::bigint",
             {id, by});
  };
  age(p3, "61 seconds");
  age(p4, "181 seconds");
  age(p4b, "10 minutes");
  // Effective priority, then id: p1 (1), p4 (1), p4b (1), p2 (2), p3 (2).
  std::vector<std::string> order;
  for (int i = 0; i < 5; ++i) {
    auto got = claim("default", 1);
    ASSERT_EQ(got.size(), 1u);
    order.push_back(got[0]);
  }
  EXPECT_EQ(order, (std::vector<std::string>{p1, p4, p4b, p2, p3}));
  // A batch claim orders the same way; without aging it is priority, then id.
  const auto q1 = enqueue_at(1, "b"), q2 = enqueue_at(2, "b"), q4 = enqueue_at(4, "b");
  db_.exec("UPDATE " + s("ready") + " SET created_at = created_at - interval '1 hour', run_at = run_at - interval '1 hour' "
           "WHERE id = $1::bigint",
           {q4});
  EXPECT_EQ(claim("b", 2), (std::vector<std::string>{q1, q2})) << "no aging on queue b";
  configure("b", R"({"priority_aging": "1m"})");
  EXPECT_EQ(claim("b", 1), (std::vector<std::string>{q4}));
}

// ---- starvation: one worker, a constant stream of urgent jobs -----------------------------------

class starvation_pg : public queue_limits_pg {
 protected:
  /// A runtime with one handler slot; a priority-4 job is enqueued, then a producer on its own
  /// session keeps the queue topped up to 30 available priority-1 jobs (every 2 ms), more than the
  /// worker can take meanwhile. Returns how long after its enqueue the priority-4 job started, or
  /// nullopt when it did not within `watch`; then stops the stream and checks the job runs.
  std::optional<std::chrono::milliseconds> low_job_start_under_stream(std::chrono::milliseconds watch) {
    auto cfg = fast_config();
    cfg.queues = {{.name = "default", .max_concurrency = 1}};
    auto rt = make(cfg);
    std::atomic<bool> low_started{false};
    std::atomic<long> urgent_done{0};
    rt->handle("urgent", [&](job_context&) {
      std::this_thread::sleep_for(5ms);
      ++urgent_done;
      return job_outcome::completed();
    });
    steady_clock::time_point low_at{};
    rt->handle("low", [&](job_context&) {
      low_at = steady_clock::now();
      low_started = true;
      return job_outcome::completed();
    });
    const auto enqueued = steady_clock::now();
    enqueue_at(4, "default", "low");
    std::atomic<bool> stop{false};
    auto top_up = [&](pg& session) {
      session.exec("SELECT " + s("enqueue_batch") +
                   "(array_fill('urgent'::text, ARRAY[n]), array_fill('{}'::jsonb, ARRAY[n]), "
                   "array_fill('default'::text, ARRAY[n]), array_fill(1, ARRAY[n])) "
                   "FROM (SELECT 30 - count(*)::int AS n FROM " + s("ready") + " r JOIN " + s("specs") + " j ON j.id = r.id WHERE j.kind = 'urgent') c WHERE n > 0");
    };
    top_up(db_);
    std::thread producer([&] {
      pg session{schema_.dsn()};
      while (!stop) {
        top_up(session);
        std::this_thread::sleep_for(2ms);
      }
    });
    EXPECT_TRUE(rt->start());
    const bool started = eventually([&] { return low_started.load(); }, watch);
    const long urgent_while = urgent_done.load();
    stop = true;
    producer.join();
    std::optional<std::chrono::milliseconds> out;
    if (started) out = std::chrono::duration_cast<std::chrono::milliseconds>(low_at - enqueued);
    // The stream ended: the low-priority job runs now in any case.
    EXPECT_TRUE(eventually([&] { return low_started.load(); }, 10s)) << "once the stream stops, the job runs";
    rt->stop();
    EXPECT_GT(urgent_while, 20) << "the stream kept the worker busy";
    return out;
  }
};

TEST_F(starvation_pg, with_priority_aging_a_priority_4_job_runs_within_about_3_intervals_under_a_stream_of_priority_1_jobs) {
  configure("default", R"({"priority_aging": "400ms"})");
  const auto started = low_job_start_under_stream(5s);
  ASSERT_TRUE(started) << "the priority-4 job starved despite aging";
  // It reaches priority 1 after 3 intervals (1.2 s), and not before 2 had passed.
  EXPECT_GE(*started, 800ms);
  EXPECT_LE(*started, 1200ms + 1000ms);
}

TEST_F(starvation_pg, without_priority_aging_a_priority_4_job_waits_while_a_stream_of_priority_1_jobs_lasts) {
  const auto started = low_job_start_under_stream(2500ms);
  EXPECT_FALSE(started) << "started " << started->count() << " ms after enqueue, while urgent jobs were available";
}

}  // namespace
}  // namespace tenure::test
