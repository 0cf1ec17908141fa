// `tenure soak`: the orchestrator (see soak.hpp). Producers enqueue in business transactions
// (some rolled back on purpose), worker processes (this binary in its hidden worker mode) run the
// handlers, a resumer answers parked callbacks, a canceller cancels running and waiting jobs, and
// the fault schedule SIGKILLs workers, terminates tenure's backends and restarts the server. Then
// the faults stop, the queue drains, the workers stop and check() judges the records.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "cli/pg_session.hpp"
#include "soak/processes.hpp"
#include "soak/producer.hpp"
#include "soak/soak.hpp"
#include "trace/trace.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/sql_text.hpp"

namespace tenure::soak {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

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

class soak_run {
 public:
  explicit soak_run(const options& opts) : opts_(opts), n_(names_for("soak_" + random_hex(opts.seed))) {
    char tmpl[] = "/tmp/tenure-soak-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("soak: mkdtemp failed");
    log_dir_ = tmpl;
    workers_ = std::make_unique<worker_processes>(opts_, n_, log_dir_, static_cast<std::size_t>(opts_.workers));
  }

  nlohmann::json run() {
    setup();
    const auto t0 = clock::now();
    for (std::size_t i = 0; i < workers_->size(); ++i) workers_->spawn(i);
    std::vector<std::thread> threads;
    for (int i = 0; i < k_producers; ++i) {
      threads.emplace_back([this, i] {
        produce(opts_, n_, {.index = i, .producers = k_producers}, producing_, producer_errors_, rolled_back_,
                bulk_batches_);
      });
    }
    std::thread resumer([this] { resume_loop(); });
    std::thread canceller([this] { cancel_loop(); });
    std::thread sampler([this, t0] { sample_loop(t0); });

    fault_loop(t0);  // until the workload's time is up
    producing_ = false;
    for (auto& t : threads) t.join();
    const double workload_s = seconds_since(t0);

    // Drain: every worker alive, no faults, until every committed job is terminal.
    for (std::size_t i = 0; i < workers_->size(); ++i) {
      if (!workers_->alive(i)) workers_->spawn(i);
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
    workers_->stop_all();

    // The jobs of rolled-back transactions, recorded now that nothing else writes.
    const auto rolled_back = rolled_back_.all();
    for (std::size_t i = 0; i < rolled_back.size(); i += 1000) {
      const std::vector<std::int64_t> part(rolled_back.begin() + static_cast<std::ptrdiff_t>(i),
                                           rolled_back.begin() + static_cast<std::ptrdiff_t>(std::min(rolled_back.size(), i + 1000)));
      if (!db.query("INSERT INTO " + n_.rec + ".rolled_back SELECT unnest($1::bigint[])", {postgres::int_array(part)})) {
        throw std::runtime_error("soak: cannot record the rolled-back jobs");
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
    out["bulk_batches"] = bulk_batches_.load();
    out["callbacks_resumed"] = resumed_.load();
    out["cancels_applied"] = cancels_.load();
    nlohmann::json faults = {{"worker_kills", workers_->kills()},
                             {"backend_terminations", terminations_},
                             {"server_restarts", restarts_}};
    if (opts_.restart_command.empty()) faults["skipped"] = {"server_restart: no --restart-command given"};
    out["faults"] = faults;
    const long crashes = workers_->crashes();
    out["worker_exits"] = workers_->exits();
    out["worker_crashes"] = crashes;
    out["worker_peak_rss_mb"] = workers_->peak_rss_mb();
    out["worker_rss_mb"] = rss_samples_;
    out["tables"] = table_samples_;
    // Every transition the run caused, checked against the protocol model's properties.
    auto traced = trace::check_database(opts_.dsn, n_.tenure);
    if (!traced) throw std::runtime_error("soak: cannot read the transition trace: " + traced.error().message());
    out["trace"] = trace::to_json(traced.value(), 5);
    out["trace_violations"] = traced.value().violations.size();
    const bool ok = passed(out) && drained && traced.value().ok() && crashes == 0;
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
      rss_samples_.push_back({{"t_s", t}, {"rss_mb", workers_->sample_rss_mb()}});
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
      // A worker that ended by itself (say, started while the server was restarting) comes back.
      for (std::size_t i = 0; i < workers_->size(); ++i) {
        const bool pending = std::any_of(respawns.begin(), respawns.end(), [&](const auto& r) { return r.second == i; });
        if (!pending && !workers_->alive(i)) respawns.emplace_back(now + 1s, i);
      }
      for (auto it = respawns.begin(); it != respawns.end();) {
        if (it->first <= now) {
          workers_->spawn(it->second);
          it = respawns.erase(it);
        } else {
          ++it;
        }
      }
      if (now >= next_kill) {
        next_kill += kill_every;
        // Worker 1 is never killed (when there are others), so its memory shows over the whole run.
        const std::size_t i = workers_->size() == 1 ? 0 : 1 + rng() % (workers_->size() - 1);
        if (workers_->alive(i)) {
          workers_->kill(i);
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
    for (auto& [when, i] : respawns) workers_->spawn(i);
  }

  options opts_;
  names n_;
  std::string log_dir_;
  std::unique_ptr<worker_processes> workers_;
  rolled_back_jobs rolled_back_;
  std::atomic<bool> producing_{true};
  std::atomic<bool> running_{true};
  std::atomic<long> producer_errors_{0}, resumed_{0}, cancels_{0}, bulk_batches_{0};
  long terminations_ = 0, restarts_ = 0;
  nlohmann::json rss_samples_ = nlohmann::json::array();
  nlohmann::json table_samples_ = nlohmann::json::array();
};

}  // namespace

nlohmann::json run(const options& opts) { return soak_run{opts}.run(); }

}  // namespace tenure::soak
