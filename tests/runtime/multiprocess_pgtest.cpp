// Several runtime processes on one database share the work: no job is lost, and a job runs twice
// only when its earlier attempt belonged to a process that crashed (at-least-once, docs/design.md §10).
//
// Three worker processes (worker_process.cpp) drain 20,000 jobs; one is killed with SIGKILL
// mid-run. Every execution is recorded durably in a side table by the handler itself, before
// the runtime completes the attempt, so the table is the ground truth of what ran.
//
// And a frozen maintenance leader (SIGSTOP) does not stop the rescue of a dead worker's attempts:
// its lease expires, a live worker takes it over and rescues them within the documented bound;
// the old leader, woken, does nothing as leader.
//
// And the queue limits hold across processes: with max_running = N three workers never run more
// than N attempts at once (spans recorded by the handlers, and the open receipts sampled), and
// with rate_per_second = R their claims over any span of T seconds stay within the token bucket
// (burst + R x T; each claimed job with the time its claim refilled the bucket, recorded by
// triggers) while reaching about R.
//
// The crash, rescue, callback and cancel runs record a trace of every committed state transition
// (tools/trace: `tenure trace install`) and check it at the end against the properties of
// models/caller_finalization.pml: no stale finalization, one terminal outcome per attempt and job
// (admin retry aside), run leases that only grow, and no business write without its attempt's
// completion.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/eventually.hpp"
#include "support/pg.hpp"
#include "trace/trace.hpp"

#ifndef TENURE_MP_WORKER
#error "TENURE_MP_WORKER (path of the worker_process executable) must be defined by the build"
#endif

namespace tenure::test {
namespace {

using namespace std::chrono_literals;
using std::chrono::steady_clock;

constexpr int k_jobs = 20'000;
constexpr int k_enqueue_chunk = 5'000;
constexpr int k_kill_after = 4'000;  // completed jobs before worker 2 is killed
constexpr auto k_drain_deadline = 120s;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The last `lines` lines of `text`.
std::string tail(const std::string& text, int lines) {
  auto pos = text.size();
  while (lines-- >= 0 && pos > 0) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) return text;
  }
  return text.substr(pos);
}

struct worker {
  std::string name;
  std::string out_path;
  std::string err_path;
  pid_t pid = -1;
  bool reaped = false;
  int status = 0;
};

class multiprocess_pg : public ::testing::Test {
 protected:
  scoped_schema schema_{"mp"};
  pg db_{schema_.dsn()};
  std::string dir_;
  std::vector<worker> workers_;

  std::string s(const std::string& name) const { return schema_.name() + "." + name; }
  long scalar_long(const std::string& sql) { return std::stol(db_.scalar(sql)); }

  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tenure-mp-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << "mkdtemp: " << std::strerror(errno);
    dir_ = tmpl;
  }

  // Kills (SIGKILL) and reaps every worker still alive, whatever happened in the test, so no
  // process outlives it; shows the workers' logs when the test failed.
  void TearDown() override {
    for (auto& w : workers_) {
      if (w.pid > 0 && !w.reaped) {
        ::kill(w.pid, SIGKILL);
        reap(w, 10s);
      }
    }
    if (HasFailure()) {
      for (auto& w : workers_) {
        std::cerr << "---- worker " << w.name << " stdout:\n" << read_file(w.out_path) << "---- worker " << w.name
                  << " log (tail):\n" << tail(read_file(w.err_path), 40) << "\n";
      }
    } else if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  /// fork + exec of the worker executable, stdout and stderr into files of this test.
  worker& spawn(const std::string& name, const std::vector<std::string>& extra = {}) {
    worker w;
    w.name = name;
    w.out_path = dir_ + "/" + name + ".out";
    w.err_path = dir_ + "/" + name + ".log";
    // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
    const std::string bin = TENURE_MP_WORKER;
    std::vector<std::string> args{bin, schema_.dsn(), schema_.name(), name};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Dies with the test process, even if the test crashes before its TearDown.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      const int out = ::open(w.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(w.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0) ::_exit(125);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::close(out);
      ::close(err);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid < 0) throw std::runtime_error(std::string{"fork: "} + std::strerror(errno));
    w.pid = pid;
    workers_.push_back(std::move(w));
    return workers_.back();
  }

  /// waitpid with a deadline (polling WNOHANG). True when the process was reaped.
  static bool reap(worker& w, std::chrono::milliseconds timeout) {
    if (w.reaped) return true;
    return poll_until(
        [&] {
          const pid_t r = ::waitpid(w.pid, &w.status, WNOHANG);
          if (r == w.pid || (r < 0 && errno == ECHILD)) w.reaped = true;
          return w.reaped;
        },
        timeout, 5ms);
  }

  static bool exited_with(const worker& w, int code) {
    return w.reaped && WIFEXITED(w.status) && WEXITSTATUS(w.status) == code;
  }

  static std::string describe_status(const worker& w) {
    if (!w.reaped) return "still running";
    if (WIFEXITED(w.status)) return "exit " + std::to_string(WEXITSTATUS(w.status));
    if (WIFSIGNALED(w.status)) return "killed by signal " + std::to_string(WTERMSIG(w.status));
    return "status " + std::to_string(w.status);
  }

  /// Installs the trace recorder (before the run's first job), watching `business` tables.
  void record_trace(const std::vector<trace::business_table>& business = {}) {
    auto r = trace::install(schema_.dsn(), schema_.name(), business);
    ASSERT_TRUE(r) << r.error().message();
  }
  /// Checks the recorded trace against the model's properties; returns the report.
  trace::report expect_trace_holds() {
    auto r = trace::check_database(schema_.dsn(), schema_.name());
    EXPECT_TRUE(r) << r.error().message();
    if (!r) return {};
    EXPECT_TRUE(r.value().ok()) << trace::to_json(r.value(), 5).dump(2);
    std::cout << "trace: " << r.value().transitions << " transitions of " << r.value().jobs << " jobs in "
              << r.value().transactions << " transactions; by who " << r.value().by_who.dump() << "\n";
    return std::move(r).value();
  }

  bool printed(const worker& w, const std::string& needle) {
    return read_file(w.out_path).find(needle) != std::string::npos;
  }
  bool logged(const worker& w, const std::string& needle) {
    return read_file(w.err_path).find(needle) != std::string::npos;
  }
  /// Records a trace and the handlers' executions, waits for `w` to be ready, enqueues one job of
  /// `kind` (3 attempts) and waits until `w` has parked it; returns its id ("" after a failure).
  std::string parked_by(worker& w, const std::string& kind) {
    record_trace();
    db_.exec("CREATE TABLE " + s("executions") +
             " (job_id bigint NOT NULL, run_lease bigint NOT NULL, worker text NOT NULL,"
             "  at timestamptz NOT NULL DEFAULT clock_timestamp())");
    wait_ready(w);
    const auto id = db_.scalar("SELECT " + s("enqueue") + "($1, '{}', 'default', 2, NULL, 3)", {kind});
    if (!poll_until([&] { return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id}) ==
                                 "waiting_external"; },
                    30s)) {
      ADD_FAILURE() << w.name << " never parked the job";
      return {};
    }
    return id;
  }

  /// True once no session of worker `name` is left on the server (10 s at most).
  bool sessions_gone(const std::string& name) {
    return poll_until([&] {
      return scalar_long("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tenure-mp-" + name + "'") == 0;
    }, 10s);
  }

  void wait_ready(worker& w) {
    ASSERT_TRUE(poll_until([&] { return printed(w, "ready\n") || reap(w, 0ms); }, 30s))
        << "worker " << w.name << " did not start";
    ASSERT_FALSE(w.reaped) << "worker " << w.name << " exited at start: " << describe_status(w) << "\n"
                           << read_file(w.err_path);
  }
};

