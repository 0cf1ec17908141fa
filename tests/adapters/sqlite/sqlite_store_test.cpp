// Behaviour of the SQLite fake that the contract suite cannot pin down portably: exact times
// from the injected clock, heartbeat freshness, backoff bounds, error mapping, files and locks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <soci/soci.h>
#include <soci/sqlite3/soci-sqlite3.h>

#include <mutex>
#include <set>
#include <thread>

#include "tenure/sqlite/store.hpp"
#include "temp_db.hpp"

namespace tenure::sqlite {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

template <class T>
T must(result<T> r) {
  if (!r) throw std::runtime_error("unexpected error: " + r.error().message());
  if constexpr (!std::is_void_v<T>) return std::move(r).value();
}

new_job job(std::string queue = "default") {
  new_job j;
  j.kind = "k";
  j.queue = std::move(queue);
  return j;
}

/// An in-memory store on a manual clock.
class sqlite_store : public ::testing::Test {
 protected:
  void SetUp() override { db_ = must(store::open(":memory:", clock_)); }

  claimed_attempt claim_one(std::string_view queue = "default") {
    auto c = must(db_->claim(queue, 1, "w"));
    if (c.size() != 1) throw std::runtime_error("nothing to claim");
    return c.front();
  }
  bool complete(attempt_id a) {
    const completion item{a, std::nullopt};
    return must(db_->complete(std::span(&item, 1))).at(0).applied;
  }

