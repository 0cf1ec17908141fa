// Failover to a streaming standby: a primary stopped hard (pg_ctl -m immediate) and its standby
// promoted, with producers and a worker process that reach the database through a multi-host DSN
// (target_session_attrs=read-write), so they find the new primary by themselves.
//
// Synchronous replication: nothing acknowledged is lost (enqueues, executions, caller-owned
// completions with their business rows), every job completes exactly once, the worker process
// reconnects without a restart, and the time from the hard stop to the first claim and the first
// completion on the new primary is measured ("failover: sync ..." line).
//
// Asynchronous replication: what the standby had not received is lost, acknowledged or not
// (measured: a burst racing the hard stop, and a burst after replication was cut). The run lease of
// a claim on the lost timeline is issued again on the new primary, to another attempt; the token
// of the lost attempt carries another secret and is refused (TN001), so its holder cannot finalize
// the new attempt ("failover: async ..." lines).
//
// Each test makes its own primary and standby (scripts/pg start / standby / promote /
// stop-immediate / destroy, $TENURE_PG_SCRIPT) in a directory of its own under the build tree,
// and destroys both at the end, failed or not. The shared test server is not touched.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "support/eventually.hpp"
#include "support/pg.hpp"
#include "tenure/log.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/store.hpp"

#ifndef TENURE_MP_WORKER
#error "TENURE_MP_WORKER (path of the worker_process executable) must be defined by the build"
#endif
#ifndef TENURE_FAILOVER_ROOT
#error "TENURE_FAILOVER_ROOT (a directory under the build tree) must be defined by the build"
#endif

namespace tenure::test {
namespace {

using namespace std::chrono_literals;
using std::chrono::steady_clock;
using std::chrono::system_clock;

const std::string k_schema = "fo";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

long ms_between(steady_clock::time_point a, steady_clock::time_point b) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count());
}

/// Microseconds since the epoch, to compare with the server's clock (same host).
std::string epoch_us(system_clock::time_point t) {
  return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count());
}

/// A private primary (a) and its streaming standby (b), made with scripts/pg in a fresh directory
/// under the build tree; both destroyed (and the directory removed) by the destructor.
class cluster_pair {
 public:
  cluster_pair() {
    const char* script = std::getenv("TENURE_PG_SCRIPT");
    if (script == nullptr || *script == '\0') {
      throw std::runtime_error(
          "TENURE_PG_SCRIPT is not set: this test makes its own clusters through scripts/pg (run it via scripts/test, "
          "or export TENURE_PG_SCRIPT=<abs path of scripts/pg>)");
    }
    script_ = script;
    root_ = std::string{TENURE_FAILOVER_ROOT} + "/failover-" + random_suffix();
    std::filesystem::create_directories(root_);
    std::filesystem::permissions(root_, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                            std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                            std::filesystem::perms::others_exec);
  }
  ~cluster_pair() {
    run(a(), "destroy");
    run(b(), "destroy");
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  cluster_pair(const cluster_pair&) = delete;
  cluster_pair& operator=(const cluster_pair&) = delete;

  const std::string& root() const { return root_; }
  std::string a() const { return root_ + "/a"; }
  std::string b() const { return root_ + "/b"; }

  /// `TENURE_PG_DIR=dir scripts/pg verb`; its output goes to a log of the pair.
  int run(const std::string& dir, const std::string& verb) const {
    const std::string cmd = "TENURE_PG_DIR='" + dir + "' '" + script_ + "' " + verb + " >>'" + root_ +
                            "/scripts.log' 2>&1";
    return std::system(cmd.c_str());
  }
  std::string log() const { return read_file(root_ + "/scripts.log"); }

  int port(const std::string& dir) const { return std::stoi(read_file(dir + "/port")); }
  std::string dsn(const std::string& dir) const {
    return "host=127.0.0.1 port=" + std::to_string(port(dir)) + " user=postgres dbname=postgres connect_timeout=2";
  }
  /// Both servers, the writable one wins: what applications are given.
  std::string multi_dsn() const {
    return "host=127.0.0.1,127.0.0.1 port=" + std::to_string(port(a())) + "," + std::to_string(port(b())) +
           " user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2";
  }

  /// The primary, migrated, with the side tables; then its standby (synchronous or not).
  void make(bool sync) {
    ASSERT_EQ(run(a(), "start"), 0) << log();
    auto m = postgres::migrate(dsn(a()), k_schema);
    ASSERT_TRUE(m) << m.error().message();
    pg db{dsn(a())};
    db.exec("CREATE TABLE " + k_schema + ".executions (job_id bigint NOT NULL, run_lease bigint NOT NULL, "
            "worker text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())");
    db.exec("CREATE TABLE " + k_schema + ".orders (job_id bigint NOT NULL, run_lease bigint NOT NULL, "
            "at timestamptz NOT NULL DEFAULT clock_timestamp())");
    ASSERT_EQ(run(b(), std::string{"standby '"} + a() + "'" + (sync ? " --sync" : "")), 0) << log();
  }

 private:
  std::string script_;
  std::string root_;
};

/// One worker process (worker_process.cpp) on the pair's multi-host DSN.
struct worker {
  std::string out_path, err_path;
  pid_t pid = -1;
  bool reaped = false;
  int status = 0;