TEST_F(multiprocess_pg, three_processes_one_killed_no_job_lost_and_reruns_only_from_the_dead) {
  record_trace();
  db_.exec("CREATE TABLE " + s("executions") +
           " (job_id bigint NOT NULL, run_lease bigint NOT NULL, worker text NOT NULL,"
           "  at timestamptz NOT NULL DEFAULT clock_timestamp())");
  for (int done = 0; done < k_jobs; done += k_enqueue_chunk) {
    db_.exec("SELECT count(*) FROM " + s("enqueue_batch") +
                 "(array_fill('exec'::text, ARRAY[$1::int]), array_fill('{}'::jsonb, ARRAY[$1::int]), "
                 "array_fill('default'::text, ARRAY[$1::int]), array_fill(2, ARRAY[$1::int]))",
             {std::to_string(k_enqueue_chunk)});
  }
  ASSERT_EQ(scalar_long("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'available'"), k_jobs);

  const auto t0 = steady_clock::now();
  workers_.reserve(3);
  spawn("w1");
  spawn("w2");
  spawn("w3");
  worker& victim = workers_[1];
  for (auto& w : workers_) {
    ASSERT_TRUE(poll_until([&] { return printed(w, "ready\n") || reap(w, 0ms); }, 30s))
        << "worker " << w.name << " did not start";
    ASSERT_FALSE(w.reaped) << "worker " << w.name << " exited at start: " << describe_status(w) << "\n"
                           << read_file(w.err_path);
  }

  // Mid-run: enough done overall, and the victim surely took part (it holds attempts now).
  const auto completed = [&] { return scalar_long("SELECT count(*) FROM " + s("done")); };
  long at_kill = 0;
  ASSERT_TRUE(poll_until(
      [&] {
        at_kill = completed();
        return at_kill >= k_kill_after &&
               scalar_long("SELECT count(*) FROM " + s("executions") + " WHERE worker = 'w2'") >= 100;
      },
      60s))
      << "never reached " << k_kill_after << " completed jobs with w2 working (completed " << completed() << ")";
  ASSERT_LT(at_kill, k_jobs) << "the run finished before the kill: the test proves nothing";

  // Freeze the victim (SIGSTOP) and wait until none of its sessions has a statement in flight:
  // its durable state is then fixed. Kill it while it holds attempts that executed (their row is
  // committed) but are not completed; these must run again. Retry on a rare unlucky moment.
  long open_at_kill = 0, executed_open_at_kill = 0;
  int freezes = 0;
  for (;;) {
    ++freezes;
    ASSERT_EQ(::kill(victim.pid, SIGSTOP), 0);
    ASSERT_TRUE(poll_until(
        [&] {
          return scalar_long("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tenure-mp-w2' "
                             "AND state <> 'idle'") == 0;
        },
        30s, 5ms))
        << "the stopped worker's sessions stayed busy";
    open_at_kill = scalar_long("SELECT count(*) FROM " + s("receipts") + " WHERE worker = 'mp-w2'");
    executed_open_at_kill = scalar_long("SELECT count(*) FROM " + s("receipts") + " r JOIN " + s("executions") +
                                        " e ON e.job_id = r.job_id AND e.run_lease = r.run_lease WHERE r.worker = "
                                        "'mp-w2'");
    if (executed_open_at_kill > 0 || freezes == 20) break;
    ASSERT_EQ(::kill(victim.pid, SIGCONT), 0);
    const long before = completed();
    ASSERT_TRUE(poll_until([&] { return completed() > before + 20; }, 30s, 5ms));
  }
  ASSERT_GE(executed_open_at_kill, 1) << "could not catch the victim holding an executed, uncompleted attempt";
  ASSERT_EQ(::kill(victim.pid, SIGKILL), 0);
  ASSERT_TRUE(reap(victim, 10s));
  ASSERT_TRUE(WIFSIGNALED(victim.status) && WTERMSIG(victim.status) == SIGKILL) << describe_status(victim);
  const auto t_kill = steady_clock::now();
  // What the victim sent before it stopped may still sit unread in its sockets (its sessions show
  // idle until they read it): a server session reads and runs it before it sees the connection
  // close. Once every session of the victim has ended, its durable state is final; count its open
  // attempts again then (its heartbeats stopped at SIGSTOP, so no rescue runs within staleness).
  ASSERT_TRUE(sessions_gone("w2")) << "the killed worker's sessions did not end";
  open_at_kill = scalar_long("SELECT count(*) FROM " + s("receipts") + " WHERE worker = 'mp-w2'");
  executed_open_at_kill = scalar_long("SELECT count(*) FROM " + s("receipts") + " r JOIN " + s("executions") +
                                      " e ON e.job_id = r.job_id AND e.run_lease = r.run_lease WHERE r.worker = "
                                      "'mp-w2'");

  // Everything completes: the killed process's open attempts are rescued by the survivors.
  long now_completed = 0;
  const worker* died = nullptr;
  ASSERT_TRUE(poll_until(
      [&] {
        for (auto& w : workers_) {
          if (&w != &victim && reap(w, 0ms)) died = &w;
        }
        if (died != nullptr) return true;  // fail fast below
        now_completed = scalar_long("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'");
        return now_completed == k_jobs;
      },
      k_drain_deadline, 50ms))
      << "only " << now_completed << " of " << k_jobs << " jobs completed within "
      << std::chrono::duration_cast<std::chrono::seconds>(k_drain_deadline).count() << " s; states: "
      << db_.scalar("SELECT string_agg(state || '=' || n, ', ') FROM (SELECT state, count(*) n FROM " + s("jobs") +
                    " GROUP BY state) x");
  ASSERT_EQ(died, nullptr) << "worker " << died->name << " died: " << describe_status(*died);
  const auto t_done = steady_clock::now();

  // Graceful stop of the survivors: each reports what it applied.
  std::uint64_t survivors_completed = 0, survivors_stale = 0, survivors_not_live_warnings = 0;
  for (auto& w : workers_) {
    if (&w == &victim) continue;
    ASSERT_EQ(::kill(w.pid, SIGTERM), 0);
  }
  for (auto& w : workers_) {
    if (&w == &victim) continue;
    ASSERT_TRUE(reap(w, 60s)) << "worker " << w.name << " did not stop after SIGTERM";
    ASSERT_TRUE(exited_with(w, 0)) << "worker " << w.name << ": " << describe_status(w);
    const auto out = read_file(w.out_path);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex{R"(completed=(\d+) stale=(\d+))"}))
        << "worker " << w.name << " printed: " << out;
    const auto log = read_file(w.err_path);
    for (auto p = log.find("is no longer live"); p != std::string::npos; p = log.find("is no longer live", p + 1)) {
      ++survivors_not_live_warnings;
    }
    survivors_completed += std::stoull(m[1]);
    survivors_stale += std::stoull(m[2]);
    std::cout << "worker " << w.name << ": " << m[0] << "\n";
  }

  // ---- durable state ----
  db_.exec("CREATE INDEX ON " + s("executions") + " (job_id, run_lease)");
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("jobs")), k_jobs);
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'"), k_jobs);
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("done") + " WHERE state = 'completed'"), k_jobs);

  // Each completion applied once: the completing attempt (job_id, done.run_lease) ran exactly once.
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("done") + " d LEFT JOIN (SELECT job_id, run_lease, count(*) AS n "
                        "FROM " + s("executions") + " GROUP BY job_id, run_lease) e ON e.job_id = d.id AND "
                        "e.run_lease = d.run_lease WHERE coalesce(e.n, 0) <> 1"),
            0);
  // No attempt ran twice under one run lease, and nothing ran that is not a job.
  EXPECT_EQ(scalar_long("SELECT count(*) FROM (SELECT 1 FROM " + s("executions") +
                        " GROUP BY job_id, run_lease HAVING count(*) > 1) x"),
            0);
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("executions") + " e WHERE NOT EXISTS (SELECT 1 FROM " +
                        s("done") + " d WHERE d.id = e.job_id AND e.run_lease <= d.run_lease)"),
            0);

  // A job ran more than once only when its earlier executions were the killed process's.
  const auto bad = db_.exec("SELECT e.job_id, e.run_lease, e.worker, d.run_lease FROM " + s("executions") +
                            " e JOIN " + s("done") + " d ON d.id = e.job_id WHERE e.run_lease <> d.run_lease AND "
                            "e.worker <> 'w2' ORDER BY 1, 2 LIMIT 20");
  EXPECT_TRUE(bad.rows.empty()) << [&] {
    std::string out = "earlier executions by a surviving worker (job, lease, worker, completing lease):";
    for (const auto& r : bad.rows) out += "\n  " + *r[0] + " " + *r[1] + " " + *r[2] + " " + *r[3];
    return out;
  }();

  // Exactly the victim's open attempts were rescued, and exactly those of them that had executed
  // ran twice: nothing else ran again.
  const long rescued_jobs = scalar_long("SELECT count(*) FROM " + s("done") + " WHERE attempt > 1");
  const long rerun_jobs = scalar_long("SELECT count(DISTINCT e.job_id) FROM " + s("executions") + " e JOIN " +
                                      s("done") + " d ON d.id = e.job_id WHERE e.run_lease <> d.run_lease");
  const long extra_executions = scalar_long("SELECT count(*) FROM " + s("executions")) - k_jobs;
  EXPECT_GE(rerun_jobs, 1) << "no job ran twice: the kill did not hit an executed, uncompleted attempt";
  if (freezes == 1) {
    // (An earlier, thawed freeze may have let the victim's attempts be rescued: then only >=.)
    EXPECT_EQ(rescued_jobs, open_at_kill) << "jobs whose attempt was rescued vs. attempts the victim held";
    EXPECT_EQ(rerun_jobs, executed_open_at_kill) << "jobs run twice vs. executed attempts the victim held";
    EXPECT_EQ(extra_executions, executed_open_at_kill);
  } else {
    EXPECT_GE(rescued_jobs, open_at_kill);
    EXPECT_GE(rerun_jobs, executed_open_at_kill);
  }

  // Every applied completion is reported once: survivors' own count + the victim's durable ones.
  const long victim_completed = scalar_long("SELECT count(*) FROM " + s("done") + " d JOIN " + s("executions") +
                                            " e ON e.job_id = d.id AND e.run_lease = d.run_lease WHERE e.worker = 'w2'");
  EXPECT_EQ(static_cast<long>(survivors_completed) + victim_completed, k_jobs)
      << "survivors reported " << survivors_completed << ", the killed worker completed " << victim_completed;

  const auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
  std::cout << "multiprocess: " << k_jobs << " jobs; kill at " << at_kill << " completed (w2 held "
            << open_at_kill << " attempts, " << executed_open_at_kill << " of them executed) after " << secs(t_kill - t0) << " s; all completed "
            << secs(t_done - t_kill) << " s after the kill (total " << secs(t_done - t0) << " s)\n"
            << "  completed by w2 before it died: " << victim_completed << "; by survivors: " << survivors_completed
            << " (stale outcomes seen: " << survivors_stale << ")\n"
            << "  jobs rescued (run_lease > 1): " << rescued_jobs << "; jobs executed twice: " << rerun_jobs
            << "; extra executions: " << extra_executions << " (victim frozen " << freezes << "x)\n"
            << "  survivors' heartbeat warnings 'is no longer live': " << survivors_not_live_warnings << "\n";
  const auto tr = expect_trace_holds();
  EXPECT_EQ(tr.by_transition.value("running->completed", 0), k_jobs);
  EXPECT_GE(tr.by_who.value("rescue", 0), rescued_jobs) << "each rescued attempt is one rescue transition";
}

