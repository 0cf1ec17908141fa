// Worker runtime behaviour against the real PostgreSQL: dispatch, wake-up, batching, heartbeats,
// rescue, cancellation, retries, hooks, metrics, graceful shutdown.
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <future>
#include <regex>

#include "runtime/runtime_fixture.hpp"
#include "support/fault_proxy.hpp"
#include "tenure/signal_port.hpp"

namespace tenure::test {
namespace {

/// GET `target` on 127.0.0.1:port: the status and the body (status 0 when nothing answered).
std::pair<int, std::string> http_get(std::uint16_t port, const std::string& target) {
  namespace beast = boost::beast;
  try {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket sock{io};
    sock.connect({boost::asio::ip::make_address("127.0.0.1"), port});
    beast::http::request<beast::http::empty_body> req{beast::http::verb::get, target, 11};
    req.set(beast::http::field::host, "localhost");
    beast::http::write(sock, req);
    beast::flat_buffer buf;
    beast::http::response<beast::http::string_body> res;
    beast::http::read(sock, buf, res);
    return {res.result_int(), res.body()};
  } catch (const std::exception&) {
    return {0, {}};
  }
}

/// Opens a gate once, at the latest when it goes out of scope (so that a failed assertion never
/// leaves a handler blocked, and stop() waiting for it).
class gate {
 public:
  void open() {
    if (!opened_.exchange(true)) promise_.set_value();
  }
  /// What a handler waits on (a copy: it outlives the gate).
  std::shared_future<void> opened() const { return opened_future_; }
  ~gate() { open(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_future_ = promise_.get_future().share();
  std::atomic<bool> opened_{false};
};

/// The value of the sample `series` (name and labels exactly as written) in Prometheus text.
std::optional<double> sample(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return std::nullopt;
  return std::stod(text.substr(at + 1 + series.size() + 1));
}

TEST_F(runtime_pg, drains_jobs_with_batched_claims_and_flushes) {
  enqueue_many(3000);
  auto rt = make();
  std::atomic<int> ran{0};
  rt->handle("noop", [&](job_context&) {
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == 3000; }));
  ASSERT_TRUE(rt->wait_idle(10s));
  const auto m = rt->metrics();
  EXPECT_EQ(ran.load(), 3000);
  EXPECT_EQ(m.completed, 3000u);
  EXPECT_EQ(m.stale_rejected, 0u);
  // Set-based batches, not a statement per job.
  EXPECT_LT(m.flushes, 3000u / 4) << "flushes=" << m.flushes;
  EXPECT_LT(m.claims, 3000u / 4) << "claims=" << m.claims;
  EXPECT_EQ(m.flushed_items, 3000u);
  EXPECT_EQ(m.in_flight, 0);
  rt->stop();
}

TEST_F(runtime_pg, args_valid_in_jsonb_but_not_readable_here_fail_the_job_at_once_with_the_reason) {
  // jsonb holds 1e1000 exactly; no double does. The handler used to get {} and fail for a
  // misleading reason, attempt after attempt, up to max_attempts.
  const auto plain = enqueue("plain", R"({"n": 1e1000})");
  const auto owned = enqueue("owned", R"({"big": [1, -1e999]})");
  const auto fine = enqueue("plain", R"({"n": 1})");
  auto rt = make();
  std::atomic<int> plain_runs{0}, owned_runs{0};
  rt->handle("plain", [&](job_context& ctx) {
    if (ctx.args().value("n", 0) != 1) ++plain_runs;
    return ctx.args().contains("n") ? job_outcome::completed() : job_outcome::retry("args have no n");
  });
  rt->handle_caller_owned("owned", [&](caller_owned_context&) -> result<finalization_receipt> {
    ++owned_runs;
    return make_error_code(errc::invalid_argument);
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state IN ('failed', 'completed')") == 3; }))
      << db_.exec("SELECT string_agg(id || ':' || state || ':' || coalesce(last_error, ''), ' | ') FROM " + s("jobs"))
             .at(0, 0);
  rt->stop();
  EXPECT_EQ(plain_runs.load(), 0) << "the handler never saw args it could not be given";
  EXPECT_EQ(owned_runs.load(), 0);
  for (const auto& id : {plain, owned}) {
    EXPECT_EQ(state_of(id), "failed") << id;
    EXPECT_EQ(db_.scalar("SELECT attempt FROM " + s("jobs") + " WHERE id = $1", {id}), "1") << "never retried";
    const auto error = db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {id});
    EXPECT_NE(error.find("args cannot be read by this process (number overflow parsing"), std::string::npos) << error;
    EXPECT_NE(error.find("failed without running its handler"), std::string::npos) << error;
  }
  EXPECT_EQ(state_of(fine), "completed");
}

TEST_F(runtime_pg, idle_worker_wakes_on_notify_without_waiting_for_the_poll) {
  auto cfg = fast_config();
  cfg.poll_interval = 30s;  // if the job is picked up quickly, NOTIFY did it
  auto rt = make(cfg);
  std::atomic<bool> ran{false};
  rt->handle("ping", [&](job_context&) {
    ran = true;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  // The worker registers itself as waiting after its empty claims settle into the long poll.
  ASSERT_TRUE(eventually([&] { return db_.scalar("SELECT count(*) FROM " + s("waiters")) == "1"; }));
  std::this_thread::sleep_for(400ms);  // let the short idle polls back off past a second
  const auto t0 = std::chrono::steady_clock::now();
  enqueue("ping");
  ASSERT_TRUE(eventually([&] { return ran.load(); }, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  rt->stop();
}

TEST_F(runtime_pg, enqueue_pays_for_notify_only_while_a_worker_waits) {
  // No worker waiting: enqueue sends no NOTIFY at all.
  pg listener{schema_.dsn()};
  listener.exec("LISTEN " + schema_.name() + "_wake");
  for (int i = 0; i < 5; ++i) enqueue("k");
  listener.query("SELECT 1");
  EXPECT_EQ(PQnotifies(listener.native()), nullptr);
  // A worker waiting on the queue: the next enqueue wakes it.
  db_.exec("SELECT " + s("worker_idle") + "('default', 'w1')");
  enqueue("k");
  listener.query("SELECT 1");
  PGnotify* n = PQnotifies(listener.native());
  ASSERT_NE(n, nullptr);
  EXPECT_STREQ(n->extra, "default");
  PQfreemem(n);
}

TEST_F(runtime_pg, polls_when_listen_is_unavailable) {
  auto store = open_store();
  auto cfg = fast_config();
  cfg.poll_interval = 50ms;
  // A signal port that can never connect: the runtime must fall back to polling.
  auto broken = postgres::make_signal_port("postgresql://postgres@127.0.0.1:1/none", schema_.name());
  auto rt = runtime::create(cfg, store, broken);
  ASSERT_TRUE(rt) << rt.error().message();
  std::atomic<int> ran{0};
  rt.value()->handle("k", [&](job_context&) {
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt.value()->start());
  std::this_thread::sleep_for(100ms);
  enqueue("k");
  enqueue("k");
  ASSERT_TRUE(eventually([&] { return ran.load() == 2; }, 10s));
  EXPECT_TRUE(eventually([&] { return count("state = 'completed'") == 2; }));
  rt.value()->stop();
}

TEST_F(runtime_pg, heartbeat_is_one_statement_for_every_attempt_and_flushes_progress) {
  enqueue_many(5, "slow");
  auto cfg = fast_config();
  cfg.heartbeat_interval = 60s;  // driven by hand below
  auto rt = make(cfg);
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  rt->handle("slow", [&](job_context& ctx) {
    ctx.set_progress(50, "halfway", {{"step", ctx.job_id()}});
    ++started;
    while (!release.load()) std::this_thread::sleep_for(1ms);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load() == 5; }));
  const auto before = rt->metrics().heartbeats;
  rt->heartbeat_now();
  EXPECT_EQ(rt->metrics().heartbeats, before + 1);
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("attempt_state") + " WHERE heartbeat_at > now() - interval '1 minute'"),
            "5");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE progress->>'message' = 'halfway' AND "
                       "(progress->>'percent')::int = 50"),
            "5");
  release = true;
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == 5; }));
  rt->stop();
}

TEST_F(runtime_pg, rescued_attempt_gets_its_cancel_flag_and_its_late_completion_is_stale) {
  const auto id = enqueue("stuck");
  // Worker A: heartbeats far apart, no maintenance: its attempt goes stale.
  auto a_cfg = fast_config();
  a_cfg.heartbeat_interval = 60s;
  a_cfg.maintenance = false;
  auto a = make(a_cfg);
  std::atomic<bool> a_started{false}, a_saw_cancel{false};
  std::atomic<std::int64_t> first_lease{0};
  std::vector<job_event> a_events;
  std::mutex mu;
  a->on_event([&](const job_event& e) {
    std::lock_guard lock(mu);
    a_events.push_back(e);
  });
  a->handle("stuck", [&](job_context& ctx) {
    if (ctx.attempt() > 1) return job_outcome::completed();  // the re-run after rescue
    first_lease = ctx.run_lease();
    a_started = true;
    a_saw_cancel = ctx.wait_cancelled(30s);
    return job_outcome::completed();  // arrives late: must be discarded as stale
  });
  ASSERT_TRUE(a->start());
  ASSERT_TRUE(eventually([&] { return a_started.load(); }));
  // Worker B: the maintenance leader with a short staleness, and no handler for "stuck"'s queue.
  auto b_cfg = fast_config();
  b_cfg.queues = {{.name = "elsewhere", .max_concurrency = 1}};
  b_cfg.heartbeat_interval = 50ms;
  b_cfg.staleness = 150ms;
  auto b = make(b_cfg);
  b->handle("other", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(b->start());
  ASSERT_TRUE(eventually([&] { return a_saw_cancel.load(); }, 10s)) << "the rescue reached A's handler";
  ASSERT_TRUE(eventually([&] { return a->metrics().stale_rejected == 1; }));
  EXPECT_GE(b->metrics().rescued, 1u);
  b->stop();
  // The rescued job ran again under a new run lease (in A, the only runtime with its handler,
  // possibly before A's stale result came back) and completed that time.
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }));
  EXPECT_EQ(db_.scalar("SELECT attempt FROM " + s("jobs") + " WHERE id = $1", {id}), "2");
  EXPECT_GT(std::stoll(db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {id})), first_lease.load());
  ASSERT_TRUE(eventually([&] { return a->metrics().completed == 1; })) << "the re-run, and only the re-run";
  a->stop();
  EXPECT_EQ(a->metrics().completed, 1u);
  std::lock_guard lock(mu);
  for (const auto& e : a_events) {
    if (e.event == lifecycle_event::completed) {
      EXPECT_GT(e.attempt.run_lease, first_lease.load()) << "no hook for a stale result";
    }
  }
}

