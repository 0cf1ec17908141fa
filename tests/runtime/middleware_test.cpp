// Handler middleware (runtime::use) and job metadata seen by handlers, against the SQLite fake
// with the runtime on the test's manual clock: order, what middleware sees before and after,
// and what happens when a middleware misbehaves.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "support/eventually.hpp"
#include "tenure/clock.hpp"
#include "tenure/runtime.hpp"

#include "sqlite_runtime_fixture.hpp"
#include "support/log_watch.hpp"

namespace tenure::middleware_tests {  // named: the file may share a unity build with others
namespace {

using namespace std::chrono_literals;

using test::eventually;

using test::watching_log;

/// A record of what happened, in order, from any thread.
struct journal {
  std::mutex mu;
  std::vector<std::string> lines;
  void add(std::string line) {
    std::lock_guard lock(mu);
    lines.push_back(std::move(line));
  }
  std::vector<std::string> all() {
    std::lock_guard lock(mu);
    return lines;
  }
};

class middleware_unit : public test::sqlite_runtime_fixture {
 protected:
  /// The runtime reads the test's manual clock: durations are what the handler advances.
  runtime_config config() {
    auto c = sqlite_runtime_fixture::config();
    c.clock = std::shared_ptr<const clock_port>(std::shared_ptr<void>{}, &clock_);  // not owned
    return c;
  }
  std::int64_t enqueue_with(std::string kind, nlohmann::json metadata) {
    auto id = inner_->enqueue({.kind = std::move(kind), .metadata = std::move(metadata)});
    if (!id) throw std::runtime_error(id.error().message());
    return id.value();
  }
  job_info read(std::int64_t id) { return inner_->read_job(id).value(); }
  /// Starts `rt`, waits until `n` attempts were claimed and nothing is in flight, stops it.
  void run_until_idle(runtime& rt, std::uint64_t n) {
    ASSERT_TRUE(rt.start());
    ASSERT_TRUE(eventually([&] { return rt.metrics().claimed >= n && rt.wait_idle(10ms); }));
    rt.stop();
  }
};

TEST_F(middleware_unit, middleware_runs_in_registration_order_around_the_handler_with_the_job_context) {
  const auto id = enqueue_with("k", {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}});
  auto rt = make(config());
  journal j;
  for (const std::string name : {"outer", "inner"}) {
    rt->use([&j, name](job_context& ctx, attempt_next& next) {
      j.add(name + " before: job " + std::to_string(ctx.job_id()) + " " + ctx.kind() + " " + ctx.queue() +
            " attempt " + std::to_string(ctx.attempt()) + " lease " + std::to_string(ctx.run_lease()) + " " +
            ctx.metadata().value("traceparent", "-"));
      const auto& r = next();
      j.add(name + " after: " + std::string{to_string(r.outcome)});
    });
  }
  rt->handle("k", [&](job_context& ctx) {
    j.add("handler sees " + ctx.metadata().dump());
    return job_outcome::completed();
  });
  run_until_idle(*rt, 1);
  const std::string ctx = "job " + std::to_string(id) +
                          " k default attempt 1 lease 1 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  EXPECT_EQ(j.all(), (std::vector<std::string>{
                         "outer before: " + ctx,
                         "inner before: " + ctx,
                         R"(handler sees {"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})",
                         "inner after: completed",
                         "outer after: completed",
                     }));
  EXPECT_EQ(state(id), job_state::completed);
}