  ~worker() {
    if (pid > 0 && !reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  void spawn(const std::string& dir, const std::string& dsn, const std::string& name) {
    out_path = dir + "/" + name + ".out";
    err_path = dir + "/" + name + ".log";
    std::vector<std::string> args{TENURE_MP_WORKER, dsn, k_schema, name};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t p = ::fork();
    if (p == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0) ::_exit(125);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::close(out);
      ::close(err);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (p < 0) throw std::runtime_error(std::string{"fork: "} + std::strerror(errno));
    pid = p;
  }
  bool reap(std::chrono::milliseconds timeout) {
    if (reaped) return true;
    return poll_until(
        [&] {
          const pid_t r = ::waitpid(pid, &status, WNOHANG);
          if (r == pid || (r < 0 && errno == ECHILD)) reaped = true;
          return reaped;
        },
        timeout, 5ms);
  }
  std::string out() const { return read_file(out_path); }
  std::string log_tail() const {
    const auto all = read_file(err_path);
    return all.size() > 6000 ? all.substr(all.size() - 6000) : all;
  }
};

/// A producer thread enqueuing through a tenure store on the multi-host DSN: every id whose
/// enqueue was acknowledged, the in-doubt answers, the time of the first acknowledgement after a
/// mark.
class producer {
 public:
  producer(const std::string& dsn, std::chrono::microseconds gap) : gap_(gap) {
    auto opened = postgres::store::open(
        {.dsn = dsn, .schema = k_schema, .pool_size = 1, .acquire_timeout = 2s, .application_name = "fo-producer"});
    if (!opened) throw std::runtime_error("producer: " + opened.error().message());
    store_ = std::move(opened).value();
    thread_ = std::thread([this] { loop(); });
  }
  ~producer() { stop(); }

  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  /// From now on, note the first acknowledgement.
  void mark() {
    const std::lock_guard lock{mu_};
    marked_ = true;
    mark_index_ = acked_.size();
    first_after_mark_.reset();
  }
  /// Acknowledged before / since mark().
  std::vector<std::int64_t> acked_before_mark() const {
    const std::lock_guard lock{mu_};
    return {acked_.begin(), acked_.begin() + static_cast<std::ptrdiff_t>(mark_index_)};
  }
  std::vector<std::int64_t> acked_since_mark() const {
    const std::lock_guard lock{mu_};
    return {acked_.begin() + static_cast<std::ptrdiff_t>(mark_index_), acked_.end()};
  }
  std::optional<steady_clock::time_point> first_after_mark() const {
    const std::lock_guard lock{mu_};
    return first_after_mark_;
  }
  std::vector<std::int64_t> acked() const {
    const std::lock_guard lock{mu_};
    return acked_;
  }
  long acked_count() const {
    const std::lock_guard lock{mu_};
    return static_cast<long>(acked_.size());
  }
  long failed() const { return failed_; }
  long in_doubt() const { return in_doubt_; }

 private:
  void loop() {
    long i = 0;
    while (!stop_) {
      const bool charge = i % 4 == 0;
      auto id = store_->enqueue({.kind = charge ? "charge" : "exec"});
      if (id) {
        ++i;
        const std::lock_guard lock{mu_};
        acked_.push_back(id.value());
        if (marked_ && !first_after_mark_) first_after_mark_ = steady_clock::now();
      } else if (id.error() == errc::commit_in_doubt) {
        ++in_doubt_;
      } else {
        ++failed_;
        std::this_thread::sleep_for(5ms);  // nothing reachable: do not spin
      }
      if (gap_.count() > 0) std::this_thread::sleep_for(gap_);
    }
  }

  std::chrono::microseconds gap_;
  std::unique_ptr<postgres::store> store_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<std::int64_t> acked_;
  bool marked_ = false;
  std::size_t mark_index_ = 0;
  std::optional<steady_clock::time_point> first_after_mark_;
  std::atomic<long> failed_{0}, in_doubt_{0};
};

std::string id_array(const std::vector<std::int64_t>& ids) {
  std::string out = "{";
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "}";
}

/// The producers' reconnect warnings are expected here: only errors are shown.
void quiet_logs() { tenure::logger()->set_level(spdlog::level::err); }

/// Spawns worker w1 on the pair's multi-host DSN and waits until it says it is ready.
void start_worker(worker& w, cluster_pair& pair) {
  w.spawn(pair.root(), pair.multi_dsn(), "w1");
  ASSERT_TRUE(poll_until([&] { return w.out().find("ready\n") != std::string::npos || w.reap(0ms); }, 30s))
      << "the worker did not start";
  ASSERT_FALSE(w.reaped) << "the worker exited at start:\n" << w.log_tail();
}

TEST(failover, sync_standby_nothing_acknowledged_is_lost_each_job_completes_once_and_the_worker_reconnects) {
  quiet_logs();
  cluster_pair pair;
  ASSERT_NO_FATAL_FAILURE(pair.make(/*sync=*/true));
  const std::string s = k_schema + ".";

  worker w;
  ASSERT_NO_FATAL_FAILURE(start_worker(w, pair));

  producer prod{pair.multi_dsn(), 2ms};
  {
    pg old_primary{pair.dsn(pair.a())};
    ASSERT_TRUE(poll_until(
        [&] {
          return std::stol(old_primary.scalar("SELECT count(*) FROM " + s + "done")) >= 200 &&
                 std::stol(old_primary.scalar("SELECT count(*) FROM " + s + "orders")) >= 20;
        },
        30s))
        << "the worker never got going on the primary\n" << w.log_tail();
  }

  // The primary dies hard mid-run; the standby is promoted.
  // What happens after stop-immediate returned happens on the new primary (the old one is gone);
  // the figures count from the moment the stop began.
  const auto stop_wall = system_clock::now();
  const auto stop_at = steady_clock::now();
  ASSERT_EQ(pair.run(pair.a(), "stop-immediate"), 0) << pair.log();
  const auto dead_wall = system_clock::now();
  prod.mark();
  ASSERT_EQ(pair.run(pair.b(), "promote"), 0) << pair.log();
  const auto promoted_at = steady_clock::now();
  const long acked_before = prod.acked_count();

  // Producers go on against the new primary, then stop; the worker drains everything.
  ASSERT_TRUE(poll_until([&] { return prod.acked_count() >= acked_before + 200; }, 30s))
      << "the producer did not reach the new primary";
  prod.stop();
  const auto acked = prod.acked();
  pg db{pair.dsn(pair.b())};
  const std::string ids = id_array(acked);
  ASSERT_TRUE(poll_until(
      [&] {
        return std::stol(db.scalar("SELECT count(*) FROM " + s + "jobs WHERE state = 'completed' AND id = ANY($1)",
                                   {ids})) == static_cast<long>(acked.size()) &&
               std::stol(db.scalar("SELECT count(*) FROM " + s + "jobs WHERE state <> 'completed'")) == 0;
      },
      60s))
      << "not every job completed on the new primary: "
      << db.scalar("SELECT string_agg(state || '=' || n, ' ') FROM (SELECT state, count(*) n FROM " + s +
                   "jobs GROUP BY state) x")
      << "\n" << w.log_tail();
  ASSERT_FALSE(w.reap(0ms)) << "the worker process died:\n" << w.log_tail();

  // Every acknowledged enqueue exists, and every job completed exactly once (done has one row per
  // job: its primary key), with the lease of an execution that was recorded.
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "jobs WHERE id = ANY($1)", {ids})),
            static_cast<long>(acked.size()));
  const long jobs = std::stol(db.scalar("SELECT count(*) FROM " + s + "jobs"));
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "done WHERE state = 'completed'")), jobs);
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "done d WHERE d.kind = 'exec' AND NOT EXISTS (SELECT 1 FROM " +
                                s + "executions e WHERE e.job_id = d.id AND e.run_lease = d.run_lease)")),
            0)
      << "an exec job completed by a lease that never executed";
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM (SELECT job_id, run_lease FROM " + s +
                                "executions GROUP BY 1, 2 HAVING count(*) > 1) x")),
            0)
      << "an attempt executed twice: a run lease was issued twice";
  // Caller-owned: each completed charge job has exactly one business row, of its completing lease;
  // no other business row exists; every acknowledged COMMIT is there.
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "done d WHERE d.kind = 'charge' AND (SELECT count(*) FROM " +
                                s + "orders o WHERE o.job_id = d.id AND o.run_lease = d.run_lease) <> 1")),
            0);
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "orders o WHERE NOT EXISTS (SELECT 1 FROM " + s +
                                "done d WHERE d.id = o.job_id AND d.run_lease = o.run_lease)")),
            0)
      << "a business row without its job's completion";
  long acked_charges = 0, lost_charges = 0;
  {
    std::istringstream lines{w.out()};
    std::string word;
    std::int64_t job = 0, lease = 0;
    while (lines >> word) {
      if (word != "acked") continue;
      lines >> job >> lease;
      ++acked_charges;
      const auto found = db.scalar("SELECT count(*) FROM " + s + "orders o JOIN " + s +
                                       "done d ON d.id = o.job_id AND d.run_lease = o.run_lease AND d.state = "
                                       "'completed' WHERE o.job_id = $1 AND o.run_lease = $2",
                                   {std::to_string(job), std::to_string(lease)});
      if (found != "1") ++lost_charges;
    }
  }
  EXPECT_GT(acked_charges, 0);
  EXPECT_EQ(lost_charges, 0) << "acknowledged caller-owned completions lost";

  // The figures: from the hard stop to the first claim (an execution recorded) and the first
  // completion on the new primary (after the old one was gone), by the server's clock; the
  // producer's first acknowledgement there.
  const auto since_stop = [&](const std::string& column, const std::string& table) {
    return std::lround(std::stod(db.scalar("SELECT extract(epoch FROM min(" + column +
                                               ") - to_timestamp($1::double precision / 1e6)) * 1000 FROM " + s + table +
                                               " WHERE " + column + " > to_timestamp($2::double precision / 1e6)",
                                           {epoch_us(stop_wall), epoch_us(dead_wall)})));
  };
  const long first_claim_ms = since_stop("at", "executions");
  const long first_complete_ms = since_stop("finalized_at", "done");
  const auto first_enqueue = prod.first_after_mark();
  ASSERT_TRUE(first_enqueue.has_value());
  const long executions = std::stol(db.scalar("SELECT count(*) FROM " + s + "executions"));
  const long exec_jobs = std::stol(db.scalar("SELECT count(*) FROM " + s + "done WHERE kind = 'exec'"));
  std::cout << "failover: sync stop_to_promoted_ms=" << ms_between(stop_at, promoted_at)
            << " reconnect_ms=" << std::max(first_claim_ms, first_complete_ms) << " first_claim_ms=" << first_claim_ms
            << " first_complete_ms=" << first_complete_ms
            << " producer_reconnect_ms=" << ms_between(stop_at, *first_enqueue) << " jobs=" << jobs
            << " acked_enqueues=" << acked.size() << " enqueue_failures=" << prod.failed()
            << " enqueue_in_doubt=" << prod.in_doubt() << " acked_charges=" << acked_charges
            << " lost=0 exec_reruns=" << executions - exec_jobs << std::endl;
  EXPECT_LT(first_claim_ms, 20'000);
  EXPECT_GT(first_claim_ms, 0);

  // The same worker process, never restarted, stops cleanly.
  ::kill(w.pid, SIGTERM);
  ASSERT_TRUE(w.reap(30s));
  EXPECT_TRUE(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0) << w.log_tail();
  EXPECT_NE(w.out().find("completed="), std::string::npos);
}