TEST_F(runtime_pg, admin_cancel_reaches_the_running_handler_within_a_second) {
  const auto id = enqueue("long");
  auto rt = make();
  std::atomic<bool> started{false};
  std::atomic<long long> cancel_seen_ms{-1};
  rt->handle("long", [&](job_context& ctx) {
    started = true;
    const auto t0 = std::chrono::steady_clock::now();
    if (ctx.wait_cancelled(30s)) {
      cancel_seen_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    }
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {id}), "t");
  ASSERT_TRUE(eventually([&] { return cancel_seen_ms.load() >= 0; }, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  ASSERT_TRUE(eventually([&] { return rt->metrics().stale_rejected == 1; }));
  EXPECT_EQ(state_of(id), "cancelled");
  rt->stop();
}

TEST_F(runtime_pg, retries_run_exactly_max_attempts_then_fail_and_snooze_spends_none) {
  auto store = open_store();
  ASSERT_TRUE(store->configure_queue("default", {.backoff_base = 1ms, .backoff_cap = 5ms}));
  ASSERT_TRUE(store->configure_queue("dlq", {.dead_letter = true, .backoff_base = 1ms, .backoff_cap = 5ms}));
  const auto flaky = enqueue("flaky", "{}", "default", 4);
  const auto doomed = enqueue("flaky", "{}", "dlq", 2);
  const auto sleepy = enqueue("sleepy", "{}", "default", 1);
  auto cfg = fast_config();
  cfg.queues = {{.name = "default", .max_concurrency = 2}, {.name = "dlq", .max_concurrency = 1}};
  cfg.poll_interval = 20ms;
  auto rt = make(cfg);
  std::mutex mu;
  std::map<std::int64_t, int> runs;
  rt->handle("flaky", [&](job_context& ctx) {
    std::lock_guard lock(mu);
    ++runs[ctx.job_id()];
    return job_outcome::retry("still broken");
  });
  rt->handle("sleepy", [&](job_context& ctx) {
    std::lock_guard lock(mu);
    if (++runs[ctx.job_id()] <= 2) return job_outcome::snooze(10ms);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state IN ('failed', 'completed')") == 3; }, 30s));
  rt->stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(runs[std::stoll(flaky)], 4) << "exactly max_attempts executions";
  EXPECT_EQ(runs[std::stoll(doomed)], 2);
  EXPECT_EQ(runs[std::stoll(sleepy)], 3) << "two snoozes and a run with max_attempts = 1";
  EXPECT_EQ(state_of(flaky), "failed");
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {flaky}), "still broken");
  EXPECT_EQ(db_.scalar("SELECT dead_lettered FROM " + s("jobs") + " WHERE id = $1", {doomed}), "t");
  EXPECT_EQ(state_of(sleepy), "completed");
  EXPECT_EQ(rt->metrics().retried, 3u + 1u);
  EXPECT_EQ(rt->metrics().failed, 2u);
  EXPECT_EQ(rt->metrics().snoozed, 2u);
}

TEST_F(runtime_pg, a_thrown_exception_is_a_retryable_failure_with_its_message) {
  const auto id = enqueue("boom", "{}", "default", 1);
  auto rt = make();
  rt->handle("boom", [](job_context&) -> job_outcome { throw std::runtime_error("disk on fire"); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "failed"; }));
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {id}), "handler threw: disk on fire");
  rt->stop();
}