// The workers' settings (worker_process.cpp): staleness 2 s, maintenance_interval 100 ms, so a
// maintenance lease of 300 ms. README: an attempt whose worker died is rescued within
// staleness + maintenance_lease + 3 x maintenance_interval of its last heartbeat.
constexpr auto k_rescue_bound = 2'000ms + 300ms + 3 * 100ms;
// Claiming and completing the rescued jobs, and a loaded machine's scheduling delays.
constexpr auto k_rescue_slack = 4'000ms;

TEST_F(multiprocess_pg, a_frozen_leader_does_not_stop_the_rescue_of_a_dead_workers_attempts) {
  constexpr int k_held = 12;  // within one worker's max_concurrency (16)
  record_trace();
  db_.exec("CREATE TABLE " + s("executions") +
           " (job_id bigint NOT NULL, run_lease bigint NOT NULL, worker text NOT NULL,"
           "  at timestamptz NOT NULL DEFAULT clock_timestamp())");
  workers_.reserve(3);
  worker& w1 = spawn("w1");
  wait_ready(w1);
  ASSERT_TRUE(poll_until([&] { return logged(w1, "worker mp-w1 is now the maintenance leader"); }, 30s))
      << "w1 never became the maintenance leader";
  // The leader freezes (a debugger, a VM pause, swap): its process keeps its TCP sessions open.
  ASSERT_EQ(::kill(w1.pid, SIGSTOP), 0);

  // w2 never leads; it takes every job and holds each attempt (the handler waits).
  worker& w2 = spawn("w2", {"no-maintenance"});
  wait_ready(w2);
  db_.exec("SELECT count(*) FROM " + s("enqueue_batch") +
               "(array_fill('hold'::text, ARRAY[$1::int]), array_fill('{}'::jsonb, ARRAY[$1::int]), "
               "array_fill('default'::text, ARRAY[$1::int]), array_fill(2, ARRAY[$1::int]))",
           {std::to_string(k_held)});
  ASSERT_TRUE(poll_until(
      [&] { return scalar_long("SELECT count(*) FROM " + s("executions") + " WHERE worker = 'w2'") == k_held; }, 30s))
      << "w2 did not take every job";
  ASSERT_EQ(scalar_long("SELECT count(*) FROM " + s("receipts") + " WHERE worker = 'mp-w2'"), k_held);

  // A third worker, alive. Then w2 dies with its attempts open.
  worker& w3 = spawn("w3");
  wait_ready(w3);
  ASSERT_EQ(::kill(w2.pid, SIGKILL), 0);
  ASSERT_TRUE(reap(w2, 10s));
  const auto t_kill = steady_clock::now();

  // While w1 stays frozen, w3 takes the lease over, rescues w2's attempts, and runs them again.
  long done = 0;
  const bool all_done = poll_until(
      [&] {
        done = scalar_long("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'completed'");
        return done == k_held;
      },
      30s, 20ms);
  const auto took = steady_clock::now() - t_kill;
  ASSERT_TRUE(all_done) << "only " << done << " of " << k_held << " jobs of the dead worker completed within 30 s "
                        << "while the leader was frozen; states: "
                        << db_.scalar("SELECT string_agg(state || '=' || n, ', ') FROM (SELECT state, count(*) n FROM " +
                                      s("jobs") + " GROUP BY state) x");
  EXPECT_LT(took, k_rescue_bound + k_rescue_slack)
      << "rescued and completed " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
      << " ms after the kill; documented bound " << k_rescue_bound.count() << " ms from the last heartbeat";
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("done") + " WHERE attempt = 2"), k_held);
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("executions") + " e JOIN " + s("done") +
                        " d ON d.id = e.job_id AND d.run_lease = e.run_lease WHERE e.worker = 'w3' AND d.attempt = 2"),
            k_held);
  EXPECT_EQ(db_.scalar("SELECT split_part(holder, '/', 1) FROM " + s("leadership")), "mp-w3");
  EXPECT_TRUE(logged(w3, "worker mp-w3 is now the maintenance leader"));
  const long term_w3 = scalar_long("SELECT term FROM " + s("leadership"));
  EXPECT_GE(term_w3, 2) << "w3's term follows w1's";

  // w1 wakes up. It does nothing as leader: w3 keeps the lease and its term (w1 cannot renew a
  // lease that expired, nor take one w3 renews), and w1 says it is no longer the leader.
  const auto w1_log_before = read_file(w1.err_path).size();
  ASSERT_EQ(::kill(w1.pid, SIGCONT), 0);
  ASSERT_TRUE(poll_until(
      [&] {
        return read_file(w1.err_path).find("worker mp-w1 is no longer the maintenance leader", w1_log_before) !=
               std::string::npos;
      },
      10s))
      << "w1 did not notice that it lost the lease";
  const auto watch_until = steady_clock::now() + 1'500ms;
  while (steady_clock::now() < watch_until) {
    ASSERT_EQ(db_.scalar("SELECT split_part(holder, '/', 1) FROM " + s("leadership")), "mp-w3");
    ASSERT_EQ(scalar_long("SELECT term FROM " + s("leadership")), term_w3);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_FALSE(logged(w1, "rescued job")) << "the woken leader rescued something";

  // w1 leads again only once w3's lease has ended: w3 stops (and releases it), w1 takes it over
  // with a newer term.
  ASSERT_EQ(::kill(w3.pid, SIGTERM), 0);
  ASSERT_TRUE(reap(w3, 60s));
  EXPECT_TRUE(exited_with(w3, 0)) << describe_status(w3);
  ASSERT_TRUE(poll_until(
      [&] { return db_.scalar("SELECT split_part(holder, '/', 1) FROM " + s("leadership")) == "mp-w1"; }, 10s))
      << "w1 did not take the lease over after w3 stopped";
  EXPECT_GT(scalar_long("SELECT term FROM " + s("leadership")), term_w3);
  ASSERT_EQ(::kill(w1.pid, SIGTERM), 0);
  ASSERT_TRUE(reap(w1, 60s));
  EXPECT_TRUE(exited_with(w1, 0)) << describe_status(w1);
  const auto tr = expect_trace_holds();
  EXPECT_EQ(tr.by_who.value("rescue", 0), k_held);
  std::cout << "frozen leader: " << k_held << " attempts of the killed worker rescued and completed "
            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms after the kill (bound "
            << k_rescue_bound.count() << " ms after the last heartbeat)\n";
}

TEST_F(multiprocess_pg, a_killed_leader_leaves_no_lock_or_lease_behind) {
  workers_.reserve(2);
  worker& w1 = spawn("w1");
  wait_ready(w1);
  ASSERT_TRUE(poll_until([&] { return logged(w1, "worker mp-w1 is now the maintenance leader"); }, 30s));
  worker& w2 = spawn("w2");
  wait_ready(w2);
  const auto holder = [&] { return db_.scalar("SELECT split_part(holder, '/', 1) FROM " + s("leadership")); };
  ASSERT_TRUE(poll_until([&] { return holder() == "mp-w1"; }, 10s));
  ASSERT_EQ(::kill(w1.pid, SIGKILL), 0);
  ASSERT_TRUE(reap(w1, 10s));
  // The dead leader's lease as it left it (w2 may, rarely, have taken it over already).
  const auto dead_lease = db_.exec("SELECT holder LIKE 'mp-w1/%', expires_at FROM " + s("leadership"));
  const bool saw_dead_lease = dead_lease.at(0, 0) == "t";
  // No session lock: w2 takes the lease once it expires (300 ms after w1's last renewal), in its
  // next maintenance round (100 ms). Measured on the server's clock, from the expiry to the
  // takeover; the slack is a loaded machine's scheduling delay of w2's maintenance thread.
  ASSERT_TRUE(poll_until([&] { return holder() == "mp-w2"; }, 10s))
      << "w2 never became the leader after the leader was killed";
  if (saw_dead_lease) {
    const long gap_ms =
        std::stol(db_.scalar("SELECT (extract(epoch FROM acquired_at - $1::timestamptz) * 1000)::bigint FROM " +
                                 s("leadership"),
                             {dead_lease.at(0, 1)}));
    EXPECT_GE(gap_ms, 0) << "w2 took a lease that had not expired";
    EXPECT_LT(gap_ms, (100ms + k_rescue_slack).count()) << "w2 took the lease " << gap_ms << " ms after it expired";
    std::cout << "killed leader: w2 took the lease " << gap_ms << " ms after it expired\n";
  }
  EXPECT_TRUE(poll_until([&] { return logged(w2, "worker mp-w2 is now the maintenance leader"); }, 5s));
  EXPECT_EQ(scalar_long("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.locktype = 'advisory' AND a.application_name LIKE 'tenure-mp-%'"),
            0)
      << "leadership must not be a session lock";
}

TEST_F(multiprocess_pg, caller_owned_jobs_through_a_killed_process_cancels_and_admin_retries_keep_the_models_properties) {
  // Three processes run caller-owned jobs (business row + complete_in_tx in the caller's
  // transaction; some first attempts roll back and retry) while an admin cancels jobs (available
  // and running ones) and retries some cancelled ones, and one process is killed with SIGKILL
  // with caller transactions open. The trace of the whole run must keep the model's properties,
  // and the business rows must be exactly those of the completing attempts.
  constexpr int k_charges = 2'000;
  db_.exec("CREATE TABLE " + s("orders") + " (job_id bigint NOT NULL, run_lease bigint NOT NULL)");
  record_trace({{s("orders")}});
  db_.exec("SELECT count(*) FROM " + s("enqueue_batch") +
               "(array_fill('charge'::text, ARRAY[$1::int]), array_fill('{}'::jsonb, ARRAY[$1::int]), "
               "array_fill('default'::text, ARRAY[$1::int]), array_fill(2, ARRAY[$1::int]))",
           {std::to_string(k_charges)});
  workers_.reserve(3);
  spawn("w1");
  spawn("w2");
  spawn("w3");
  for (auto& w : workers_) wait_ready(w);
  worker& victim = workers_[1];
  const auto finished = [&] {
    return scalar_long("SELECT count(*) FROM " + s("jobs") + " WHERE state IN ('completed', 'cancelled', 'failed')");
  };
  // The admin: cancels 100 jobs picked at random, alternately among the running and the available
  // ones, and gives every other cancelled job a retry; the victim dies once a third are done.
  constexpr int k_cancels = 100;
  long cancels = 0, cancelled_running = 0, retried = 0;
  bool killed = false;
  const bool drained = poll_until(
      [&] {
        const long done = finished();
        if (cancels < k_cancels) {
          const bool running = cancels % 2 == 0;
          // Once the victim is dead its open attempts are left to the rescue: the admin would
          // otherwise pick them, the only receipts that stay, and cancel every one first.
          const auto pick = db_.exec(running ? "SELECT job_id FROM " + s("receipts") +
                                                   (killed ? " WHERE worker <> 'mp-w2'" : "") + " ORDER BY random() LIMIT 1"
                                             : "SELECT id FROM " + s("ready") + " ORDER BY random() LIMIT 1");
          if (!pick.rows.empty() && db_.scalar("SELECT " + s("cancel_job") + "($1)", {pick.rows[0][0]}) == "t") {
            ++cancels;
            if (running) ++cancelled_running;
            if (cancels % 2 == 0 && db_.scalar("SELECT " + s("retry_job") + "($1)", {pick.rows[0][0]}) == "t") ++retried;
          }
        }
        if (!killed && done >= k_charges / 3) {
          // Frozen, the victim's open attempts stay open; it dies only while it holds some.
          EXPECT_EQ(::kill(victim.pid, SIGSTOP), 0);
          if (scalar_long("SELECT count(*) FROM " + s("receipts") + " WHERE worker = 'mp-w2'") > 0) {
            EXPECT_EQ(::kill(victim.pid, SIGKILL), 0);
            killed = reap(victim, 10s);
          } else {
            EXPECT_EQ(::kill(victim.pid, SIGCONT), 0);
          }
        }
        return killed && done == k_charges && scalar_long("SELECT count(*) FROM " + s("receipts")) == 0;
      },
      90s, 5ms);
  ASSERT_TRUE(killed);
  ASSERT_TRUE(drained) << "states: "
                       << db_.scalar("SELECT string_agg(state || '=' || n, ', ') FROM (SELECT state, count(*) n FROM " +
                                     s("jobs") + " GROUP BY state) x");
  for (auto& w : workers_) {
    if (&w == &victim) continue;
    ASSERT_EQ(::kill(w.pid, SIGTERM), 0);
    ASSERT_TRUE(reap(w, 60s));
    EXPECT_TRUE(exited_with(w, 0)) << w.name << ": " << describe_status(w);
  }
  // Business rows: one per completed job, of its completing attempt; none of a cancelled job.
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("orders")), scalar_long("SELECT count(*) FROM " + s("done") +
                                                                             " WHERE state = 'completed'"));
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("orders") + " o LEFT JOIN " + s("done") +
                        " d ON d.id = o.job_id AND d.run_lease = o.run_lease AND d.state = 'completed' WHERE d.id IS NULL"),
            0);
  const auto tr = expect_trace_holds();
  EXPECT_EQ(tr.business_writes, static_cast<std::size_t>(scalar_long("SELECT count(*) FROM " + s("orders"))));
  EXPECT_EQ(tr.by_who.value("caller", 0), scalar_long("SELECT count(*) FROM " + s("orders")));
  EXPECT_EQ(tr.by_who.value("cancel", 0), cancels);
  EXPECT_GE(tr.by_transition.value("running->cancelled", 0), 1) << "no running attempt was cancelled";
  EXPECT_EQ(tr.by_who.value("admin_retry", 0), retried);
  EXPECT_GE(tr.by_transition.value("running->retryable", 0), 1) << "rolled-back first attempts were retried";
  EXPECT_GE(tr.by_who.value("rescue", 0), 1) << "the killed process's open attempts were rescued; by who: " << tr.by_who.dump()
                                            << "; by transition: " << tr.by_transition.dump();
  std::cout << "caller-owned: " << k_charges << " jobs; cancelled " << cancels << " (picked running: " << cancelled_running
            << "), admin retries "
            << retried << ", rescued " << tr.by_who.value("rescue", 0) << "\n";
}

