// Runtime logic against the SQLite fake with fault injection and an injected clock: the
// completion batcher, heartbeats and shutdown. Loops are driven by hand (heartbeat_now,
// maintenance_now); every wait has a deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "support/eventually.hpp"
#include "tenure/testing/faulty_store.hpp"
#include "tenure/sqlite/store.hpp"
#include "tenure/clock.hpp"
#include "tenure/runtime.hpp"

#include "sqlite_runtime_fixture.hpp"
#include "support/log_watch.hpp"

namespace tenure {
namespace {

using namespace std::chrono_literals;
using testing::op;

using test::eventually;

class runtime_unit : public test::sqlite_runtime_fixture {};

TEST_F(runtime_unit, completions_are_flushed_as_batches_not_one_statement_each) {
  for (int i = 0; i < 200; ++i) enqueue();
  auto c = config();
  c.queues[0].max_concurrency = 200;
  c.claim_batch = 200;
  c.completion_batch = 200;
  c.flush_delay = 200ms;
  auto rt = make(c);
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 200; }));
  EXPECT_LE(faulty_->calls(op::complete), 3) << "200 completions in a handful of flushes";
  EXPECT_EQ(rt->metrics().flushed_items, 200u);
  rt->stop();
}

TEST_F(runtime_unit, a_failed_flush_keeps_the_attempt_and_its_permit_until_a_retry_answers) {
  const auto first = enqueue("first");
  const auto second = enqueue("second");
  auto c = config();
  c.queues[0].max_concurrency = 1;  // one permit: the second job needs the first one's permit
  auto rt = make(c);
  std::mutex mu;
  std::vector<std::string> order;
  rt->on_event([&](const job_event& e) {
    std::lock_guard lock(mu);
    order.push_back(std::string{to_string(e.event)} + ":" + e.kind);
  });
  rt->handle("first", [](job_context&) { return job_outcome::completed(); });
  rt->handle("second", [](job_context&) { return job_outcome::completed(); });
  // The first three flushes fail without reaching the database.
  faulty_->fail_nth(op::complete, 1, errc::database_unavailable);
  faulty_->fail_nth(op::complete, 2, errc::database_unavailable);
  faulty_->fail_nth(op::complete, 3, errc::database_unavailable);
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().flush_failures >= 2; }));
  // Meanwhile the attempt is still open in the database and still held here.
  EXPECT_EQ(state(first), job_state::running);
  EXPECT_EQ(rt->metrics().in_flight, 1);
  EXPECT_EQ(state(second), job_state::available) << "the permit is not released before the flush answers";
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 2; }));
  rt->stop();
  EXPECT_EQ(rt->metrics().flush_failures, 3u);
  EXPECT_EQ(state(first), job_state::completed);
  EXPECT_EQ(state(second), job_state::completed);
  std::lock_guard lock(mu);
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[1], "completed:first");
  EXPECT_EQ(order[2], "started:second") << "second claimed only after first's flush answered";
}

TEST_F(runtime_unit, a_flush_with_an_unknown_outcome_is_reconciled_not_double_counted) {
  const auto id = enqueue();
  auto rt = make(config());
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  // The first flush lands but its answer is lost; the retry then finds the attempt closed.
  faulty_->fail_after_apply_nth(op::complete, 1);
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
  EXPECT_EQ(rt->metrics().stale_rejected, 0u) << "our own completion is not counted as stale";
  EXPECT_EQ(rt->metrics().flush_failures, 1u);
  EXPECT_GE(faulty_->calls(op::reconcile), 1);
  EXPECT_EQ(state(id), job_state::completed);
  EXPECT_EQ(inner_->read_job(id).value().run_lease, 1);
}

