// Time enters the runtime only through runtime_config::clock: with a manual clock, a lease,
// a reconcile budget or a shutdown timeout passes when the test advances the clock, however
// long the test waits in real time; and stop() is woken by the events it waits for.
// Assertions are about what happens, never about how fast: real waits only give a wrong
// implementation the time to show itself.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "support/eventually.hpp"
#include "tenure/clock.hpp"
#include "tenure/runtime.hpp"
#include "tenure/signal_port.hpp"
#include "tenure/sqlite/store.hpp"
#include "tenure/testing/faulty_store.hpp"

#include "sqlite_runtime_fixture.hpp"

namespace tenure {
namespace {

using namespace std::chrono_literals;
using testing::op;

using test::eventually;

/// Grants the maintenance lease on the first request; every later request (a renewal) fails as
/// if the database could not be reached. Sends no signals.
class one_grant_port final : public signal_port {
 public:
  result<void> connect() override { return success(); }
  bool connected() const noexcept override { return true; }
  result<std::vector<signal>> wait(std::chrono::milliseconds timeout) override {
    std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds{10}));
    return std::vector<signal>{};
  }
  result<std::optional<std::int64_t>> try_lead(const std::string&, std::chrono::milliseconds) override {
    if (asked.fetch_add(1) == 0) return std::optional<std::int64_t>{7};
    return errc::database_unavailable;
  }
  void resign(const std::string&, std::int64_t term) noexcept override { resigned = term; }

  std::atomic<int> asked{0};
  std::atomic<std::int64_t> resigned{0};
};

/// Hands the runtime one wake-up for queue "default" each time the test sets `pending`. Never
/// grants the maintenance lease.
class wake_port final : public signal_port {
 public:
  result<void> connect() override { return success(); }
  bool connected() const noexcept override { return true; }
  result<std::vector<signal>> wait(std::chrono::milliseconds timeout) override {
    std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds{5}));
    if (!pending.exchange(false)) return std::vector<signal>{};
    signal s;
    s.what = signal::kind::wake;
    s.queue = "default";
    return std::vector<signal>{s};
  }
  result<std::optional<std::int64_t>> try_lead(const std::string&, std::chrono::milliseconds) override {
    return std::optional<std::int64_t>{};
  }
  void resign(const std::string&, std::int64_t) noexcept override {}

  std::atomic<bool> pending{false};
};

class runtime_clock : public test::sqlite_runtime_fixture {
 protected:
  /// The runtime reads the test's manual clock too.
  runtime_config config() {
    auto c = sqlite_runtime_fixture::config();
    c.shutdown_timeout = 1h;
    c.clock = std::shared_ptr<const clock_port>(std::shared_ptr<void>{}, &clock_);  // not owned
    return c;
  }
};

TEST_F(runtime_clock, leadership_is_given_up_once_the_manual_clock_passes_the_lease_expiry_without_renewal) {
  auto port = std::make_shared<one_grant_port>();
  auto c = config();
  c.maintenance_interval = 50ms;  // passes run every 50 ms of real time while leading
  c.maintenance_lease = 200ms;
  auto rt = make(c, port);
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().leader; }));
  EXPECT_EQ(rt->metrics().leader_term, 7);
  ASSERT_TRUE(eventually([&] { return faulty_->calls(op::promote_due) > 0; })) << "the leader runs its passes";

  // Real time passing does not expire the lease, nor bring the next renewal: the clock decides.
  std::this_thread::sleep_for(600ms);
  EXPECT_TRUE(rt->metrics().leader) << "the lease expired by real time, not by the runtime's clock";
  EXPECT_EQ(port->asked.load(), 1) << "a renewal was asked before the runtime's clock said it was due";

  // Past the renewal time the renewal fails; the lease is kept until it expires.
  clock_.advance(100ms);
  ASSERT_TRUE(eventually([&] { return port->asked.load() >= 2; })) << "the renewal is asked once it is due";
  EXPECT_TRUE(rt->metrics().leader) << "a failed renewal keeps the lease until it expires";

  // Past the expiry (200 ms after the first request) without renewal: no longer the leader.
  clock_.advance(101ms);
  EXPECT_FALSE(rt->metrics().leader);
  EXPECT_EQ(rt->metrics().leader_term, 0);
  rt->maintenance_now();  // a pass would go through promote_due; none runs without the lease
  const auto passes = faulty_->calls(op::promote_due);
  rt->maintenance_now();
  std::this_thread::sleep_for(200ms);  // the maintenance timer ticks meanwhile
  EXPECT_EQ(faulty_->calls(op::promote_due), passes) << "no maintenance pass after the lease expired";
  rt->stop();
  EXPECT_EQ(port->resigned.load(), 0) << "an expired lease is not resigned: nothing is held";
}

