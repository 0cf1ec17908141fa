// `tenure soak`: the orchestrator (see soak.hpp). Producers enqueue in business transactions
// (some rolled back on purpose), worker processes (this binary in its hidden worker mode) run the
// handlers, a resumer answers parked callbacks, a canceller cancels running and waiting jobs, and
// the fault schedule SIGKILLs workers, terminates tenure's backends and restarts the server. Then
// the faults stop, the queue drains, the workers stop and check() judges the records.
#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "cli/pg_session.hpp"
#include "soak/soak.hpp"
#include "trace/trace.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::soak {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }
double rounded(double v) { return static_cast<double>(static_cast<long>(v * 10 + 0.5)) / 10; }

/// The workload's kinds, with their share of the enqueues.
struct kind_share {
  const char* kind;
  int weight;
};
constexpr kind_share k_kinds[] = {
    {"complete", 30}, {"fail", 5},           {"retry", 8},          {"snooze", 8},          {"deadline", 3},
    {"park", 8},      {"park_timeout", 4},   {"cancel_running", 4}, {"cancel_waiting", 4},  {"caller_owned", 16},
};
constexpr int k_rollback_percent = 10;
constexpr int k_producers = 4;
/// Longest an attempt of the workload stays open: the 20 s waits of cancel_running, deadline and
/// cancel_waiting's callback, the 30 s callback of park, plus the rescue bound (staleness 6 s).
constexpr auto k_attempt_limit = 45s;
constexpr auto k_drain_limit = 240s;

std::string random_hex(std::uint64_t seed) {
  std::mt19937_64 rng{seed ^ std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  auto v = rng();
  for (int i = 0; i < 8; ++i, v >>= 4) s += hex[v & 0xf];
  return s;
}

/// /proc/<pid>/status fields, in MB (0 when the process is gone).
double proc_status_mb(pid_t pid, const char* field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  const std::string key = std::string{field} + ":";
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size())) / 1024.0;
  }
  return 0;
}

/// A pg_session that reconnects on the next use after any failure; errors are counted, not thrown.
class session {
 public:
  explicit session(std::string dsn) : dsn_(std::move(dsn)) {}
  std::optional<std::vector<cli::pg_session::row>> query(const std::string& sql,
                                                          const std::vector<std::string>& params = {}) {
    try {
      if (!db_) db_ = std::make_unique<cli::pg_session>(dsn_);
      return db_->query(sql, params, "soak");
    } catch (const std::exception&) {
      db_.reset();
      ++errors;
      return std::nullopt;
    }
  }
  long errors = 0;

 private:
  std::string dsn_;
  std::unique_ptr<cli::pg_session> db_;
};

struct worker_slot {
  pid_t pid = -1;
  int incarnation = 0;
  double peak_rss_mb = 0;  ///< the highest VmHWM of any of its incarnations
};

class soak_run {
 public:
  explicit soak_run(const options& opts) : opts_(opts), n_(names_for("soak_" + random_hex(opts.seed))) {
    char tmpl[] = "/tmp/tenure-soak-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("soak: mkdtemp failed");
    log_dir_ = tmpl;
  }

  nlohmann::json run() {
    setup();
    const auto t0 = clock::now();
    for (std::size_t i = 0; i < slots_.size(); ++i) spawn(i);
    std::vector<std::thread> threads;
    for (int i = 0; i < k_producers; ++i) threads.emplace_back([this, i] { produce(i); });
    std::thread resumer([this] { resume_loop(); });
    std::thread canceller([this] { cancel_loop(); });
    std::thread sampler([this, t0] { sample_loop(t0); });

    fault_loop(t0);  // until the workload's time is up
    producing_ = false;
    for (auto& t : threads) t.join();
    const double workload_s = seconds_since(t0);

    // Drain: every worker alive, no faults, until every committed job is terminal.
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (!alive(i)) spawn(i);
    }
    const auto d0 = clock::now();
    bool drained = false;
    session db{opts_.dsn};
    while (clock::now() - d0 < k_drain_limit) {
      auto rows = db.query("SELECT count(*) FROM " + n_.rec + ".orders o JOIN " + n_.tenure +
                           ".jobs j ON j.id = o.job_id WHERE j.state NOT IN ('completed', 'failed', 'cancelled')");
      if (rows && !rows->empty() && *(*rows)[0][0] == "0") {
        drained = true;
        break;
      }
      std::this_thread::sleep_for(1s);
    }
    const double drain_s = seconds_since(d0);
    running_ = false;
    resumer.join();
    canceller.join();
    sampler.join();
    stop_workers();

