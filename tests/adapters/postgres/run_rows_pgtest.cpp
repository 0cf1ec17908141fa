// Run rows (schema 30): a COPY batch read back by enqueue_copied_ready waits as one `runs` row per
// (queue, priority). Claims take from runs and ready rows in one order, under the run row's lock;
// a cancel cuts a job out of its run; the jobs view, depths and limits count run jobs as any other.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/pg.hpp"

using namespace std::chrono_literals;
using tenure::test::pg;
using tenure::test::scoped_schema;

namespace {

class run_rows : public ::testing::Test {
 protected:
  scoped_schema schema_{"runrows"};
  pg db_{schema_.dsn()};
  std::string s(const std::string& name) const { return schema_.name() + "." + name; }

  /// COPY `n` jobs of (queue, priority) into specs on `c`'s open transaction (no BEGIN/COMMIT).
  void copy_rows(pg& c, const std::string& queue, int priority, int n) {
    std::string data;
    for (int i = 0; i < n; ++i) data += "k\t{}\t" + queue + "\t" + std::to_string(priority) + "\t3\t{}\n";
    c.copy_in("COPY " + s("specs") + " (kind, args, queue, priority, max_attempts, metadata) FROM STDIN", data);
  }
  /// One bulk batch through COPY and its read-back, committed: the ids in order.
  std::vector<long> bulk(const std::string& queue, int priority, int n) {
    db_.exec("BEGIN");
    copy_rows(db_, queue, priority, n);
    const auto ids = db_.scalar("SELECT " + s("enqueue_copied_ready") + "($1)", {std::to_string(n)});
    db_.exec("COMMIT");
    return parse_ids(ids);
  }
  static std::vector<long> parse_ids(std::string text) {
    std::vector<long> out;
    for (auto& ch : text) {
      if (ch == '{' || ch == '}' || ch == ',') ch = ' ';
    }
    std::istringstream in{text};
    for (long v; in >> v;) out.push_back(v);
    return out;
  }
  std::string count(const std::string& from_where) { return db_.scalar("SELECT count(*) FROM " + s(from_where)); }
  /// The job ids of one claim of `k` on `c`, in claim order.
  std::vector<long> claim(pg& c, int k, const std::string& queue = "q") {
    const auto r = c.exec("SELECT job_id FROM " + s("claim_attempts") + "($1, $2)", {queue, std::to_string(k)});
    std::vector<long> out;
    for (const auto& row : r.rows) out.push_back(std::stol(*row[0]));
    return out;
  }
  std::vector<long> claim(int k, const std::string& queue = "q") { return claim(db_, k, queue); }
  std::string state(long id) {
    return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {std::to_string(id)});
  }
};

TEST_F(run_rows, a_bulk_batch_waits_in_run_rows_of_at_most_200_ids_per_queue_and_priority_and_its_jobs_are_available) {
  const auto a = bulk("q", 2, 300);
  const auto b = bulk("other", 1, 200);
  ASSERT_EQ(a.size(), 300u);
  ASSERT_EQ(b.size(), 200u);
  EXPECT_EQ(count("runs"), "3");
  EXPECT_EQ(count("ready"), "0") << "no row per job";
  EXPECT_EQ(db_.scalar("SELECT string_agg(cardinality(job_ids) || ' ' || taken || ' ' || lo || ' ' || hi, ', ' ORDER BY run_id) FROM " +
                       s("runs") + " WHERE queue = 'q'"),
            "200 0 " + std::to_string(a[0]) + " " + std::to_string(a[199]) + ", 100 0 " + std::to_string(a[200]) + " " +
                std::to_string(a[299]));
  EXPECT_EQ(db_.scalar("SELECT bool_and(job_ids = (SELECT array_agg(u ORDER BY u) FROM unnest(job_ids) u)) FROM " + s("runs")),
            "t") << "ids ascending";
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'available' AND attempt = 0 AND run_lease = 0"),
            "500");
  EXPECT_EQ(state(a[123]), "available");
  EXPECT_EQ(db_.scalar("SELECT string_agg(queue || ':' || available, ' ' ORDER BY queue) FROM " + s("queue_depths") + "()"),
            "other:200 q:300");
  EXPECT_EQ(db_.scalar("SELECT counts->>'available' FROM " + s("list_queues") + "() WHERE queue = 'q'"), "300");
  EXPECT_EQ(db_.scalar("SELECT oldest_available IS NOT NULL FROM " + s("list_queues") + "() WHERE queue = 'q'"), "t");
  // Taken jobs leave the count.
  EXPECT_EQ(claim(120).size(), 120u);
  EXPECT_EQ(db_.scalar("SELECT available || ' ' || running FROM " + s("queue_depths") + "() WHERE queue = 'q'"), "180 120");
  EXPECT_EQ(db_.scalar("SELECT string_agg(taken::text, ',' ORDER BY run_id) FROM " + s("runs") + " WHERE queue = 'q'"),
            "120,0");
  // A claim fills itself from as many runs as it needs: the rest of the first, then the second.
  EXPECT_EQ(claim(150), std::vector<long>(a.begin() + 120, a.begin() + 270));
  EXPECT_EQ(db_.scalar("SELECT string_agg(taken::text, ',' ORDER BY run_id) FROM " + s("runs") + " WHERE queue = 'q'"),
            "70") << "the used-up run is gone";
}