TEST_F(runtime_pg, text_postgres_cannot_store_is_repaired_at_the_boundary_not_refused_on_every_retry) {
  // PostgreSQL refuses NUL in jsonb (22P05) and invalid UTF-8 in text (22021): such a value used
  // to be refused on every retry, holding its job (and every completion batched behind it)
  // running for good. It is stored with U+FFFD in place of each offending byte instead.
  const auto progress_job = enqueue("nul");
  const auto thrower = enqueue("bad-bytes", "{}", "default", 1);
  std::vector<std::string> others;
  for (int i = 0; i < 5; ++i) others.push_back(enqueue("ok"));
  auto rt = make();
  const std::string bad{"a\0b\xff", 4};
  std::atomic<bool> flushed{false};
  rt->handle("nul", [&](job_context& ctx) {
    ctx.set_progress(10, bad);
    auto f = ctx.flush_progress();
    flushed = f && f.value();
    return job_outcome::completed(nlohmann::json{{"note", bad}});
  });
  // (what() is a C string: it ends at a NUL, so only the invalid byte reaches the runtime.)
  rt->handle("bad-bytes", [&](job_context&) -> job_outcome { throw std::runtime_error("a\xff b"); });
  rt->handle("ok", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(progress_job) == "completed"; }));
  ASSERT_TRUE(eventually([&] { return state_of(thrower) == "failed"; }));
  for (const auto& id : others) ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }));
  EXPECT_TRUE(flushed.load()) << "the mid-run progress was stored";
  const std::string fixed = "a\xEF\xBF\xBD" "b\xEF\xBF\xBD";
  EXPECT_EQ(db_.scalar("SELECT progress->>'note' FROM " + s("jobs") + " WHERE id = $1", {progress_job}), fixed);
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {thrower}),
            "handler threw: a\xEF\xBF\xBD b");
  EXPECT_EQ(rt->metrics().database_errors, 0u) << "nothing was refused";
  rt->stop();
}