  manual_clock clock_;
  std::unique_ptr<store> db_;
};

TEST_F(sqlite_store, timestamps_come_from_the_injected_clock) {
  const auto t0 = clock_.now();
  must(db_->configure_queue("timed", false, 1min));
  const auto id = must(db_->enqueue(job("timed")));
  auto info = must(db_->read_job(id));
  EXPECT_EQ(info.created_at, t0);
  EXPECT_EQ(info.run_at, t0);

  clock_.advance(5s);
  const auto c = claim_one("timed");
  EXPECT_EQ(c.deadline, t0 + 5s + 1min);

  clock_.advance(5s);
  const completion item{c.attempt, std::nullopt};
  const auto done = must(db_->complete(std::span(&item, 1)));
  EXPECT_EQ(done.at(0).completed_at, t0 + 10s);
  info = must(db_->read_job(id));
  EXPECT_EQ(info.finalized_at, t0 + 10s);
  EXPECT_EQ(info.created_at, t0);
}

TEST_F(sqlite_store, scheduled_run_at_is_kept_to_the_microsecond) {
  auto j = job();
  j.run_at = clock_.now() + 90s + 1234ns;  // stored in microseconds, like timestamptz
  const auto id = must(db_->enqueue(j));
  const auto info = must(db_->read_job(id));
  EXPECT_EQ(info.state, job_state::scheduled);
  EXPECT_EQ(info.run_at, clock_.now() + 90s + 1us);
  clock_.advance(90s);
  EXPECT_THAT(must(db_->claim("default", 1, "w")), IsEmpty());
  clock_.advance(1us);
  EXPECT_THAT(must(db_->claim("default", 1, "w")), SizeIs(1));
}

TEST_F(sqlite_store, a_heartbeat_keeps_an_attempt_from_being_rescued) {
  must(db_->enqueue(job()));
  must(db_->enqueue(job()));
  const auto quiet = claim_one(), beating = claim_one();
  clock_.advance(20s);
  const std::vector<attempt_id> one{beating.attempt};
  EXPECT_THAT(must(db_->heartbeat(one)), ElementsAre(beating.attempt));
  clock_.advance(10s - 1us);
  EXPECT_THAT(must(db_->rescue_stale(30s)), IsEmpty());  // 30 s minus 1 µs since the claim
  clock_.advance(1us);
  const auto rescued = must(db_->rescue_stale(30s));  // "at least stale_after old"
  ASSERT_THAT(rescued, SizeIs(1));
  EXPECT_EQ(rescued[0].attempt, quiet.attempt);
  EXPECT_EQ(must(db_->read_job(quiet.attempt.job_id)).last_error,
            "rescued: no heartbeat for 00:00:30");
  clock_.advance(20s);
  ASSERT_THAT(must(db_->rescue_stale(30s)), SizeIs(1));  // 30 s since its heartbeat
}

TEST_F(sqlite_store, rescue_names_a_passed_hard_deadline) {
  must(db_->configure_queue("timed", false, 10s));
  const auto id = must(db_->enqueue(job("timed")));
  claim_one("timed");
  clock_.advance(10s);
  ASSERT_THAT(must(db_->rescue_stale(1h)), SizeIs(1));
  EXPECT_EQ(must(db_->read_job(id)).last_error, "rescued: hard deadline passed");
}

TEST_F(sqlite_store, backoff_is_exponential_with_equal_jitter_and_capped) {
  must(db_->configure_queue("q", false, std::nullopt, 10s, 60s));
  auto j = job("q");
  j.max_attempts = 10;
  const auto id = must(db_->enqueue(j));
  for (int n = 1; n <= 5; ++n) {
    const auto c = claim_one("q");
    ASSERT_EQ(c.attempt_number, n);
    const auto failed_at = clock_.now();
    ASSERT_EQ(must(db_->fail(c.attempt, "boom", fail_disposition::retry)), job_state::retryable);
    const auto d = std::min<std::chrono::microseconds>(60s, 10s * (1 << (n - 1)));
    const auto wait = must(db_->read_job(id)).run_at - failed_at;
    EXPECT_GE(wait, d / 2) << "failure " << n;
    EXPECT_LE(wait, d) << "failure " << n;
    clock_.set(failed_at + wait);
  }
}

TEST_F(sqlite_store, backoff_jitter_is_deterministic_for_a_seed) {
  auto delays = [](std::uint64_t seed) {
    manual_clock clock;
    auto db = must(store::open(":memory:", clock, {.seed = seed}));
    auto j = job();
    j.max_attempts = 10;
    const auto id = must(db->enqueue(j));
    std::vector<time_point> run_ats;
    for (int n = 0; n < 5; ++n) {
      const auto c = must(db->claim("default", 1, "w")).at(0);
      must(db->fail(c.attempt, "boom", fail_disposition::retry));
      run_ats.push_back(must(db->read_job(id)).run_at);
      clock.set(run_ats.back());
    }
    return run_ats;
  };
  EXPECT_EQ(delays(7), delays(7));
  EXPECT_NE(delays(7), delays(8));
}

TEST_F(sqlite_store, non_positive_delays_make_the_job_available_now) {
  const auto id = must(db_->enqueue(job()));
  auto c = claim_one();
  ASSERT_EQ(must(db_->fail(c.attempt, "x", fail_disposition::retry, -5s)), job_state::retryable);
  EXPECT_EQ(must(db_->read_job(id)).run_at, clock_.now());
  c = claim_one();  // due at once
  must(db_->snooze(c.attempt, -5s));
  const auto info = must(db_->read_job(id));
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_EQ(info.run_at, clock_.now());
}

TEST_F(sqlite_store, error_text_is_bounded_in_characters) {
  must(db_->enqueue(job()));
  must(db_->enqueue(job()));
  const auto ascii = claim_one(), wide = claim_one();
  must(db_->fail(ascii.attempt, std::string(70000, 'x'), fail_disposition::permanent));
  EXPECT_EQ(must(db_->read_job(ascii.attempt.job_id)).last_error,
            std::string(65536, 'x') + " ... [truncated 4464 characters]");
  std::string e;
  for (int i = 0; i < 65537; ++i) e += "\xC3\xA9";  // é: two bytes, one character
  must(db_->fail(wide.attempt, e, fail_disposition::permanent));
  EXPECT_EQ(must(db_->read_job(wide.attempt.job_id)).last_error,
            e.substr(0, 2 * 65536) + " ... [truncated 1 characters]");
}

TEST_F(sqlite_store, cancel_attempt_without_a_reason_keeps_the_last_error) {
  const auto id = must(db_->enqueue(job()));
  must(db_->fail(claim_one().attempt, "boom", fail_disposition::retry, 0us));
  must(db_->cancel_attempt(claim_one().attempt, ""));
  const auto info = must(db_->read_job(id));
  EXPECT_EQ(info.state, job_state::cancelled);
  EXPECT_EQ(info.last_error, "boom");
}

TEST_F(sqlite_store, configure_queue_rejects_bad_policies) {
  EXPECT_EQ(db_->configure_queue("q", false, 0us).error(), errc::invalid_argument);
  EXPECT_EQ(db_->configure_queue("q", false, -1s).error(), errc::invalid_argument);
  EXPECT_EQ(db_->configure_queue("q", false, std::nullopt, -1s, 1s).error(),
            errc::invalid_argument);
  EXPECT_EQ(db_->configure_queue("q", false, std::nullopt, 2s, 1s).error(),
            errc::invalid_argument);
  EXPECT_TRUE(db_->configure_queue("q", true, 1s, 0s, 0s));
  must(db_->configure_queue("q", false, std::nullopt));  // replaces: no deadline, no DLQ
  must(db_->enqueue(job("q")));
  EXPECT_FALSE(claim_one("q").deadline);
}

TEST_F(sqlite_store, in_memory_databases_are_private) {
  manual_clock clock;
  auto other = must(store::open(":memory:", clock));
  const auto id = must(db_->enqueue(job()));
  EXPECT_EQ(other->read_job(id).error(), errc::job_not_found);
}

TEST_F(sqlite_store, one_handle_serves_many_threads) {
  std::vector<new_job> jobs(200, job());
  must(db_->enqueue_batch(jobs));
  std::mutex mu;
  std::vector<std::int64_t> claimed;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (;;) {
        auto r = db_->claim("default", 3, "w");
        std::lock_guard lock(mu);
        if (!r || r.value().empty()) return;
        for (const auto& c : r.value()) claimed.push_back(c.attempt.job_id);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(claimed.size(), 200u);
  EXPECT_EQ(std::set<std::int64_t>(claimed.begin(), claimed.end()).size(), 200u);
}

// ---- files, schema, errors ------------------------------------------------------------------

TEST(sqlite_store_file, reopening_a_file_keeps_its_jobs) {
  test::temp_db file;
  manual_clock clock;
  std::int64_t id = 0;
  {
    auto db = must(store::open(file.path(), clock));
    id = must(db->enqueue(job()));
  }
  auto db = must(store::open(file.path(), clock));
  EXPECT_EQ(must(db->read_job(id)).state, job_state::available);
  EXPECT_GT(must(db->enqueue(job())), id);  // ids keep counting
}

TEST(sqlite_store_file, another_schema_version_is_refused) {
  test::temp_db file;
  {
    soci::session raw(soci::sqlite3, file.path());
    raw << "PRAGMA user_version = 99";
  }
  manual_clock clock;
  auto db = store::open(file.path(), clock);
  ASSERT_FALSE(db);
  EXPECT_EQ(db.error(), errc::schema_mismatch);
}

TEST(sqlite_store_file, an_unreachable_path_is_database_unavailable) {
  manual_clock clock;
  auto db = store::open("/nonexistent-tenure-dir/sub/x.db", clock);
  ASSERT_FALSE(db);
  EXPECT_EQ(db.error(), errc::database_unavailable);
  EXPECT_EQ(store::open("bad\"name.db", clock).error(), errc::invalid_argument);
}

TEST(sqlite_store_file, a_broken_schema_is_database_error_not_an_exception) {
  test::temp_db file;
  manual_clock clock;
  auto db = must(store::open(file.path(), clock));
  const auto id = must(db->enqueue(job()));
  soci::session raw(soci::sqlite3, file.path());
  raw << "DROP TABLE receipts";
  const auto claimed = db->claim("default", 1, "w");  // fails after taking the ready row
  ASSERT_FALSE(claimed);
  EXPECT_EQ(claimed.error(), errc::database_error);
  EXPECT_EQ(db->read_job(id).error(), errc::database_error);  // the view needs receipts too
  std::int64_t ready_id = 0;
  raw << "SELECT id FROM ready", soci::into(ready_id);
  EXPECT_EQ(ready_id, id);  // rolled back whole: the job is still ready
}

TEST(sqlite_store_file, a_held_write_lock_is_a_transient_conflict) {
  test::temp_db file;
  manual_clock clock;
  auto db = must(store::open(file.path(), clock, {.busy_timeout = 0ms}));
  soci::session raw(soci::sqlite3, file.path());
  raw << "BEGIN IMMEDIATE";
  const auto refused = db->enqueue(job());
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), errc::transient_conflict);
  raw << "ROLLBACK";
  const auto id = must(db->enqueue(job()));
  EXPECT_EQ(id, 1);  // the refused call wrote nothing, not even an id
}

}  // namespace
}  // namespace tenure::sqlite