TEST_F(run_rows, claims_take_jobs_from_runs_and_ready_rows_in_priority_then_id_order) {
  // Ready rows before, between and after two runs, in two priorities.
  std::vector<std::pair<int, long>> all;  // (priority, id)
  auto single = [&](int priority) {
    const long id = std::stol(db_.scalar("SELECT " + s("enqueue") + "('k', '{}', 'q', $1)", {std::to_string(priority)}));
    all.emplace_back(priority, id);
  };
  single(2);
  single(1);
  for (long id : bulk("q", 2, 40)) all.emplace_back(2, id);
  single(2);
  single(1);
  for (long id : bulk("q", 1, 25)) all.emplace_back(1, id);
  single(2);
  for (long id : bulk("q", 2, 30)) all.emplace_back(2, id);
  single(1);
  std::sort(all.begin(), all.end());
  std::vector<long> want;
  for (const auto& [p, id] : all) want.push_back(id);

  std::vector<long> got;
  for (int round = 0; round < 100; ++round) {
    const auto one = claim(7);
    if (one.empty()) break;
    got.insert(got.end(), one.begin(), one.end());
  }
  EXPECT_EQ(got, want) << "each job once, by (priority, id), across runs and ready rows";
  EXPECT_EQ(count("runs"), "0") << "a used-up run is deleted";
  EXPECT_EQ(count("ready"), "0");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'running' AND attempt = 1"),
            std::to_string(want.size()));
}

TEST_F(run_rows, a_claim_skips_a_run_another_claim_holds_and_the_next_claim_goes_on_from_where_it_stopped) {
  const auto first = bulk("q", 2, 10);
  const auto second = bulk("q", 2, 10);
  pg other{schema_.dsn()};
  db_.exec("BEGIN");
  EXPECT_EQ(claim(db_, 4), std::vector<long>(first.begin(), first.begin() + 4));
  // The first run is locked by the open claim: the other session takes from the second run.
  EXPECT_EQ(claim(other, 3), std::vector<long>(second.begin(), second.begin() + 3));
  db_.exec("COMMIT");
  // After the commit, the first run's latest version says 4 were taken.
  EXPECT_EQ(claim(other, 3), std::vector<long>(first.begin() + 4, first.begin() + 7));
  EXPECT_EQ(db_.scalar("SELECT string_agg(taken::text, ',' ORDER BY run_id) FROM " + s("runs")), "7,3");
}

