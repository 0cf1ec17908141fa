// Notifications are hints. Any role that can connect may NOTIFY tenure's channels (NOTIFY needs
// no privilege), so a role with no tenure grant floods them here: cancel, wake and callback
// notifications for running attempts, random ids and malformed payloads. No handler is
// cancelled unless the database says its attempt is no longer live, and the flood costs a
// bounded number of statements.
#include <atomic>
#include <future>

#include "tenure/testing/faulty_store.hpp"
#include "runtime/runtime_fixture.hpp"

namespace tenure::test {
namespace {

using steady = std::chrono::steady_clock;

/// A login role with no tenure grant at all, dropped at the end.
class outsider_role {
 public:
  explicit outsider_role(pg& admin) : admin_(admin), name_("hint_outsider_" + random_suffix()) {
    admin_.exec("CREATE ROLE " + name_ + " LOGIN");
  }
  ~outsider_role() {
    admin_.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + name_ + "'");
    admin_.query("DROP ROLE IF EXISTS " + name_);
  }
  const std::string& name() const { return name_; }

 private:
  pg& admin_;
  std::string name_;
};

/// Runs `round(conn)` over and over on a connection of its own until stopped; counts rounds.
class flood {
 public:
  template <class Round>
  flood(std::string dsn, Round round)
      : thread_([this, dsn = std::move(dsn), round = std::move(round)] {
          try {
            pg conn{dsn};
            while (!stop_.load()) {
              round(conn);
              rounds_.fetch_add(1);
            }
          } catch (const std::exception& e) {
            ADD_FAILURE() << "flood: " << e.what();
          }
        }) {}
  ~flood() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  long rounds() const { return rounds_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<long> rounds_{0};
  std::thread thread_;
};

class notification_hints_pg : public runtime_pg {
 protected:
  outsider_role outsider_{db_};
  std::string outsider_dsn() const { return dsn_with_user(schema_.dsn(), outsider_.name()); }
  std::string channel(const std::string& what) const { return schema_.name() + "_" + what; }

  /// A long heartbeat, so that only a notification can cancel a handler promptly.
  static runtime_config slow_heartbeat_config() {
    auto c = fast_config();
    c.heartbeat_interval = 3s;
    return c;
  }

