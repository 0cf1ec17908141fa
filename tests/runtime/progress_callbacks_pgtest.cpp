// Long attempts through the runtime against the real PostgreSQL: progress buffered by
// the handler, forced guarded flushes, progress kept across a retry as a checkpoint, and external
// callbacks (register, wait, resume, cancel while waiting, callback timeout).
#include <atomic>
#include <mutex>

#include "runtime/runtime_fixture.hpp"

namespace tenure::test {
namespace {

TEST_F(runtime_pg, flush_progress_applies_now_and_materializes_the_lease_keeping_the_run_lease) {
  const auto id = enqueue("long");
  auto cfg = fast_config();
  cfg.heartbeat_interval = 60s;  // only the forced flush may write
  auto rt = make(cfg);
  std::atomic<bool> flushed{false}, release{false};
  std::atomic<int> flush_answer{-1};
  std::atomic<std::int64_t> lease{0};
  rt->handle("long", [&](job_context& ctx) {
    lease = ctx.run_lease();
    ctx.set_progress(40, "copying", {{"offset", 4000}});
    auto r = ctx.flush_progress();
    flush_answer = r ? (r.value() ? 1 : 0) : 2;
    flushed = true;
    while (!release.load()) std::this_thread::sleep_for(1ms);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return flushed.load(); }));
  EXPECT_EQ(flush_answer.load(), 1);
  // The lease row exists now, for the same (job_id, run_lease) the claim gave.
  const auto claimed = std::to_string(lease.load());
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("attempt_state") + " WHERE job_id = $1 AND run_lease = $2",
                       {id, claimed}),
            "1");
  EXPECT_EQ(db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {id}), claimed);
  EXPECT_EQ(db_.scalar("SELECT progress->>'message' || ':' || (progress->>'percent') || ':' || "
                       "(progress->'metadata'->>'offset') FROM " + s("jobs") + " WHERE id = $1",
                       {id}),
            "copying:40:4000");
  EXPECT_EQ(db_.scalar("SELECT heartbeat_at IS NOT NULL FROM " + s("jobs") + " WHERE id = $1", {id}), "t");
  release = true;
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }));
  // The last progress stays with the finished job.
  EXPECT_EQ(db_.scalar("SELECT progress->>'message' FROM " + s("jobs") + " WHERE id = $1", {id}), "copying");
  rt->stop();
}

TEST_F(runtime_pg, flush_progress_reports_stale_after_an_admin_cancel_and_cancels_the_context) {
  const auto id = enqueue("long");
  auto cfg = fast_config();
  cfg.heartbeat_interval = 60s;
  auto rt = make(cfg);
  std::atomic<bool> started{false}, go{false}, done{false};
  std::atomic<int> flush_answer{-1};
  std::atomic<bool> cancelled_after{false};
  rt->handle("long", [&](job_context& ctx) {
    started = true;
    while (!go.load()) std::this_thread::sleep_for(1ms);
    ctx.set_progress(90, "late");
    auto r = ctx.flush_progress();
    flush_answer = r ? (r.value() ? 1 : 0) : 2;
    cancelled_after = ctx.is_cancelled();
    done = true;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  // Close the attempt behind the handler's back without the NOTIFY reaching it first: cancel it
  // in SQL, then let the handler flush.
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {id}), "t");
  go = true;
  ASSERT_TRUE(eventually([&] { return done.load(); }));
  EXPECT_EQ(flush_answer.load(), 0) << "a stale flush answers false, not an error and not true";
  EXPECT_TRUE(cancelled_after.load());
  // The stale progress was not applied to the cancelled job.
  EXPECT_EQ(db_.scalar("SELECT coalesce(progress->>'message', '<none>') FROM " + s("jobs") + " WHERE id = $1", {id}),
            "<none>");
  EXPECT_EQ(state_of(id), "cancelled");
  rt->stop();
}

