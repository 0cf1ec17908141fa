// Parked callbacks against the real PostgreSQL: a handler returns job_outcome::park after
// registering a callback; the attempt waits as waiting_external with no thread and no permit,
// and a resume continues it (the same job and attempt number, under a new run lease: the
// continuation is a claim) on any worker. Also the races of a parked attempt's resume with rescue, complete_callback, another
// resume and cancel, through the store (the storage port).
#include <atomic>
#include <barrier>
#include <mutex>

#include "runtime/runtime_fixture.hpp"

namespace tenure::test {
namespace {

/// What each call of a parking handler saw.
struct park_probe {
  std::mutex mu;
  std::vector<std::string> ids;        ///< callbacks registered, in order
  std::vector<std::string> calls;      ///< "<attempt>/<resumed_with or ->" per call
  std::vector<std::int64_t> leases;    ///< the run lease of each call
  std::vector<std::string> tokens;     ///< the token of each call
  std::string id(std::size_t i) {
    std::lock_guard lock(mu);
    return i < ids.size() ? ids[i] : std::string{};
  }
  std::size_t call_count() {
    std::lock_guard lock(mu);
    return calls.size();
  }
  /// The handler: parks on a fresh callback on a normal start; completes with the payload as its
  /// progress when continued.
  job_outcome run(job_context& ctx, std::chrono::milliseconds timeout) {
    auto resumed = ctx.resumed_with();
    {
      std::lock_guard lock(mu);
      calls.push_back(std::to_string(ctx.attempt()) + "/" + (resumed ? resumed->dump() : "-"));
      leases.push_back(ctx.run_lease());
      tokens.push_back(ctx.token().to_string());
    }
    if (resumed) return job_outcome::completed(*resumed);
    auto cb = ctx.register_callback(timeout);
    if (!cb) return job_outcome::fail("register: " + cb.error().message());
    {
      std::lock_guard lock(mu);
      ids.push_back(cb.value());
    }
    return job_outcome::park(cb.value());
  }
};

TEST_F(runtime_pg, a_parked_handler_frees_its_permit_and_a_resume_continues_the_same_attempt_with_the_payload) {
  const auto id = enqueue("external");
  auto c = fast_config();
  c.queues = {{.name = "default", .max_concurrency = 1}};
  auto rt = make(c);
  park_probe p;
  std::atomic<int> other_ran{0};
  std::atomic<int> parked_events{0};
  rt->on_event([&](const job_event& e) {
    if (e.event == lifecycle_event::parked) ++parked_events;
  });
  rt->handle("other", [&](job_context&) {
    ++other_ran;
    return job_outcome::completed();
  });
  rt->handle("external", [&](job_context& ctx) { return p.run(ctx, 60s); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "waiting_external"; }));
  // With one permit, other jobs run while the first one is parked.
  const auto o1 = enqueue("other");
  const auto o2 = enqueue("other");
  ASSERT_TRUE(eventually([&] { return state_of(o1) == "completed" && state_of(o2) == "completed"; }, 10s))
      << "a parked attempt must not hold its queue's permit";
  EXPECT_EQ(parked_events.load(), 1);
  // Nothing heartbeats a parked attempt, and maintenance leaves it alone.
  const auto hb = db_.scalar("SELECT heartbeat_at FROM " + s("attempt_state") + " WHERE job_id = $1", {id});
  std::this_thread::sleep_for(700ms);
  EXPECT_EQ(db_.scalar("SELECT heartbeat_at FROM " + s("attempt_state") + " WHERE job_id = $1", {id}), hb);
  EXPECT_EQ(state_of(id), "waiting_external");
  EXPECT_EQ(db_.scalar("SELECT no_handler FROM " + s("attempt_state") + " WHERE job_id = $1", {id}), "t");
  EXPECT_EQ(p.call_count(), 1u);

  auto store = open_store();
  auto resumed = store->resume_callback(p.id(0), R"({"by": "alice"})");
  ASSERT_TRUE(resumed);
  EXPECT_TRUE(resumed.value());
  auto again = store->resume_callback(p.id(0), "{}");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again.value()) << "a second resume of the same callback loses";
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }, 10s));
  {
    std::lock_guard lock(p.mu);
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0], "1/-");
    EXPECT_EQ(p.calls[1], R"(1/{"by":"alice"})") << "the same attempt, with the payload";
    EXPECT_GT(p.leases[1], p.leases[0]) << "the continuation runs under a new run lease";
    EXPECT_NE(p.tokens[0], p.tokens[1]) << "the continuation has a new attempt secret";
  }
  EXPECT_EQ(db_.scalar("SELECT run_lease || ':' || attempt || ':' || (progress->>'by') FROM " + s("jobs") +
                           " WHERE id = $1",
                       {id}),
            std::to_string(p.leases.at(1)) + ":1:alice");
  EXPECT_EQ(other_ran.load(), 2);
  rt->stop();
}

