// The loopback fault proxy against the project's PostgreSQL: it forwards plain traffic, and when
// armed it lets a COMMIT reach the server, swallows the server's reply and resets the client --
// the server committed, the client saw a broken connection.
#include "support/fault_proxy.hpp"

#include <gtest/gtest.h>

#include <time.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/pg.hpp"

namespace tenure::test {
namespace {

using namespace std::chrono_literals;

template <class Cond>
bool poll_until(Cond cond, std::chrono::milliseconds timeout = 10s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

// CPU time this process uses while the test thread sleeps: the proxy must not spin when idle.
std::chrono::milliseconds idle_cpu(std::chrono::milliseconds sleep = 300ms) {
  auto cpu = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return std::chrono::seconds{ts.tv_sec} + std::chrono::nanoseconds{ts.tv_nsec};
  };
  const auto before = cpu();
  std::this_thread::sleep_for(sleep);
  return std::chrono::duration_cast<std::chrono::milliseconds>(cpu() - before);
}

// A proxy in front of the test server, a direct connection, and a fresh table `t` (id int).
class FaultProxy : public ::testing::Test {
 protected:
  void SetUp() override {
    direct_ = std::make_unique<pg>(test_dsn());
    table_ = "fault_proxy_" + random_suffix();
    direct_->exec("CREATE TABLE " + table_ + " (id int PRIMARY KEY)");
    proxy_ = std::make_unique<fault_proxy>(test_dsn());
  }
  void TearDown() override {
    proxy_.reset();
    if (direct_) direct_->query("DROP TABLE IF EXISTS " + table_);
  }