TEST_F(runtime_clock, a_caller_owned_attempt_that_cannot_reconcile_releases_its_permit_once_the_manual_clock_passes_the_budget) {
  auto id = inner_->enqueue({.kind = "charge", .max_attempts = 1});
  ASSERT_TRUE(id);
  auto c = config();
  c.queues[0].max_concurrency = 1;
  c.reconcile_budget = 200ms;  // the capacity sweep looks every 50 ms of real time
  auto rt = make(c);
  std::atomic<bool> exited{false};
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    faulty_->lose_connection();  // the database goes away as the handler exits
    ctx.note_failure("provider unreachable");
    exited = true;
    return make_error_code(errc::database_unavailable);
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return exited.load() && faulty_->calls(op::reconcile) >= 1; }));

  // Real time well past the budget: the permit is held, for the runtime's clock has not moved.
  std::this_thread::sleep_for(600ms);
  auto m = rt->metrics();
  EXPECT_EQ(m.permits_held, 1) << "the budget was counted in real time, not on the runtime's clock";
  EXPECT_EQ(m.capacity_released, 0u);

  clock_.advance(199ms);
  std::this_thread::sleep_for(200ms);  // several sweeps
  EXPECT_EQ(rt->metrics().permits_held, 1) << "released before the budget was spent";

  clock_.advance(2ms);
  ASSERT_TRUE(eventually([&] { return rt->metrics().capacity_released == 1; }));
  m = rt->metrics();
  EXPECT_EQ(m.permits_held, 0) << "the capacity is released";
  EXPECT_EQ(m.in_flight, 1) << "the watcher still holds the attempt, reconciling";
  EXPECT_EQ(m.watching, 1);
  EXPECT_EQ(faulty_->calls(op::fail) + faulty_->calls(op::complete), 0) << "no write without evidence";
  EXPECT_EQ(state(id.value()), job_state::running);

  // The next read is due once its backoff (at most 5 s) has passed, by the runtime's clock too.
  faulty_->restore_connection();
  clock_.advance(6s);
  ASSERT_TRUE(eventually([&] { return rt->wait_idle(10ms); }));
  EXPECT_EQ(state(id.value()), job_state::failed) << "max_attempts 1: the policy fails it";
  rt->stop();
}

TEST_F(runtime_clock, stop_returns_when_the_last_handler_finishes_not_at_the_shutdown_timeout) {
  auto id = inner_->enqueue({.kind = "k"});
  ASSERT_TRUE(id);
  auto c = config();
  c.shutdown_timeout = 1h;  // and the manual clock never gets there
  auto rt = make(c);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<bool> running{false};
  std::atomic<bool> finished{false};
  rt->handle("k", [&](job_context&) {
    running = true;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    finished = true;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return running.load(); }));
  auto stopped = std::async(std::launch::async, [&] {
    rt->stop();
    return finished.load();  // what stop() saw as it returned
  });
  std::this_thread::sleep_for(300ms);  // time for a wrong stop() to return early
  ASSERT_EQ(stopped.wait_for(0ms), std::future_status::timeout) << "stop() returned while a handler was running";
  EXPECT_EQ(state(id.value()), job_state::running);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  // Generous: the point is that the handler's exit wakes stop(), long before the manual clock
  // (which never moves here) could reach the shutdown timeout.
  ASSERT_EQ(stopped.wait_for(60s), std::future_status::ready) << "stop() was not woken by the handler's exit";
  EXPECT_TRUE(stopped.get()) << "stop() returned before the handler finished";
  EXPECT_EQ(state(id.value()), job_state::completed) << "its completion was flushed before stop() returned";
  EXPECT_EQ(rt->metrics().completed, 1u);
}

TEST_F(runtime_clock, stop_gives_up_on_a_handler_once_the_manual_clock_passes_the_shutdown_timeout) {
  auto id = inner_->enqueue({.kind = "k"});
  ASSERT_TRUE(id);
  auto c = config();
  c.shutdown_timeout = 200ms;
  auto rt = make(c);
  std::atomic<bool> running{false};
  std::atomic<bool> cancelled{false};
  rt->handle("k", [&](job_context& ctx) {
    running = true;
    cancelled = ctx.wait_cancelled(std::chrono::milliseconds::max());
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return running.load(); }));
  auto stopped = std::async(std::launch::async, [&] { rt->stop(); });
  std::this_thread::sleep_for(600ms);  // real time past the timeout
  ASSERT_EQ(stopped.wait_for(0ms), std::future_status::timeout)
      << "stop() gave up by real time, not by the runtime's clock";
  EXPECT_FALSE(cancelled.load());
  clock_.advance(201ms);
  ASSERT_EQ(stopped.wait_for(60s), std::future_status::ready);
  EXPECT_TRUE(cancelled.load()) << "past the timeout the handler is cancelled";
  EXPECT_EQ(state(id.value()), job_state::running) << "its attempt stays open for rescue";
}

TEST_F(runtime_clock, a_wake_up_right_after_an_idle_poll_claims_at_once_not_after_the_wake_gap) {
  auto c = config();
  c.poll_interval = 10min;  // idle polls double from 2 ms: after the 12th, the next is seconds away
  c.maintenance_interval = 20min;
  c.maintenance_lease = 1h;
  auto port = std::make_shared<wake_port>();
  auto rt = make(c, port);
  std::atomic<int> ran{0};
  rt->handle("k", [&](job_context&) {
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return faulty_->calls(op::claim) >= 12; }));
  const auto claims = faulty_->calls(op::claim);
  enqueue();
  port->pending = true;
  // The runtime's clock stands still, so the last idle poll answered "now": a wake-up held back
  // until a gap after that answer would wait for the next idle poll, seconds away in real time.
  ASSERT_TRUE(eventually([&] { return ran.load() == 1; }, 1500ms)) << "the wake-up did not claim";
  // (A claim that found a job polls eagerly again, so more claims may follow this one.)
  EXPECT_GT(faulty_->calls(op::claim), claims);
  rt->stop();
}

}  // namespace
}  // namespace tenure