/// Whether a session runs claim_attempts waiting for a lock (polled for up to 2 s).
bool claim_waits_for_a_lock(pg& probe) {
  for (int i = 0; i < 200; ++i) {
    if (probe.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%claim_attempts%' "
                     "AND pid <> pg_backend_pid()") == "1") {
      return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST_F(run_rows, a_claim_finding_every_run_held_waits_for_the_first_and_takes_its_next_ids) {
  const auto ids = bulk("q", 2, 10);
  pg other{schema_.dsn()};
  pg probe{schema_.dsn()};
  db_.exec("BEGIN");
  ASSERT_EQ(claim(db_, 4), std::vector<long>(ids.begin(), ids.begin() + 4));
  // The only run is held: the other claim waits for it instead of leaving with nothing.
  auto waiting = std::async(std::launch::async, [&] { return claim(other, 3); });
  EXPECT_TRUE(claim_waits_for_a_lock(probe)) << "the claim waited for the held run row";
  EXPECT_EQ(waiting.wait_for(50ms), std::future_status::timeout);
  db_.exec("COMMIT");
  // It reads the run's latest version: the holder took 4.
  EXPECT_EQ(waiting.get(), std::vector<long>(ids.begin() + 4, ids.begin() + 7));
  EXPECT_EQ(db_.scalar("SELECT taken FROM " + s("runs")), "7");
  EXPECT_EQ(other.scalar("SHOW lock_timeout"), "0") << "the session's lock_timeout is restored";
}

TEST_F(run_rows, with_priority_aging_a_claim_finding_every_run_held_waits_for_one_too) {
  const auto ids = bulk("q", 3, 10);
  db_.exec("SELECT " + s("configure_queue") + "('q', '{\"priority_aging\": \"1 minute\"}')");
  pg other{schema_.dsn()};
  pg probe{schema_.dsn()};
  db_.exec("BEGIN");
  ASSERT_EQ(claim(db_, 4), std::vector<long>(ids.begin(), ids.begin() + 4));
  auto waiting = std::async(std::launch::async, [&] { return claim(other, 3); });
  EXPECT_TRUE(claim_waits_for_a_lock(probe));
  db_.exec("COMMIT");
  EXPECT_EQ(waiting.get(), std::vector<long>(ids.begin() + 4, ids.begin() + 7));
}

TEST_F(run_rows, a_claim_waiting_for_a_held_run_the_holder_used_up_goes_on_to_the_next_run) {
  const auto first = bulk("q", 2, 10);
  const auto second = bulk("q", 2, 10);
  pg other{schema_.dsn()};
  pg probe{schema_.dsn()};
  db_.exec("BEGIN");
  ASSERT_EQ(claim(db_, 15).size(), 15u) << "all of the first run and 5 of the second, both held";
  auto waiting = std::async(std::launch::async, [&] { return claim(other, 3); });
  EXPECT_TRUE(claim_waits_for_a_lock(probe));
  db_.exec("COMMIT");
  EXPECT_EQ(waiting.get(), std::vector<long>(second.begin() + 5, second.begin() + 8))
      << "the first run was deleted under the wait; the second's latest version says 5 taken";
  EXPECT_EQ(db_.scalar("SELECT string_agg(taken::text, ',') FROM " + s("runs")), "8");
  EXPECT_EQ(first.size(), 10u);
}

TEST_F(run_rows, a_claim_waiting_for_a_held_run_gives_up_after_500_ms_or_the_sessions_shorter_lock_timeout) {
  const auto ids = bulk("q", 2, 10);
  pg other{schema_.dsn()};
  db_.exec("BEGIN");
  ASSERT_EQ(claim(db_, 4).size(), 4u);
  // The holder stays open: the wait is bounded, and the claim leaves with nothing (no error).
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(claim(other, 3).empty());
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 450ms);
  EXPECT_LT(waited, 5s);
  EXPECT_EQ(other.scalar("SHOW lock_timeout"), "0");
  other.exec("SET lock_timeout = '100ms'");
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(claim(other, 3).empty());
  waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 90ms);
  EXPECT_LT(waited, 450ms) << "the session's shorter lock_timeout bounds the wait";
  EXPECT_EQ(other.scalar("SHOW lock_timeout"), "100ms");
  db_.exec("COMMIT");
  EXPECT_EQ(claim(other, 3), std::vector<long>(ids.begin() + 4, ids.begin() + 7));
}

TEST_F(run_rows, a_claim_finding_every_run_held_takes_waiting_ready_rows_without_waiting) {
  const auto ids = bulk("q", 2, 10);
  const long single = std::stol(db_.scalar("SELECT " + s("enqueue") + "('k', '{}', 'q', 3)"));
  pg other{schema_.dsn()};
  db_.exec("BEGIN");
  ASSERT_EQ(claim(db_, 4), std::vector<long>(ids.begin(), ids.begin() + 4));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(claim(other, 3), std::vector<long>{single}) << "the ready row, as before";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 400ms) << "no wait for the held run";
  db_.exec("COMMIT");
}

