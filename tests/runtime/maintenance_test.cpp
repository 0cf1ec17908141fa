// The maintenance leader's housekeeping after each pass, over the SQLite fake behind the
// fault-injecting decorator: reclaiming the claim path's dead rows (asked with the configured
// threshold, never with 0, no more once the store says it cannot, again after a failure, before
// the depth count), and a queue depth count that waits 100 times as long as the last one took,
// by the runtime's clock.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "support/eventually.hpp"
#include "tenure/runtime.hpp"
#include "tenure/testing/faulty_store.hpp"

#include "sqlite_runtime_fixture.hpp"

namespace tenure {
namespace {

using namespace std::chrono_literals;
using testing::op;

using test::eventually;

class maintenance_unit : public test::sqlite_runtime_fixture {
 protected:
  runtime_config config() {
    auto c = sqlite_runtime_fixture::config();
    c.maintenance_interval = 10ms;  // no signal port: every pass runs
    c.clock = std::shared_ptr<const clock_port>(std::shared_ptr<void>{}, &clock_);  // not owned
    return c;
  }
  /// Waits for `n` more maintenance passes (each promotes due jobs first).
  bool passes(std::int64_t n) {
    const auto from = faulty_->calls(op::promote_due);
    return eventually([&] { return faulty_->calls(op::promote_due) >= from + n; });
  }
};

TEST_F(maintenance_unit, reclaim_is_asked_once_and_not_again_when_the_store_cannot_reclaim) {
  auto c = config();
  c.reclaim_dead_rows = 1'234;
  auto rt = make(c);
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(passes(10));
  // The SQLite fake answers errc::unsupported: asked once, then never again.
  EXPECT_EQ(faulty_->calls(op::reclaim_dead_rows), 1);
  EXPECT_EQ(rt->metrics().reclaims, 0u);
  rt->stop();
}

TEST_F(maintenance_unit, reclaim_dead_rows_zero_never_asks_the_store) {
  auto c = config();
  c.reclaim_dead_rows = 0;
  auto rt = make(c);
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(passes(10));
  EXPECT_EQ(faulty_->calls(op::reclaim_dead_rows), 0);
  rt->stop();
}

TEST_F(maintenance_unit, a_failed_reclaim_counts_as_a_database_error_and_is_asked_again_at_the_next_pass) {
  faulty_->fail_nth(op::reclaim_dead_rows, 1, errc::database_unavailable);
  auto rt = make(config());
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return faulty_->calls(op::reclaim_dead_rows) >= 2; }));
  ASSERT_TRUE(passes(10));
  EXPECT_EQ(faulty_->calls(op::reclaim_dead_rows), 2) << "the second answer (unsupported) ends the asking";
  EXPECT_GE(rt->metrics().database_errors, 1u);
  rt->stop();
}

TEST_F(maintenance_unit, a_negative_reclaim_dead_rows_is_refused) {
  auto c = config();
  c.reclaim_dead_rows = -1;
  auto r = runtime::create(std::move(c), faulty_);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("reclaim_dead_rows"), std::string::npos) << r.error().message();
}

TEST_F(maintenance_unit, the_leader_reclaims_dead_rows_before_it_counts_queue_depths) {
  // After a large drain the count would otherwise read every dead row of the claim path.
  auto c = config();
  c.reclaim_dead_rows = 1'234;
  faulty_->hold(op::reclaim_dead_rows);
  auto rt = make(c);
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return faulty_->calls(op::reclaim_dead_rows) == 1; }));
  EXPECT_EQ(faulty_->calls(op::queue_depths), 0) << "counted before the dead rows were reclaimed";
  faulty_->release(op::reclaim_dead_rows);
  EXPECT_TRUE(eventually([&] { return faulty_->calls(op::queue_depths) == 1; })) << "counted after it";
  rt->stop();
}

TEST_F(maintenance_unit, a_slow_depth_count_waits_a_hundred_times_its_duration_by_the_runtimes_clock) {
  faulty_->hold(op::queue_depths);
  auto rt = make(config());
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return faulty_->calls(op::queue_depths) == 1; }));
  clock_.advance(100ms);  // the count takes 100 ms by the runtime's clock
  faulty_->release(op::queue_depths);
  ASSERT_TRUE(passes(10));
  EXPECT_EQ(faulty_->calls(op::queue_depths), 1) << "no count before 100 x 100 ms passed";
  clock_.advance(9'800ms);  // 9.9 s after the count began
  ASSERT_TRUE(passes(10));
  EXPECT_EQ(faulty_->calls(op::queue_depths), 1);
  clock_.advance(200ms);  // 10.1 s
  EXPECT_TRUE(eventually([&] { return faulty_->calls(op::queue_depths) == 2; })) << "counted again once due";
  rt->stop();
}

}  // namespace
}  // namespace tenure