TEST_F(runtime_pg, typed_handler_gets_args_and_bad_args_fail_permanently) {
  struct charge {
    int order = 0;
    std::string currency;
  };
  const auto good = enqueue("charge", R"({"order": 7, "currency": "EUR"})");
  const auto bad = enqueue("charge", R"({"order": "seven"})");
  auto rt = make();
  std::atomic<int> seen_order{0};
  rt->handle<nlohmann::json>("charge", [&](const nlohmann::json& args, job_context&) {
    const charge c{args.at("order").get<int>(), args.at("currency").get<std::string>()};
    seen_order = c.order;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(good) == "completed"; }));
  EXPECT_EQ(seen_order.load(), 7);
  ASSERT_TRUE(eventually([&] { return state_of(bad) != "running" && state_of(bad) != "available"; }));
  rt->stop();
}

TEST_F(runtime_pg, lifecycle_hooks_fire_after_durable_transitions) {
  const auto id = enqueue("ok");
  auto rt = make();
  std::mutex mu;
  std::vector<std::pair<lifecycle_event, std::string>> seen;
  rt->on_event([&](const job_event& e) {
    // By the time the hook runs, the transition is visible to any other connection.
    pg other{schema_.dsn()};
    std::lock_guard lock(mu);
    seen.emplace_back(e.event, other.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1",
                                            {std::to_string(e.attempt.job_id)}));
  });
  rt->handle("ok", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return seen.size() == 2;
  }));
  rt->stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(seen[0].first, lifecycle_event::started);
  EXPECT_EQ(seen[0].second, "running");
  EXPECT_EQ(seen[1].first, lifecycle_event::completed);
  EXPECT_EQ(seen[1].second, "completed");
  (void)id;
}