TEST_F(middleware_unit, middleware_sees_each_outcome_with_its_message_and_the_handler_duration_on_the_runtime_clock) {
  struct expected {
    std::string kind;
    attempt_outcome outcome;
    std::string message;
    std::chrono::milliseconds took;
    job_state state;
  };
  const std::vector<expected> cases = {
      {"complete", attempt_outcome::completed, "", 10ms, job_state::completed},
      {"retry", attempt_outcome::retry, "try later", 20ms, job_state::retryable},
      {"fail", attempt_outcome::failed, "bad input", 30ms, job_state::failed},
      {"cancel", attempt_outcome::cancelled, "not wanted", 40ms, job_state::cancelled},
      {"snooze", attempt_outcome::snoozed, "", 50ms, job_state::scheduled},
      {"throw", attempt_outcome::retry, "handler threw: boom", 60ms, job_state::retryable},
  };
  std::vector<std::int64_t> ids;
  for (const auto& c : cases) ids.push_back(enqueue(c.kind));
  auto cfg = config();
  cfg.queues[0].max_concurrency = 1;  // one at a time: each handler's clock advance is its own
  auto rt = make(cfg);
  std::mutex mu;
  std::map<std::string, attempt_report> seen;
  rt->use([&](job_context& ctx, attempt_next& next) {
    const auto& r = next();
    std::lock_guard lock(mu);
    seen[ctx.kind()] = r;
  });
  for (const auto& c : cases) {
    rt->handle(c.kind, [this, c](job_context&) {
      clock_.advance(c.took);
      switch (c.outcome) {
        case attempt_outcome::completed: return job_outcome::completed();
        case attempt_outcome::failed: return job_outcome::fail(c.message);
        case attempt_outcome::cancelled: return job_outcome::cancel(c.message);
        case attempt_outcome::snoozed: return job_outcome::snooze(1h);
        default:
          if (c.kind == "throw") throw std::runtime_error("boom");
          return job_outcome::retry(c.message);
      }
    });
  }
  run_until_idle(*rt, cases.size());
  ASSERT_EQ(seen.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(c.kind);
    const auto& r = seen.at(c.kind);
    EXPECT_EQ(r.outcome, c.outcome);
    EXPECT_EQ(r.message, c.message);
    EXPECT_EQ(r.duration, std::chrono::nanoseconds{c.took});
    EXPECT_EQ(state(ids[i]), c.state);
  }
}

/// What a tracing middleware sets for the handler's thread (at namespace scope: GCC mishandles a
/// function-local thread_local used from a lambda).
thread_local std::string current_trace;

TEST_F(middleware_unit, a_thread_local_set_by_middleware_around_next_is_seen_by_the_handler) {
  enqueue_with("k", {{"traceparent", "00-aa-bb-01"}});
  auto rt = make(config());
  rt->use([](job_context& ctx, attempt_next& next) {
    current_trace = ctx.metadata().value("traceparent", "");
    next();
    current_trace.clear();
  });
  std::string handler_saw;
  rt->handle("k", [&](job_context&) {
    handler_saw = current_trace;
    return job_outcome::completed();
  });
  run_until_idle(*rt, 1);
  EXPECT_EQ(handler_saw, "00-aa-bb-01");
}

TEST_F(middleware_unit, a_middleware_that_throws_before_next_retries_the_attempt_logged_without_running_the_handler) {
  const auto id = enqueue("k");
  const auto other = enqueue("other");
  auto rt = make(config());
  rt->use([](job_context& ctx, attempt_next& next) {
    if (ctx.kind() == "k") throw std::runtime_error("tracer not ready");
    next();
  });
  std::atomic<int> runs{0};
  rt->handle("k", [&](job_context&) {
    ++runs;
    return job_outcome::completed();
  });
  rt->handle("other", [](job_context&) { return job_outcome::completed(); });
  watching_log logged{"middleware 1 threw: tracer not ready (job"};  // the error line
  run_until_idle(*rt, 2);
  EXPECT_EQ(runs.load(), 0);
  EXPECT_EQ(state(id), job_state::retryable);
  EXPECT_EQ(read(id).last_error, "middleware 1 threw: tracer not ready");
  EXPECT_EQ(logged.hits(), 1);
  EXPECT_EQ(state(other), job_state::completed) << "the runtime goes on";
}

TEST_F(middleware_unit, a_middleware_that_throws_after_a_completed_handler_turns_the_attempt_into_a_retry) {
  const auto id = enqueue("k");
  auto rt = make(config());
  rt->use([](job_context&, attempt_next& next) {
    next();
    throw 7;  // not even a std::exception
  });
  std::atomic<int> runs{0};
  rt->handle("k", [&](job_context&) {
    ++runs;
    return job_outcome::completed();
  });
  watching_log logged{"middleware 1 threw a non-standard exception (job"};  // the error line
  run_until_idle(*rt, 1);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(state(id), job_state::retryable) << "the handler's completion is discarded, not silently kept";
  EXPECT_EQ(read(id).last_error, "middleware 1 threw a non-standard exception");
  EXPECT_EQ(logged.hits(), 1);
  EXPECT_EQ(rt->metrics().retried, 1u);
}