TEST_F(run_rows, a_claim_at_repeatable_read_passes_held_runs_by_without_waiting_or_failing) {
  bulk("q", 2, 10);
  pg other{schema_.dsn()};
  db_.exec("BEGIN");
  ASSERT_EQ(claim(db_, 4).size(), 4u);
  other.exec("BEGIN ISOLATION LEVEL REPEATABLE READ");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(claim(other, 3).empty()) << "nothing from the held run, and no 40001";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 400ms);
  other.exec("COMMIT");
  db_.exec("COMMIT");
}

TEST_F(run_rows, claims_whose_waits_for_each_others_runs_deadlock_leave_with_nothing_instead_of_failing) {
  bulk("q1", 2, 10);
  bulk("q2", 2, 10);
  pg a{schema_.dsn()};
  pg b{schema_.dsn()};
  pg probe{schema_.dsn()};
  for (pg* c : {&a, &b}) c->exec("SET deadlock_timeout = '50ms'");  // below the wait's 500 ms
  a.exec("BEGIN");
  b.exec("BEGIN");
  ASSERT_EQ(claim(a, 1, "q1").size(), 1u);  // a holds q1's run
  ASSERT_EQ(claim(b, 1, "q2").size(), 1u);  // b holds q2's run
  auto a_waits = std::async(std::launch::async, [&] { return claim(a, 3, "q2"); });
  EXPECT_TRUE(claim_waits_for_a_lock(probe));
  const auto b_got = claim(b, 3, "q1");  // closes the cycle: one of the two waits is ended
  b.exec("COMMIT");
  const auto a_got = a_waits.get();
  a.exec("COMMIT");
  EXPECT_TRUE(a_got.empty() || b_got.empty()) << "the deadlock ended one wait with nothing";
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("claim_items")), std::to_string(2 + a_got.size() + b_got.size()));
}

TEST_F(run_rows, a_claim_beside_one_holding_a_run_of_a_large_batch_takes_the_batchs_next_run_before_a_lower_priority) {
  const auto urgent = bulk("q", 1, 1000);
  const auto later = bulk("q", 4, 100);
  pg other{schema_.dsn()};
  db_.exec("BEGIN");
  EXPECT_EQ(claim(db_, 10), std::vector<long>(urgent.begin(), urgent.begin() + 10));
  // The first run of the batch is held: the other claim takes from its second, not priority 4.
  EXPECT_EQ(claim(other, 10), std::vector<long>(urgent.begin() + 200, urgent.begin() + 210));
  db_.exec("COMMIT");
  EXPECT_EQ(claim(other, 5), std::vector<long>(urgent.begin() + 10, urgent.begin() + 15));
  EXPECT_EQ(later.size(), 100u);
}

TEST_F(run_rows, concurrent_claimers_draining_runs_take_each_job_exactly_once) {
  std::vector<long> ids;
  for (int b = 0; b < 6; ++b) {
    for (long id : bulk("q", 1 + b % 2, 250)) ids.push_back(id);
  }
  std::atomic<bool> go{false};
  auto drain = [&] {
    pg c{schema_.dsn()};
    std::vector<long> mine;
    while (!go.load()) std::this_thread::yield();
    for (int empty = 0; empty < 3;) {
      const auto one = claim(c, 17);
      if (one.empty()) {
        ++empty;
        std::this_thread::sleep_for(5ms);
        continue;
      }
      empty = 0;
      mine.insert(mine.end(), one.begin(), one.end());
    }
    return mine;
  };
  std::vector<std::future<std::vector<long>>> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(std::async(std::launch::async, drain));
  go = true;
  std::vector<long> got;
  std::vector<std::size_t> per_worker;
  for (auto& w : workers) {
    const auto mine = w.get();
    per_worker.push_back(mine.size());
    got.insert(got.end(), mine.begin(), mine.end());
  }
  std::sort(got.begin(), got.end());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(got, ids) << "every job claimed, none twice";
  EXPECT_EQ(count("runs"), "0");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("claim_items")), std::to_string(ids.size()));
  EXPECT_GE(std::count_if(per_worker.begin(), per_worker.end(), [](std::size_t n) { return n > 0; }), 2)
      << "the claimers raced: more than one took jobs";
}

