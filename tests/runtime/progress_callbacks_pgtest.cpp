// Long attempts (issue 4) through the runtime against the real PostgreSQL: progress buffered by
// the handler, forced guarded flushes, and progress kept across a retry as a checkpoint.
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
  rt->handle("long", [&](job_context& ctx) {
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
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("attempt_state") + " WHERE job_id = $1 AND run_lease = 1", {id}),
            "1");
  EXPECT_EQ(db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {id}), "1");
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
    if (ctx.run_lease() == 1) {
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
  EXPECT_EQ(db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {id}), "2");
  a->stop();
}

}  // namespace
}  // namespace tenure::test
