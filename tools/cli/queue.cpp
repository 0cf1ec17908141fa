// tenure queue list [--json] | queue pause QUEUE | queue resume QUEUE
// tenure queue configure QUEUE [--retain-completed D] [--retain-cancelled D] [--retain-failed D]
//                              [--dead-letter on|off] [--hard-deadline D|none] [--backoff-base D]
//                              [--backoff-cap D] [--max-running N|none] [--rate-per-second R|none]
//                              [--rate-burst B|none] [--priority-aging D|none]
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/admin.hpp"
#include "cli/commands.hpp"
#include "cli/number_text.hpp"
#include "cli/pg_session.hpp"
#include "cli/time_text.hpp"

namespace tenure::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

using admin::queue_row;

std::vector<queue_row> read_queues(const context& ctx) {
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  return admin::read_queues(db, ctx.schema);
}

std::string setting_text(const ordered_json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "on" : "off";
  if (v.is_null()) return "none";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string age_text(std::optional<double> seconds) {
  if (!seconds) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", *seconds);
  return buf;
}

void print_settings_line(const ordered_json& settings) {
  std::string line;
  for (const auto& [key, value] : settings.items()) {
    line += (line.empty() ? "" : ", ") + key + " " + setting_text(value);
  }
  std::cout << "  settings  " << line << '\n';
}

int run_list(const context& ctx, bool json) {
  const auto queues = read_queues(ctx);
  if (json) {
    ordered_json out;
    out["schema"] = ctx.schema;
    out["queues"] = ordered_json::array();
    for (const auto& q : queues) out["queues"].push_back(admin::to_json(q));
    // A queue name is user data: invalid UTF-8 becomes U+FFFD instead of an exception.
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    return k_exit_ok;
  }
  if (queues.empty()) {
    std::cout << "no queues in schema " << ctx.schema << '\n';
    return k_exit_ok;
  }
  for (const auto& q : queues) {
    std::cout << "queue " << printable(q.name) << (q.paused ? "  PAUSED" : "  running") << '\n';
    std::string jobs;
    for (const auto& [state, n] : q.counts.items()) jobs += (jobs.empty() ? "" : ", ") + state + " " + n.dump();
    std::cout << "  jobs      " << jobs << '\n';
    std::cout << "  oldest available job  " << age_text(q.oldest_available_seconds) << '\n';
    print_settings_line(q.settings);
  }
  return k_exit_ok;
}

/// Runs one administration function; a value the database refuses (SQLSTATE class 22, e.g. a
/// backoff cap below the base) is the command line's fault: exit 2 with the server's words.
std::vector<pg_session::row> admin_call(const context& ctx, const std::string& call, const std::vector<std::string>& params,
                                        const std::string& what) {
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  try {
    return db.query("SELECT " + db.quote_ident(ctx.schema) + "." + call, params, what);
  } catch (const command_error& e) {
    if (db.last_sqlstate().starts_with("22")) throw command_error(e.what(), k_exit_usage);
    throw;
  }
}

int run_pause(const context& ctx, const std::string& queue, bool pause) {
  const std::string name = "queue " + printable(queue);
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  bool changed = false;
  try {
    changed = admin::set_paused(db, ctx.schema, queue, pause);
  } catch (const command_error& e) {
    // A name the database refuses is the command line's fault.
    if (db.last_sqlstate().starts_with("22")) throw command_error(e.what(), k_exit_usage);
    throw;
  }
  if (pause) {
    std::cout << name << (changed ? " paused: no worker claims its jobs until it is resumed" : " was already paused")
              << '\n';
  } else {
    std::cout << name << (changed ? " resumed" : " was not paused") << '\n';
  }
  return k_exit_ok;
}

struct configure_options {
  std::string queue;
  std::string retain_completed, retain_cancelled, retain_failed, dead_letter, hard_deadline, backoff_base,
      backoff_cap;
  std::string max_running, rate_per_second, rate_burst, priority_aging;  // "none" clears
};

int run_configure(const context& ctx, const configure_options& o) {
  // The settings as configure_queue reads them: durations in whole microseconds, exactly.
  ordered_json settings = ordered_json::object();
  auto duration = [](const std::string& text) {  // checked by CLI11 already
    return ordered_json(std::to_string(parse_duration(text)->count()) + "us");
  };
  if (!o.dead_letter.empty()) settings["dead_letter"] = o.dead_letter == "on";
  if (!o.hard_deadline.empty()) settings["hard_deadline"] = o.hard_deadline == "none" ? ordered_json() : duration(o.hard_deadline);
  if (!o.backoff_base.empty()) settings["backoff_base"] = duration(o.backoff_base);
  if (!o.backoff_cap.empty()) settings["backoff_cap"] = duration(o.backoff_cap);
  if (!o.retain_completed.empty()) settings["retain_completed"] = duration(o.retain_completed);
  if (!o.retain_cancelled.empty()) settings["retain_cancelled"] = duration(o.retain_cancelled);
  if (!o.retain_failed.empty()) settings["retain_failed"] = duration(o.retain_failed);
  // Limits and aging: "none" is JSON null (clears); numbers were checked by CLI11 already.
  auto none_or = [](const std::string& text, auto value) { return text == "none" ? ordered_json() : ordered_json(value(text)); };
  if (!o.max_running.empty()) settings["max_running"] = none_or(o.max_running, [](const std::string& t) { return std::stoll(t); });
  if (!o.rate_per_second.empty()) settings["rate_per_second"] = none_or(o.rate_per_second, [](const std::string& t) { return std::stod(t); });
  if (!o.rate_burst.empty()) settings["rate_burst"] = none_or(o.rate_burst, [](const std::string& t) { return std::stod(t); });
  if (!o.priority_aging.empty()) settings["priority_aging"] = o.priority_aging == "none" ? ordered_json() : duration(o.priority_aging);
  if (settings.empty()) {
    throw command_error(
        "nothing to change: give at least one of --retain-completed, --retain-cancelled, --retain-failed, "
        "--dead-letter, --hard-deadline, --backoff-base, --backoff-cap, --max-running, --rate-per-second, "
        "--rate-burst, --priority-aging",
        k_exit_usage);
  }
  const std::string name = "queue " + printable(o.queue);
  const auto rows = admin_call(ctx, "configure_queue($1, $2::jsonb)::text", {o.queue, settings.dump()},
                               "cannot configure " + name);
  std::cout << name << " configured\n";
  if (!rows.empty()) print_settings_line(admin::ordered_settings(rows[0][0]));
  return k_exit_ok;
}

std::string check_on_off(const std::string& text) {
  return text == "on" || text == "off" ? "" : "'" + printable(text) + "' must be on or off";
}

std::string check_deadline(const std::string& text) {
  if (text == "none") return {};
  if (auto reason = check_duration(text); !reason.empty()) return reason + " (or none)";
  if (parse_duration(text)->count() == 0) return "a hard deadline must be positive (or none, for no deadline)";
  return {};
}

std::string check_aging(const std::string& text) {
  if (text == "none") return {};
  if (auto reason = check_duration(text); !reason.empty()) return reason + " (or none)";
  if (parse_duration(text)->count() == 0) return "priority aging must be positive (or none, for no aging)";
  return {};
}

std::string check_max_running(const std::string& text) {
  if (text == "none") return {};
  if (auto reason = check_integer(text, 1, 2147483647); !reason.empty()) return reason + " (or none)";
  return {};
}

/// A rate or burst: a plain number from `min` (exclusive when `min` is 0) to 1,000,000, or none.
std::string check_rate(const std::string& text, double min, const std::string& unit) {
  if (text == "none") return {};
  if (auto reason = check_number(text, min, 1'000'000, unit); !reason.empty()) return reason + " (or none)";
  if (std::stod(text) <= 0) return "'" + text + "' must be positive (or none, for no limit)";
  return {};
}

}  // namespace