// ---- queue limits across processes ---------------------------------------------------------------

class queue_limits_mp : public multiprocess_pg {
 protected:
  void SetUp() override {
    multiprocess_pg::SetUp();
    db_.exec("CREATE TABLE " + s("spans") +
             " (job_id bigint NOT NULL, worker text NOT NULL, started_at timestamptz NOT NULL,"
             "  ended_at timestamptz NOT NULL)");
  }
  void enqueue_spans(int n) {
    db_.exec("SELECT count(*) FROM " + s("enqueue_batch") +
                 "(array_fill('span'::text, ARRAY[$1::int]), array_fill('{}'::jsonb, ARRAY[$1::int]), "
                 "array_fill('default'::text, ARRAY[$1::int]), array_fill(2, ARRAY[$1::int]))",
             {std::to_string(n)});
  }
  void start_three() {
    workers_.reserve(3);
    for (const char* name : {"w1", "w2", "w3"}) spawn(name);
    for (auto& w : workers_) wait_ready(w);
  }
  /// SIGTERM to every worker, then each must stop cleanly.
  void stop_all() {
    for (auto& w : workers_) ::kill(w.pid, SIGTERM);
    for (auto& w : workers_) {
      EXPECT_TRUE(reap(w, 30s)) << w.name;
      EXPECT_TRUE(exited_with(w, 0)) << w.name << ": " << describe_status(w);
    }
  }
};