TEST_F(runtime_unit, heartbeat_covers_running_attempts_and_those_waiting_for_their_flush) {
  const auto running = enqueue("slow");
  const auto finished = enqueue("fast");
  auto rt = make(config());
  std::atomic<bool> release{false};
  rt->handle("slow", [&](job_context&) {
    while (!release.load()) std::this_thread::sleep_for(1ms);
    return job_outcome::completed();
  });
  rt->handle("fast", [](job_context&) { return job_outcome::completed(); });
  // Every flush fails for now: "fast" waits for its flush while holding its attempt.
  faulty_->fail_nth(op::complete, 1, errc::database_unavailable);
  faulty_->fail_nth(op::complete, 2, errc::database_unavailable);
  faulty_->fail_nth(op::complete, 3, errc::database_unavailable);
  faulty_->fail_nth(op::complete, 4, errc::database_unavailable);
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().flush_failures >= 1 && rt->metrics().in_flight == 2; }));
  const auto before = faulty_->calls(op::heartbeat);
  clock_.advance(100s);  // both attempts were claimed 100 s ago
  rt->heartbeat_now();
  EXPECT_EQ(faulty_->calls(op::heartbeat), before + 1) << "one statement for all attempts";
  // Had the heartbeat skipped either attempt, a 30 s staleness rescue would close it now.
  auto rescued = inner_->rescue_stale(30s);
  ASSERT_TRUE(rescued);
  EXPECT_TRUE(rescued.value().empty());
  release = true;
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 2; }));
  rt->stop();
  EXPECT_EQ(state(running), job_state::completed);
  EXPECT_EQ(state(finished), job_state::completed);
}

TEST_F(runtime_unit, a_heartbeat_that_finds_the_attempt_gone_cancels_the_handler_and_the_result_is_stale) {
  const auto id = enqueue();
  auto rt = make(config());
  std::atomic<bool> started{false}, cancelled{false};
  std::mutex mu;
  std::vector<std::int64_t> completed_leases;
  rt->on_event([&](const job_event& e) {
    std::lock_guard lock(mu);
    if (e.event == lifecycle_event::completed) completed_leases.push_back(e.attempt.run_lease);
  });
  rt->handle("k", [&](job_context& ctx) {
    if (ctx.run_lease() > 1) return job_outcome::completed();  // the re-run after the rescue
    started = true;
    cancelled = ctx.wait_cancelled(10s);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  clock_.advance(1min);
  ASSERT_EQ(inner_->rescue_stale(30s).value().size(), 1u);  // another process rescued it
  rt->heartbeat_now();
  ASSERT_TRUE(eventually([&] { return rt->metrics().stale_rejected == 1; }));
  EXPECT_TRUE(cancelled.load());
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; })) << "re-run under a new lease";
  rt->stop();
  EXPECT_EQ(state(id), job_state::completed);
  EXPECT_EQ(inner_->read_job(id).value().run_lease, 2);
  std::lock_guard lock(mu);
  EXPECT_EQ(completed_leases, std::vector<std::int64_t>{2}) << "no completed hook for the stale lease 1";
}