TEST_F(runtime_pg, complete_callback_and_fail_callback_finish_a_parked_attempt) {
  const auto done = enqueue("external");
  const auto failed = enqueue("external");
  auto rt = make();
  park_probe p;
  rt->handle("external", [&](job_context& ctx) { return p.run(ctx, 60s); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(done) == "waiting_external" && state_of(failed) == "waiting_external"; }));
  const auto cb_of = [&](const std::string& job) {
    return db_.scalar("SELECT callback_id FROM " + s("attempt_state") + " WHERE job_id = $1", {job});
  };
  const auto cb_done = cb_of(done), cb_failed = cb_of(failed);
  EXPECT_EQ(db_.scalar("SELECT " + s("complete_callback") + "($1::uuid, '{\"from\": \"outside\"}')", {cb_done}), "t");
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_callback") + "($1::uuid, 'refused', false)", {cb_failed}), "t");
  EXPECT_EQ(state_of(done), "completed");
  EXPECT_EQ(state_of(failed), "failed");
  EXPECT_EQ(db_.scalar("SELECT progress->>'from' FROM " + s("jobs") + " WHERE id = $1", {done}), "outside");
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {failed}), "refused");
  // Resolved: a resume now loses, and nothing runs the handler again.
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {cb_done}), "f");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(p.call_count(), 2u);
  rt->stop();
}

TEST_F(runtime_pg, callback_timeout_rescues_a_parked_attempt_as_a_waiting_one) {
  auto store = open_store();
  ASSERT_TRUE(store->configure_queue("default", {.backoff_base = 1ms, .backoff_cap = 5ms}));
  const auto id = enqueue("external", "{}", "default", 2);
  auto rt = make();
  park_probe p;
  rt->handle("external", [&](job_context& ctx) { return p.run(ctx, 150ms); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "failed"; }, 15s));
  EXPECT_EQ(db_.scalar("SELECT attempt || ':' || last_error FROM " + s("jobs") + " WHERE id = $1", {id}),
            "2:rescued: callback timed out");
  {
    std::lock_guard lock(p.mu);
    ASSERT_EQ(p.calls.size(), 2u) << "each attempt parked once, none was continued";
    EXPECT_EQ(p.calls[0], "1/-");
    EXPECT_EQ(p.calls[1], "2/-");
    EXPECT_GT(p.leases[1], p.leases[0]);
  }
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {p.id(1)}), "f");
  rt->stop();
}

TEST_F(runtime_pg, cancel_of_a_parked_attempt_closes_it_and_its_callback) {
  const auto id = enqueue("external");
  auto rt = make();
  park_probe p;
  rt->handle("external", [&](job_context& ctx) { return p.run(ctx, 60s); });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "waiting_external"; }));
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {id}), "t");
  EXPECT_EQ(state_of(id), "cancelled");
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {p.id(0)}), "f");
  EXPECT_EQ(db_.scalar("SELECT " + s("complete_callback") + "($1::uuid)", {p.id(0)}), "f");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(p.call_count(), 1u);
  EXPECT_EQ(state_of(id), "cancelled");
  rt->stop();
}

TEST_F(runtime_pg, a_resume_before_the_handler_parks_continues_the_attempt_at_once) {
  const auto id = enqueue("external");
  auto rt = make();
  std::mutex mu;
  std::string cb_id;
  std::vector<std::string> seen;
  std::atomic<bool> go{false};
  rt->handle("external", [&](job_context& ctx) {
    if (auto r = ctx.resumed_with()) {
      std::lock_guard lock(mu);
      seen.push_back(std::to_string(ctx.attempt()) + ":" + r->dump());
      return job_outcome::completed(*r);
    }
    auto cb = ctx.register_callback(60s);
    if (!cb) return job_outcome::fail("register");
    {
      std::lock_guard lock(mu);
      cb_id = cb.value();
    }
    while (!go.load()) std::this_thread::sleep_for(1ms);
    return job_outcome::park(cb.value());
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return !cb_id.empty();
  }));
  std::string cb;
  {
    std::lock_guard lock(mu);
    cb = cb_id;
  }
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid, '{\"early\": true}')", {cb}), "t");
  EXPECT_EQ(state_of(id), "running") << "not parked yet: the resume is kept for the handler";
  go = true;
  ASSERT_TRUE(eventually([&] { return state_of(id) == "completed"; }, 10s));
  std::lock_guard lock(mu);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], R"(1:{"early":true})");
}