  /// One round of an outsider's cancel flood: every (id, lease) in [first, last] x [1, 3], random
  /// ids, and payloads that do not parse.
  std::function<void(pg&)> cancel_round(long first, long last) const {
    return [ch = channel("cancel"), first, last](pg& c) {
      // query(), never exec(): nothing may throw on the flood's thread.
      // Every (job, lease) the first claims can have opened: a lease is claim id * 65536 + place.
      c.query("SELECT count(pg_notify($1, j || ':' || ((k << 16) + p))) FROM generate_series($2::bigint, $3::bigint) j, "
              "generate_series(1, 4) k, generate_series(1, 8) p",
              {ch, std::to_string(first), std::to_string(last)});
      c.query("SELECT count(pg_notify($1, (random() * 1e9)::bigint || ':' || (1 + (random() * 5)::int))) "
             "FROM generate_series(1, 50)",
             {ch});
      c.query("SELECT count(pg_notify($1, p)) FROM unnest(ARRAY['', 'x', '1:', ':1', '1:2:3', '-1:1', '0:0', "
             "'99999999999999999999999:1', ' 1:1', '1:1 ', '1;1', repeat('9', 7000)]) p",
             {ch});
      std::this_thread::sleep_for(5ms);
    };
  }
};

TEST_F(notification_hints_pg, a_cancel_flood_from_a_role_without_grants_cancels_no_handler_and_fails_no_job) {
  std::atomic<int> cancelled_handlers{0};
  auto rt = make(slow_heartbeat_config());
  rt->handle("work", [&](job_context& ctx) {
    if (ctx.wait_cancelled(1500ms)) {
      ++cancelled_handlers;
      return job_outcome::retry("cancelled");  // what a handler does when told it was cancelled
    }
    return job_outcome::completed();
  });
  std::vector<long> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(std::stol(enqueue("work", "{}", "default", /*max_attempts=*/2)));

  flood attack{outsider_dsn(), cancel_round(ids.front() - 5, ids.back() + 5)};
  ASSERT_TRUE(eventually([&] { return attack.rounds() > 0; }, 10s));
  ASSERT_TRUE(rt->start());
  EXPECT_TRUE(eventually([&] { return count("state IN ('completed', 'failed', 'cancelled')") == 8; }, 30s));
  attack.stop();
  rt->stop();

  EXPECT_EQ(cancelled_handlers.load(), 0) << "a notification cancelled a handler whose attempt was live";
  EXPECT_EQ(count("state = 'completed'"), 8);
  EXPECT_EQ(count("state = 'failed'"), 0);
  EXPECT_EQ(count("attempt > 1"), 0) << "an attempt was spent on a forged cancel";
  const auto m = rt->metrics();
  EXPECT_GT(m.cancel_checks, 0u) << "the hints for the running attempts were checked";
  // One check per 50 ms at most, whatever the flood's size (the run takes ~1.5 s).
  EXPECT_LT(m.cancel_checks, 80u) << "rounds of the flood: " << attack.rounds();
  EXPECT_GT(attack.rounds(), 20) << "the flood ran while the handlers did";
}

TEST_F(notification_hints_pg, an_admin_cancel_and_a_rescue_still_cancel_their_handlers_promptly_during_a_flood) {
  std::mutex mu;
  std::map<long, steady::time_point> cancelled_at;
  auto rt = make(slow_heartbeat_config());
  rt->handle("victim", [&](job_context& ctx) {
    if (ctx.attempt() > 1) return job_outcome::completed();  // the rescued job's next attempt
    if (ctx.wait_cancelled(30s)) {
      std::lock_guard lock(mu);
      cancelled_at[static_cast<long>(ctx.job_id())] = steady::now();
    }
    return job_outcome::completed();  // stale after the cancel: discarded
  });
  const long by_admin = std::stol(enqueue("victim"));
  flood attack{outsider_dsn(), cancel_round(by_admin - 5, by_admin + 20)};
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return state_of(std::to_string(by_admin)) == "running"; }));
  std::this_thread::sleep_for(300ms);  // the flood names the running attempt many times over
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(cancelled_at.empty()) << "the flood alone cancelled the handler";
  }

  // An admin cancel: a guarded transition, then the NOTIFY; the database says "not live".
  auto t0 = steady::now();
  ASSERT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {std::to_string(by_admin)}), "t");
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return cancelled_at.contains(by_admin);
  }, 10s));
  {
    std::lock_guard lock(mu);
    EXPECT_LT(cancelled_at[by_admin] - t0, 1s) << "the heartbeat (3 s) found it, not the notification";
  }
  EXPECT_EQ(state_of(std::to_string(by_admin)), "cancelled");

  // A rescue by another worker's maintenance: the same NOTIFY, the same check.
  const long rescued = std::stol(enqueue("victim"));
  ASSERT_TRUE(eventually([&] { return state_of(std::to_string(rescued)) == "running"; }));
  // rescue_stale skips an attempt whose receipt another transaction holds at that instant (SKIP
  // LOCKED, as in the leader's pass), so it is asked again until it has rescued this one.
  ASSERT_TRUE(eventually([&] {
    t0 = steady::now();
    return db_.scalar("SELECT " + s("rescue_stale") + "('0 seconds')") == "1";
  }, 10s)) << "the running attempt was never rescued";
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return cancelled_at.contains(rescued);
  }, 10s));
  {
    std::lock_guard lock(mu);
    EXPECT_LT(cancelled_at[rescued] - t0, 1s);
  }
  attack.stop();
  rt->stop();
}