/// Ids of `n` jobs of kind `kind` enqueued (and acknowledged) one by one on `db`.
std::vector<std::int64_t> enqueue_each(pg& db, const std::string& kind, int n) {
  std::vector<std::int64_t> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(std::stoll(db.scalar("SELECT " + k_schema + ".enqueue($1)", {kind})));
  }
  return ids;
}

// A burst racing the hard stop of a primary whose standby is asynchronous: acknowledged enqueues
// may be missing after promotion (measured, bounded by what the standby had not received), and
// whatever exists completes exactly once, with the worker process reconnected by itself.
TEST(failover, async_standby_burst_racing_the_stop_loses_at_most_the_unreplicated_tail_and_nothing_completes_twice) {
  quiet_logs();
  cluster_pair pair;
  ASSERT_NO_FATAL_FAILURE(pair.make(/*sync=*/false));
  const std::string s = k_schema + ".";
  worker w;
  ASSERT_NO_FATAL_FAILURE(start_worker(w, pair));

  std::vector<std::unique_ptr<producer>> producers;  // several sessions: a burst of commits in flight
  for (int i = 0; i < 3; ++i) producers.push_back(std::make_unique<producer>(pair.multi_dsn(), 0us));
  const auto acked_total = [&] {
    long n = 0;
    for (auto& p : producers) n += p->acked_count();
    return n;
  };
  ASSERT_TRUE(poll_until([&] { return acked_total() >= 1500; }, 30s)) << "the producers never got going";
  const auto stop_at = steady_clock::now();
  ASSERT_EQ(pair.run(pair.a(), "stop-immediate"), 0) << pair.log();
  const long acked_at_stop = acked_total();
  for (auto& p : producers) p->mark();
  ASSERT_EQ(pair.run(pair.b(), "promote"), 0) << pair.log();
  ASSERT_TRUE(poll_until([&] { return acked_total() >= acked_at_stop + 100; }, 30s))
      << "the producers did not reach the new primary";
  std::vector<std::int64_t> acked, old_side, new_side;
  for (auto& p : producers) {
    p->stop();
    const auto before = p->acked_before_mark(), after = p->acked_since_mark();
    old_side.insert(old_side.end(), before.begin(), before.end());
    new_side.insert(new_side.end(), after.begin(), after.end());
  }
  acked = old_side;
  acked.insert(acked.end(), new_side.begin(), new_side.end());

  // Lost: acknowledged by the old primary and missing on the new one. The new primary's id
  // sequence may hand out a lost id again (to a new job): such an id counts as lost too.
  pg db{pair.dsn(pair.b())};
  const std::set<std::int64_t> reissued_set = [&] {
    std::set<std::int64_t> olds{old_side.begin(), old_side.end()}, both;
    for (auto id : new_side) {
      if (olds.count(id) != 0) both.insert(id);
    }
    return both;
  }();
  const long reissued_ids = static_cast<long>(reissued_set.size());
  const long lost = static_cast<long>(old_side.size()) -
                    std::stol(db.scalar("SELECT count(*) FROM " + s + "jobs WHERE id = ANY($1)", {id_array(old_side)})) +
                    reissued_ids;
  ASSERT_TRUE(poll_until(
      [&] { return std::stol(db.scalar("SELECT count(*) FROM " + s + "jobs WHERE state <> 'completed'")) == 0; }, 60s))
      << db.scalar("SELECT string_agg(state || '=' || n, ' ') FROM (SELECT state, count(*) n FROM " + s +
                   "jobs GROUP BY state) x")
      << "\n" << w.log_tail();
  ASSERT_FALSE(w.reap(0ms)) << "the worker process died:\n" << w.log_tail();
  const long jobs = std::stol(db.scalar("SELECT count(*) FROM " + s + "jobs"));
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "done WHERE state = 'completed'")), jobs);
  // A lost job id may be issued again on the new primary to another job: an acknowledged id that
  // exists names the job that was acknowledged only when its kind matches; both kinds complete.
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "orders o WHERE NOT EXISTS (SELECT 1 FROM " + s +
                                "done d WHERE d.id = o.job_id AND d.run_lease = o.run_lease)")),
            0)
      << "a business row without its job's completion";
  EXPECT_EQ(std::stol(db.scalar("SELECT count(*) FROM " + s + "done d WHERE d.kind = 'charge' AND (SELECT count(*) FROM " +
                                s + "orders o WHERE o.job_id = d.id AND o.run_lease = d.run_lease) <> 1")),
            0);
  EXPECT_LE(reissued_ids, lost) << "an id issued twice was lost the first time";
  ::kill(w.pid, SIGTERM);
  ASSERT_TRUE(w.reap(30s));
  EXPECT_TRUE(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0) << w.log_tail();
  const auto reached = producers[0]->first_after_mark();
  std::cout << "failover: async race acked_before_stop=" << acked_at_stop << " acked_total=" << acked.size()
            << " lost_acked_enqueues=" << lost << " reissued_job_ids=" << reissued_ids << " producer_reconnect_ms="
            << (reached ? ms_between(stop_at, *reached) : -1) << " jobs=" << jobs << std::endl;
}