TEST_F(runtime_pg, parking_on_a_callback_whose_resume_wait_for_callback_returned_is_retried_not_parked) {
  const auto id = enqueue("external", "{}", "default", 1);
  auto rt = make();
  rt->handle("external", [&](job_context& ctx) {
    auto cb = ctx.register_callback(60s);
    if (!cb) return job_outcome::fail("register");
    std::thread([this, id = cb.value()] {
      pg other{schema_.dsn()};
      other.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {id});
    }).join();
    auto payload = ctx.wait_for_callback(cb.value());
    if (!payload) return job_outcome::fail("wait");
    return job_outcome::park(cb.value());  // a handler bug: the payload was already delivered
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(id) == "failed"; }, 10s));
  EXPECT_NE(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {id}).find("already returned"),
            std::string::npos);
  rt->stop();
}

// ---- the races, through the storage port ----------------------------------------------------

/// Claims one job of "default" and parks it on a fresh callback with `timeout`.
struct parked_attempt {
  claimed_attempt claim;
  std::string callback;
};
parked_attempt park_one(postgres::store& st, std::chrono::microseconds timeout) {
  auto c = st.claim("default", 1, "racer");
  if (!c || c.value().size() != 1) throw std::runtime_error("claim");
  auto cb = st.register_callback(c.value()[0].attempt, timeout);
  if (!cb) throw std::runtime_error("register");
  auto parked = st.park_callback(c.value()[0].attempt, cb.value());
  if (!parked || parked.value() != park_result::parked) throw std::runtime_error("park");
  return {c.value()[0], cb.value()};
}

/// Runs `a` and `b` at once (as closely as two threads can), `rounds` times.
template <class A, class B>
void race(A&& a, B&& b) {
  std::barrier sync{2};
  std::thread t([&] {
    sync.arrive_and_wait();
    b();
  });
  sync.arrive_and_wait();
  a();
  t.join();
}

TEST_F(runtime_pg, a_resume_racing_the_callback_timeout_rescue_of_a_parked_attempt_has_one_winner) {
  auto st = open_store();
  constexpr int k_rounds = 12;
  int resumes_won = 0, rescues_won = 0;
  for (int i = 0; i < k_rounds; ++i) {
    const auto id = enqueue("external", "{}", "default", 5);
    auto p = park_one(*st, std::chrono::milliseconds{1});
    std::this_thread::sleep_for(5ms);  // the callback deadline has passed: both may act
    result<bool> resumed{false};
    result<std::vector<rescued_attempt>> rescued{std::vector<rescued_attempt>{}};
    race([&] { resumed = st->resume_callback(p.callback, R"({"n": 1})"); },
         [&] { rescued = st->rescue_stale(std::chrono::hours{1}); });
    ASSERT_TRUE(resumed);
    ASSERT_TRUE(rescued);
    const bool rescue_won = std::any_of(rescued.value().begin(), rescued.value().end(),
                                        [&](const rescued_attempt& r) { return r.attempt == p.claim.attempt; });
    ASSERT_NE(resumed.value(), rescue_won) << "exactly one of resume and rescue wins (round " << i << ")";
    resumes_won += resumed.value();
    rescues_won += rescue_won;
    // Either way the job is available once, and the next claim says which attempt it runs.
    ASSERT_EQ(state_of(id), "available");
    auto next = st->claim("default", 1, "racer");
    ASSERT_TRUE(next);
    ASSERT_EQ(next.value().size(), 1u);
    const auto& n = next.value()[0];
    if (resumed.value()) {
      EXPECT_EQ(n.attempt.job_id, p.claim.attempt.job_id);
      EXPECT_GT(n.attempt.run_lease, p.claim.attempt.run_lease) << "the continuation is a new run lease";
      EXPECT_EQ(n.attempt_number, p.claim.attempt_number);
      ASSERT_TRUE(n.resumed_with);
      EXPECT_EQ(nlohmann::json::parse(*n.resumed_with), nlohmann::json({{"n", 1}}));
    } else {
      EXPECT_GT(n.attempt.run_lease, p.claim.attempt.run_lease) << "a rescued attempt is retried as a new one";
      EXPECT_EQ(n.attempt_number, p.claim.attempt_number + 1);
      EXPECT_FALSE(n.resumed_with);
    }
    ASSERT_TRUE(st->complete(std::vector<completion>{{n.attempt, std::nullopt}}));
  }
  std::cout << "resume vs rescue: resume won " << resumes_won << ", rescue won " << rescues_won << "\n";
}