TEST_F(runtime_pg, graceful_shutdown_flushes_every_returned_completion) {
  enqueue_many(40, "work");
  auto cfg = fast_config();
  cfg.flush_delay = 10s;           // only size or shutdown can trigger the flush
  cfg.completion_batch = 10'000;
  cfg.queues = {{.name = "default", .max_concurrency = 40}};
  auto rt = make(cfg);
  std::atomic<int> returned{0};
  rt->handle("work", [&](job_context&) {
    std::this_thread::sleep_for(50ms);
    ++returned;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return returned.load() >= 10; }));
  rt->stop();
  EXPECT_EQ(returned.load(), 40) << "handlers finish within the shutdown timeout";
  EXPECT_EQ(count("state = 'completed'"), 40) << "every returned completion is durable after stop()";
}

TEST_F(runtime_pg, shutdown_timeout_leaves_unfinished_attempts_open_for_rescue) {
  const auto id = enqueue("stubborn");
  auto cfg = fast_config();
  cfg.shutdown_timeout = 200ms;
  auto rt = make(cfg);
  std::atomic<bool> started{false}, cancelled{false};
  rt->handle("stubborn", [&](job_context& ctx) {
    started = true;
    cancelled = ctx.wait_cancelled(10s);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  rt->stop();
  EXPECT_TRUE(cancelled.load()) << "past the timeout the handler is told to stop";
  EXPECT_EQ(state_of(id), "running") << "nothing invented: the attempt stays open";
  EXPECT_EQ(db_.scalar("SELECT " + s("rescue_stale") + "('0 seconds')"), "1");
  EXPECT_EQ(state_of(id), "available");
}

TEST_F(runtime_pg, metrics_are_served_in_prometheus_text) {
  enqueue_many(3, "m");
  auto cfg = fast_config();
  cfg.metrics_port = 0;
  auto rt = make(cfg);
  rt->handle("m", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return rt->metrics().completed == 3; }));
  ASSERT_TRUE(rt->metrics_port());
  namespace beast = boost::beast;
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket sock{io};
  sock.connect({boost::asio::ip::make_address("127.0.0.1"), *rt->metrics_port()});
  beast::http::request<beast::http::empty_body> req{beast::http::verb::get, "/metrics", 11};
  req.set(beast::http::field::host, "localhost");
  beast::http::write(sock, req);
  beast::flat_buffer buf;
  beast::http::response<beast::http::string_body> res;
  beast::http::read(sock, buf, res);
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_NE(res.body().find("tenure_completed_total{queue=\"default\"} 3"), std::string::npos) << res.body();
  EXPECT_NE(res.body().find("# TYPE tenure_in_flight gauge"), std::string::npos);
  EXPECT_NE(res.body().find("tenure_pending_completions 0"), std::string::npos) << "all three were flushed";
  rt->stop();
}