TEST_F(runtime_unit, maintenance_rescues_by_the_injected_clock_and_flags_the_local_handler) {
  // A hard deadline is the one rescue the leader applies to its own attempts: their staleness it
  // refreshes itself right before rescuing (a live attempt of the leader is never stale).
  ASSERT_TRUE(inner_->configure_queue("default", false, std::chrono::microseconds{10s}));
  enqueue();
  auto c = config();
  c.heartbeat_interval = 10s;  // staleness 30 s; timers never fire during the test
  auto rt = make(c);
  std::atomic<bool> started{false}, cancelled{false};
  rt->handle("k", [&](job_context& ctx) {
    if (ctx.run_lease() > 1) return job_outcome::completed();
    started = true;
    cancelled = ctx.wait_cancelled(10s);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  clock_.advance(9s);
  rt->maintenance_now();
  EXPECT_EQ(rt->metrics().rescued, 0u) << "before its deadline";
  clock_.advance(40s);  // past the deadline, and past staleness: only the deadline applies
  rt->maintenance_now();
  EXPECT_EQ(rt->metrics().rescued, 1u);
  ASSERT_TRUE(eventually([&] { return cancelled.load(); }));
  ASSERT_TRUE(eventually([&] { return rt->metrics().stale_rejected == 1; }));
  rt->stop();
}

TEST_F(runtime_unit, the_maintenance_leader_never_rescues_its_own_live_attempts_for_staleness) {
  enqueue();
  auto c = config();
  c.heartbeat_interval = 10s;  // staleness 30 s; the heartbeat timer never fires in the test
  auto rt = make(c);
  std::atomic<bool> started{false}, release{false};
  rt->handle("k", [&](job_context&) {
    started = true;
    while (!release.load()) std::this_thread::sleep_for(1ms);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  clock_.advance(5min);  // its heartbeat is long overdue (as when the pool was starved)
  rt->maintenance_now();
  EXPECT_EQ(rt->metrics().rescued, 0u);
  release = true;
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
  EXPECT_EQ(rt->metrics().stale_rejected, 0u);
}

TEST_F(runtime_unit, stop_flushes_every_pending_completion_at_once) {
  for (int i = 0; i < 20; ++i) enqueue();
  auto c = config();
  c.queues[0].max_concurrency = 20;
  c.completion_batch = 1000;
  c.flush_delay = 1h;  // only shutdown can trigger this flush
  auto rt = make(c);
  std::atomic<int> returned{0};
  rt->handle("k", [&](job_context&) {
    ++returned;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return returned.load() == 20; }));
  // A handler counts itself before its outcome reaches the runtime; wait for all 20 outcomes.
  ASSERT_TRUE(eventually([&] { return rt->metrics().pending_completions == 20; }));
  EXPECT_EQ(rt->metrics().completed, 0u) << "nothing flushed yet";
  EXPECT_EQ(faulty_->calls(op::complete), 0);
  rt->stop();
  EXPECT_EQ(rt->metrics().completed, 20u);
  EXPECT_EQ(rt->metrics().pending_completions, 0);
  EXPECT_EQ(faulty_->calls(op::complete), 1);
}

TEST_F(runtime_unit, stop_keeps_retrying_a_failing_flush_within_its_deadline) {
  const auto id = enqueue();
  auto c = config();
  c.flush_delay = 1h;
  auto rt = make(c);
  std::atomic<bool> returned{false};
  rt->handle("k", [&](job_context&) {
    returned = true;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return returned.load(); }));
  faulty_->fail_nth(op::complete, 1, errc::database_unavailable);
  faulty_->fail_nth(op::complete, 2, errc::transient_conflict);
  rt->stop();
  EXPECT_EQ(state(id), job_state::completed) << "the completion a handler returned is durable after stop()";
  EXPECT_EQ(rt->metrics().flush_failures, 2u);
}

using test::watching_log;

TEST_F(runtime_unit, stop_waits_for_a_claim_in_flight_and_runs_what_it_claimed) {
  auto rt = make(config());
  std::atomic<int> ran{0};
  rt->handle("k", [&](job_context&) {
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue_under_a_held_claim();
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    rt->stop();
    stopped = true;
  });
  // stop() has to wait for the claim's answer; give it the time to (wrongly) return first.
  eventually([&] { return stopped.load(); }, 200ms);
  faulty_->release(op::claim);
  stopper.join();
  EXPECT_EQ(ran.load(), 1) << "what the claim in flight took ran before stop() returned";
  EXPECT_EQ(state(id), job_state::completed);
}

TEST_F(runtime_unit, wait_idle_counts_a_claim_awaiting_its_answer_as_work_in_flight) {
  auto rt = make(config());
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  rt->handle("k", [&](job_context&) {
    while (!release.load()) std::this_thread::sleep_for(1ms);
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue_under_a_held_claim();
  EXPECT_FALSE(rt->wait_idle(100ms)) << "the claim in flight may take a job";
  faulty_->release(op::claim);
  // The claim took the job: its handler runs (held here) until released.
  EXPECT_FALSE(rt->wait_idle(100ms)) << "the claimed attempt is running";
  release = true;
  EXPECT_TRUE(rt->wait_idle(10s));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(state(id), job_state::completed);
  rt->stop();
}

TEST_F(runtime_unit, a_claimed_handler_starts_without_waiting_for_the_control_thread) {
  // The claim's answer hands the handler to the pool where it arrives; the control thread, held
  // here inside the `started` hook, admits the attempt when it gets to it, and the handler's exit
  // is settled only after that.
  const auto id = enqueue();
  auto rt = make(config());
  std::mutex mu;
  std::condition_variable cv;
  bool handler_ran = false;
  std::atomic<int> ran_during_hook{-1};
  std::vector<std::string> events;
  rt->on_event([&](const job_event& e) {
    std::unique_lock lock(mu);
    events.emplace_back(to_string(e.event));
    if (e.event == lifecycle_event::started) {
      ran_during_hook = cv.wait_for(lock, 5s, [&] { return handler_ran; }) ? 1 : 0;
    }
  });
  rt->handle("k", [&](job_context&) {
    {
      std::lock_guard lock(mu);
      handler_ran = true;
    }
    cv.notify_all();
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state(id) == job_state::completed; }));
  EXPECT_EQ(ran_during_hook.load(), 1) << "the handler ran while the control thread was busy in the started hook";
  rt->stop();
  EXPECT_EQ(rt->metrics().completed, 1u);
  std::lock_guard lock(mu);
  EXPECT_EQ(events, (std::vector<std::string>{"started", "completed"}));
}

TEST_F(runtime_unit, a_claim_answered_after_the_shutdown_timeout_is_given_back_without_spending_an_attempt) {
  auto c = config();
  c.shutdown_timeout = 50ms;
  auto rt = make(c);
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  watching_log gave_up{"after the shutdown timeout"};
  const auto id = enqueue_under_a_held_claim();
  std::thread stopper([&] { rt->stop(); });
  ASSERT_TRUE(eventually([&] { return gave_up.hits() > 0; })) << "stop() gave up waiting for the claim's handlers";
  faulty_->release(op::claim);
  stopper.join();
  const auto j = inner_->read_job(id).value();
  EXPECT_TRUE(j.state == job_state::available || j.state == job_state::scheduled)
      << "given back (snoozed), not left running for rescue: " << to_string(j.state);
  EXPECT_EQ(j.attempt, 0) << "no attempt spent";
  EXPECT_EQ(rt->metrics().claimed, 0u);
}

TEST_F(runtime_unit, a_claim_launched_just_before_the_shutdown_timeout_gives_back_the_jobs_it_has_no_handler_for) {
  // The claim's database thread decides to launch before stop() gives up on handlers; its answer
  // reaches the control thread only after stop() has. A job of a kind with no handler here is
  // then given back at once (no attempt spent), as a claim answered after the timeout does, not
  // left open for rescue. The control thread is held inside a `completed` hook while stop()
  // queues its give-up step and the claim is answered, so the three happen in that order.
  auto c = config();
  c.shutdown_timeout = 500ms;
  auto rt = make(c);
  std::mutex mu;
  std::condition_variable cv;
  bool quick_may_finish = false, hook_may_return = false, blocker_may_return = false, in_hook = false;
  const auto wait_for = [&](bool& flag) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, 20s, [&] { return flag; });
  };
  const auto open = [&](bool& flag) {
    {
      std::lock_guard lock(mu);
      flag = true;
    }
    cv.notify_all();
  };
  rt->handle("block", [&](job_context&) {
    wait_for(blocker_may_return);
    return job_outcome::completed();
  });
  rt->handle("quick", [&](job_context&) {
    wait_for(quick_may_finish);
    return job_outcome::completed();
  });
  rt->on_event([&](const job_event& e) {
    if (e.event != lifecycle_event::completed || e.kind != "quick") return;
    open(in_hook);
    wait_for(hook_may_return);
  });
  const auto blocker = enqueue("block");
  const auto quick = enqueue("quick");
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state(blocker) == job_state::running && state(quick) == job_state::running; }));
  const auto orphan = enqueue_under_a_held_claim();  // kind "k": no handler here
  watching_log gave_up{"after the shutdown timeout"};
  std::thread stopper([&] { rt->stop(); });
  std::this_thread::sleep_for(100ms);  // stop() stops claiming and starts waiting for handlers
  open(quick_may_finish);              // its completion holds the control thread in the hook
  wait_for(in_hook);
  std::this_thread::sleep_for(1s);  // past the shutdown timeout: stop() queues its give-up step
  EXPECT_EQ(gave_up.hits(), 0) << "the give-up step waits behind the hook";
  faulty_->release(op::claim);  // the claim is answered and launched: stop() has not given up yet
  ASSERT_TRUE(eventually([&] { return faulty_->waiting(op::claim) == 0 && faulty_->forwarded(op::claim) > 0; }));
  std::this_thread::sleep_for(100ms);  // its answer queues behind the give-up step
  open(hook_may_return);
  ASSERT_TRUE(eventually([&] { return gave_up.hits() > 0; }));
  open(blocker_may_return);
  stopper.join();
  // The sleeps above are margins, not the proof of the order: an answer that reached the control
  // thread before the give-up step would have been admitted and snoozed for 60 s as a kind without
  // a handler (scheduled); given back, the job is available at once.
  const auto j = inner_->read_job(orphan).value();
  EXPECT_EQ(j.state, job_state::available)
      << "given back at once: not left open for rescue (running), nor admitted before stop() gave up (scheduled): "
      << to_string(j.state);
  EXPECT_EQ(j.attempt, 0) << "no attempt spent";
}