TEST_F(run_rows, cancelling_a_job_inside_a_run_cuts_it_out_and_no_claim_takes_it) {
  const auto ids = bulk("q", 2, 20);
  EXPECT_EQ(claim(5).size(), 5u);
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {std::to_string(ids[9])}), "t");
  EXPECT_EQ(state(ids[9]), "cancelled");
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {std::to_string(ids[9])}), "f") << "already cancelled";
  EXPECT_EQ(db_.scalar("SELECT cardinality(job_ids) || ' ' || taken FROM " + s("runs")), "19 5") << "the taken prefix kept";
  EXPECT_EQ(count("ready"), "0");
  // The cancelled job is retryable as any other, and then waits as a ready row.
  std::vector<long> got = claim(100);
  EXPECT_EQ(got.size(), 14u);
  EXPECT_EQ(std::find(got.begin(), got.end(), ids[9]), got.end());
  EXPECT_EQ(count("runs"), "0");
  EXPECT_EQ(db_.scalar("SELECT " + s("retry_job") + "($1)", {std::to_string(ids[9])}), "t");
  EXPECT_EQ(claim(100), std::vector<long>{ids[9]});
  // A job that waits in a run is not retried (it has not finished).
  const auto more = bulk("q", 2, 3);
  EXPECT_EQ(db_.scalar("SELECT " + s("retry_job") + "($1)", {std::to_string(more[1])}), "f");
}

TEST_F(run_rows, cancelling_the_last_untaken_job_of_a_run_deletes_the_run) {
  const auto ids = bulk("q", 2, 3);
  EXPECT_EQ(claim(2).size(), 2u);
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {std::to_string(ids[2])}), "t");
  EXPECT_EQ(count("runs"), "0");
  EXPECT_TRUE(claim(5).empty());
  EXPECT_EQ(state(ids[2]), "cancelled");
}

TEST_F(run_rows, a_cancel_that_waits_for_a_claim_holding_the_run_cancels_the_attempt_that_claim_opened) {
  const auto ids = bulk("q", 2, 5);
  pg admin{schema_.dsn()};
  db_.exec("BEGIN");
  ASSERT_EQ(claim(db_, 2), (std::vector<long>{ids[0], ids[1]}));
  auto cancel = std::async(std::launch::async, [&] {
    return admin.scalar("SELECT " + s("cancel_job") + "($1)", {std::to_string(ids[1])});
  });
  // The cancel waits for the claim's lock on the run row.
  pg probe{schema_.dsn()};
  bool waiting = false;
  for (int i = 0; i < 200 && !waiting; ++i) {
    waiting = probe.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%cancel_job%'") == "1";
    if (!waiting) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(waiting) << "cancel_job waited for the run row";
  EXPECT_EQ(cancel.wait_for(50ms), std::future_status::timeout);
  db_.exec("COMMIT");
  EXPECT_EQ(cancel.get(), "t");
  // Not cut out of the run (the claim took it): its attempt was cancelled.
  EXPECT_EQ(state(ids[1]), "cancelled");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("closures") + " x JOIN " + s("claim_items") +
                       " i USING (claim_id, pos) WHERE i.job_id = $1 AND x.outcome = 'x'",
                       {std::to_string(ids[1])}),
            "1");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("claim_items") + " WHERE job_id = $1", {std::to_string(ids[1])}), "1")
      << "claimed once, cancelled in that claim";
  EXPECT_EQ(db_.scalar("SELECT cardinality(job_ids) || ' ' || taken FROM " + s("runs")), "5 2") << "the run untouched";
  EXPECT_EQ(claim(10), (std::vector<long>{ids[2], ids[3], ids[4]}));
}

TEST_F(run_rows, max_running_and_the_rate_bound_what_a_claim_takes_from_a_run) {
  bulk("q", 2, 50);
  db_.exec("SELECT " + s("configure_queue") + "('q', '{\"max_running\": 3}')");
  EXPECT_EQ(claim(10).size(), 3u);
  EXPECT_TRUE(claim(10).empty()) << "three running";
  db_.exec("SELECT " + s("configure_queue") + "('q', '{\"max_running\": null, \"rate_per_second\": 0.001, \"rate_burst\": 4}')");
  EXPECT_EQ(claim(10).size(), 4u) << "the bucket's burst";
  EXPECT_TRUE(claim(10).empty());
  EXPECT_EQ(db_.scalar("SELECT taken FROM " + s("runs")), "7");
}