TEST_F(runtime_pg, per_queue_metrics_after_a_drain_label_each_queue_with_its_own_counts_and_histograms) {
  enqueue_many(30, "ok", "billing");
  enqueue_many(12, "ok", "mail");
  enqueue_many(4, "bad", "mail");
  auto cfg = fast_config();
  cfg.queues = {{.name = "billing", .max_concurrency = 4}, {.name = "mail", .max_concurrency = 4}};
  cfg.metrics_port = 0;
  auto rt = make(cfg);
  rt->handle("ok", [](job_context&) { return job_outcome::completed(); });
  rt->handle("bad", [](job_context&) { return job_outcome::fail("refused"); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == 42 && count("state = 'failed'") == 4; }));
  ASSERT_TRUE(rt->wait_idle(10s));
  const auto m = rt->metrics();
  EXPECT_EQ(m.completed, 42u);
  EXPECT_EQ(m.failed, 4u);
  const auto* billing = m.queue("billing");
  const auto* mail = m.queue("mail");
  ASSERT_NE(billing, nullptr);
  ASSERT_NE(mail, nullptr);
  EXPECT_EQ(billing->completed, 30u);
  EXPECT_EQ(billing->failed, 0u);
  EXPECT_EQ(billing->claimed, 30u);
  EXPECT_EQ(mail->completed, 12u);
  EXPECT_EQ(mail->failed, 4u);
  EXPECT_EQ(mail->claimed, 16u);
  EXPECT_EQ(billing->pickup_latency.count, 30u);
  EXPECT_EQ(mail->pickup_latency.count, 16u);
  EXPECT_EQ(billing->run_duration[static_cast<std::size_t>(run_outcome::completed)].count, 30u);
  EXPECT_EQ(mail->run_duration[static_cast<std::size_t>(run_outcome::completed)].count, 12u);
  EXPECT_EQ(mail->run_duration[static_cast<std::size_t>(run_outcome::failed)].count, 4u);

  const auto [status, text] = http_get(*rt->metrics_port(), "/metrics");
  ASSERT_EQ(status, 200);
  EXPECT_EQ(sample(text, R"(tenure_completed_total{queue="billing"})"), 30);
  EXPECT_EQ(sample(text, R"(tenure_completed_total{queue="mail"})"), 12);
  EXPECT_EQ(sample(text, R"(tenure_failed_total{queue="mail"})"), 4);
  EXPECT_EQ(sample(text, R"(tenure_failed_total{queue="billing"})"), 0);
  EXPECT_EQ(sample(text, R"(tenure_pickup_latency_seconds_count{queue="billing"})"), 30);
  EXPECT_EQ(sample(text, R"(tenure_run_duration_seconds_count{queue="billing",outcome="completed"})"), 30);
  EXPECT_EQ(sample(text, R"(tenure_run_duration_seconds_count{queue="mail",outcome="failed"})"), 4);
  // The buckets of each series are cumulative and end at _count (le="+Inf").
  for (const std::string series : {R"(tenure_run_duration_seconds_bucket{queue="billing",outcome="completed",le=")",
                                   R"(tenure_pickup_latency_seconds_bucket{queue="mail",le=")"}) {
    std::vector<double> counts;
    for (std::size_t at = 0; (at = text.find("\n" + series, at)) != std::string::npos; ++at) {
      const auto value = text.find("} ", at);
      counts.push_back(std::stod(text.substr(value + 2)));
    }
    ASSERT_EQ(counts.size(), 19u) << series << "\n" << text;
    EXPECT_TRUE(std::is_sorted(counts.begin(), counts.end())) << series;
    EXPECT_EQ(counts.back(), series.find("billing") != std::string::npos ? 30 : 16) << series;
  }
  EXPECT_NE(text.find("# TYPE tenure_run_duration_seconds histogram"), std::string::npos);
  rt->stop();
}