TEST_F(runtime_pg, progress_survives_a_retry_and_the_next_attempt_resumes_from_previous_progress) {
  auto store = open_store();
  ASSERT_TRUE(store->configure_queue("default", {.backoff_base = 1ms, .backoff_cap = 5ms}));
  const auto id = enqueue("resumable", "{}", "default", 3);
  auto rt = make();
  std::mutex mu;
  std::vector<std::string> seen;  // previous_progress as each attempt saw it
  rt->handle("resumable", [&](job_context& ctx) {
    auto prev = ctx.previous_progress();
    if (!prev) return job_outcome::fail("previous_progress failed: " + prev.error().message());
    {
      std::lock_guard lock(mu);
      seen.push_back(prev.value() ? prev.value()->dump() : "none");
    }
    const int from = prev.value() ? prev.value()->at("metadata").at("next").get<int>() : 0;
    // Each attempt does one step, checkpoints, and fails until step 2 is reached.
    ctx.set_progress((from + 1) * 33, "step " + std::to_string(from + 1), {{"next", from + 1}});
    auto f = ctx.flush_progress();
    if (!f || !f.value()) return job_outcome::fail("flush failed");
    // Flushing this attempt's progress does not change what previous_progress reports.
    auto again = ctx.previous_progress();
    if (!again || again.value() != prev.value()) return job_outcome::fail("previous_progress changed");
    if (from + 1 < 3) return job_outcome::retry("not yet");
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }));
  rt->stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], "none");
  EXPECT_EQ(nlohmann::json::parse(seen[1]).at("metadata").at("next"), 1);
  EXPECT_EQ(nlohmann::json::parse(seen[2]).at("metadata").at("next"), 2);
  EXPECT_EQ(nlohmann::json::parse(seen[2]).at("message"), "step 2");
  EXPECT_EQ(db_.scalar("SELECT (progress->'metadata'->>'next') || '/' || attempt FROM " + s("jobs") +
                           " WHERE id = $1",
                       {id}),
            "3/3");
}

TEST_F(runtime_pg, rescue_keeps_the_heartbeated_progress_for_the_next_attempt) {
  const auto id = enqueue("stuck");
  // Worker A: heartbeats (and flushes) once by hand, then goes silent; no maintenance.
  auto a_cfg = fast_config();
  a_cfg.heartbeat_interval = 60s;
  a_cfg.maintenance = false;
  auto a = make(a_cfg);
  std::atomic<bool> a_flushed{false};
  std::atomic<bool> resumed_ok{false};
  a->handle("stuck", [&](job_context& ctx) {
    if (ctx.attempt() == 1) {
      ctx.set_progress(70, "before the crash", {{"next", 7}});
      auto f = ctx.flush_progress();
      a_flushed = f && f.value();
      ctx.wait_cancelled(30s);
      return job_outcome::completed();  // stale by then
    }
    auto prev = ctx.previous_progress();
    resumed_ok = prev && prev.value() && prev.value()->at("metadata").at("next") == 7;
    return job_outcome::completed();
  });
  ASSERT_TRUE(a->start());
  ASSERT_TRUE(eventually([&] { return a_flushed.load(); }));
  // Rescue reads freshness from the lease row: A flushed just now, so a generous staleness
  // rescues nothing yet ...
  EXPECT_EQ(db_.scalar("SELECT " + s("rescue_stale") + "('1 hour')"), "0");
  // ... and a tiny one rescues it.
  ASSERT_TRUE(eventually([&] { return db_.scalar("SELECT " + s("rescue_stale") + "('50 milliseconds')") == "1"; }, 5s));
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }));
  EXPECT_TRUE(resumed_ok.load());
  EXPECT_EQ(db_.scalar("SELECT attempt FROM " + s("jobs") + " WHERE id = $1", {id}), "2");
  a->stop();
}

/// A handler that registers a callback, publishes the id and waits for it.
struct callback_probe {
  std::mutex mu;
  std::vector<std::string> ids;  ///< one per attempt, in order
  std::atomic<int> waits_returned{0};
  std::atomic<bool> last_stale{false};
  std::atomic<bool> cancelled_after_wait{false};
  std::string last_payload;
  std::string id(std::size_t i) {
    std::lock_guard lock(mu);
    return i < ids.size() ? ids[i] : std::string{};
  }
  /// ctx.register_callback(timeout), recording the id when it succeeds.
  result<std::string> register_in(job_context& ctx, std::chrono::milliseconds timeout) {
    auto cb = ctx.register_callback(timeout);
    if (cb) {
      std::lock_guard lock(mu);
      ids.push_back(cb.value());
    }
    return cb;
  }
};