TEST_F(run_rows, priority_aging_lets_an_old_low_priority_run_go_before_new_high_priority_rows) {
  const auto old = bulk("q", 4, 5);
  db_.exec("UPDATE " + s("runs") + " SET created_at = now() - interval '1 hour'");
  std::vector<long> urgent;
  for (int i = 0; i < 3; ++i) {
    urgent.push_back(std::stol(db_.scalar("SELECT " + s("enqueue") + "('k', '{}', 'q', 1)")));
  }
  // Without aging priority 1 goes first; with aging the hour-old batch counts as priority 1 and
  // its smaller ids go first.
  db_.exec("BEGIN");
  EXPECT_EQ(claim(3), urgent);
  db_.exec("ROLLBACK");
  db_.exec("SELECT " + s("configure_queue") + "('q', '{\"priority_aging\": \"1 minute\"}')");
  EXPECT_EQ(claim(4), (std::vector<long>{old[0], old[1], old[2], old[3]}));
  // (a claim lists its jobs by priority, then id: the aged one last)
  EXPECT_EQ(claim(3), (std::vector<long>{urgent[0], urgent[1], old[4]}));
  EXPECT_EQ(count("runs"), "0");
}

TEST_F(run_rows, a_second_read_back_of_the_same_copy_places_no_job_twice) {
  db_.exec("BEGIN");
  copy_rows(db_, "q", 2, 8);
  const auto once = db_.scalar("SELECT " + s("enqueue_copied_ready") + "(8)");
  EXPECT_EQ(db_.scalar("SELECT " + s("enqueue_copied_ready") + "(8)"), once) << "the same answer";
  db_.exec("COMMIT");
  EXPECT_EQ(count("runs"), "1");
  EXPECT_EQ(db_.scalar("SELECT cardinality(job_ids) FROM " + s("runs")), "8");
  EXPECT_EQ(claim(100).size(), 8u);
  EXPECT_TRUE(claim(100).empty());
}

TEST_F(run_rows, a_second_read_back_after_a_claim_in_the_same_transaction_places_no_claimed_job_again) {
  // Some of the batch claimed in the producer's transaction, then all of it.
  for (const int first_claim : {3, 8}) {
    db_.exec("BEGIN");
    copy_rows(db_, "q", 2, 8);
    const auto once = db_.scalar("SELECT " + s("enqueue_copied_ready") + "(8)");
    const auto ids = parse_ids(once);
    ASSERT_EQ(ids.size(), 8u);
    EXPECT_EQ(claim(db_, first_claim), std::vector<long>(ids.begin(), ids.begin() + first_claim));
    EXPECT_EQ(db_.scalar("SELECT " + s("enqueue_copied_ready") + "(8)"), once) << "the same answer";
    db_.exec("COMMIT");
    EXPECT_EQ(claim(100), std::vector<long>(ids.begin() + first_claim, ids.end()))
        << "only the jobs no claim took: " << first_claim;
    EXPECT_TRUE(claim(100).empty());
    EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("claim_items") + " WHERE job_id BETWEEN $1 AND $2",
                         {std::to_string(ids.front()), std::to_string(ids.back())}),
              "8")
        << "each job claimed once";
    EXPECT_EQ(count("runs"), "0");
  }
}

TEST_F(run_rows, producers_whose_batches_interleave_ids_each_get_a_run_and_every_job_waits_once) {
  pg other{schema_.dsn()};
  db_.exec("BEGIN");
  other.exec("BEGIN");
  copy_rows(db_, "q", 2, 5);
  copy_rows(other, "q", 2, 5);
  copy_rows(db_, "q", 2, 5);  // ids 1-5 and 11-15 here, 6-10 in the other session
  const auto mine = parse_ids(db_.scalar("SELECT " + s("enqueue_copied_ready") + "(10)"));
  db_.exec("COMMIT");
  // The committed run's span covers the other batch's ids; none of them is in it.
  const auto theirs = parse_ids(other.scalar("SELECT " + s("enqueue_copied_ready") + "(5)"));
  other.exec("COMMIT");
  ASSERT_EQ(mine.size(), 10u);
  ASSERT_EQ(theirs.size(), 5u);
  EXPECT_GT(theirs.front(), mine.front());
  EXPECT_LT(theirs.back(), mine.back());
  EXPECT_EQ(count("runs"), "2");
  std::vector<long> got;
  for (auto one = claim(100); !one.empty(); one = claim(100)) got.insert(got.end(), one.begin(), one.end());
  std::vector<long> want = mine;
  want.insert(want.end(), theirs.begin(), theirs.end());
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
}

}  // namespace