TEST_F(queue_limits_mp, three_processes_never_run_more_than_max_running_attempts_at_once_and_drain_the_queue) {
  constexpr int k_limit = 3, k_span_jobs = 150;
  db_.exec("SELECT " + s("configure_queue") + "('default', '{\"max_running\": 3}')");
  enqueue_spans(k_span_jobs);
  // One attempt at a time per process: the limit of 3 is reached only by the processes together
  // (one process re-claiming every freed slot first left the others nothing).
  ::setenv("TENURE_MP_CONCURRENCY", "1", 1);
  start_three();
  ::unsetenv("TENURE_MP_CONCURRENCY");
  // Sample the queue's open attempts while the three processes drain it.
  long most_open = 0;
  ASSERT_TRUE(poll_until(
      [&] {
        most_open = std::max(most_open, scalar_long("SELECT count(*) FROM " + s("receipts") + " WHERE queue = 'default'"));
        return scalar_long("SELECT count(*) FROM " + s("done")) == k_span_jobs;
      },
      60s, 1ms))
      << "the queue did not drain: " << scalar_long("SELECT count(*) FROM " + s("done")) << " done";
  stop_all();
  EXPECT_LE(most_open, k_limit) << "open attempts sampled above max_running";
  // The spans the handlers recorded: at the start of each, how many were running.
  const long most_running = scalar_long(
      "SELECT max((SELECT count(*) FROM " + s("spans") + " b WHERE b.started_at <= a.started_at AND b.ended_at > a.started_at)) "
      "FROM " + s("spans") + " a");
  EXPECT_LE(most_running, k_limit) << "handlers ran above max_running";
  EXPECT_GE(most_running, 2) << "the limit was never approached: the test proves little";
  EXPECT_EQ(scalar_long("SELECT count(DISTINCT job_id) FROM " + s("spans")), k_span_jobs);
  EXPECT_GE(scalar_long("SELECT count(DISTINCT worker) FROM " + s("spans")), 2) << "one process did all the work";
}