TEST_F(runtime_unit, a_hook_that_throws_anything_is_logged_and_the_job_still_completes) {
  const auto id = enqueue();
  auto rt = make(config());
  std::atomic<int> calls{0};
  rt->on_event([&](const job_event&) {
    ++calls;
    throw 42;  // not a std::exception
  });
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  watching_log logged{"non-standard exception"};
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
  EXPECT_EQ(state(id), job_state::completed);
  EXPECT_EQ(calls.load(), 2) << "started and completed";
  EXPECT_EQ(logged.hits(), 2);
}

TEST_F(runtime_unit, sql_schema_follows_the_same_name_rule_as_migrate) {
  auto c = config();
  c.sql_schema = std::string(54, 's');
  auto accepted = runtime::create(c, faulty_, nullptr);
  EXPECT_TRUE(accepted) << accepted.error().message();
  c.sql_schema = std::string(55, 's');  // 63 bytes would fit an identifier, not <schema>_callback
  auto refused = runtime::create(c, faulty_, nullptr);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), errc::invalid_argument);
  EXPECT_NE(refused.error().message().find("at most 54 characters"), std::string::npos) << refused.error().message();
}

TEST_F(runtime_unit, on_event_after_start_is_refused) {
  auto rt = make(config());
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  watching_log refused{"on_event() after start() is ignored"};
  std::atomic<int> calls{0};
  rt->on_event([&](const job_event&) { ++calls; });  // would race the control thread's reads
  EXPECT_EQ(refused.hits(), 1);
  enqueue();
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
  EXPECT_EQ(calls.load(), 0);
}

