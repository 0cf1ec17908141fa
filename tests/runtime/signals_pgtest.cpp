// The signal session (LISTEN/NOTIFY and the maintenance lease) when its server goes silent:
// the network path drops without a word, or a host accepts connections and never answers.
// Every wait is bounded, so leadership moves on and stop() returns. And leadership is a lease,
// not a session lock: a session that stays open (a paused process, a pooled server connection)
// does not keep it past its expiry.
#include <future>

#include "runtime/runtime_fixture.hpp"
#include "tenure/signal_port.hpp"
#include "support/fault_proxy.hpp"

namespace tenure::test {
namespace {

using steady = std::chrono::steady_clock;

class signals_pg : public runtime_pg {
 protected:
  fault_proxy proxy_{schema_.dsn()};
  std::shared_ptr<signal_port> port(const std::string& dsn, const std::string& name) {
    return postgres::make_signal_port(dsn, schema_.name(), name);
  }
};

TEST_F(signals_pg, a_leader_whose_session_goes_silent_gives_up_leadership_within_one_round_trip_limit) {
  auto a = port(proxy_.dsn(schema_.dsn()), "signals-a");
  auto b = port(schema_.dsn(), "signals-b");
  ASSERT_TRUE(a->connect());
  ASSERT_TRUE(b->connect());
  auto a_leads = a->try_lead("a", 500ms);
  ASSERT_TRUE(a_leads);
  EXPECT_EQ(a_leads.value(), std::optional<std::int64_t>{1});
  auto b_leads = b->try_lead("b", 500ms);
  ASSERT_TRUE(b_leads);
  EXPECT_FALSE(b_leads.value());

  // A's network path drops without a word; A's own socket stays open and silent. A renews no
  // more, and B takes the lease over once it expired.
  EXPECT_EQ(proxy_.black_hole_all(), 1u);
  ASSERT_TRUE(eventually([&] {
    auto r = b->try_lead("b", 500ms);
    return r && r.value() == std::optional<std::int64_t>{2};
  }, 10s)) << "B takes the lease A no longer renews";
  // A must not go on believing it leads: its next try_lead gets no answer and gives up.
  const auto t0 = steady::now();
  auto again = a->try_lead("a", 500ms);
  const auto took = steady::now() - t0;
  ASSERT_FALSE(again) << "A still says it leads while B does";
  EXPECT_EQ(again.error(), errc::database_unavailable);
  EXPECT_FALSE(a->connected());
  EXPECT_LT(took, 8s);
}

TEST_F(signals_pg, stop_returns_when_the_signal_session_stops_answering_mid_statement) {
  // B leads, so A asks for the lease on every maintenance round: a statement in flight whenever
  // its session goes silent.
  auto b = port(schema_.dsn(), "signals-b");
  ASSERT_TRUE(b->connect());
  ASSERT_TRUE(b->try_lead("b", 10min).value());
  auto a = runtime::create(fast_config(), open_store(), port(proxy_.dsn(schema_.dsn()), "signals-a"));
  ASSERT_TRUE(a) << a.error().message();
  a.value()->handle("noop", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(a.value()->start());
  ASSERT_TRUE(eventually([&] { return proxy_.connections() == 1; }, 5s));
  std::this_thread::sleep_for(300ms);  // a few maintenance rounds: A asks, B keeps the lease
  EXPECT_FALSE(a.value()->metrics().leader);
  EXPECT_EQ(proxy_.black_hole_all(), 1u);
  std::this_thread::sleep_for(300ms);  // A's next question is now in flight, unanswered
  auto stopped = std::async(std::launch::async, [&] { a.value()->stop(); });
  EXPECT_EQ(stopped.wait_for(10s), std::future_status::ready) << "stop() waited on the silent signal session";
  proxy_.kill_everything();  // (lets a stop() that waited return, so the test ends either way)
  stopped.wait();
}

TEST_F(signals_pg, connecting_to_a_server_that_never_answers_gives_up_by_the_connect_timeout) {
  proxy_.silence(true);
  // The DSN's own connect_timeout wins over tenure's default...
  auto quick = port(proxy_.dsn(schema_.dsn()) + " connect_timeout=2", "signals-quick");
  auto t0 = steady::now();
  auto r = quick->connect();
  EXPECT_FALSE(r);
  EXPECT_EQ(r.error(), errc::database_unavailable);
  EXPECT_LT(steady::now() - t0, 5s);
  // ...and without one, tenure's default (10 s) still bounds the wait: never the kernel's minutes.
  auto plain = port(proxy_.dsn(schema_.dsn()), "signals-plain");
  t0 = steady::now();
  auto connecting = std::async(std::launch::async, [&] { return plain->connect(); });
  const bool gave_up = connecting.wait_for(15s) == std::future_status::ready;
  const auto took = steady::now() - t0;
  EXPECT_TRUE(gave_up) << "connect() still waiting after 15 s";
  if (!gave_up) proxy_.kill_everything();  // (so that the test ends either way)
  EXPECT_FALSE(connecting.get());
  EXPECT_GE(took, 8s);
}

TEST_F(signals_pg, a_leader_whose_session_stays_open_but_renews_no_more_loses_the_lease_at_its_expiry) {
  // A paused process, or a pooled server connection that outlived its client: the session is
  // alive and idle. With a session lock it kept leadership for as long as it stayed open.
  auto a = port(schema_.dsn(), "signals-a");
  auto b = port(schema_.dsn(), "signals-b");
  ASSERT_TRUE(a->connect());
  ASSERT_TRUE(b->connect());
  ASSERT_EQ(a->try_lead("a", 400ms).value(), std::optional<std::int64_t>{1});
  const auto t0 = steady::now();
  ASSERT_FALSE(b->try_lead("b", 400ms).value());
  ASSERT_TRUE(eventually([&] { return b->try_lead("b", 400ms).value() == std::optional<std::int64_t>{2}; }, 5s))
      << "B never took the lease of a leader that stopped renewing";
  EXPECT_GE(steady::now() - t0, 300ms) << "B took the lease before it expired";
  EXPECT_TRUE(a->connected());
  EXPECT_FALSE(a->try_lead("a", 400ms).value()) << "A cannot renew a lease B holds";
  pg db{schema_.dsn()};
  EXPECT_EQ(db.scalar("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                      "WHERE l.locktype = 'advisory' AND a.application_name LIKE 'signals-%'"),
            "0")
      << "leadership must not be a session lock";
}

TEST_F(signals_pg, a_stopping_leader_releases_its_lease_so_the_next_worker_leads_at_once) {
  auto made_a = runtime::create(fast_config(), open_store(), port(schema_.dsn(), "signals-a"));
  ASSERT_TRUE(made_a);
  auto& a = *made_a.value();
  a.handle("noop", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(eventually([&] { return a.metrics().leader; }, 5s));
  const auto term_a = a.metrics().leader_term;
  EXPECT_GE(term_a, 1);
  auto cfg = fast_config();
  cfg.maintenance_lease = 60s;  // B's own lease is long: what matters is how A's ends
  auto made_b = runtime::create(cfg, open_store(), port(schema_.dsn(), "signals-b"));
  ASSERT_TRUE(made_b);
  auto& b = *made_b.value();
  b.handle("noop", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(b.start());
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(b.metrics().leader);
  a.stop();
  EXPECT_FALSE(a.metrics().leader);
  ASSERT_TRUE(eventually([&] { return b.metrics().leader; }, 5s)) << "B did not take the released lease";
  EXPECT_GT(b.metrics().leader_term, term_a);
  b.stop();
}

TEST_F(signals_pg, a_leader_whose_lease_was_taken_over_rescues_nothing_until_it_leads_again) {
  auto made = runtime::create(fast_config(), open_store(), port(schema_.dsn(), "signals-a"));
  ASSERT_TRUE(made);
  auto& a = *made.value();
  a.handle("noop", [](job_context&) { return job_outcome::completed(); });
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(eventually([&] { return a.metrics().leader; }, 5s));
  // Another holder takes the lease over (as after A's lease expired while A was paused), and an
  // attempt of a silent worker becomes stale (staleness 600 ms).
  db_.exec("UPDATE " + s("leadership") +
           " SET holder = 'thief', term = term + 1, expires_at = clock_timestamp() + interval '1 hour'");
  const auto id = enqueue("noop", "{}", "elsewhere");  // a queue A does not serve
  ASSERT_EQ(db_.exec("SELECT job_id FROM " + s("claim") + "('elsewhere')").rows.size(), 1u);
  ASSERT_TRUE(eventually([&] { return !a.metrics().leader; }, 5s)) << "A still acts as leader";
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id}), "running")
      << "A rescued although it no longer held the lease";
  EXPECT_EQ(a.metrics().rescued, 0u);
  // The thief's lease ends: A takes it with a newer term and rescues the attempt.
  db_.exec("UPDATE " + s("leadership") + " SET expires_at = clock_timestamp()");
  ASSERT_TRUE(eventually([&] { return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id}) == "available"; },
                         10s));
  EXPECT_TRUE(a.metrics().leader);
  EXPECT_EQ(a.metrics().leader_term, std::stoll(db_.scalar("SELECT term FROM " + s("leadership"))));
  // The counter moves when the control thread handles the pass's answer, just after its commit.
  EXPECT_TRUE(eventually([&] { return a.metrics().rescued == 1u; }, 5s)) << a.metrics().rescued;
  a.stop();
}

}  // namespace
}  // namespace tenure::test