TEST_F(queue_limits_mp, three_processes_claim_within_the_token_bucket_and_reach_about_the_rate) {
  constexpr double k_rate = 20, k_burst = 20;  // the default burst: max(1, rate)
  // Every claimed job with the time its claim refilled the bucket: triggers log the claim's
  // transaction for each receipt opened and for each write of the bucket.
  db_.exec("CREATE TABLE " + s("claim_log") + " (job_id bigint NOT NULL, tx bigint NOT NULL DEFAULT txid_current())");
  db_.exec("CREATE TABLE " + s("bucket_log") + " (tx bigint NOT NULL DEFAULT txid_current(), at timestamptz NOT NULL)");
  db_.exec("CREATE FUNCTION " + s("log_claim") + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO " +
           s("claim_log") + " (job_id) SELECT unnest(NEW.job_ids); RETURN NULL; END $$");
  db_.exec("CREATE TRIGGER log_claim AFTER INSERT ON " + s("claims") + " FOR EACH ROW EXECUTE FUNCTION " +
           s("log_claim") + "()");
  db_.exec("CREATE FUNCTION " + s("log_bucket") + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO " +
           s("bucket_log") + " (at) VALUES (NEW.rate_refilled_at); RETURN NULL; END $$");
  db_.exec("CREATE TRIGGER log_bucket AFTER UPDATE OF rate_refilled_at ON " + s("queues") +
           " FOR EACH ROW WHEN (NEW.rate_refilled_at IS NOT NULL) EXECUTE FUNCTION " + s("log_bucket") + "()");
  db_.exec("SELECT " + s("configure_queue") + "('default', '{\"rate_per_second\": 20}')");
  enqueue_spans(400);  // more than 3 s can take
  start_three();
  ASSERT_TRUE(poll_until(
      [&] {
        return db_.scalar("SELECT coalesce(extract(epoch FROM clock_timestamp() - min(at)), 0) >= 3 FROM " +
                          s("bucket_log")) == "t";
      },
      30s))
      << "no claims";
  stop_all();
  std::vector<double> t;
  for (const auto& row : db_.exec("SELECT extract(epoch FROM b.at) FROM " + s("claim_log") + " c JOIN " + s("bucket_log") +
                                  " b USING (tx) ORDER BY b.at")
                             .rows) {
    t.push_back(std::stod(*row[0]));
  }
  ASSERT_FALSE(t.empty());
  // Over every span [t_i, t_j] of bucket times: at most burst + rate x span claims.
  for (std::size_t i = 0; i < t.size(); ++i) {
    for (std::size_t j = i; j < t.size(); ++j) {
      const double allowed = k_burst + k_rate * (t[j] - t[i]) + 1e-6;
      ASSERT_LE(static_cast<double>(j - i + 1), allowed)
          << (j - i + 1) << " claims within " << (t[j] - t[i]) << " s (claims " << i << ".." << j << ")";
    }
  }
  // And the rate is reached, roughly: beyond the burst, at least half of rate x span.
  const double span = t.back() - t.front();
  EXPECT_GE(span, 2.5);
  EXPECT_GE(static_cast<double>(t.size()) - k_burst, 0.5 * k_rate * span) << t.size() << " claims in " << span << " s";
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("jobs") + " WHERE state IN ('available', 'completed')"), 400);
  EXPECT_EQ(scalar_long("SELECT count(*) FROM " + s("claim_log") + " c WHERE NOT EXISTS (SELECT 1 FROM " + s("bucket_log") +
                        " b WHERE b.tx = c.tx)"),
            0)
      << "every claim wrote the bucket";
}