TEST_F(runtime_unit, progress_with_nul_or_invalid_utf8_is_stored_with_replacement_characters) {
  const auto id = enqueue();
  auto rt = make(config());
  const std::string bad{"a\0b\xff", 4};
  std::atomic<bool> flushed{false};
  rt->handle("k", [&](job_context& ctx) {
    ctx.set_progress(50, bad);
    auto f = ctx.flush_progress();
    flushed = f && f.value();
    EXPECT_EQ(inner_->read_job(ctx.job_id()).value().progress.value_or(""),
              R"({"message":"a)" "\xEF\xBF\xBD" "b" "\xEF\xBF\xBD" R"(","percent":50})");
    return job_outcome::completed(nlohmann::json{{bad, bad}});  // the key too
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
  EXPECT_TRUE(flushed.load());
  const std::string fixed = "a\xEF\xBF\xBD" "b\xEF\xBF\xBD";
  EXPECT_EQ(inner_->read_job(id).value().progress.value_or(""), nlohmann::json({{fixed, fixed}}).dump());
}

TEST_F(runtime_unit, a_flush_refused_as_invalid_is_split_and_only_the_refused_completion_is_left_to_rescue) {
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(enqueue());
  auto c = config();
  c.flush_delay = 1h;
  c.completion_batch = 3;  // the three completions go in one flush
  auto rt = make(c);
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  faulty_->fail_nth(op::complete, 1, errc::invalid_argument);  // the batch of three
  faulty_->fail_nth(op::complete, 2, errc::invalid_argument);  // the first of them, alone
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 2 && rt->metrics().in_flight == 0; }));
  EXPECT_EQ(faulty_->calls(op::complete), 4) << "one batch, then one statement per item";
  int running = 0;
  for (auto id : ids) running += state(id) == job_state::running;
  EXPECT_EQ(running, 1) << "the refused completion is not retried: its attempt waits for rescue";
  EXPECT_EQ(rt->metrics().pending_completions, 0);
  // Rescue (after staleness, 3 h here) runs it again.
  ASSERT_TRUE(eventually([&] {
    clock_.advance(4h);
    rt->maintenance_now();
    return rt->metrics().completed == 3;
  }));
  rt->stop();
  for (auto id : ids) EXPECT_EQ(state(id), job_state::completed);
}

