// faulty_store: the faults it promises, proven against the state of the real (SQLite) store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tenure/testing/faulty_store.hpp"
#include "tenure/sqlite/store.hpp"

namespace tenure::testing {
namespace {

using namespace std::chrono_literals;
using sqlite::store;
using ::testing::IsEmpty;
using ::testing::SizeIs;

template <class T>
T must(result<T> r) {
  if (!r) throw std::runtime_error("unexpected error: " + r.error().message());
  if constexpr (!std::is_void_v<T>) return std::move(r).value();
}

new_job job() {
  new_job j;
  j.kind = "k";
  return j;
}

/// Calls `o` once with harmless arguments; returns its error, or an empty code on success.
std::error_code call(storage_port& s, op o) {
  const attempt_id a{1, 1};
  const new_job j = job();
  const completion c{a, std::nullopt};
  auto code = [](const auto& r) -> std::error_code { return r ? std::error_code{} : r.error().code(); };
  switch (o) {
    case op::enqueue: return code(s.enqueue(j));
    case op::enqueue_batch: return code(s.enqueue_batch(std::span(&j, 1)));
    case op::claim: return code(s.claim("default", 1, "w"));
    case op::heartbeat: return code(s.heartbeat(std::span(&a, 1)));
    case op::complete: return code(s.complete(std::span(&c, 1)));
    case op::fail: return code(s.fail(a, "x", fail_disposition::retry));
    case op::snooze: return code(s.snooze(a, 0us));
    case op::cancel_attempt: return code(s.cancel_attempt(a, "x"));
    case op::cancel_job: return code(s.cancel_job(1));
    case op::retry_job: return code(s.retry_job(1));
    case op::read_job: return code(s.read_job(1));
    case op::rescue_stale: return code(s.rescue_stale(1h));
    case op::promote_due: return code(s.promote_due());
    case op::reconcile: return code(s.reconcile(a));
    case op::checkpoint: return code(s.checkpoint(a));
    case op::register_callback: return code(s.register_callback(a, 1s));
    case op::await_callback: return code(s.await_callback(a, "cb"));
    case op::park_callback: return code(s.park_callback(a, "cb"));
    case op::resume_callback: return code(s.resume_callback("cb", "{}"));
    case op::extend_callback: return code(s.extend_callback("cb", 1s));
    case op::complete_callback: return code(s.complete_callback("cb"));
    case op::fail_callback: return code(s.fail_callback("cb", "x", true));
    case op::configure_queue: return code(s.configure_queue("q", {}));
    case op::queue_depths: return code(s.queue_depths());
    case op::reclaim_dead_rows: return code(s.reclaim_dead_rows(1));
  }
  return make_error_code(errc::protocol_error);
}

class sqlite_faulty_store : public ::testing::Test {
 protected:
  void SetUp() override { inner_ = must(store::open(":memory:", clock_)); }