TEST_F(runtime_pg, a_resume_racing_complete_callback_or_another_resume_of_a_parked_attempt_has_one_winner) {
  auto st = open_store();
  for (int i = 0; i < 10; ++i) {
    const auto id = enqueue("external");
    auto p = park_one(*st, std::chrono::seconds{60});
    result<bool> a{false}, b{false};
    const bool with_complete = i % 2 == 0;
    race([&] { a = st->resume_callback(p.callback, R"({"who": "a"})"); },
         [&] {
           b = with_complete ? st->complete_callback(p.callback, std::nullopt)
                             : st->resume_callback(p.callback, R"({"who": "b"})");
         });
    ASSERT_TRUE(a);
    ASSERT_TRUE(b);
    ASSERT_NE(a.value(), b.value()) << "exactly one wins (round " << i << ")";
    if (with_complete && b.value()) {
      EXPECT_EQ(state_of(id), "completed");
      continue;
    }
    EXPECT_EQ(state_of(id), "available");
    EXPECT_EQ(count("id = " + id), 1);
    auto next = st->claim("default", 1, "racer");
    ASSERT_TRUE(next);
    ASSERT_EQ(next.value().size(), 1u);
    ASSERT_TRUE(next.value()[0].resumed_with);
    EXPECT_EQ(nlohmann::json::parse(*next.value()[0].resumed_with).at("who"), a.value() ? "a" : "b");
    ASSERT_TRUE(st->complete(std::vector<completion>{{next.value()[0].attempt, std::nullopt}}));
  }
}

TEST_F(runtime_pg, the_old_token_cannot_finalize_a_parked_attempt_nor_its_continuation) {
  auto st = open_store();
  const auto id = enqueue("external");
  auto p = park_one(*st, std::chrono::seconds{60});
  const auto old_token = p.claim.token().to_string();
  const auto complete_with = [&](const std::string& token) {
    return db_.query("SELECT * FROM " + s("complete_job") + "($1)", {token});
  };
  auto parked = complete_with(old_token);
  EXPECT_FALSE(parked.ok);
  EXPECT_EQ(parked.sqlstate, "TN001") << "a parked attempt is owned by its callback";
  ASSERT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {p.callback}), "t");
  auto next = st->claim("default", 1, "racer");
  ASSERT_TRUE(next);
  ASSERT_EQ(next.value().size(), 1u);
  ASSERT_EQ(next.value()[0].attempt.job_id, p.claim.attempt.job_id);
  ASSERT_GT(next.value()[0].attempt.run_lease, p.claim.attempt.run_lease);
  auto stale = complete_with(old_token);
  EXPECT_FALSE(stale.ok);
  EXPECT_EQ(stale.sqlstate, "TN001") << "the continuation's secret is new: the old token is refused";
  EXPECT_EQ(state_of(id), "running");
  auto fresh = complete_with(next.value()[0].token().to_string());
  EXPECT_TRUE(fresh.ok) << fresh.error;
  EXPECT_EQ(state_of(id), "completed");
}

TEST_F(runtime_pg, park_callback_is_guarded_by_the_attempt_and_its_current_callback) {
  auto st = open_store();
  enqueue("external");
  auto c = st->claim("default", 1, "w");
  ASSERT_TRUE(c);
  ASSERT_EQ(c.value().size(), 1u);
  const auto a = c.value()[0].attempt;
  auto first = st->register_callback(a, std::chrono::seconds{60});
  auto second = st->register_callback(a, std::chrono::seconds{60});
  ASSERT_TRUE(first && second);
  auto rotated = st->park_callback(a, first.value());
  ASSERT_FALSE(rotated);
  EXPECT_EQ(rotated.error(), errc::stale_attempt) << "a rotated callback cannot be parked on";
  auto other_lease = st->park_callback({a.job_id, a.run_lease + 1}, second.value());
  ASSERT_FALSE(other_lease);
  EXPECT_EQ(other_lease.error(), errc::stale_attempt);
  auto not_uuid = st->park_callback(a, "nope");
  ASSERT_FALSE(not_uuid);
  EXPECT_EQ(not_uuid.error(), errc::stale_attempt);
  auto parked = st->park_callback(a, second.value());
  ASSERT_TRUE(parked);
  EXPECT_EQ(parked.value(), park_result::parked);
  EXPECT_EQ(db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {std::to_string(a.job_id)}),
            "waiting_external");
}

}  // namespace
}  // namespace tenure::test