TEST_F(multiprocess_pg, a_parked_attempt_survives_its_worker_killed_and_is_continued_by_another_process) {
  workers_.reserve(2);
  worker& w1 = spawn("w1");
  const auto id = parked_by(w1, "park");
  ASSERT_FALSE(id.empty());
  // The parked attempt needs nothing of w1: kill it without letting it stop.
  ASSERT_EQ(::kill(w1.pid, SIGKILL), 0);
  ASSERT_TRUE(reap(w1, 10s));
  // A statement w1 sent just before it died (an idle poll's claim) runs on in its session; once it
  // has, nothing of w1 can take the continuation (that case is the next test's).
  ASSERT_TRUE(sessions_gone("w1"));
  const auto cb = db_.scalar("SELECT callback_id FROM " + s("attempt_state") + " WHERE job_id = $1", {id});
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid, '{\"approved\": \"yes\"}')", {cb}), "t");
  EXPECT_EQ(db_.scalar("SELECT state || ':' || attempt FROM " + s("jobs") + " WHERE id = $1", {id}), "available:1");
  worker& w2 = spawn("w2");
  wait_ready(w2);
  ASSERT_TRUE(poll_until(
      [&] { return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id}) == "completed"; }, 30s))
      << "the resumed attempt was not continued by w2";
  // The same attempt (attempt 1) from claim to completion, executed once by each process, the
  // continuation under a new run lease.
  EXPECT_EQ(db_.scalar("SELECT attempt || ':' || (progress->>'approved') FROM " + s("jobs") + " WHERE id = $1", {id}),
            "1:yes");
  EXPECT_EQ(db_.scalar("SELECT string_agg(worker, ',' ORDER BY at) || '/' || count(DISTINCT run_lease) FROM " +
                           s("executions") + " WHERE job_id = $1",
                       {id}),
            "w1,w2/2");
  const auto tr = expect_trace_holds();
  EXPECT_EQ(tr.by_transition.value("waiting_external->available", 0), 1) << "the resume";
  EXPECT_EQ(tr.by_transition.value("available->running", 0), 2) << "the claim, then the continuation";
}