    // The jobs of rolled-back transactions, recorded now that nothing else writes.
    {
      std::lock_guard lock{mu_};
      for (std::size_t i = 0; i < rolled_back_.size(); i += 1000) {
        std::string ids = "{";
        for (std::size_t k = i; k < std::min(rolled_back_.size(), i + 1000); ++k) {
          ids += (k > i ? "," : "") + std::to_string(rolled_back_[k]);
        }
        ids += "}";
        if (!db.query("INSERT INTO " + n_.rec + ".rolled_back SELECT unnest($1::bigint[])", {ids})) {
          throw std::runtime_error("soak: cannot record the rolled-back jobs");
        }
      }
    }

    cli::pg_session check_db{opts_.dsn};
    nlohmann::json out;
    out["schema"] = n_.tenure;
    out["seed"] = opts_.seed;
    out["minutes"] = opts_.minutes;
    out["workers"] = opts_.workers;
    out["workload_s"] = rounded(workload_s);
    out["drain_s"] = rounded(drain_s);
    out["drained"] = drained;
    out.update(check(check_db, n_, {.attempt_limit = k_attempt_limit, .slack = 30s}));
    out["producer_errors"] = producer_errors_.load();
    out["callbacks_resumed"] = resumed_.load();
    out["cancels_applied"] = cancels_.load();
    nlohmann::json faults = {{"worker_kills", kills_},
                             {"backend_terminations", terminations_},
                             {"server_restarts", restarts_}};
    if (opts_.restart_command.empty()) faults["skipped"] = {"server_restart: no --restart-command given"};
    out["faults"] = faults;
    nlohmann::json peaks = nlohmann::json::array();
    {
      std::lock_guard lock{mu_};
      for (const auto& s : slots_) peaks.push_back(rounded(s.peak_rss_mb));
    }
    out["worker_peak_rss_mb"] = peaks;
    out["worker_rss_mb"] = rss_samples_;
    out["tables"] = table_samples_;
    // Every transition the run caused, checked against the protocol model's properties.
    auto traced = trace::check_database(opts_.dsn, n_.tenure);
    if (!traced) throw std::runtime_error("soak: cannot read the transition trace: " + traced.error().message());
    out["trace"] = trace::to_json(traced.value(), 5);
    out["trace_violations"] = traced.value().violations.size();
    const bool ok = passed(out) && drained && traced.value().ok();
    out["ok"] = ok;
    out["logs"] = log_dir_;
    if (ok && !opts_.keep_schema) {
      check_db.query("DROP SCHEMA " + n_.rec + " CASCADE", {}, "soak: cleanup");
      check_db.query("DROP SCHEMA " + n_.tenure + " CASCADE", {}, "soak: cleanup");
      std::error_code ec;
      std::filesystem::remove_all(log_dir_, ec);
      out.erase("logs");
    }
    return out;
  }

 private:
  void setup() {
    if (auto m = postgres::migrate(opts_.dsn, n_.tenure); !m) {
      throw std::runtime_error("soak: migrate failed: " + m.error().message());
    }
    cli::pg_session db{opts_.dsn};
    create_records(db, n_);
    // The transition recorder (opt-in triggers): the caller-owned business rows are the effects
    // whose attempts must have completed in the same transaction.
    if (auto t = trace::install(opts_.dsn, n_.tenure, {{.name = n_.rec + ".business"}}); !t) {
      throw std::runtime_error("soak: cannot install the transition recorder: " + t.error().message());
    }
    db.query("CREATE INDEX ON " + n_.rec + ".callbacks (created_at) WHERE resolve = 'resume' AND resolved_at IS NULL",
             {}, "soak: setup");
    slots_.resize(static_cast<std::size_t>(opts_.workers));
  }

  // ---- worker processes --------------------------------------------------------------------
  void spawn(std::size_t i) {
    std::lock_guard lock{mu_};
    auto& s = slots_[i];
    const std::string name = "w" + std::to_string(i + 1) + "-" + std::to_string(++s.incarnation);
    const std::string log = log_dir_ + "/" + name + ".log";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("soak: fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out >= 0) {
        ::dup2(out, 1);
        ::dup2(out, 2);
      }
      ::execl(opts_.self_exe.c_str(), opts_.self_exe.c_str(), "soak", "--worker", name.c_str(), "--database-url",
              opts_.dsn.c_str(), "--schema", n_.tenure.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    s.pid = pid;
  }

  bool alive(std::size_t i) {
    std::lock_guard lock{mu_};
    auto& s = slots_[i];
    if (s.pid <= 0) return false;
    int status = 0;
    if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
      s.pid = -1;
      return false;
    }
    return true;
  }

  void kill_worker(std::size_t i) {
    pid_t pid;
    {
      std::lock_guard lock{mu_};
      pid = slots_[i].pid;
      slots_[i].pid = -1;
    }
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ++kills_;
  }

  void stop_workers() {
    std::vector<pid_t> pids;
    {
      std::lock_guard lock{mu_};
      for (auto& s : slots_) {
        if (s.pid > 0) pids.push_back(s.pid), s.pid = -1;
      }
    }
    for (pid_t pid : pids) ::kill(pid, SIGTERM);
    for (pid_t pid : pids) {
      const auto until = clock::now() + 15s;
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (clock::now() > until) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(50ms);
      }
    }
  }

  // ---- producers -----------------------------------------------------------------------------
  void produce(int index) {
    std::mt19937_64 rng{opts_.seed * 1'000'003 + static_cast<std::uint64_t>(index)};
    int total_weight = 0;
    for (const auto& k : k_kinds) total_weight += k.weight;
    const auto gap = std::chrono::duration<double>(k_producers / std::max(0.1, opts_.rate));
    auto next = clock::now();
    PGconn* conn = nullptr;
    const std::string order_sql = "INSERT INTO " + n_.rec + ".orders (job_id, kind, caller_owned) VALUES ($1, $2, $3)";
    const auto ok = [](PGresult* r) {
      const bool good = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
      PQclear(r);
      return good;
    };
    while (producing_) {
      next += std::chrono::duration_cast<clock::duration>(gap);
      std::this_thread::sleep_until(next);
      if (clock::now() - next > 2s) next = clock::now();  // after an outage, do not burst
      if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
        if (conn) PQfinish(conn);
        const char* keys[] = {"dbname", "application_name", nullptr};
        const char* vals[] = {opts_.dsn.c_str(), "soak-producer", nullptr};
        conn = PQconnectdbParams(keys, vals, 1);
        if (PQstatus(conn) != CONNECTION_OK) {
          ++producer_errors_;
          std::this_thread::sleep_for(200ms);
          continue;
        }
      }
      int pick = static_cast<int>(rng() % static_cast<std::uint64_t>(total_weight));
      const char* kind = k_kinds[0].kind;
      for (const auto& k : k_kinds) {
        if ((pick -= k.weight) < 0) {
          kind = k.kind;
          break;
        }
      }
      const bool rollback = static_cast<int>(rng() % 100) < k_rollback_percent;
      const std::string kind_text = kind;
      const bool caller_owned = kind_text == "caller_owned";
      if (!ok(PQexec(conn, "BEGIN"))) {
        ++producer_errors_;
        continue;
      }
      auto id = tenure::enqueue(conn,
                                {.kind = kind_text,
                                 .args = {{"producer", index}},
                                 .queue = kind_text == "deadline" ? "soak_deadline" : "soak"},
                                {.schema = n_.tenure});
      if (!id) {
        ++producer_errors_;
        PQclear(PQexec(conn, "ROLLBACK"));
        continue;
      }
      const std::string id_text = std::to_string(id.value());
      const char* params[] = {id_text.c_str(), kind, caller_owned ? "true" : "false"};
      if (!ok(PQexecParams(conn, order_sql.c_str(), 3, nullptr, params, nullptr, nullptr, 0))) {
        ++producer_errors_;
        PQclear(PQexec(conn, "ROLLBACK"));
        std::lock_guard lock{mu_};
        rolled_back_.push_back(id.value());  // COMMIT was never sent: the job never existed
        continue;
      }
      if (rollback) {
        PQclear(PQexec(conn, "ROLLBACK"));
        std::lock_guard lock{mu_};
        rolled_back_.push_back(id.value());
        continue;
      }
      // A COMMIT whose reply is lost is in doubt: the order row says whether it committed.
      if (!ok(PQexec(conn, "COMMIT"))) ++producer_errors_;
    }
    if (conn) PQfinish(conn);
  }

  // ---- callbacks and cancels from outside ------------------------------------------------------
  void resume_loop() {
    session db{opts_.dsn};
    while (running_) {
      std::this_thread::sleep_for(200ms);
      auto rows = db.query("SELECT callback_id FROM " + n_.rec +
                           ".callbacks WHERE resolve = 'resume' AND resolved_at IS NULL "
                           "AND created_at < clock_timestamp() - interval '200 milliseconds' ORDER BY created_at LIMIT 200");
      if (!rows) continue;
      for (const auto& row : *rows) {
        auto answer = db.query("SELECT " + n_.tenure + ".resume_callback($1::uuid, '{\"resumed\": true}')", {*row[0]});
        if (!answer) break;
        if ((*answer)[0][0] == "t") ++resumed_;
        db.query("UPDATE " + n_.rec + ".callbacks SET resolved_at = clock_timestamp() WHERE callback_id = $1::uuid",
                 {*row[0]});
      }
    }
  }

  void cancel_loop() {
    session db{opts_.dsn};
    std::set<std::string> done;
    long watermark = 0;
    while (running_) {
      std::this_thread::sleep_for(300ms);
      // Executions commit out of id order: look back past the highest id seen.
      auto rows = db.query("SELECT id, job_id FROM " + n_.rec +
                               ".executions WHERE id > $1 AND outcome IN ('waiting_for_cancel', 'parked_for_cancel') "
                               "AND at < clock_timestamp() - interval '300 milliseconds' ORDER BY id",
                           {std::to_string(std::max(0L, watermark - 2'000))});
      if (!rows) continue;
      for (const auto& row : *rows) {
        watermark = std::max(watermark, std::stol(*row[0]));
        if (done.count(*row[1])) continue;
        auto answer = db.query("SELECT " + n_.tenure + ".cancel_job($1::bigint)", {*row[1]});
        if (!answer) break;
        done.insert(*row[1]);
        if ((*answer)[0][0] == "t") ++cancels_;
      }
    }
  }

  // ---- samples -----------------------------------------------------------------------------------
  void sample_loop(clock::time_point t0) {
    session db{opts_.dsn};
    const auto every = std::chrono::duration_cast<clock::duration>(
        std::chrono::duration<double>(std::clamp(opts_.minutes * 60 / 12, 5.0, 300.0)));
    auto next = clock::now();
    while (running_) {
      std::this_thread::sleep_for(100ms);
      if (clock::now() < next) continue;
      next += every;
      const double t = rounded(seconds_since(t0));
      nlohmann::json rss = nlohmann::json::array();
      {
        std::lock_guard lock{mu_};
        for (auto& s : slots_) {
          const double now_mb = s.pid > 0 ? proc_status_mb(s.pid, "VmRSS") : 0;
          if (s.pid > 0) s.peak_rss_mb = std::max(s.peak_rss_mb, proc_status_mb(s.pid, "VmHWM"));
          rss.push_back(rounded(now_mb));
        }
      }
      rss_samples_.push_back({{"t_s", t}, {"rss_mb", rss}});
      auto rows = db.query(
          "SELECT relname, pg_total_relation_size(relid), n_dead_tup FROM pg_stat_user_tables "
          "WHERE schemaname = $1 ORDER BY 2 DESC LIMIT 5",
          {n_.tenure});
      if (!rows) continue;
      nlohmann::json top = nlohmann::json::array();
      for (const auto& row : *rows) {
        top.push_back({{"table", *row[0]}, {"bytes", std::stol(*row[1])}, {"dead_tuples", std::stol(*row[2])}});
      }
      table_samples_.push_back({{"t_s", t}, {"largest", top}});
    }
  }

  // ---- faults ------------------------------------------------------------------------------------
  void fault_loop(clock::time_point t0) {
    const double total = opts_.minutes * 60;
    const auto interval = [&](double share, double lo, double hi) {
      return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(std::clamp(total * share, lo, hi)));
    };
    const auto kill_every = interval(1.0 / 6, 5, 30);
    const auto terminate_every = interval(1.0 / 8, 4, 20);
    const auto restart_every = interval(1.0 / 2, 10, 120);
    std::mt19937_64 rng{opts_.seed};
    auto next_kill = t0 + kill_every, next_terminate = t0 + terminate_every, next_restart = t0 + restart_every;
    std::vector<std::pair<clock::time_point, std::size_t>> respawns;
    session db{opts_.dsn};
    const auto end = t0 + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(total));
    while (clock::now() < end) {
      std::this_thread::sleep_for(100ms);
      const auto now = clock::now();
      for (auto it = respawns.begin(); it != respawns.end();) {
        if (it->first <= now) {
          spawn(it->second);
          it = respawns.erase(it);
        } else {
          ++it;
        }
      }
      if (now >= next_kill) {
        next_kill += kill_every;
        // Worker 1 is never killed (when there are others), so its memory shows over the whole run.
        const std::size_t i = slots_.size() == 1 ? 0 : 1 + rng() % (slots_.size() - 1);
        if (alive(i)) {
          kill_worker(i);
          respawns.emplace_back(now + std::chrono::milliseconds{500 + rng() % 2000}, i);
        }
      }
      if (now >= next_terminate) {
        next_terminate += terminate_every;
        auto rows = db.query(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'tenure-soak-w%' AND random() < 0.3");
        if (rows && !rows->empty()) terminations_ += std::stol(*(*rows)[0][0]);
      }
      if (!opts_.restart_command.empty() && now >= next_restart && now + 5s < end) {
        next_restart += restart_every;
        // Its output goes to stderr: stdout carries only the JSON line.
        const std::string command = "(" + opts_.restart_command + ") 1>&2";
        if (std::system(command.c_str()) == 0) ++restarts_;
      }
    }
    for (auto& [when, i] : respawns) spawn(i);
  }

  options opts_;
  names n_;
  std::string log_dir_;
  std::mutex mu_;  // slots_, rolled_back_
  std::vector<worker_slot> slots_;
  std::vector<std::int64_t> rolled_back_;
  std::atomic<bool> producing_{true};
  std::atomic<bool> running_{true};
  std::atomic<long> producer_errors_{0}, resumed_{0}, cancels_{0};
  long kills_ = 0, terminations_ = 0, restarts_ = 0;
  nlohmann::json rss_samples_ = nlohmann::json::array();
  nlohmann::json table_samples_ = nlohmann::json::array();
};

}  // namespace

nlohmann::json run(const options& opts) { return soak_run{opts}.run(); }

}  // namespace tenure::soak