TEST_F(runtime_unit, an_outcome_refused_as_invalid_is_not_retried_and_left_to_rescue) {
  const auto id = enqueue();
  auto rt = make(config());
  rt->handle("k", [](job_context& ctx) {
    if (ctx.run_lease() == 1) return job_outcome::retry("first try");
    return job_outcome::completed();
  });
  faulty_->fail_nth(op::fail, 1, errc::invalid_argument);
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return faulty_->calls(op::fail) == 1 && rt->metrics().in_flight == 0; }))
      << "the entry is released, not retried with backoff";
  EXPECT_EQ(state(id), job_state::running);
  ASSERT_TRUE(eventually([&] {
    clock_.advance(4h);
    rt->maintenance_now();
    return rt->metrics().completed == 1;
  }));
  rt->stop();
  EXPECT_EQ(faulty_->calls(op::fail), 1);
  EXPECT_EQ(state(id), job_state::completed);
}

TEST_F(runtime_unit, a_heartbeat_refused_as_invalid_drops_its_progress_and_heartbeats_go_on) {
  const auto id = enqueue();
  auto rt = make(config());
  std::atomic<bool> started{false}, release{false};
  rt->handle("k", [&](job_context& ctx) {
    ctx.set_progress(7, "refused");
    started = true;
    while (!release.load()) std::this_thread::sleep_for(1ms);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  faulty_->fail_nth(op::heartbeat, 1, errc::invalid_argument);
  rt->heartbeat_now();
  EXPECT_EQ(faulty_->calls(op::heartbeat), 1);
  rt->heartbeat_now();  // goes without the refused progress
  EXPECT_EQ(faulty_->forwarded(op::heartbeat), 1);
  EXPECT_FALSE(inner_->read_job(id).value().progress) << "the refused progress was dropped, not sent again";
  release = true;
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
}

TEST_F(runtime_unit, claim_failures_back_off_and_recover) {
  enqueue();
  auto rt = make(config());
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  faulty_->lose_connection();
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().database_errors >= 3; }));
  EXPECT_GE(faulty_->calls(op::claim), 3);
  EXPECT_EQ(faulty_->forwarded(op::claim), 0) << "nothing reached the database";
  EXPECT_EQ(rt->metrics().completed, 0u);
  faulty_->restore_connection();
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
}

TEST_F(runtime_unit, an_unknown_kind_is_given_back_without_spending_an_attempt) {
  const auto id = enqueue("nobody_handles_this");
  auto rt = make(config());
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().snoozed == 1; }));
  rt->stop();
  const auto j = inner_->read_job(id).value();
  EXPECT_EQ(j.state, job_state::scheduled);
  EXPECT_EQ(j.attempt, 0);
}

// ---- caller-owned exits: reconciliation when the database cannot answer (case 4) ----------