TEST_F(runtime_pg, the_leader_vacuums_the_claim_path_after_a_drain_leaves_enough_dead_rows) {
  // Autovacuum stays off the claim path's tables here: an autovacuum could clean the drain's dead
  // rows first (or hold the table while the leader's VACUUM skips it).
  for (const std::string table : {"ready", "open_claims"}) {
    db_.exec("ALTER TABLE " + s(table) + " SET (autovacuum_enabled = false)");
  }
  enqueue_many(1'500, "x");
  auto cfg = fast_config();
  cfg.claim_batch = 500;
  cfg.reclaim_dead_rows = 1'000;
  auto rt = make(cfg);
  rt->handle("x", [](job_context&) { return job_outcome::completed(); });
  const auto vacuums = [&](const std::string& table) {
    return std::stol(db_.scalar("SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
                                {schema_.name(), table}));
  };
  ASSERT_EQ(vacuums("ready"), 0);
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == 1'500; }));
  // The drain's backends report their dead rows within a few seconds; the next pass vacuums.
  // (1,500 dead rows in ready; open_claims holds one row per claim of 500, below the threshold.)
  ASSERT_TRUE(eventually([&] { return rt->metrics().reclaims >= 1; }, 30s)) << rt->metrics().reclaims;
  EXPECT_GE(vacuums("ready"), 1);
  EXPECT_EQ(count("state = 'completed'"), 1'500) << "reclaiming changed no job";
  rt->stop();
}

TEST_F(runtime_pg, queue_depth_gauges_match_the_database) {
  enqueue_many(5, "x", "elsewhere");  // a queue nobody here serves
  db_.exec("SELECT " + s("enqueue") + "('x', '{}', 'elsewhere', 2, now() + interval '1 hour', 25) FROM generate_series(1, 2)");
  enqueue("hold");
  enqueue("later");
  auto cfg = fast_config();
  auto rt = make(cfg);
  gate release;
  std::atomic<bool> holding{false};
  rt->handle("hold", [&holding, opened = release.opened()](job_context&) {
    holding = true;
    opened.wait();
    return job_outcome::completed();
  });
  rt->handle("later", [](job_context&) { return job_outcome::retry_after(std::chrono::hours{1}, "not yet"); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return holding.load() && count("state = 'retryable'") == 1; }));
  auto db_count = [&](const std::string& queue, const std::string& state) {
    return count("queue = '" + queue + "' AND state = '" + state + "'");
  };
  // The leader counts on its next pass.
  ASSERT_TRUE(eventually([&] {
    const auto m = rt->metrics();
    const auto* q = m.queue("default");
    return q && q->depth_known && q->retryable == 1 && q->running == 1;
  }));
  const auto m = rt->metrics();
  for (const std::string name : {"default", "elsewhere"}) {
    const auto* q = m.queue(name);
    ASSERT_NE(q, nullptr) << name;
    ASSERT_TRUE(q->depth_known) << name;
    EXPECT_EQ(q->available, db_count(name, "available")) << name;
    EXPECT_EQ(q->scheduled, db_count(name, "scheduled")) << name;
    EXPECT_EQ(q->retryable, db_count(name, "retryable")) << name;
    EXPECT_EQ(q->running, db_count(name, "running")) << name;
    EXPECT_EQ(q->waiting_external, db_count(name, "waiting_external")) << name;
  }
  EXPECT_EQ(m.queue("elsewhere")->available, 5);
  EXPECT_EQ(m.queue("elsewhere")->scheduled, 2);
  const double age = std::stod(db_.scalar("SELECT extract(epoch from clock_timestamp() - min(created_at)) FROM " +
                                          s("jobs") + " WHERE queue = 'elsewhere' AND state = 'available'"));
  EXPECT_GT(m.queue("elsewhere")->oldest_available_seconds, 0);
  EXPECT_LE(m.queue("elsewhere")->oldest_available_seconds, age + 1);
  const auto text = rt->prometheus_text();
  EXPECT_EQ(sample(text, R"(tenure_queue_depth{queue="elsewhere",state="available"})"), 5);
  EXPECT_EQ(sample(text, R"(tenure_queue_depth{queue="default",state="running"})"), 1);
  release.open();
  rt->stop();
}

TEST_F(runtime_pg, healthz_turns_503_once_the_database_stops_answering_past_the_limit_and_200_when_it_answers) {
  fault_proxy proxy{schema_.dsn()};
  auto cfg = fast_config();
  cfg.metrics_port = 0;
  cfg.unhealthy_after = 1s;
  auto made = postgres::make_runtime({.dsn = proxy.dsn(schema_.dsn()), .schema = schema_.name(), .runtime = cfg});
  ASSERT_TRUE(made) << made.error().message();
  auto rt = std::move(made).value();
  rt->handle("noop", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(rt->start());
  const auto port = *rt->metrics_port();
  EXPECT_EQ(http_get(port, "/healthz").first, 200);
  // The database goes away: every connection is cut and new ones are refused.
  proxy.refuse(true);
  proxy.kill_everything();
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return http_get(port, "/healthz").first == 503; }, 15s));
  EXPECT_GE(std::chrono::steady_clock::now() - cut, 900ms) << "unhealthy before the limit passed";
  const auto [status, body] = http_get(port, "/healthz");
  EXPECT_EQ(status, 503);
  EXPECT_NE(body.find("the database has not answered"), std::string::npos) << body;
  EXPECT_FALSE(rt->health().ok);
  proxy.refuse(false);
  ASSERT_TRUE(eventually([&] { return http_get(port, "/healthz").first == 200; }, 15s)) << "healthy again";
  rt->stop();
}

TEST_F(runtime_pg, readyz_is_503_while_starting_and_stopping_and_200_while_running) {
  enqueue("hold");
  auto cfg = fast_config();
  cfg.metrics_port = 0;
  auto rt = make(cfg);
  gate release;
  std::atomic<bool> holding{false};
  rt->handle("hold", [&holding, opened = release.opened()](job_context&) {
    holding = true;
    opened.wait();
    return job_outcome::completed();
  });
  EXPECT_FALSE(rt->readiness().ok);
  EXPECT_EQ(rt->readiness().reason, "not ready: starting");
  ASSERT_TRUE(rt->start());
  const auto port = *rt->metrics_port();
  EXPECT_EQ(http_get(port, "/readyz").first, 200);
  ASSERT_TRUE(eventually([&] { return holding.load(); }));
  auto stopping = std::async(std::launch::async, [&] { rt->stop(); });
  struct open_on_exit {
    gate& g;
    ~open_on_exit() { g.open(); }
  } opener{release};  // destroyed before `stopping` waits for stop()
  // stop() drains the held handler: the runtime is not ready meanwhile, while still serving.
  ASSERT_TRUE(eventually([&] { return http_get(port, "/readyz").first == 503; }, 10s));
  EXPECT_NE(http_get(port, "/readyz").second.find("not ready: stopping"), std::string::npos);
  EXPECT_EQ(http_get(port, "/healthz").first, 200) << "stopping is not unhealthy";
  release.open();
  EXPECT_EQ(stopping.wait_for(10s), std::future_status::ready);
}