TEST_F(multiprocess_pg, a_continuation_whose_worker_is_killed_is_rescued_and_continued_with_its_payload_elsewhere) {
  workers_.reserve(2);
  worker& w1 = spawn("w1");
  const auto id = parked_by(w1, "park_hold");
  ASSERT_FALSE(id.empty());
  const auto cb = db_.scalar("SELECT callback_id FROM " + s("attempt_state") + " WHERE job_id = $1", {id});
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1::uuid, '{\"approved\": \"yes\"}')", {cb}), "t");
  // w1 continues the attempt and holds it: two executions, the continuation running.
  ASSERT_TRUE(poll_until([&] { return scalar_long("SELECT count(*) FROM " + s("executions") + " WHERE job_id = " + id) == 2; },
                         30s))
      << "w1 never continued the resumed attempt";
  EXPECT_EQ(db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id}), "running");
  // The process dies in the middle of the continuation; another one is started.
  ASSERT_EQ(::kill(w1.pid, SIGKILL), 0);
  ASSERT_TRUE(reap(w1, 10s));
  worker& w2 = spawn("w2");
  wait_ready(w2);
  // w2 rescues the silent continuation (staleness 2 s) and runs it again with the callback's
  // answer, as the next attempt: it completes, and no second callback is registered.
  ASSERT_TRUE(poll_until(
      [&] { return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id}) == "completed"; }, 30s))
      << "the rescued continuation was not continued with its payload: "
      << db_.scalar("SELECT state || ':' || attempt FROM " + s("jobs") + " WHERE id = $1", {id});
  EXPECT_EQ(db_.scalar("SELECT attempt || ':' || (progress->>'approved') FROM " + s("jobs") + " WHERE id = $1", {id}),
            "2:yes");
  EXPECT_EQ(db_.scalar("SELECT string_agg(worker, ',' ORDER BY at) || '/' || count(DISTINCT run_lease) FROM " +
                           s("executions") + " WHERE job_id = $1",
                       {id}),
            "w1,w1,w2/3");
  expect_trace_holds();
}

}  // namespace
}  // namespace tenure::test