  std::string via_proxy(const std::string& app = "fault_proxy_test") const {
    return proxy_->dsn(test_dsn()) + " application_name=" + app;
  }
  int rows() { return std::stoi(direct_->scalar("SELECT count(*) FROM " + table_)); }
  int backends(const std::string& app) {
    return std::stoi(direct_->scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", {app}));
  }

  std::unique_ptr<pg> direct_;
  std::unique_ptr<fault_proxy> proxy_;
  std::string table_;
};

TEST_F(FaultProxy, ForwardsQueriesBothWays) {
  pg a{via_proxy()};
  pg b{via_proxy()};
  EXPECT_EQ(a.scalar("SELECT 1 + 1"), "2");
  EXPECT_EQ(b.scalar("SELECT $1::int * 2", {"21"}), "42");  // extended protocol
  EXPECT_EQ(a.scalar("SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()"), "false");

  // Large in both directions: more than the proxy's read chunk and queue cap.
  const std::string big(3'000'000, 'x');
  EXPECT_EQ(b.scalar("SELECT length($1)", {big}), "3000000");
  const auto r = a.exec("SELECT repeat('y', 1000) FROM generate_series(1, 5000)");
  ASSERT_EQ(r.rows.size(), 5000u);
  EXPECT_EQ(r.at(4999, 0), std::string(1000, 'y'));

  a.exec("BEGIN");
  a.exec("INSERT INTO " + table_ + " VALUES (1), (2)");
  a.exec("COMMIT");  // not armed: passes
  EXPECT_EQ(b.scalar("SELECT count(*) FROM " + table_), "2");
  EXPECT_EQ(rows(), 2);
  EXPECT_EQ(proxy_->accepted(), 2u);
  EXPECT_EQ(proxy_->connections(), 2u);
  EXPECT_EQ(proxy_->fired(), 0);
  EXPECT_LT(idle_cpu().count(), 50);
}

TEST_F(FaultProxy, LostCommitAckServerCommittedClientSawError) {
  const std::string app = "fp_victim_" + random_suffix();
  pg bystander{via_proxy()};
  pg c{via_proxy(app)};
  c.exec("BEGIN");
  c.exec("INSERT INTO " + table_ + " VALUES (1)");
  proxy_->arm_drop_commit_reply();
  EXPECT_EQ(proxy_->armed(), 1);

  const auto r = c.query("COMMIT");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(PQstatus(c.native()), CONNECTION_BAD) << r.error;
  EXPECT_EQ(proxy_->fired(), 1);
  EXPECT_EQ(proxy_->armed(), 0);
  // The proxy waited for the server's reply before resetting the client: committed, visible now.
  EXPECT_EQ(rows(), 1);
  // The upstream side was closed too: the victim's backend goes away.
  EXPECT_TRUE(poll_until([&] { return backends(app) == 0; }));

  // Other connections keep working, and the fault was one-shot.
  EXPECT_EQ(bystander.scalar("SELECT count(*) FROM " + table_), "1");
  pg again{via_proxy()};
  again.exec("BEGIN");
  again.exec("INSERT INTO " + table_ + " VALUES (2)");
  EXPECT_TRUE(again.query("COMMIT").ok);
  EXPECT_EQ(rows(), 2);
  EXPECT_EQ(proxy_->fired(), 1);
}

TEST_F(FaultProxy, LostCommitAckExtendedProtocol) {
  pg c{via_proxy()};
  c.exec("BEGIN");
  c.exec("INSERT INTO " + table_ + " VALUES ($1::int)", {"7"});
  proxy_->arm_drop_commit_reply();
  // Parse/Bind/Describe/Execute/Sync with COMMIT as the unnamed statement.
  PGresult* r = PQexecParams(c.native(), "commit", 0, nullptr, nullptr, nullptr, nullptr, 0);
  EXPECT_NE(PQresultStatus(r), PGRES_COMMAND_OK);
  PQclear(r);
  EXPECT_EQ(PQstatus(c.native()), CONNECTION_BAD);
  EXPECT_EQ(proxy_->fired(), 1);
  EXPECT_EQ(rows(), 1);

  // A named prepared COMMIT, executed later, is recognised too.
  pg d{via_proxy()};
  PQclear(PQprepare(d.native(), "fin", "END TRANSACTION;", 0, nullptr));
  d.exec("BEGIN");
  d.exec("INSERT INTO " + table_ + " VALUES (8)");
  proxy_->arm_drop_commit_reply();
  r = PQexecPrepared(d.native(), "fin", 0, nullptr, nullptr, nullptr, 0);
  EXPECT_NE(PQresultStatus(r), PGRES_COMMAND_OK);
  PQclear(r);
  EXPECT_EQ(PQstatus(d.native()), CONNECTION_BAD);
  EXPECT_EQ(proxy_->fired(), 2);
  EXPECT_EQ(rows(), 2);
}

TEST_F(FaultProxy, CountedArmFiresThatManyTimes) {
  proxy_->arm_drop_commit_reply(2);
  const char* commits[] = {"  end ;", "Commit Work", "COMMIT"};
  for (int i = 0; i < 3; ++i) {
    pg c{via_proxy()};
    c.exec("BEGIN");
    c.exec("INSERT INTO " + table_ + " VALUES (" + std::to_string(i) + ")");
    const auto r = c.query(commits[i]);
    EXPECT_EQ(r.ok, i == 2) << commits[i];
    EXPECT_EQ(PQstatus(c.native()), i == 2 ? CONNECTION_OK : CONNECTION_BAD) << commits[i];
  }
  EXPECT_EQ(proxy_->fired(), 2);
  EXPECT_EQ(rows(), 3);  // every COMMIT reached the server

  proxy_->arm_drop_commit_reply(3);
  proxy_->disarm();
  pg c{via_proxy()};
  c.exec("BEGIN");
  EXPECT_TRUE(c.query("COMMIT").ok);  // passes when disarmed
  EXPECT_EQ(proxy_->fired(), 2);
}

TEST_F(FaultProxy, RollbackIsNotIntercepted) {
  pg c{via_proxy()};
  proxy_->arm_drop_commit_reply();
  c.exec("BEGIN");
  c.exec("INSERT INTO " + table_ + " VALUES (1)");
  EXPECT_TRUE(c.query("ROLLBACK").ok);
  EXPECT_EQ(c.scalar("SELECT 'commit'"), "commit");  // only the statement COMMIT counts
  EXPECT_EQ(c.scalar("SELECT $1::text", {"COMMIT"}), "COMMIT");
  EXPECT_EQ(PQstatus(c.native()), CONNECTION_OK);
  EXPECT_EQ(proxy_->fired(), 0);
  EXPECT_EQ(proxy_->armed(), 1);
  EXPECT_EQ(rows(), 0);

  // Still armed: the next COMMIT is the one intercepted.
  c.exec("BEGIN");
  c.exec("INSERT INTO " + table_ + " VALUES (2)");
  EXPECT_FALSE(c.query("COMMIT").ok);
  EXPECT_EQ(PQstatus(c.native()), CONNECTION_BAD);
  EXPECT_EQ(proxy_->fired(), 1);
  EXPECT_EQ(direct_->scalar("SELECT string_agg(id::text, ',') FROM " + table_), "2");
}

TEST_F(FaultProxy, KillAllDropsConnections) {
  const std::string app = "fp_killed_" + random_suffix();
  pg a{via_proxy(app)};
  pg b{via_proxy(app)};
  a.exec("BEGIN");
  a.exec("INSERT INTO " + table_ + " VALUES (1)");
  EXPECT_TRUE(poll_until([&] { return proxy_->connections() == 2; }));

  EXPECT_EQ(proxy_->kill_all(), 2u);
  EXPECT_EQ(proxy_->connections(), 0u);
  EXPECT_FALSE(a.query("SELECT 1").ok);
  EXPECT_FALSE(b.query("SELECT 1").ok);
  EXPECT_EQ(PQstatus(a.native()), CONNECTION_BAD);
  EXPECT_EQ(PQstatus(b.native()), CONNECTION_BAD);
  EXPECT_TRUE(poll_until([&] { return backends(app) == 0; }));
  EXPECT_EQ(rows(), 0);  // the open transaction died with its connection
  EXPECT_EQ(proxy_->fired(), 0);

  pg c{via_proxy()};  // the proxy itself keeps serving
  EXPECT_EQ(c.scalar("SELECT 3"), "3");
  EXPECT_EQ(proxy_->kill_all(), 1u);
  EXPECT_EQ(proxy_->kill_all(), 0u);
}

TEST_F(FaultProxy, RefuseClosesNewConnectionsOnly) {
  pg before{via_proxy()};
  proxy_->refuse(true);
  EXPECT_THROW(pg{via_proxy()}, std::runtime_error);
  EXPECT_EQ(before.scalar("SELECT 5"), "5");
  proxy_->refuse(false);
  pg after{via_proxy()};
  EXPECT_EQ(after.scalar("SELECT 6"), "6");
  EXPECT_EQ(proxy_->accepted(), 2u);
}

TEST_F(FaultProxy, SslRequestIsAnsweredThenFaultStillWorks) {
  ASSERT_EQ(direct_->scalar("SHOW ssl"), "off") << "the test server is expected to run without SSL";
  // libpq sends SSLRequest first; the server answers 'N' and a startup packet follows.
  pg c{via_proxy() + " sslmode=prefer"};
  c.exec("BEGIN");
  c.exec("INSERT INTO " + table_ + " VALUES (1)");
  proxy_->arm_drop_commit_reply();
  EXPECT_FALSE(c.query("COMMIT").ok);
  EXPECT_EQ(proxy_->fired(), 1);
  EXPECT_EQ(rows(), 1);
}

TEST_F(FaultProxy, SurvivesClientDisconnectsAndStopsCleanly) {
  for (int i = 0; i < 20; ++i) {
    PGconn* c = PQconnectdb(via_proxy().c_str());
    ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    if (i % 2 == 0) {
      // Leave in the middle of a large result.
      ASSERT_EQ(PQsendQuery(c, "SELECT repeat('z', 1000) FROM generate_series(1, 20000)"), 1);
    }
    PQfinish(c);
  }
  EXPECT_TRUE(poll_until([&] { return proxy_->connections() == 0; }));
  EXPECT_LT(idle_cpu().count(), 50);

  // A proxy destroyed under an open connection: the client sees an error, nothing crashes.
  pg c{via_proxy()};
  EXPECT_EQ(c.scalar("SELECT 1"), "1");
  proxy_.reset();
  EXPECT_FALSE(c.query("SELECT 1").ok);
}

TEST(FaultProxyDsn, RewritesDsnAndRecognisesCommit) {
  const auto [host, port] = fault_proxy::upstream_of("postgresql://u@127.0.0.1:6543/db?sslmode=require");
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 6543);
  EXPECT_EQ(fault_proxy::upstream_of("host=localhost dbname=x").second, 5432);
  EXPECT_THROW(fault_proxy::upstream_of("host=/var/run/postgresql"), std::runtime_error);
  EXPECT_THROW(fault_proxy::upstream_of("dbname=x"), std::runtime_error);

  fault_proxy p{"127.0.0.1", 1};  // nothing listens there; only the DSN is looked at
  const auto dsn = p.dsn("postgresql://u@127.0.0.1:6543/db?sslmode=require");
  EXPECT_NE(dsn.find("host=127.0.0.1 port=" + std::to_string(p.port())), std::string::npos) << dsn;
  EXPECT_NE(dsn.find("sslmode=disable gssencmode=disable"), std::string::npos) << dsn;
  EXPECT_EQ(dsn.find("require"), std::string::npos) << dsn;
  EXPECT_EQ(dsn.find("6543"), std::string::npos) << dsn;
  EXPECT_NE(dsn.find("user='u'"), std::string::npos) << dsn;

  for (const char* yes : {"COMMIT", "commit;", "  End ; ", "\n\tcommit work", "END TRANSACTION;"}) {
    EXPECT_TRUE(fault_proxy::is_commit_statement(yes)) << yes;
  }
  for (const char* no : {"ROLLBACK", "", ";", "COMMIT PREPARED 'x'", "SELECT 1; COMMIT", "committed", "end;;"}) {
    EXPECT_FALSE(fault_proxy::is_commit_statement(no)) << no;
  }
}

}  // namespace
}  // namespace tenure::test