void register_queue(CLI::App& app, context& ctx) {
  auto* queue = app.add_subcommand("queue", "List, pause, resume and configure queues");
  queue->require_subcommand(1);

  auto json = std::make_shared<bool>(false);
  auto* list = queue->add_subcommand("list", "Every queue: paused or not, its settings, jobs per state, oldest available job");
  list->add_flag("--json", *json, "Print a JSON object");
  list->callback([&ctx, json] { ctx.run = [&ctx, json] { return run_list(ctx, *json); }; });

  auto name = std::make_shared<std::string>();
  auto* pause = queue->add_subcommand("pause", "Stop workers claiming the queue's jobs (running attempts finish)");
  pause->add_option("QUEUE", *name, "The queue")->required();
  pause->callback([&ctx, name] { ctx.run = [&ctx, name] { return run_pause(ctx, *name, true); }; });
  auto* resume = queue->add_subcommand("resume", "Let workers claim the queue's jobs again (sleeping workers wake at once)");
  resume->add_option("QUEUE", *name, "The queue")->required();
  resume->callback([&ctx, name] { ctx.run = [&ctx, name] { return run_pause(ctx, *name, false); }; });

  auto o = std::make_shared<configure_options>();
  auto* configure = queue->add_subcommand("configure", "Change a queue's settings (those not given keep their value)");
  configure->add_option("QUEUE", o->queue, "The queue")->required();
  auto duration_option = [&](const char* flag, std::string& target, const char* help) {
    configure->add_option(flag, target, help)->type_name("D")->check(check_duration, "D");
  };
  duration_option("--retain-completed", o->retain_completed, "Keep completed jobs this long (default 24h)");
  duration_option("--retain-cancelled", o->retain_cancelled, "Keep cancelled jobs this long (default 24h)");
  duration_option("--retain-failed", o->retain_failed, "Keep failed and dead-lettered jobs this long (default 7d)");
  duration_option("--backoff-base", o->backoff_base, "First retry delay (default 1s)");
  duration_option("--backoff-cap", o->backoff_cap, "Longest retry delay (default 1h)");
  configure->add_option("--dead-letter", o->dead_letter, "Failed jobs go to the dead-letter table: on or off")
      ->type_name("on|off")
      ->check(check_on_off, "on|off");
  configure->add_option("--hard-deadline", o->hard_deadline, "Rescue attempts running longer than D (none: no limit)")
      ->type_name("D|none")
      ->check(check_deadline, "D|none");
  configure->add_option("--max-running", o->max_running, "Attempts of the queue running at once, all processes (none: no limit)")
      ->type_name("N|none")
      ->check(check_max_running, "N|none");
  configure->add_option("--rate-per-second", o->rate_per_second, "Claims per second, all processes; may be fractional (none: no limit)")
      ->type_name("R|none")
      ->check([](const std::string& t) { return check_rate(t, 0, "claims per second"); }, "R|none");
  configure->add_option("--rate-burst", o->rate_burst, "Claims the rate allows at once after a quiet spell (none: max(1, rate))")
      ->type_name("B|none")
      ->check([](const std::string& t) { return check_rate(t, 1, "claims"); }, "B|none");
  configure->add_option("--priority-aging", o->priority_aging, "An available job gains one priority level per D waited (none: no aging)")
      ->type_name("D|none")
      ->check(check_aging, "D|none");
  configure->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_configure(ctx, *o); }; });
}

}  // namespace tenure::cli