  manual_clock clock_;
  std::unique_ptr<store> inner_;
};

TEST_F(sqlite_faulty_store, the_nth_call_fails_without_reaching_the_store) {
  faulty_store db(*inner_);
  db.fail_nth(op::enqueue, 2, errc::database_unavailable);
  const auto first = must(db.enqueue(job()));
  const auto second = db.enqueue(job());
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error(), errc::database_unavailable);
  const auto third = must(db.enqueue(job()));
  EXPECT_EQ(third, first + 1);  // the refused call never took an id
  EXPECT_THAT(must(inner_->claim("default", 10, "w")), SizeIs(2));
  EXPECT_EQ(db.calls(op::enqueue), 3);
  EXPECT_EQ(db.forwarded(op::enqueue), 2);
}

TEST_F(sqlite_faulty_store, a_refused_completion_leaves_the_attempt_open) {
  faulty_store db(*inner_);
  const auto id = must(db.enqueue(job()));
  const auto a = must(db.claim("default", 1, "w")).at(0).attempt;
  db.fail_nth(op::complete, 1, errc::transient_conflict);
  const completion c{a, std::nullopt};
  EXPECT_EQ(db.complete(std::span(&c, 1)).error(), errc::transient_conflict);
  EXPECT_EQ(must(inner_->read_job(id)).state, job_state::running);
  EXPECT_EQ(must(db.reconcile(a)), attempt_evidence::open);
  EXPECT_TRUE(must(db.complete(std::span(&c, 1))).at(0).applied);  // the rule is spent
}

TEST_F(sqlite_faulty_store, rules_count_from_when_they_are_armed_and_only_their_op) {
  faulty_store db(*inner_);
  for (int i = 0; i < 3; ++i) must(db.enqueue(job()));
  db.fail_nth(op::claim, 1, errc::shutting_down);
  must(db.enqueue(job()));  // other operations are untouched
  EXPECT_EQ(db.claim("default", 1, "w", true).error(), errc::shutting_down);  // either overload
  EXPECT_THAT(must(db.claim("default", 10, "w", false)), SizeIs(4));
  EXPECT_EQ(db.calls(op::claim), 2);
  db.fail_nth(op::read_job, 1, errc::database_error);
  db.clear_faults();
  EXPECT_TRUE(db.read_job(1));
}

TEST_F(sqlite_faulty_store, after_apply_the_write_is_durable_but_reported_in_doubt) {
  faulty_store db(*inner_);
  db.fail_after_apply_nth(op::enqueue, 1);
  EXPECT_EQ(db.enqueue(job()).error(), errc::commit_in_doubt);
  const auto claimed = must(db.claim("default", 10, "w"));
  ASSERT_THAT(claimed, SizeIs(1));  // the enqueue did land
  const auto a = claimed[0].attempt;

  db.fail_after_apply_nth(op::complete, 1);
  const completion c{a, R"({"n": 1})"};
  EXPECT_EQ(db.complete(std::span(&c, 1)).error(), errc::commit_in_doubt);
  EXPECT_EQ(must(db.reconcile(a)), attempt_evidence::completed_by_this);  // case 1: accept
  EXPECT_EQ(must(inner_->read_job(a.job_id)).state, job_state::completed);
  EXPECT_EQ(db.forwarded(op::complete), 1);
}

TEST_F(sqlite_faulty_store, after_apply_passes_on_the_stores_own_error) {
  faulty_store db(*inner_);
  must(db.enqueue(job()));
  const auto a = must(db.claim("default", 1, "w")).at(0).attempt;
  ASSERT_TRUE(must(db.cancel_job(a.job_id)));
  db.fail_after_apply_nth(op::fail, 1);
  EXPECT_EQ(db.fail(a, "late", fail_disposition::retry).error(), errc::stale_attempt);
}

TEST_F(sqlite_faulty_store, a_lost_connection_refuses_every_call_until_restored) {
  faulty_store db(*inner_);
  const auto id = must(db.enqueue(job()));
  db.lose_connection();
  for (std::size_t i = 0; i < k_op_count; ++i) {
    const auto o = static_cast<op>(i);
    EXPECT_EQ(call(db, o), errc::database_unavailable) << to_string(o);
    EXPECT_EQ(db.calls(o), o == op::enqueue ? 2 : 1) << to_string(o);
  }
  // Nothing reached the store: the job is still the only one, and still available.
  EXPECT_EQ(must(inner_->read_job(id)).state, job_state::available);
  EXPECT_EQ(inner_->read_job(id + 1).error(), errc::job_not_found);
  EXPECT_EQ(db.forwarded(op::claim), 0);

  db.restore_connection();
  EXPECT_THAT(must(db.claim("default", 10, "w")), SizeIs(1));
}

TEST_F(sqlite_faulty_store, checkpoints_and_callbacks_are_forwarded_counted_and_faultable_like_every_call) {
  // They used to bypass the decorator: checkpoint() answered while the connection was "lost",
  // and callbacks never reached the inner store (the port's default refused them).
  faulty_store db(*inner_);
  must(db.enqueue(job()));
  const auto claimed = must(db.claim("default", 1, "w"));
  ASSERT_THAT(claimed, SizeIs(1));
  const auto a = claimed[0].attempt;
  EXPECT_EQ(must(db.checkpoint(a)), std::nullopt);
  EXPECT_EQ(db.forwarded(op::checkpoint), 1);
  // The SQLite store's own answer (a fresh callback id) comes back, which proves the call got there.
  const auto id = db.register_callback(a, 1s);
  ASSERT_TRUE(id) << id.error().message();
  EXPECT_EQ(id.value().size(), 36u) << id.value();
  EXPECT_EQ(db.forwarded(op::register_callback), 1);
  db.fail_nth(op::register_callback, 1, errc::database_unavailable);
  EXPECT_EQ(db.register_callback(a, 1s).error(), errc::database_unavailable);
  EXPECT_EQ(db.calls(op::register_callback), 2);
  EXPECT_EQ(db.forwarded(op::register_callback), 1);
  db.lose_connection();
  EXPECT_EQ(db.checkpoint(a).error(), errc::database_unavailable);
  EXPECT_EQ(db.forwarded(op::checkpoint), 1);
}

TEST_F(sqlite_faulty_store, a_held_operation_waits_counted_but_unforwarded_until_released) {
  faulty_store db(*inner_);
  must(db.enqueue(job()));
  db.hold(op::claim);
  std::atomic<bool> returned{false};
  std::thread t([&] {
    EXPECT_THAT(must(db.claim("default", 10, "w")), SizeIs(1));
    returned = true;
  });
  while (db.calls(op::claim) == 0) std::this_thread::yield();
  EXPECT_EQ(db.forwarded(op::claim), 1);  // decided, and waiting before the inner store
  EXPECT_FALSE(returned.load());
  EXPECT_THAT(must(inner_->claim("default", 10, "other")), SizeIs(1)) << "the held claim reached nothing yet";
  must(db.enqueue(job()));  // other operations pass
  db.release(op::claim);
  t.join();
  EXPECT_TRUE(returned.load());
}

TEST_F(sqlite_faulty_store, a_held_operation_is_counted_as_waiting_until_released) {
  faulty_store db(*inner_);
  must(db.enqueue(job()));
  EXPECT_THAT(must(db.claim("default", 10, "w")), SizeIs(1));
  EXPECT_EQ(db.waiting(op::claim), 0) << "a call made while nothing is held never waits";
  db.hold(op::claim);
  std::thread t([&] { EXPECT_THAT(must(db.claim("default", 10, "w")), SizeIs(1)); });
  while (db.waiting(op::claim) == 0) std::this_thread::yield();
  EXPECT_EQ(db.waiting(op::claim), 1);
  EXPECT_EQ(db.waiting(op::enqueue), 0);
  must(db.enqueue(job()));  // written while the claim waits: the claim reads it once released
  db.release(op::claim);
  t.join();
  EXPECT_EQ(db.waiting(op::claim), 0);
}

TEST_F(sqlite_faulty_store, faults_are_counted_exactly_across_threads) {
  faulty_store db(*inner_);
  db.fail_nth(op::enqueue, 50, errc::database_unavailable);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        if (!db.enqueue(job())) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 1);
  EXPECT_EQ(db.calls(op::enqueue), 100);
  EXPECT_THAT(must(inner_->claim("default", 1000, "w")), SizeIs(99));
}

}  // namespace
}  // namespace tenure::testing