TEST_F(runtime_pg, wait_for_callback_parks_holds_the_permit_and_returns_the_resume_payload) {
  const auto id = enqueue("external");
  auto rt = make([] {
    auto c = fast_config();
    c.queues = {{.name = "default", .max_concurrency = 1}};
    return c;
  }());
  callback_probe p;
  std::atomic<bool> other_ran{false};
  rt->handle("other", [&](job_context&) {
    other_ran = true;
    return job_outcome::completed();
  });
  std::atomic<std::int64_t> lease{0};
  rt->handle("external", [&](job_context& ctx) {
    lease = ctx.run_lease();
    auto cb = p.register_in(ctx, 60s);
    if (!cb) return job_outcome::fail("register: " + cb.error().message());
    auto payload = ctx.wait_for_callback(cb.value());
    ++p.waits_returned;
    if (!payload) return job_outcome::fail("wait: " + payload.error().message());
    {
      std::lock_guard lock(p.mu);
      p.last_payload = payload.value().dump();
    }
    return job_outcome::completed(nlohmann::json{{"approved_by", payload.value().at("by")}});
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "waiting_external"; }));
  const auto cb = p.id(0);
  ASSERT_EQ(cb.size(), 36u);
  // The waiting handler keeps its permit: with one permit, another job is not started.
  const auto other = enqueue("other");
  std::this_thread::sleep_for(600ms);  // several heartbeats, polls and maintenance passes
  EXPECT_FALSE(other_ran.load());
  EXPECT_EQ(state_of(id), "waiting_external") << "heartbeats and maintenance leave a waiting attempt alone";
  EXPECT_EQ(p.waits_returned.load(), 0);
  // Resume through the C++ client.
  auto store = open_store();
  auto resumed = store->resume_callback(cb, R"({"by": "alice"})");
  ASSERT_TRUE(resumed);
  EXPECT_TRUE(resumed.value());
  auto again = store->resume_callback(cb, "{}");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again.value()) << "already resolved";
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }, 10s));
  EXPECT_EQ(p.waits_returned.load(), 1);
  {
    std::lock_guard lock(p.mu);
    EXPECT_EQ(p.last_payload, R"({"by":"alice"})");
  }
  EXPECT_EQ(db_.scalar("SELECT run_lease || ':' || (progress->>'approved_by') FROM " + s("jobs") + " WHERE id = $1",
                       {id}),
            std::to_string(lease.load()) + ":alice")
      << "same run lease from claim to completion";
  ASSERT_TRUE(eventually([&] { return other_ran.load() && state_of(other) == "completed"; }));
  rt->stop();
}

TEST_F(runtime_pg, the_resume_notify_wakes_the_waiting_handler_before_its_next_poll) {
  const auto id = enqueue("external");
  auto rt = make();
  callback_probe p;
  rt->handle("external", [&](job_context& ctx) {
    auto cb = p.register_in(ctx, 60s);
    if (!cb) return job_outcome::fail("register");
    auto payload = ctx.wait_for_callback(cb.value());
    ++p.waits_returned;
    return payload ? job_outcome::completed() : job_outcome::fail("wait");
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "waiting_external"; }));
  std::this_thread::sleep_for(2500ms);  // the poll backoff is at its 1 s cap by now
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {p.id(0)}), "t");
  ASSERT_TRUE(eventually([&] { return p.waits_returned.load() == 1; }, 5s));
  // Polling alone would take up to 1 s here; the NOTIFY on <schema>_callback takes milliseconds.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 250ms);
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }));
  rt->stop();
}

TEST_F(runtime_pg, resume_before_the_handler_waits_returns_at_once) {
  const auto id = enqueue("external");
  auto rt = make();
  callback_probe p;
  std::atomic<bool> go_wait{false};
  rt->handle("external", [&](job_context& ctx) {
    auto cb = p.register_in(ctx, 60s);
    if (!cb) return job_outcome::fail("register");
    while (!go_wait.load()) std::this_thread::sleep_for(1ms);
    auto payload = ctx.wait_for_callback(cb.value());
    ++p.waits_returned;
    if (!payload) return job_outcome::fail("wait");
    return job_outcome::completed(payload.value());
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return !p.id(0).empty(); }));
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid, '{\"early\": true}')", {p.id(0)}), "t");
  EXPECT_EQ(state_of(id), "running");
  go_wait = true;
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }, 5s));
  EXPECT_EQ(db_.scalar("SELECT progress->>'early' FROM " + s("jobs") + " WHERE id = $1", {id}), "true");
  rt->stop();
}

TEST_F(runtime_pg, admin_cancel_while_waiting_wakes_the_handler_with_cancellation) {
  const auto id = enqueue("external");
  auto rt = make();
  callback_probe p;
  std::atomic<long long> woke_ms{-1};
  rt->handle("external", [&](job_context& ctx) {
    auto cb = p.register_in(ctx, 60s);
    if (!cb) return job_outcome::fail("register");
    auto payload = ctx.wait_for_callback(cb.value());
    p.last_stale = !payload && payload.error() == errc::stale_attempt;
    p.cancelled_after_wait = ctx.is_cancelled();
    ++p.waits_returned;
    return job_outcome::completed();  // stale: discarded
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "waiting_external"; }));
  std::this_thread::sleep_for(2500ms);  // the poll backoff is at its 1 s cap by now
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {id}), "t");
  ASSERT_TRUE(eventually([&] { return p.waits_returned.load() == 1; }, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  EXPECT_TRUE(p.last_stale.load());
  EXPECT_TRUE(p.cancelled_after_wait.load());
  ASSERT_TRUE(eventually([&] { return rt->metrics().stale_rejected == 1; }));
  EXPECT_EQ(state_of(id), "cancelled");
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {p.id(0)}), "f");
  rt->stop();
}