TEST_F(runtime_pg, queue_hard_deadline_from_the_config_rescues_a_long_attempt) {
  const auto id = enqueue("endless", "{}", "default", 1);
  auto cfg = fast_config();
  cfg.queues = {{.name = "default", .max_concurrency = 2, .hard_deadline = 300ms}};
  auto rt = make(cfg);
  std::atomic<bool> cancelled{false};
  rt->handle("endless", [&](job_context& ctx) {
    cancelled = ctx.wait_cancelled(20s);  // heartbeats keep it fresh; only the deadline can stop it
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return cancelled.load(); }, 10s));
  ASSERT_TRUE(eventually([&] { return state_of(id) == "failed"; }));
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {id}), "rescued: hard deadline passed");
  EXPECT_GE(rt->metrics().rescued, 1u);
  rt->stop();
}

TEST_F(runtime_pg, create_refuses_staleness_below_twice_the_heartbeat) {
  auto cfg = fast_config();
  cfg.heartbeat_interval = 1s;
  cfg.staleness = 1500ms;
  auto r = postgres::make_runtime({.dsn = schema_.dsn(), .schema = schema_.name(), .runtime = cfg});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_NE(r.error().message().find("staleness"), std::string::npos) << r.error().message();
}

TEST_F(runtime_pg, create_refuses_a_maintenance_lease_below_twice_the_interval_or_above_an_hour) {
  for (const auto lease : {std::chrono::milliseconds{150}, std::chrono::milliseconds{std::chrono::hours{2}}}) {
    auto cfg = fast_config();  // maintenance_interval 100 ms
    cfg.maintenance_lease = lease;
    auto r = postgres::make_runtime({.dsn = schema_.dsn(), .schema = schema_.name(), .runtime = cfg});
    ASSERT_FALSE(r) << lease.count();
    EXPECT_EQ(r.error(), errc::invalid_argument);
    EXPECT_NE(r.error().message().find("maintenance_lease"), std::string::npos) << r.error().message();
  }
  auto cfg = fast_config();
  cfg.maintenance_lease = 200ms;
  auto r = postgres::make_runtime({.dsn = schema_.dsn(), .schema = schema_.name(), .runtime = cfg});
  EXPECT_TRUE(r) << "twice the interval is enough";
}

TEST_F(runtime_pg, metadata_from_the_store_and_the_sql_functions_reaches_handlers_and_middleware) {
  const nlohmann::json m{{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
  auto store = open_store();
  std::map<std::string, std::string> path_of;  // job id -> how it was enqueued
  path_of[std::to_string(store->enqueue({.kind = "k", .metadata = m}).value())] = "store enqueue";
  const std::vector<new_job> batch{{.kind = "k", .metadata = m}};
  path_of[std::to_string(store->enqueue_batch(batch).value().at(0))] = "store enqueue_batch";
  path_of[db_.scalar("SELECT " + s("enqueue") + "('k', metadata => $1::jsonb)", {m.dump()})] = "sql enqueue";
  path_of[db_.scalar("SELECT job_id FROM " + s("enqueue_batch") +
                         "(ARRAY['k'], ARRAY['{}']::jsonb[], ARRAY['default'], ARRAY[2], metadatas => ARRAY[$1]::jsonb[])",
                     {m.dump()})] = "sql enqueue_batch";
  path_of[std::to_string(store->enqueue({.kind = "k"}).value())] = "none";
  auto rt = make();
  std::mutex mu;
  std::map<std::string, nlohmann::json> handler_saw, middleware_saw;
  rt->use([&](job_context& ctx, attempt_next& next) {
    {
      std::lock_guard lock(mu);
      middleware_saw[std::to_string(ctx.job_id())] = ctx.metadata();
    }
    next();
  });
  rt->handle("k", [&](job_context& ctx) {
    std::lock_guard lock(mu);
    handler_saw[std::to_string(ctx.job_id())] = ctx.metadata();
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == 5; }));
  rt->stop();
  ASSERT_EQ(handler_saw.size(), 5u);
  for (const auto& [id, path] : path_of) {
    const auto want = path == "none" ? nlohmann::json::object() : m;
    EXPECT_EQ(handler_saw[id], want) << path;
    EXPECT_EQ(middleware_saw[id], want) << path;
    EXPECT_EQ(nlohmann::json::parse(store->read_job(std::stoll(id)).value().metadata), want) << path << ", completed";
  }
}

}  // namespace
}  // namespace tenure::test