TEST_F(runtime_unit, caller_owned_exit_during_an_outage_releases_the_permit_after_the_budget_and_writes_nothing) {
  auto id = inner_->enqueue({.kind = "charge", .max_attempts = 1});
  ASSERT_TRUE(id);
  auto c = config();
  c.queues[0].max_concurrency = 1;
  c.reconcile_budget = 100ms;
  auto rt = make(c);
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    faulty_->lose_connection();  // the database goes away as the handler exits
    ctx.note_failure("provider unreachable");
    return make_error_code(errc::database_unavailable);
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().watching == 1; }));
  auto m = rt->metrics();
  EXPECT_EQ(m.permits_held, 0) << "the heavy capacity is released";
  EXPECT_EQ(m.in_flight, 1) << "the light watcher still holds the attempt";
  EXPECT_EQ(m.capacity_released, 1u);
  EXPECT_GE(faulty_->calls(op::reconcile), 2) << "still reconciling";
  EXPECT_EQ(faulty_->calls(op::fail) + faulty_->calls(op::complete), 0) << "no write without evidence";
  EXPECT_EQ(state(id.value()), job_state::running) << "the attempt is still open";
  faulty_->restore_connection();
  ASSERT_TRUE(eventually([&] { return rt->wait_idle(10ms); }));
  EXPECT_EQ(faulty_->forwarded(op::fail), 1) << "resolved exactly once, by the retry policy";
  EXPECT_EQ(state(id.value()), job_state::failed) << "max_attempts 1: the policy fails it";
  EXPECT_EQ(inner_->read_job(id.value()).value().last_error, "provider unreachable");
  EXPECT_EQ(rt->metrics().watching, 0);
  rt->stop();
}

TEST_F(runtime_unit, a_permit_released_past_the_staleness_says_so_instead_of_no_answer_after_0_ms) {
  // The handler outlives the attempt's staleness while heartbeats cannot reach the database (a
  // paused process looks the same); when it returns, its permit is released at once. The warning
  // used to say "no answer from the database for its outcome after 0 ms".
  const auto id = enqueue();
  auto c = config();
  c.heartbeat_interval = 20ms;  // staleness 60 ms
  c.reconcile_budget = 1h;
  auto rt = make(c);
  watching_log staleness{"past its staleness of 60 ms"};
  watching_log zero{"after 0 ms"};
  rt->handle("k", [&](job_context&) {
    faulty_->lose_connection();
    std::this_thread::sleep_for(150ms);
    return job_outcome::retry("boom");
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().capacity_released == 1; }));
  EXPECT_EQ(staleness.hits(), 1);
  EXPECT_EQ(zero.hits(), 0);
  faulty_->restore_connection();
  rt->stop();
  (void)id;
}

TEST_F(runtime_unit, a_released_permit_lets_other_jobs_run_while_the_watcher_keeps_reconciling) {
  const auto slow = enqueue("charge");
  auto c = config();
  c.queues[0].max_concurrency = 1;
  c.reconcile_budget = 50ms;
  auto rt = make(c);
  std::atomic<int> plain{0};
  rt->handle_caller_owned("charge", [&](caller_owned_context&) -> result<finalization_receipt> {
    return make_error_code(errc::database_unavailable);
  });
  rt->handle("plain", [&](job_context&) {
    ++plain;
    return job_outcome::completed();
  });
  // Evidence cannot be read for a while (five failures, backing off 50 ms .. 800 ms).
  for (int n = 1; n <= 5; ++n) faulty_->fail_nth(op::reconcile, n, errc::database_unavailable);
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().watching == 1; }));
  const auto other = enqueue("plain");
  ASSERT_TRUE(eventually([&] { return state(other) == job_state::completed; }))
      << "the released permit runs the next job";
  EXPECT_EQ(state(slow), job_state::running) << "still unresolved: no evidence yet";
  EXPECT_EQ(faulty_->calls(op::fail), 0);
  ASSERT_TRUE(eventually([&] { return state(slow) == job_state::retryable; }));
  EXPECT_EQ(faulty_->forwarded(op::reconcile), 1) << "the sixth read answered";
  EXPECT_EQ(plain.load(), 1);
  rt->stop();
}