TEST_F(notification_hints_pg, a_wake_flood_costs_a_bounded_number_of_claims_and_real_work_is_still_picked_up) {
  std::atomic<int> ran{0};
  auto rt = make();
  rt->handle("noop", [&](job_context&) {
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  std::this_thread::sleep_for(500ms);  // settle into the idle poll

  // Baseline: an idle worker for one second.
  const auto before = rt->metrics().claims;
  std::this_thread::sleep_for(1s);
  const auto idle_claims = rt->metrics().claims - before;

  // The same second under a flood: each wake-up in its own transaction (PostgreSQL folds equal
  // payloads of one transaction into one), plus wake-ups for queues this worker does not serve.
  std::atomic<long> sent{0};
  const auto flood_start = rt->metrics().claims;
  const auto t_flood = steady::now();
  {
    flood attack{outsider_dsn(), [&, ch = channel("wake")](pg& c) {
                   c.query("SELECT pg_notify($1, 'default')", {ch});
                   c.query("SELECT count(pg_notify($1, 'q' || g)) FROM generate_series(1, 5) g", {ch});
                   sent += 6;
                 }};
    std::this_thread::sleep_for(1s);
  }
  const auto flood_claims = rt->metrics().claims - flood_start;
  const auto flood_ms = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t_flood).count();
  EXPECT_GT(sent.load(), 1000) << "the flood was not a flood";
  // At most one wake-up claim per 20 ms on top of the idle polling (without the bound: one
  // claim per wake-up, as fast as the database answers).
  EXPECT_LE(flood_claims, idle_claims + flood_ms / 20 + 10)
      << "idle: " << idle_claims << ", wake-ups sent: " << sent.load() << " in " << flood_ms << " ms";

  // A real wake-up is still picked up at once.
  std::this_thread::sleep_for(500ms);
  const auto t0 = steady::now();
  enqueue("noop");
  ASSERT_TRUE(eventually([&] { return ran.load() == 1; }, 10s));
  EXPECT_LT(steady::now() - t0, 500ms);
  rt->stop();
}

TEST_F(notification_hints_pg, a_resume_flood_makes_a_waiting_handler_poll_a_bounded_number_of_times) {
  auto inner = open_store();
  auto store = std::make_shared<testing::faulty_store>(*inner);
  auto created = runtime::create(slow_heartbeat_config(), store,
                                 postgres::make_signal_port(schema_.dsn(), schema_.name(), "hints"));
  ASSERT_TRUE(created) << created.error().message();
  auto rt = std::move(created).value();
  std::promise<std::string> callback;
  std::atomic<bool> resumed{false};
  rt->handle("wait", [&](job_context& ctx) {
    auto id = ctx.register_callback(60s);
    if (!id) return job_outcome::retry("register: " + id.error().message());
    callback.set_value(id.value());
    auto payload = ctx.wait_for_callback(id.value());
    if (!payload) return job_outcome::retry("wait: " + payload.error().message());
    resumed = true;
    return job_outcome::completed();
  });
  const auto job = enqueue("wait");
  ASSERT_TRUE(rt->start());
  auto cb = callback.get_future();
  ASSERT_EQ(cb.wait_for(20s), std::future_status::ready);
  const auto id = cb.get();
  ASSERT_TRUE(eventually([&] { return state_of(job) == "waiting_external"; }));
  const auto lease = db_.scalar("SELECT run_lease FROM " + s("jobs") + " WHERE id = $1", {job});

  const auto polls_before = store->calls(testing::op::await_callback);
  const auto t_flood = steady::now();
  std::atomic<long> sent{0};
  {
    flood attack{outsider_dsn(), [&, ch = channel("callback"), payload = job + ":" + lease](pg& c) {
                   c.query("SELECT pg_notify($1, $2)", {ch, payload});
                   ++sent;
                 }};
    std::this_thread::sleep_for(1s);
  }
  const auto polls = store->calls(testing::op::await_callback) - polls_before;
  const auto flood_ms = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t_flood).count();
  EXPECT_GT(sent.load(), 500) << "the flood was not a flood";
  // One poll per 100 ms at most when poked (plus its own backoff polls).
  EXPECT_LE(polls, flood_ms / 100 + 5) << "resume notifications sent: " << sent.load() << " in " << flood_ms << " ms";
  EXPECT_EQ(state_of(job), "waiting_external") << "a forged resume changed nothing";
  EXPECT_FALSE(resumed.load());

  // The real resume still wakes it promptly.
  const auto t0 = steady::now();
  ASSERT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid, '{}'::jsonb)", {id}), "t");
  ASSERT_TRUE(eventually([&] { return resumed.load(); }, 10s));
  EXPECT_LT(steady::now() - t0, 1s);
  ASSERT_TRUE(eventually([&] { return state_of(job) == "completed"; }, 10s));
  rt->stop();
}

}  // namespace
}  // namespace tenure::test