// Replication cut, then work on the primary, then the hard stop and promotion: everything done
// after the cut is lost, acknowledged or not (enqueues, a completion, a caller-owned completion
// with its business row, claims). The claims are issued again on the new primary with the same
// (job_id, run_lease); the tokens of the lost timeline carry other secrets and are refused (TN001),
// so their holder cannot finalize (or keep alive, or fail) the new attempts.
TEST(failover, async_standby_loses_what_it_had_not_received_and_a_lost_token_cannot_finalize_the_reissued_lease) {
  quiet_logs();
  cluster_pair pair;
  ASSERT_NO_FATAL_FAILURE(pair.make(/*sync=*/false));
  const std::string s = k_schema + ".";
  pg a{pair.dsn(pair.a())};
  pg b{pair.dsn(pair.b())};
  const auto before = enqueue_each(a, "x", 3);
  ASSERT_TRUE(poll_until(
      [&] { return b.scalar("SELECT count(*) FROM " + s + "jobs WHERE id = ANY($1)", {id_array(before)}) == "3"; }, 30s))
      << "the standby never received the jobs";

  // Cut replication: the standby forgets its primary (primary_conninfo is reloadable).
  b.exec("ALTER SYSTEM SET primary_conninfo = ''");
  b.exec("SELECT pg_reload_conf()");
  ASSERT_TRUE(poll_until([&] { return a.scalar("SELECT count(*) FROM pg_stat_replication") == "0"; }, 30s));

  // The lost timeline: three claims, one completion, one caller-owned completion with its
  // business row, a burst of enqueues; each acknowledged by the primary.
  auto claimed = a.exec("SELECT job_id, run_lease, token FROM " + s + "claim('default', 3) ORDER BY job_id");
  ASSERT_EQ(claimed.rows.size(), 3u);
  const std::string j1 = claimed.at(0, 0), j2 = claimed.at(1, 0), j3 = claimed.at(2, 0);
  const std::string lease1 = claimed.at(0, 1), lease2 = claimed.at(1, 1), lease3 = claimed.at(2, 1);
  const std::string old1 = claimed.at(0, 2), old2 = claimed.at(1, 2), old3 = claimed.at(2, 2);
  a.exec("SELECT * FROM " + s + "complete_job($1)", {old3});
  a.exec("BEGIN");
  a.exec("INSERT INTO " + s + "orders (job_id, run_lease) VALUES ($1, $2)", {j2, lease2});
  a.exec("SELECT * FROM " + s + "complete_job($1)", {old2});
  a.exec("COMMIT");
  const auto burst = enqueue_each(a, "x", 300);
  const long acked_writes = 3 + 1 + 1 + static_cast<long>(burst.size());

  ASSERT_EQ(pair.run(pair.a(), "stop-immediate"), 0) << pair.log();
  ASSERT_EQ(pair.run(pair.b(), "promote"), 0) << pair.log();
  ASSERT_TRUE(poll_until([&] { return b.scalar("SELECT pg_is_in_recovery()") == "f"; }, 30s));

  // What the standby had not received is gone, acknowledged or not, and atomically: the
  // caller-owned completion and its business row are both missing.
  const long lost_enqueues =
      300 - std::stol(b.scalar("SELECT count(*) FROM " + s + "jobs WHERE id = ANY($1)", {id_array(burst)}));
  EXPECT_EQ(lost_enqueues, 300);
  EXPECT_EQ(b.scalar("SELECT string_agg(state || ':' || run_lease, ' ' ORDER BY id) FROM " + s +
                     "jobs WHERE id = ANY($1)",
                     {id_array(before)}),
            "available:0 available:0 available:0")
      << "the claims and completions of the lost timeline are gone: the jobs run again";
  EXPECT_EQ(b.scalar("SELECT count(*) FROM " + s + "orders"), "0");

  // The new primary issues the same run leases again, to new attempts with new secrets.
  auto again = b.exec("SELECT job_id, run_lease, token FROM " + s + "claim('default', 3) ORDER BY job_id");
  ASSERT_EQ(again.rows.size(), 3u);
  EXPECT_EQ(again.at(0, 0) + ":" + again.at(0, 1) + " " + again.at(1, 0) + ":" + again.at(1, 1) + " " +
                again.at(2, 0) + ":" + again.at(2, 1),
            j1 + ":" + lease1 + " " + j2 + ":" + lease2 + " " + j3 + ":" + lease3)
      << "each (job_id, run_lease) of the lost timeline names a new attempt";
  const std::string new1 = again.at(0, 2), new2 = again.at(1, 2), new3 = again.at(2, 2);
  EXPECT_NE(new1, old1);

  // Every use of a lost token is refused like a stale attempt, and changes nothing.
  const auto refused = [&](const std::string& sql, const std::string& token) {
    auto r = b.query(sql, {token});
    return !r.ok && r.sqlstate == "TN001";
  };
  EXPECT_TRUE(refused("SELECT * FROM " + s + "complete_job($1)", old1));
  EXPECT_TRUE(refused("SELECT * FROM " + s + "fail_job($1, 'lost timeline')", old1));
  EXPECT_TRUE(refused("SELECT * FROM " + s + "complete_job($1)", old3));
  EXPECT_EQ(b.scalar("SELECT " + s + "heartbeat($1)", {old1}), "f");
  // The caller-owned finalization of the lost timeline, replayed: refused, its business row
  // rolls back with it.
  b.exec("BEGIN");
  b.exec("INSERT INTO " + s + "orders (job_id, run_lease) VALUES ($1, $2)", {j2, lease2});
  const bool replay_refused = refused("SELECT * FROM " + s + "complete_job($1)", old2);
  b.exec("ROLLBACK");
  EXPECT_TRUE(replay_refused);
  EXPECT_EQ(b.scalar("SELECT string_agg(state, ' ' ORDER BY id) FROM " + s + "jobs WHERE id = ANY($1)",
                     {id_array(before)}),
            "running running running");

  // The new attempts finish with their own tokens, each exactly once.
  b.exec("SELECT * FROM " + s + "complete_job($1)", {new1});
  b.exec("BEGIN");
  b.exec("INSERT INTO " + s + "orders (job_id, run_lease) VALUES ($1, $2)", {j2, lease2});
  b.exec("SELECT * FROM " + s + "complete_job($1)", {new2});
  b.exec("COMMIT");
  EXPECT_TRUE(refused("SELECT * FROM " + s + "complete_job($1)", new1)) << "a second completion is stale";
  b.exec("SELECT * FROM " + s + "fail_job($1, 'new attempt failed', true)", {new3});
  EXPECT_EQ(b.scalar("SELECT string_agg(state || ':' || run_lease, ' ' ORDER BY id) FROM " + s +
                     "jobs WHERE id = ANY($1)",
                     {id_array(before)}),
            "completed:" + lease1 + " completed:" + lease2 + " retryable:" + lease3);
  EXPECT_EQ(b.scalar("SELECT count(*) FROM " + s + "orders"), "1");

  std::cout << "failover: async cut acked_writes_after_cut=" << acked_writes << " lost_enqueues=" << lost_enqueues
            << "/300 lost_completions=1 lost_caller_owned=1 (business row too) reissued_leases=3"
            << " lost_tokens_refused=TN001" << std::endl;
}