TEST_F(runtime_unit, a_caller_owned_attempt_cancelled_while_waiting_for_a_slot_never_runs_its_handler) {
  const auto first = enqueue("charge");
  auto c = config();
  c.max_caller_owned = 1;  // the second attempt waits for the first's slot
  auto rt = make(c);
  std::mutex mu;
  std::condition_variable cv;
  bool release_first = false;
  std::atomic<int> runs_of_second{0};
  std::atomic<bool> first_running{false};
  std::atomic<std::int64_t> second{0};  // enqueued once the first holds the slot
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    if (ctx.job_id() == second.load()) {
      ++runs_of_second;
      return make_error_code(errc::database_unavailable);
    }
    first_running = true;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release_first; });
    return make_error_code(errc::database_unavailable);
  });
  ASSERT_TRUE(rt->start());
  // The first holds the only slot before the second exists, so the second is the one waiting.
  ASSERT_TRUE(eventually([&] { return first_running.load(); }));
  second = enqueue("charge");
  ASSERT_TRUE(eventually([&] { return rt->metrics().in_flight == 2; }));
  ASSERT_TRUE(inner_->cancel_job(second.load()).value());
  rt->heartbeat_now();  // finds the second attempt gone and cancels it
  {
    std::lock_guard lock(mu);
    release_first = true;
  }
  cv.notify_all();
  ASSERT_TRUE(eventually([&] { return rt->wait_idle(10ms); }));
  EXPECT_EQ(runs_of_second.load(), 0) << "a cancelled attempt never starts its handler";
  EXPECT_EQ(state(second.load()), job_state::cancelled);
  EXPECT_EQ(rt->metrics().stale_rejected, 1u);
  EXPECT_NE(state(first), job_state::running) << "the first attempt was settled by the policy";
  rt->stop();
}


TEST_F(runtime_unit, a_parked_handler_frees_its_permit_and_a_resume_continues_the_same_attempt_on_any_runtime) {
  auto c = config();
  c.queues = {{.name = "default", .max_concurrency = 1}};
  const auto parked = enqueue("approval");
  std::mutex mu;
  std::string callback;
  std::vector<std::string> calls;  // "<run_lease>/<attempt>/<payload or ->"
  std::atomic<int> others{0};
  const auto handler = [&](job_context& ctx) {
    const auto payload = ctx.resumed_with();
    {
      std::lock_guard lock(mu);
      calls.push_back(std::to_string(ctx.run_lease()) + "/" + std::to_string(ctx.attempt()) + "/" +
                      (payload ? payload->dump() : "-"));
    }
    if (payload) return job_outcome::completed(*payload);
    auto cb = ctx.register_callback(1h);
    if (!cb) return job_outcome::fail("register: " + cb.error().message());
    std::lock_guard lock(mu);
    callback = cb.value();
    return job_outcome::park(cb.value());
  };
  auto first = make(c);
  first->handle("approval", handler);
  first->handle("other", [&](job_context&) {
    ++others;
    return job_outcome::completed();
  });
  ASSERT_TRUE(first->start());
  ASSERT_TRUE(eventually([&] { return state(parked) == job_state::waiting_external; }));
  // One permit, and the parked attempt does not hold it.
  const auto o1 = enqueue("other");
  const auto o2 = enqueue("other");
  ASSERT_TRUE(eventually([&] { return state(o1) == job_state::completed && state(o2) == job_state::completed; }))
      << "a parked attempt must not keep its queue's permit";
  first->stop();
  first.reset();
  // Another runtime continues it once resumed.
  std::string cb;
  {
    std::lock_guard lock(mu);
    cb = callback;
  }
  ASSERT_TRUE(inner_->resume_callback(cb, R"({"ok": true})").value());
  auto second = make(c);
  second->handle("approval", handler);
  ASSERT_TRUE(second->start());
  ASSERT_TRUE(eventually([&] { return state(parked) == job_state::completed; }));
  second->stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], "1/1/-");
  EXPECT_EQ(calls[1], R"(2/1/{"ok":true})") << "the continuation: a new run lease, the same attempt";
  EXPECT_EQ(inner_->read_job(parked).value().run_lease, 2);
}

}  // namespace
}  // namespace tenure
