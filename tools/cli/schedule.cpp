// tenure schedule add NAME --cron EXPR --kind K [--args JSON] [--queue Q] [--timezone TZ]
// tenure schedule remove NAME | schedule list [--json]
// Every command only calls SQL (schedule_upsert, schedule_remove, list_schedules): the database
// parses cron expressions and computes the slots.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/admin.hpp"
#include "cli/commands.hpp"
#include "cli/pg_session.hpp"
#include "cli/time_text.hpp"

namespace tenure::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

/// `YYYY-MM-DDTHH:MM:SSZ` of a timestamptz column, in SQL.
std::string iso(const std::string& column) {
  return "to_char(" + column + " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')";
}

struct add_options {
  std::string name, cron, kind, args = "{}", queue = "default", timezone = "UTC";
};

int run_add(const context& ctx, const add_options& o) {
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  const std::string label = "schedule " + printable(o.name);
  std::vector<pg_session::row> rows;
  try {
    rows = db.query("SELECT " + iso("u.next_slot") + ", u.created, to_char(u.next_slot AT TIME ZONE $6, " +
                        "'YYYY-MM-DD HH24:MI') FROM " + db.quote_ident(ctx.schema) +
                        ".schedule_upsert($1, $2, $3, $4::jsonb, $5, $6) u",
                    {o.name, o.cron, o.kind, o.args, o.queue, o.timezone}, "cannot save " + label);
  } catch (const command_error& e) {
    if (db.last_sqlstate().starts_with("22")) throw command_error(e.what(), k_exit_usage);
    throw;
  }
  const auto& r = rows.at(0);
  std::cout << label << (r[1] == "t" ? " created" : " updated");
  if (r[0]) {
    std::cout << "; next run " << *r[0] << " (" << *r[2] << " " << printable(o.timezone) << ")\n";
  } else {
    std::cout << "; it has no next run\n";
  }
  return k_exit_ok;
}

int run_remove(const context& ctx, const std::string& name) {
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  const auto rows = db.query("SELECT " + db.quote_ident(ctx.schema) + ".schedule_remove($1)", {name},
                             "cannot remove schedule " + printable(name));
  if (rows.at(0)[0] != "t") {
    throw command_error("schedule " + printable(name) + " not found");
  }
  std::cout << "schedule " << printable(name) << " removed (jobs it enqueued stay)\n";
  return k_exit_ok;
}

struct schedule_row {
  std::string name, cron, kind, args, queue, timezone;
  std::optional<std::string> next_run, next_local, last_run, last_enqueued_at, last_job_id, last_error;
  std::string created_at, updated_at;
};

std::vector<schedule_row> read_schedules(const context& ctx) {
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  const auto rows = db.query(
      "SELECT name, cron, kind, args::text, queue, timezone, " + iso("next_slot") +
          ", to_char(next_slot AT TIME ZONE timezone, 'YYYY-MM-DD HH24:MI'), " + iso("last_slot") + ", " +
          iso("last_enqueued_at") + ", last_job_id::text, last_error, " + iso("created_at") + ", " +
          iso("updated_at") + " FROM " + db.quote_ident(ctx.schema) + ".list_schedules()",
      {}, "cannot list schedules");
  std::vector<schedule_row> out;
  for (const auto& r : rows) {
    out.push_back({.name = r[0].value_or(""),
                   .cron = r[1].value_or(""),
                   .kind = r[2].value_or(""),
                   .args = r[3].value_or("{}"),
                   .queue = r[4].value_or(""),
                   .timezone = r[5].value_or(""),
                   .next_run = r[6],
                   .next_local = r[7],
                   .last_run = r[8],
                   .last_enqueued_at = r[9],
                   .last_job_id = r[10],
                   .last_error = r[11],
                   .created_at = r[12].value_or(""),
                   .updated_at = r[13].value_or("")});
  }
  return out;
}

ordered_json optional_text(const std::optional<std::string>& v) { return v ? ordered_json(*v) : ordered_json(); }