// A runtime holding an attempt of the lost timeline: it claimed the job on the old primary (the
// claim never reached the standby), the primary died, the new primary issued the same run lease
// to another worker's attempt. The runtime's completion of its own attempt, flushed to the new
// primary once its handler returns, must be stale: it names the same (job_id, run_lease), but not
// the same attempt (another secret). The other worker's attempt finishes with its own token.
TEST(failover, async_a_runtime_attempt_of_the_lost_timeline_does_not_finalize_the_reissued_lease) {
  quiet_logs();
  cluster_pair pair;
  ASSERT_NO_FATAL_FAILURE(pair.make(/*sync=*/false));
  const std::string s = k_schema + ".";
  pg a{pair.dsn(pair.a())};
  pg b{pair.dsn(pair.b())};
  const std::string job = a.scalar("SELECT " + s + "enqueue('hold')");
  ASSERT_TRUE(poll_until([&] { return b.scalar("SELECT count(*) FROM " + s + "jobs WHERE id = $1", {job}) == "1"; }, 30s));
  b.exec("ALTER SYSTEM SET primary_conninfo = ''");
  b.exec("SELECT pg_reload_conf()");
  ASSERT_TRUE(poll_until([&] { return a.scalar("SELECT count(*) FROM pg_stat_replication") == "0"; }, 30s));

  postgres::runtime_options opt;
  opt.dsn = pair.multi_dsn();
  opt.schema = k_schema;
  opt.application_name = "fo-runtime";
  auto& cfg = opt.runtime;
  cfg.queues = {{.name = "default", .max_concurrency = 1}};  // its permit stays with the held attempt
  cfg.heartbeat_interval = 100ms;
  cfg.poll_interval = 50ms;
  cfg.maintenance = false;  // nobody rescues: the test decides who holds the job
  auto made = postgres::make_runtime(opt);
  ASSERT_TRUE(made) << made.error().message();
  auto rt = std::move(made).value();
  std::atomic<std::int64_t> held_lease{0};
  std::atomic<bool> release{false};
  rt->handle("hold", [&](job_context& ctx) {
    held_lease = ctx.run_lease();
    while (!release) std::this_thread::sleep_for(5ms);
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(poll_until([&] { return held_lease.load() != 0; }, 30s)) << "the runtime never claimed the job";

  ASSERT_EQ(pair.run(pair.a(), "stop-immediate"), 0) << pair.log();
  ASSERT_EQ(pair.run(pair.b(), "promote"), 0) << pair.log();
  ASSERT_TRUE(poll_until([&] { return b.scalar("SELECT pg_is_in_recovery()") == "f"; }, 30s));

  // Another worker claims the job on the new primary: the same run lease, another attempt.
  auto other = b.exec("SELECT job_id, run_lease, token FROM " + s + "claim('default', 1)");
  ASSERT_EQ(other.rows.size(), 1u);
  EXPECT_EQ(other.at(0, 0), job);
  EXPECT_EQ(other.at(0, 1), std::to_string(held_lease.load())) << "the lease of the lost claim is issued again";

  // The runtime's handler returns; its completion reaches the new primary.
  const auto stale_before = rt->metrics().stale_rejected;
  release = true;
  ASSERT_TRUE(rt->wait_idle(30s)) << "the runtime never settled its attempt";
  const auto m = rt->metrics();
  const std::string state_after_flush =
      b.scalar("SELECT state FROM " + s + "jobs WHERE id = $1", {job});
  auto finished = b.query("SELECT * FROM " + s + "complete_job($1)", {other.at(0, 2)});
  rt->stop();
  std::cout << "failover: async lost-timeline runtime completion: job state after its flush=" << state_after_flush
            << " stale_rejected=" << m.stale_rejected - stale_before << " completed_events=" << m.completed
            << " other_worker_completion=" << (finished.ok ? "applied" : finished.sqlstate) << std::endl;
  EXPECT_EQ(state_after_flush, "running") << "the lost attempt's completion finalized the re-issued attempt";
  EXPECT_EQ(m.stale_rejected - stale_before, 1u);
  EXPECT_TRUE(finished.ok) << finished.sqlstate << " " << finished.error;
  EXPECT_EQ(b.scalar("SELECT state || ':' || run_lease FROM " + s + "jobs WHERE id = $1", {job}),
            "completed:" + other.at(0, 1));
}

}  // namespace
}  // namespace tenure::test