TEST_F(runtime_pg, callback_timeout_retries_while_attempts_remain_then_fails) {
  auto store = open_store();
  ASSERT_TRUE(store->configure_queue("default", {.backoff_base = 1ms, .backoff_cap = 5ms}));
  const auto id = enqueue("external", "{}", "default", 2);
  auto rt = make();
  callback_probe p;
  rt->handle("external", [&](job_context& ctx) {
    auto cb = p.register_in(ctx, 150ms);
    if (!cb) return job_outcome::fail("register");
    auto payload = ctx.wait_for_callback(cb.value());
    if (!payload && payload.error() == errc::stale_attempt) p.last_stale = true;
    ++p.waits_returned;
    return job_outcome::completed();  // stale after a timeout: discarded
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "failed"; }, 15s));
  ASSERT_TRUE(eventually([&] { return p.waits_returned.load() == 2; }));
  EXPECT_TRUE(p.last_stale.load());
  EXPECT_EQ(db_.scalar("SELECT attempt || ':' || last_error FROM " + s("jobs") + " WHERE id = $1", {id}),
            "2:rescued: callback timed out");
  {
    std::lock_guard lock(p.mu);
    ASSERT_EQ(p.ids.size(), 2u);
    EXPECT_NE(p.ids[0], p.ids[1]);
  }
  EXPECT_EQ(rt->metrics().completed, 0u);
  rt->stop();
}

TEST_F(runtime_pg, shutdown_timeout_gives_up_on_a_waiting_handler_and_leaves_the_attempt_parked) {
  const auto id = enqueue("external");
  auto cfg = fast_config();
  cfg.shutdown_timeout = 300ms;
  auto rt = make(cfg);
  callback_probe p;
  std::atomic<bool> shutting_down{false};
  rt->handle("external", [&](job_context& ctx) {
    auto cb = p.register_in(ctx, 60s);
    if (!cb) return job_outcome::fail("register");
    auto payload = ctx.wait_for_callback(cb.value());
    shutting_down = !payload && payload.error() == errc::shutting_down;
    ++p.waits_returned;
    return job_outcome::completed();  // a waiting attempt's own completion is refused
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "waiting_external"; }));
  rt->stop();
  ASSERT_TRUE(eventually([&] { return p.waits_returned.load() == 1; }, 5s));
  EXPECT_TRUE(shutting_down.load());
  EXPECT_EQ(state_of(id), "waiting_external") << "still parked, its callback still resumable";
  EXPECT_EQ(db_.scalar("SELECT " + s("complete_callback") + "($1::uuid)", {p.id(0)}), "t");
  EXPECT_EQ(state_of(id), "completed");
}

TEST_F(runtime_pg, extend_and_finish_a_waiting_attempt_from_the_cpp_client) {
  const auto id = enqueue("external");
  auto store = open_store();  // opened first: the window below must not include a pool connect
  auto rt = make();
  callback_probe p;
  rt->handle("external", [&](job_context& ctx) {
    auto cb = p.register_in(ctx, 1s);
    if (!cb) return job_outcome::fail("register");
    auto payload = ctx.wait_for_callback(cb.value());
    p.last_stale = !payload && payload.error() == errc::stale_attempt;
    ++p.waits_returned;
    return job_outcome::retry("should be discarded");
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "waiting_external"; }));
  auto extended = store->extend_callback(p.id(0), std::chrono::hours{1});
  ASSERT_TRUE(extended);
  EXPECT_TRUE(extended.value());
  std::this_thread::sleep_for(1300ms);  // past the original timeout, with maintenance running
  EXPECT_EQ(state_of(id), "waiting_external");
  auto done = store->complete_callback(p.id(0), R"({"from": "outside"})");
  ASSERT_TRUE(done);
  EXPECT_TRUE(done.value());
  ASSERT_TRUE(eventually([&] { return p.waits_returned.load() == 1; }, 5s));
  EXPECT_TRUE(p.last_stale.load()) << "the handler learns its attempt was finished elsewhere";
  EXPECT_EQ(state_of(id), "completed");
  EXPECT_EQ(db_.scalar("SELECT progress->>'from' FROM " + s("jobs") + " WHERE id = $1", {id}), "outside");
  auto unknown = store->fail_callback("not-a-uuid", "x", false);
  ASSERT_TRUE(unknown);
  EXPECT_FALSE(unknown.value());
  rt->stop();
}

}  // namespace
}  // namespace tenure::test
