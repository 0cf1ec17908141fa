// samples/billing_inbox end to end: the provider, the web backend and workers run as separate
// processes of the built binary; orders go in over real HTTP; the database is checked after.
// Workers are killed (SIGKILL) and paused (SIGSTOP) in the middle of a charge. Every wait has a
// deadline; every child is killed and reaped when the test ends (and dies with the test process).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "support/fault_proxy.hpp"
#include "support/pg.hpp"

#ifndef BILLING_INBOX_BIN
#error "BILLING_INBOX_BIN (path of the billing_inbox executable) must be defined by the build"
#endif

namespace tenure::test {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
namespace fs = std::filesystem;

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = steady::now() + timeout;
  while (steady::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return cond();
}

/// One child process of the sample binary: stdout through a pipe (for its "listening" line),
/// stderr into a log file. Killed with SIGKILL and reaped on destruction; PR_SET_PDEATHSIG kills
/// it too if the test process dies first.
class child {
 public:
  child(std::string name, const std::vector<std::string>& args, const fs::path& log)
      : name_(std::move(name)), log_(log) {
    std::vector<std::string> all{BILLING_INBOX_BIN};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (err < 0) throw std::runtime_error("open " + log.string());
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {  // only async-signal-safe calls from here
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    ::close(err);
    if (pid_ < 0) {
      ::close(fds[0]);
      throw std::runtime_error("fork failed");
    }
    out_ = fds[0];
  }
  ~child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::kill(pid_, SIGCONT);
      int status = 0;
      ::waitpid(pid_, &status, 0);  // SIGKILL cannot be ignored: this returns
    }
    if (out_ >= 0) ::close(out_);
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  /// The rest of the first stdout line starting with `prefix`; empty on timeout or exit.
  std::string wait_line(const std::string& prefix, std::chrono::milliseconds timeout = 20s) {
    const auto deadline = steady::now() + timeout;
    for (;;) {
      for (auto nl = buf_.find('\n'); nl != std::string::npos; nl = buf_.find('\n')) {
        const std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()).count();
      if (left <= 0) return {};
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[512];
      const auto n = ::read(out_, chunk, sizeof chunk);
      if (n <= 0) return {};  // exited
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }
  void signal(int sig) { ::kill(pid_, sig); }
  /// Waits for the exit (polling, with a deadline); true when reaped.
  bool wait_exit(std::chrono::milliseconds timeout = 20s) {
    return reaped_ || eventually([&] {
             reaped_ = ::waitpid(pid_, &status_, WNOHANG) == pid_;
             return reaped_;
           }, timeout);
  }
  int exit_status() const { return status_; }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  std::string log() const {
    std::ifstream in{log_};
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string name_;
  fs::path log_;
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
  bool reaped_ = false;
  int status_ = 0;
};

struct reply {
  int status = 0;  ///< 0: no answer
  std::string body;
  std::string head;  ///< the status line and headers, as sent
};

/// A tiny HTTP/1.1 client on a raw socket (Connection: close, read to EOF, 10 s deadline).
reply http(const std::string& base, const std::string& method, const std::string& path, const std::string& body = {},
           const std::string& extra_headers = {}) {
  const auto colon = base.rfind(':');
  const int port = std::stoi(base.substr(colon + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  reply r;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return r;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  for (std::size_t sent = 0; sent < req.size();) {
    const auto n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer (413) before reading everything
    sent += static_cast<std::size_t>(n);
  }
  std::string raw;
  char chunk[4096];
  for (;;) {
    const auto n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) break;
    raw.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const auto end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  return r;
}

std::string json_order(const std::string& customer, long amount) {
  return R"({"customer":")" + customer + R"(","amount_cents":)" + std::to_string(amount) + "}";
}

/// The value of "key": in a flat JSON text (enough for {"order_id":1,"job_id":2}).
std::string json_field(const std::string& body, const std::string& key) {
  const auto at = body.find("\"" + key + "\":");
  if (at == std::string::npos) return {};
  auto v = body.substr(at + key.size() + 3);
  return v.substr(0, v.find_first_of(",}"));
}

class billing_inbox : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("billing_inbox_" + schema_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (HasFailure())
      for (auto& c : children_) std::cerr << "---- log of " << c->name() << " ----\n" << c->log() << "\n";
    children_.clear();  // SIGKILL + reap
    db_.query("DROP SCHEMA IF EXISTS " + app_ + " CASCADE");
    db_.query("DROP SCHEMA IF EXISTS " + schema_ + " CASCADE");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  child& spawn(const std::string& name, std::vector<std::string> args, const std::string& dsn = {}) {
    std::vector<std::string> common{"--database-url", dsn.empty() ? dsn_ : dsn, "--schema", schema_, "--app-schema", app_};
    args.insert(args.begin(), common.begin(), common.end());
    children_.push_back(std::make_unique<child>(name, args, dir_ / (name + ".log")));
    return *children_.back();
  }
  /// Starts a server role and returns its URL (from its "listening" line).
  std::string start(const std::string& name, std::vector<std::string> args, const std::string& dsn = {}) {
    args.insert(args.end(), {"--listen", "127.0.0.1:0"});
    auto& c = spawn(name, std::move(args), dsn);
    auto url = c.wait_line("listening ");
    EXPECT_FALSE(url.empty()) << name << " did not start:\n" << c.log();
    return url;
  }
  std::string start_provider(int delay_ms) {
    return provider_ = start("provider", {"--role", "provider", "--provider-delay-ms", std::to_string(delay_ms)});
  }
  std::string start_web(const std::string& dsn = {}) { return start("web", {"--role", "web"}, dsn); }
  /// A worker with its own /metrics; returns its URL. Short heartbeat and staleness.
  std::string start_worker(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--role", "worker", "--worker-name", name, "--provider-url", provider_,
                                  "--heartbeat-ms", "100", "--staleness-ms", "500"};
    args.insert(args.end(), extra.begin(), extra.end());
    return start(name, args);
  }
  child& proc(const std::string& name) {
    for (auto& c : children_)
      if (c->name() == name) return *c;
    throw std::runtime_error("no child " + name);
  }

  std::string order(const std::string& web, const std::string& customer, long amount) {
    const auto r = http(web, "POST", "/orders", json_order(customer, amount));
    EXPECT_EQ(r.status, 201) << r.body;
    return json_field(r.body, "order_id");
  }
  std::string q(const std::string& sql, const std::vector<cell>& params = {}) {
    auto r = db_.exec(sql, params);
    if (r.rows.empty() || !r.rows[0][0]) return "<none>";
    return *r.rows[0][0];
  }
  long n(const std::string& sql, const std::vector<cell>& params = {}) { return std::stol(q(sql, params)); }
  std::string a(const char* table) const { return app_ + "." + table; }
  std::string jobs() const { return schema_ + ".jobs"; }
  std::string order_state(const std::string& id) { return q("SELECT state FROM " + a("orders") + " WHERE id = $1", {id}); }
  /// "state attempt" of the order's charge job.
  std::string charge_job(const std::string& id) {
    return q("SELECT j.state || ' ' || j.attempt FROM " + a("orders") + " o JOIN " + jobs() +
                 " j ON j.id = o.charge_job_id WHERE o.id = $1",
             {id});
  }

  /// The checks every paid order must pass: paid exactly once, in the same transaction as its
  /// charge job's completion (complete_in_tx: paid_at = finalized_at, paid_run_lease = the
  /// job's), one provider charge for its key, one receipt_email job, completed, one receipt.
  void expect_paid_once(const std::string& id, int attempt, int provider_calls) {
    SCOPED_TRACE("order " + id);
    EXPECT_EQ(order_state(id), "paid");
    EXPECT_EQ(charge_job(id), "completed " + std::to_string(attempt));
    EXPECT_EQ(q("SELECT (o.paid_at = j.finalized_at AND o.paid_run_lease = j.run_lease)::text FROM " + a("orders") +
                    " o JOIN " + jobs() + " j ON j.id = o.charge_job_id WHERE o.id = $1",
                {id}),
              "true")
        << "the order was paid in the transaction that completed its job";
    EXPECT_EQ(q("SELECT count(*) || ' ' || sum(calls) || ' ' || bool_and(p.charge_id = o.charge_id) FROM " +
                    a("provider_charges") + " p JOIN " + a("orders") + " o ON p.idempotency_key = o.id::text WHERE o.id = $1",
                {id}),
              "1 " + std::to_string(provider_calls) + " true")
        << "one charge at the provider, the one recorded with the order";
    EXPECT_EQ(n("SELECT count(*) FROM " + a("charge_log") + " WHERE order_id = $1 AND event = 'finalized'", {id}), 1);
    EXPECT_TRUE(eventually([&] {
      return q("SELECT count(*) || ' ' || bool_and(state = 'completed') FROM " + jobs() +
                   " WHERE kind = 'receipt_email' AND (args->>'order_id') = $1",
               {id}) == "1 true";
    })) << "exactly one receipt_email job, completed";
    EXPECT_TRUE(eventually([&] { return n("SELECT count(*) FROM " + a("receipts_sent") + " WHERE order_id = $1", {id}) == 1; }));
  }

  std::string dsn_ = test_dsn();
  std::string schema_ = "bi_" + random_suffix();
  std::string app_ = schema_ + "_app";
  pg db_{dsn_};
  fs::path dir_;
  std::string provider_;
  std::vector<std::unique_ptr<child>> children_;
};

TEST_F(billing_inbox, orders_are_paid_through_complete_in_tx_and_bad_input_writes_nothing) {
  start_provider(0);
  const auto web = start_web();
  const auto worker = start_worker("worker-1");
  std::vector<std::string> ids;
  for (const auto& [who, cents] : std::vector<std::pair<std::string, long>>{{"ada", 1250}, {"grace", 990}, {"linus", 42}})
    ids.push_back(order(web, who, cents));

  // Bad input: 4xx with a JSON error, and nothing written.
  const std::vector<std::tuple<std::string, std::string, int>> bad{
      {"not json", "{\"customer\":\"ada\",", 400},
      {"not an object", "[1,2]", 400},
      {"missing amount", R"({"customer":"ada"})", 400},
      {"negative amount", json_order("ada", -5), 400},
      {"zero amount", json_order("ada", 0), 400},
      {"fractional amount", R"({"customer":"ada","amount_cents":12.5})", 400},
      {"empty customer", json_order("  ", 100), 400},
      {"missing customer", R"({"amount_cents":100})", 400},
      {"oversized body", json_order(std::string(20'000, 'a'), 100), 413},
      // Refused by a check that runs after the insert: the order and its job roll back.
      {"blocked customer", json_order("Mallory", 100), 422},
  };
  for (const auto& [what, body, status] : bad) {
    const auto r = http(web, "POST", "/orders", body);
    EXPECT_EQ(r.status, status) << what << ": " << r.body;
    EXPECT_NE(r.body.find("\"error\""), std::string::npos) << what << ": " << r.body;
  }
  const auto wrong_method = http(web, "GET", "/orders");
  EXPECT_EQ(wrong_method.status, 405);
  EXPECT_NE(wrong_method.head.find("\r\nAllow: POST\r\n"), std::string::npos) << wrong_method.head;
  EXPECT_EQ(http(web, "GET", "/nowhere").status, 404);

  for (const auto& id : ids) ASSERT_TRUE(eventually([&] { return order_state(id) == "paid"; })) << "order " << id;
  for (const auto& id : ids) expect_paid_once(id, /*attempt=*/1, /*provider_calls=*/1);

  // Nothing of the refused requests exists: three orders, three charge jobs, all of them paired.
  EXPECT_EQ(n("SELECT count(*) FROM " + a("orders")), 3);
  EXPECT_EQ(n("SELECT count(*) FROM " + a("orders") + " WHERE lower(customer) = 'mallory'"), 0);
  EXPECT_EQ(n("SELECT count(*) FROM " + jobs() + " WHERE kind = 'charge'"), 3);
  EXPECT_EQ(n("SELECT count(*) FROM " + jobs() + " j WHERE kind = 'charge' AND NOT EXISTS (SELECT 1 FROM " +
              a("orders") + " o WHERE o.charge_job_id = j.id AND o.id = (j.args->>'order_id')::bigint)"),
            0);
  EXPECT_EQ(n("SELECT count(*) FROM " + a("provider_charges")), 3);

  // The read side.
  const auto got = http(web, "GET", "/orders/" + ids[0]);
  ASSERT_EQ(got.status, 200) << got.body;
  for (const auto* part : {"\"state\":\"paid\"", "\"amount_cents\":1250", "\"run_lease\":", "\"kind\":\"charge\"",
                           "\"kind\":\"receipt_email\"", "\"customer\":\"ada\""})
    EXPECT_NE(got.body.find(part), std::string::npos) << part << " in " << got.body;
  EXPECT_EQ(http(web, "GET", "/orders/99999999").status, 404);
  EXPECT_EQ(http(web, "GET", "/orders/abc").status, 400);
  EXPECT_EQ(http(web, "GET", "/orders/-1").status, 400);

  const auto health = http(web, "GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  const auto web_metrics = http(web, "GET", "/metrics").body;
  EXPECT_NE(web_metrics.find("billing_orders_created_total 3\n"), std::string::npos) << web_metrics;
  EXPECT_NE(web_metrics.find("billing_orders_rejected_total 9\n"), std::string::npos) << web_metrics;
  const auto worker_metrics = http(worker, "GET", "/metrics").body;
  EXPECT_NE(worker_metrics.find("billing_charges_finalized_total 3\n"), std::string::npos) << worker_metrics;
  EXPECT_NE(worker_metrics.find("tenure_completed"), std::string::npos) << "the runtime's own metrics";
  const auto charges = http(provider_, "GET", "/charges");
  EXPECT_EQ(charges.status, 200);
  EXPECT_NE(charges.body.find("\"idempotency_key\":\"" + ids[0] + "\""), std::string::npos) << charges.body;

  // A graceful stop (SIGTERM) exits 0.
  for (const auto* name : {"web", "worker-1", "provider"}) {
    proc(name).signal(SIGTERM);
    ASSERT_TRUE(proc(name).wait_exit()) << name;
    EXPECT_TRUE(WIFEXITED(proc(name).exit_status()) && WEXITSTATUS(proc(name).exit_status()) == 0) << name;
  }
}

TEST_F(billing_inbox, worker_killed_during_the_provider_call_is_rescued_and_the_order_is_paid_once) {
  start_provider(1'500);  // the provider records the charge, then takes 1.5 s to answer
  const auto web = start_web();
  start_worker("victim");
  const auto id = order(web, "ada", 1250);
  // The victim is inside the provider call once the provider has recorded it.
  ASSERT_TRUE(eventually([&] { return n("SELECT count(*) FROM " + a("provider_charges") + " WHERE idempotency_key = $1", {id}) == 1; }));
  EXPECT_EQ(charge_job(id), "running 1");
  proc("victim").signal(SIGKILL);
  ASSERT_TRUE(proc("victim").wait_exit());
  EXPECT_EQ(order_state(id), "pending") << "charged at the provider, not yet recorded here";

  start_worker("rescuer");
  ASSERT_TRUE(eventually([&] { return order_state(id) == "paid"; }, 30s));
  expect_paid_once(id, /*attempt=*/2, /*provider_calls=*/2);
  // Each run lease by its rank among the order's attempts: 1 the victim's, 2 the rescuer's.
  EXPECT_EQ(q("SELECT string_agg(r || ':' || worker || ':' || event, ',' ORDER BY id) FROM (SELECT id, worker, event, "
              "dense_rank() OVER (ORDER BY run_lease) AS r FROM " + a("charge_log") + " WHERE order_id = $1) x",
              {id}),
            "1:victim:provider_call,2:rescuer:provider_call,2:rescuer:provider_answered,2:rescuer:finalized");
}

TEST_F(billing_inbox, worker_killed_after_the_provider_answered_before_its_transaction_is_rescued) {
  start_provider(0);
  const auto web = start_web();
  start_worker("victim", {"--commit-delay-ms", "60000"});  // holds the answer, never commits
  const auto id = order(web, "grace", 990);
  ASSERT_TRUE(eventually([&] {
    return n("SELECT count(*) FROM " + a("charge_log") + " WHERE order_id = $1 AND event = 'provider_answered'", {id}) == 1;
  }));
  proc("victim").signal(SIGKILL);
  ASSERT_TRUE(proc("victim").wait_exit());
  EXPECT_EQ(order_state(id), "pending");
  EXPECT_EQ(charge_job(id), "running 1");

  start_worker("rescuer");
  ASSERT_TRUE(eventually([&] { return order_state(id) == "paid"; }, 30s));
  expect_paid_once(id, /*attempt=*/2, /*provider_calls=*/2);
}

TEST_F(billing_inbox, paused_worker_rescued_meanwhile_has_its_late_complete_in_tx_rejected_and_rolled_back) {
  start_provider(1'500);
  const auto web = start_web();
  // The sleeper takes no part in rescue: a paused process that held the maintenance lock would
  // keep anyone else from rescuing.
  const auto sleeper = start_worker("sleeper", {"--maintenance", "off", "--provider-timeout-ms", "60000"});
  const auto id = order(web, "linus", 42);
  ASSERT_TRUE(eventually([&] { return n("SELECT count(*) FROM " + a("provider_charges") + " WHERE idempotency_key = $1", {id}) == 1; }));
  proc("sleeper").signal(SIGSTOP);  // inside the provider call: no more heartbeats

  start_worker("rescuer");
  ASSERT_TRUE(eventually([&] { return order_state(id) == "paid"; }, 30s));
  EXPECT_EQ(charge_job(id), "completed 2");

  proc("sleeper").signal(SIGCONT);  // gets its (old) provider answer, then tries to finish lease 1
  ASSERT_TRUE(eventually([&] {
    return n("SELECT count(*) FROM " + a("charge_log") + " WHERE order_id = $1 AND event = 'stale_rejected'", {id}) == 1;
  })) << "the sleeper's complete_in_tx must have been rejected";
  EXPECT_EQ(q("SELECT r || ':' || worker FROM (SELECT worker, event, dense_rank() OVER (ORDER BY run_lease) AS r FROM " +
              a("charge_log") + " WHERE order_id = $1) x WHERE event = 'stale_rejected'",
              {id}),
            "1:sleeper") << "the first attempt's lease";
  // Its business writes rolled back with the rejected completion: the order still names lease 2,
  // and its receipt_email job never existed.
  expect_paid_once(id, /*attempt=*/2, /*provider_calls=*/2);
  EXPECT_TRUE(eventually([&] {
    return http(sleeper, "GET", "/metrics").body.find("billing_charges_stale_total 1\n") != std::string::npos;
  }));
  const auto m = http(sleeper, "GET", "/metrics").body;
  EXPECT_NE(m.find("billing_charges_finalized_total 0\n"), std::string::npos) << m;
}

TEST_F(billing_inbox, healthz_is_503_while_the_database_is_unreachable_and_recovers) {
  fault_proxy proxy{dsn_};
  const auto web = start_web(proxy.dsn(dsn_));
  EXPECT_EQ(http(web, "GET", "/healthz").status, 200);
  proxy.refuse(true);
  proxy.kill_all();
  EXPECT_EQ(http(web, "GET", "/healthz").status, 503);
  const auto r = http(web, "POST", "/orders", json_order("ada", 100));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("\"error\""), std::string::npos);
  proxy.refuse(false);
  EXPECT_TRUE(eventually([&] { return http(web, "GET", "/healthz").status == 200; }));
  EXPECT_EQ(http(web, "POST", "/orders", json_order("ada", 100)).status, 201);
  EXPECT_EQ(n("SELECT count(*) FROM " + a("orders")), 1) << "nothing written while the database was away";
}

TEST_F(billing_inbox, lost_commit_reply_is_reported_as_in_doubt_with_the_order_id_and_nothing_is_half_written) {
  fault_proxy proxy{dsn_};
  const auto web = start_web(proxy.dsn(dsn_));
  proxy.arm_drop_commit_reply();  // the server commits; the web process sees a broken connection
  const auto r = http(web, "POST", "/orders", json_order("ada", 1250));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("check GET /orders/"), std::string::npos) << r.body;
  const auto id = json_field(r.body, "order_id");
  ASSERT_FALSE(id.empty()) << r.body;
  EXPECT_EQ(proxy.fired(), 1);
  // The order and its charge job committed together, and the answer told the client where to look.
  EXPECT_EQ(q("SELECT o.state || ' ' || j.kind || ' ' || j.state FROM " + a("orders") + " o JOIN " + jobs() +
                  " j ON j.id = o.charge_job_id WHERE o.id = $1",
              {id}),
            "pending charge available");
  const auto got = http(web, "GET", "/orders/" + id);
  EXPECT_EQ(got.status, 200) << got.body;
}

TEST_F(billing_inbox, an_order_blocked_behind_a_lock_is_answered_503_within_the_lock_timeout_and_writes_nothing) {
  const auto web = start("web", {"--role", "web", "--db-lock-timeout-ms", "300"});
  pg locker{dsn_};
  locker.exec("BEGIN");
  locker.exec("LOCK TABLE " + a("orders") + " IN ACCESS EXCLUSIVE MODE");  // a migration, a long report
  const auto t0 = steady::now();
  const auto blocked = http(web, "POST", "/orders", json_order("ada", 100));
  EXPECT_LT(steady::now() - t0, 5s) << "the request waited on the lock without a limit";
  EXPECT_EQ(blocked.status, 503) << blocked.body;
  EXPECT_NE(blocked.body.find("nothing was written"), std::string::npos) << blocked.body;
  locker.exec("COMMIT");
  EXPECT_EQ(n("SELECT count(*) FROM " + a("orders")), 0);
  EXPECT_EQ(n("SELECT count(*) FROM " + jobs()), 0);
  EXPECT_EQ(http(web, "POST", "/orders", json_order("ada", 100)).status, 201) << "the next one goes through";
}

TEST_F(billing_inbox, a_commit_the_server_refuses_is_answered_409_as_not_written_not_in_doubt) {
  const auto web = start_web();
  // A deferred check that fails at COMMIT, on a live session (as a deferred constraint would).
  db_.exec("CREATE FUNCTION " + a("refuse_at_commit") + "() RETURNS trigger LANGUAGE plpgsql AS "
           "$$BEGIN IF NEW.customer = 'late-refusal' THEN RAISE EXCEPTION 'refused at commit'; END IF; "
           "RETURN NULL; END$$");
  db_.exec("CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON " + a("orders") +
           " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + a("refuse_at_commit") + "()");
  const auto r = http(web, "POST", "/orders", json_order("late-refusal", 100));
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("nothing was written"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("check GET /orders/"), std::string::npos) << "it is not in doubt: " << r.body;
  EXPECT_EQ(n("SELECT count(*) FROM " + a("orders")), 0);
  EXPECT_EQ(n("SELECT count(*) FROM " + jobs()), 0);
  EXPECT_EQ(http(web, "POST", "/orders", json_order("ada", 100)).status, 201);
}

TEST_F(billing_inbox, a_provider_answering_404_is_retried_and_the_order_paid_once_the_url_is_fixed) {
  const auto web = start_web();
  provider_ = web;  // a mistyped --provider-url: POST /charges answers 404 there
  start_worker("misconfigured");
  const auto id = order(web, "ada", 900);
  ASSERT_TRUE(eventually([&] {
    return q("SELECT last_error FROM " + jobs() + " j JOIN " + a("orders") + " o ON o.charge_job_id = j.id WHERE o.id = $1",
             {id}).find("provider answered 404") != std::string::npos;
  }));
  const auto state = q("SELECT j.state FROM " + jobs() + " j JOIN " + a("orders") + " o ON o.charge_job_id = j.id WHERE o.id = $1", {id});
  EXPECT_NE(state, "failed") << "a 404 is not the charge's fault: it must not fail for good";
  proc("misconfigured").signal(SIGKILL);
  ASSERT_TRUE(proc("misconfigured").wait_exit());
  start_provider(0);
  start_worker("fixed");
  ASSERT_TRUE(eventually([&] { return order_state(id) == "paid"; }, 30s));
  EXPECT_EQ(n("SELECT count(*) FROM " + a("provider_charges") + " WHERE idempotency_key = $1", {id}), 1);
}

TEST_F(billing_inbox, out_of_file_descriptors_the_web_server_pauses_accepting_instead_of_spinning_and_recovers) {
  const auto web = start_web();
  auto& server = proc("web");
  const auto fds_open = [&] {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/" + std::to_string(server.pid()) + "/fd")) ++n;
    return n;
  };
  const auto cpu_ticks = [&] {  // utime + stime of the web process, in clock ticks
    std::ifstream in{"/proc/" + std::to_string(server.pid()) + "/stat"};
    std::string stat{std::istreambuf_iterator<char>(in), {}};
    std::istringstream rest{stat.substr(stat.rfind(')') + 2)};
    std::string field;
    long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) stime = std::stoll(field);
    }
    return utime + stime;
  };
  rlimit old{};
  ASSERT_EQ(::prlimit(server.pid(), RLIMIT_NOFILE, nullptr, &old), 0);
  const rlimit low{fds_open() + 4, old.rlim_max};  // the soft limit only: raised back below
  ASSERT_EQ(::prlimit(server.pid(), RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);
  // Idle clients hold what is left, and more queue up behind them in the listen backlog.
  std::vector<int> idle;
  const int port = std::stoi(web.substr(web.rfind(':') + 1));
  for (int i = 0; i < 20; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(300ms);
  const auto before = cpu_ticks();
  std::this_thread::sleep_for(2s);
  const auto used_s = static_cast<double>(cpu_ticks() - before) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  EXPECT_LT(used_s, 0.5) << "the web process burned " << used_s << " s of CPU in 2 s";
  EXPECT_NE(server.log().find("cannot accept connections"), std::string::npos) << "the cause is logged";
  for (int fd : idle) ::close(fd);
  ASSERT_EQ(::prlimit(server.pid(), RLIMIT_NOFILE, &old, nullptr), 0) << std::strerror(errno);
  EXPECT_TRUE(eventually([&] { return http(web, "GET", "/healthz").status == 200; }, 10s));
}

TEST_F(billing_inbox, a_port_already_in_use_ends_the_process_before_its_worker_claims_anything) {
  const auto web = start_web();
  const auto id = order(web, "ada", 300);  // a charge job is waiting, and nobody works it yet
  // Another program holds the port the next process is told to use.
  const int taken = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len);
  const auto port = std::to_string(ntohs(addr.sin_port));
  auto& all = spawn("all", {"--role", "all", "--listen", "127.0.0.1:" + port, "--heartbeat-ms", "200"});
  ASSERT_TRUE(all.wait_exit());
  ::close(taken);
  EXPECT_TRUE(WIFEXITED(all.exit_status()) && WEXITSTATUS(all.exit_status()) == 1) << all.log();
  EXPECT_NE(all.log().find("cannot listen on 127.0.0.1:" + port), std::string::npos) << all.log();
  EXPECT_EQ(charge_job(id), "available 0") << "the job was never claimed by the process that could not serve";
}

TEST_F(billing_inbox, role_all_runs_web_worker_and_provider_in_one_process) {
  auto& all = spawn("all", {"--role", "all", "--listen", "127.0.0.1:0", "--heartbeat-ms", "200"});
  const auto provider = all.wait_line("provider listening ");
  const auto web = all.wait_line("listening ");
  ASSERT_FALSE(web.empty()) << all.log();
  const auto id = order(web, "ada", 700);
  ASSERT_TRUE(eventually([&] { return order_state(id) == "paid"; }));
  expect_paid_once(id, 1, 1);
  EXPECT_NE(http(web, "GET", "/metrics").body.find("tenure_completed"), std::string::npos);
  EXPECT_EQ(http(provider, "GET", "/charges").status, 200);
  all.signal(SIGINT);
  ASSERT_TRUE(all.wait_exit());
  EXPECT_TRUE(WIFEXITED(all.exit_status()) && WEXITSTATUS(all.exit_status()) == 0);
}

}  // namespace
}  // namespace tenure::test