TEST_F(middleware_unit, a_middleware_that_skips_next_retries_the_attempt_and_the_outer_one_sees_that_retry) {
  const auto id = enqueue("k");
  auto rt = make(config());
  attempt_report outer_saw;
  rt->use([&](job_context&, attempt_next& next) { outer_saw = next(); });
  rt->use([](job_context&, attempt_next&) {});  // swallows the handler
  std::atomic<int> runs{0};
  rt->handle("k", [&](job_context&) {
    ++runs;
    return job_outcome::completed();
  });
  run_until_idle(*rt, 1);
  EXPECT_EQ(runs.load(), 0);
  EXPECT_EQ(outer_saw.outcome, attempt_outcome::retry);
  EXPECT_EQ(outer_saw.message, "middleware 2 returned without calling next(): the handler did not run");
  EXPECT_EQ(outer_saw.duration, std::chrono::nanoseconds{0});
  EXPECT_EQ(state(id), job_state::retryable);
  EXPECT_EQ(read(id).last_error, outer_saw.message);
}

TEST_F(middleware_unit, next_called_twice_runs_the_handler_once_and_returns_the_same_report) {
  const auto id = enqueue("k");
  auto rt = make(config());
  std::vector<attempt_outcome> reports;
  rt->use([&](job_context&, attempt_next& next) {
    reports.push_back(next().outcome);
    reports.push_back(next().outcome);
  });
  std::atomic<int> runs{0};
  rt->handle("k", [&](job_context&) {
    ++runs;
    return job_outcome::fail("no");
  });
  run_until_idle(*rt, 1);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(reports, (std::vector<attempt_outcome>{attempt_outcome::failed, attempt_outcome::failed}));
  EXPECT_EQ(state(id), job_state::failed);
}

TEST_F(middleware_unit, a_caller_owned_handler_is_wrapped_and_reported_as_caller_owned_with_its_error) {
  const auto id = enqueue_with("charge", {{"tenant", "acme"}});
  auto rt = make(config());
  attempt_report saw;
  std::string tenant;
  rt->use([&](job_context& ctx, attempt_next& next) {
    tenant = ctx.metadata().value("tenant", "");
    saw = next();
  });
  rt->handle_caller_owned("charge", [](caller_owned_context& ctx) -> result<finalization_receipt> {
    ctx.note_failure("provider unreachable");
    return make_error_code(errc::database_unavailable);
  });
  run_until_idle(*rt, 1);
  EXPECT_EQ(tenant, "acme");
  EXPECT_EQ(saw.outcome, attempt_outcome::caller_owned);
  EXPECT_EQ(saw.message, "provider unreachable");
  EXPECT_EQ(state(id), job_state::retryable) << "the evidence showed the attempt open: the policy retried it";
}

TEST_F(middleware_unit, use_after_start_is_ignored) {
  const auto id = enqueue("k");
  auto rt = make(config());
  rt->handle("k", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  std::atomic<int> calls{0};
  watching_log logged{"use() after start() is ignored"};
  rt->use([&](job_context&, attempt_next& next) {
    ++calls;
    next();
  });
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 1; }));
  rt->stop();
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(logged.hits(), 1);
  EXPECT_EQ(state(id), job_state::completed);
}

TEST_F(middleware_unit, a_job_without_metadata_shows_an_empty_object_to_handlers) {
  enqueue("k");
  auto rt = make(config());
  nlohmann::json saw = nullptr;
  rt->handle("k", [&](job_context& ctx) {
    saw = ctx.metadata();
    return job_outcome::completed();
  });
  run_until_idle(*rt, 1);
  EXPECT_EQ(saw, nlohmann::json::object());
}

}  // namespace
}  // namespace tenure::middleware_tests