int run_schedule_list(const context& ctx, bool json) {
  const auto schedules = read_schedules(ctx);
  if (json) {
    // args is spliced in as jsonb's own text (never parsed: a number no double holds would
    // change); names, kinds and errors are user data: invalid UTF-8 becomes U+FFFD.
    std::string items;
    for (const auto& s : schedules) {
      ordered_json f;
      f["name"] = s.name;
      f["cron"] = s.cron;
      f["timezone"] = s.timezone;
      f["kind"] = s.kind;
      f["queue"] = s.queue;
      f["args"] = nullptr;
      f["next_run"] = optional_text(s.next_run);
      f["last_run"] = optional_text(s.last_run);
      f["last_enqueued_at"] = optional_text(s.last_enqueued_at);
      f["last_job_id"] = s.last_job_id ? ordered_json(std::stoll(*s.last_job_id)) : ordered_json();
      f["last_error"] = optional_text(s.last_error);
      f["created_at"] = s.created_at;
      f["updated_at"] = s.updated_at;
      items += (items.empty() ? "" : ",") + admin::job_json_text(f, s.args, "{}", -1);
    }
    std::cout << "{\"schema\":" << ordered_json(ctx.schema).dump() << ",\"schedules\":[" << items << "]}\n";
    return k_exit_ok;
  }
  if (schedules.empty()) {
    std::cout << "no schedules in schema " << ctx.schema << '\n';
    return k_exit_ok;
  }
  for (const auto& s : schedules) {
    std::cout << "schedule " << printable(s.name) << "  " << printable(s.cron) << "  (" << printable(s.timezone)
              << ")\n";
    std::cout << "  job       kind " << printable(s.kind) << ", queue " << printable(s.queue) << ", args "
              << printable(s.args) << '\n';
    std::cout << "  next run  "
              << (s.next_run ? *s.next_run + " (" + s.next_local.value_or("") + " " + printable(s.timezone) + ")"
                             : std::string{"none"})
              << '\n';
    std::cout << "  last run  "
              << (s.last_run ? *s.last_run + (s.last_job_id ? " (job " + *s.last_job_id + ")" : std::string{})
                             : std::string{"never"})
              << '\n';
    if (s.last_error) std::cout << "  last error  " << printable(*s.last_error) << '\n';
  }
  return k_exit_ok;
}

}  // namespace

void register_schedule(CLI::App& app, context& ctx) {
  auto* schedule = app.add_subcommand("schedule", "Add, remove and list periodic (cron) schedules");
  schedule->require_subcommand(1);

  auto o = std::make_shared<add_options>();
  auto* add = schedule->add_subcommand("add", "Create or replace a schedule: every slot of EXPR enqueues a job");
  add->add_option("NAME", o->name, "The schedule's name")->required();
  add->add_option("--cron", o->cron, "5-field cron expression: minute hour day-of-month month day-of-week")
      ->type_name("EXPR")
      ->required();
  add->add_option("--kind", o->kind, "The job kind to enqueue")->type_name("K")->required();
  add->add_option("--args", o->args, "Job arguments as a JSON object")->type_name("JSON")->capture_default_str();
  add->add_option("--queue", o->queue, "The queue")->type_name("Q")->capture_default_str();
  add->add_option("--timezone", o->timezone, "Time zone the expression is read in (e.g. Europe/Berlin)")
      ->type_name("TZ")
      ->capture_default_str();
  add->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_add(ctx, *o); }; });

  auto name = std::make_shared<std::string>();
  auto* remove = schedule->add_subcommand("remove", "Remove a schedule (jobs it enqueued stay)");
  remove->add_option("NAME", *name, "The schedule's name")->required();
  remove->callback([&ctx, name] { ctx.run = [&ctx, name] { return run_remove(ctx, *name); }; });

  auto json = std::make_shared<bool>(false);
  auto* list = schedule->add_subcommand("list", "Every schedule with its next and last run");
  list->add_flag("--json", *json, "Print a JSON object");
  list->callback([&ctx, json] { ctx.run = [&ctx, json] { return run_schedule_list(ctx, *json); }; });
}

}  // namespace tenure::cli
