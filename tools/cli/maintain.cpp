// tenure maintain [--once | --interval D] [--stale-after SECONDS]: the maintenance leader's passes
// (promotion of due jobs, rescue of stale attempts, pruning of expired finished jobs) from the
// command line, under the same lease as the runtimes' leader. `tenure rescue` is its alias.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/commands.hpp"
#include "cli/number_text.hpp"
#include "cli/pg_session.hpp"
#include "cli/time_text.hpp"

namespace tenure::cli {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true); }

struct maintain_options {
  bool once = false;
  std::string interval;
  double stale_after_seconds = 30.0;
};

/// This process's name for the lease: unique per process, recognizable in the leadership row.
std::string holder_name() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return "tenure-maintain:" + std::string{host} + ":" + std::to_string(::getpid());
}

std::string interval_literal(std::chrono::microseconds d) { return std::to_string(d.count()) + " microseconds"; }

/// Who holds the lease, for the message of a process that is not the leader. Best effort: a role
/// without SELECT on the leadership table gets a shorter message.
std::string current_holder(pg_session& db, const context& ctx) {
  try {
    const auto rows = db.query("SELECT holder, term, round(extract(epoch FROM expires_at - clock_timestamp()), 1) FROM " +
                                   db.quote_ident(ctx.schema) + ".leadership WHERE name = 'maintenance'",
                               {}, "cannot read the maintenance lease");
    if (rows.empty() || !rows[0][0] || !rows[0][1] || !rows[0][2]) return {};
    return " (held by " + printable(*rows[0][0]) + ", term " + *rows[0][1] + ", for another " + *rows[0][2] + "s)";
  } catch (const command_error&) {
    return {};
  }
}

/// One round: ask for the lease, run the fenced pass as its holder. Returns the exit code of a
/// --once run: 0 when the pass ran or another process leads, 1 when the lease was lost mid-pass.
int round(const context& ctx, pg_session& db, postgres::store& store, const std::string& holder,
          std::chrono::microseconds ttl, std::chrono::microseconds stale_after, std::optional<std::int64_t>& term,
          bool& said_standby) {
  const std::string s = db.quote_ident(ctx.schema);
  const auto got = db.query("SELECT " + s + ".acquire_leadership($1, $2::interval)", {holder, interval_literal(ttl)},
                            "cannot ask for the maintenance lease");
  if (got.empty() || !got[0][0]) {
    if (!said_standby) {
      std::cout << "not the maintenance leader: another process holds the lease" << current_holder(db, ctx)
                << "; nothing done" << std::endl;
      said_standby = true;
    }
    term.reset();
    return k_exit_ok;
  }
  const std::int64_t t = std::stoll(*got[0][0]);
  if (!term || *term != t) std::cout << "maintenance leader " << printable(holder) << ", term " << t << std::endl;
  term = t;
  said_standby = false;
  auto rescued = store.maintain(leader_lease{holder, t}, stale_after);
  if (!rescued) {
    if (rescued.error() == errc::leadership_lost) {
      std::cout << "lost the maintenance lease of term " << t << " before the pass ran; nothing changed"
                << std::endl;
      term.reset();
      return k_exit_runtime;
    }
    throw adapter_error("maintenance pass failed", rescued.error());
  }
  const auto& list = rescued.value();
  std::cout << "maintenance pass done: due jobs promoted, expired finished jobs pruned, rescued " << list.size()
            << (list.size() == 1 ? " stale attempt" : " stale attempts") << (list.empty() ? "" : ":") << std::endl;
  for (const auto& r : list) {
    std::cout << "  job " << r.attempt.job_id << " (queue " << printable(r.queue) << ", run lease "
              << r.attempt.run_lease << ") -> " << to_string(r.new_state) << '\n';
  }
  std::cout << std::flush;
  return k_exit_ok;
}

int run_maintain(const context& ctx, const maintain_options& o) {
  using namespace std::chrono;
  auto store = open_store(ctx);
  pg_session db(ctx.dsn());
  const std::string holder = holder_name();
  const auto stale_after = microseconds{std::llround(o.stale_after_seconds * 1e6)};
  std::optional<std::int64_t> term;
  bool said_standby = false;
  auto release = [&] {
    if (!term) return;
    try {
      db.query("SELECT " + db.quote_ident(ctx.schema) + ".release_leadership($1, $2::bigint)",
               {holder, std::to_string(*term)}, "cannot release the maintenance lease");
    } catch (const command_error&) {
      // Best effort: a lease not released expires.
    }
  };

  if (o.interval.empty()) {
    int code = k_exit_ok;
    try {
      code = round(ctx, db, *store, holder, seconds{60}, stale_after, term, said_standby);
    } catch (...) {
      release();
      throw;
    }
    release();
    return code;
  }

  // Every interval, like a runtime's leader: the lease lasts three intervals (at most an hour),
  // so a process that stops (or freezes) hands leadership on within that.
  const auto every = *parse_duration(o.interval);
  const auto ttl = std::min<microseconds>(3 * every, hours{1});
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  while (!g_stop.load()) {
    const auto next = steady_clock::now() + every;
    try {
      round(ctx, db, *store, holder, ttl, stale_after, term, said_standby);
    } catch (const command_error& e) {
      // A database that is away for a while is waited for, as a runtime would.
      std::cerr << "tenure: " << e.what() << std::endl;
      term.reset();
    }
    while (!g_stop.load() && steady_clock::now() < next) std::this_thread::sleep_for(milliseconds{20});
  }
  release();
  std::cout << "stopped" << (term ? "; the maintenance lease is released" : "") << std::endl;
  return k_exit_ok;
}

std::string check_interval(const std::string& text) {
  if (auto reason = check_duration(text); !reason.empty()) return reason;
  if (*parse_duration(text) < std::chrono::milliseconds{100}) return "the interval must be at least 100ms";
  return {};
}

}  // namespace

void register_maintain(CLI::App& app, context& ctx) {
  auto o = std::make_shared<maintain_options>();
  auto* cmd = app.add_subcommand(
      "maintain",
      "Run the maintenance leader's pass (promote due jobs, rescue stale attempts, prune expired finished jobs) "
      "under the maintenance lease: once (--once, the default) or every --interval");
  cmd->alias("rescue");
  auto* once = cmd->add_flag("--once", o->once, "One pass, then release the lease (the default)");
  cmd->add_option("--interval", o->interval, "A pass every D (e.g. 1s, 30s, 5m) until SIGINT or SIGTERM")
      ->type_name("D")
      ->check(check_interval, "D")
      ->excludes(once);
  cmd->add_option("--stale-after", o->stale_after_seconds, "Seconds without a heartbeat before an attempt is stale")
      ->type_name("SECONDS")
      ->check([](const std::string& text) { return check_seconds(text, 100.0 * 365 * 24 * 3600); }, "SECONDS")
      ->capture_default_str();
  cmd->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_maintain(ctx, *o); }; });
}

}  // namespace tenure::cli
