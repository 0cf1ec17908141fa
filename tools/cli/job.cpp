// tenure job show ID [--json] | job cancel ID | job retry ID
// tenure job list [--state S] [--queue Q] [--kind K] [--limit N] [--after-id ID] [--json]
// tenure job retry|cancel --state S | --queue Q | --kind K [--dry-run]   (every matching job)
#include <iomanip>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/admin.hpp"
#include "cli/commands.hpp"
#include "cli/number_text.hpp"
#include "cli/pg_session.hpp"
#include "cli/time_text.hpp"

namespace tenure::cli {
namespace {

std::string text_or(const std::optional<std::string>& v) { return v.value_or("0"); }

/// Reads one job; "job N not found" for an unknown id.
job_info read_or_fail(postgres::store& store, std::int64_t id) {
  auto job = store.read_job(id);
  if (!job) {
    if (job.error() == errc::job_not_found) throw command_error("job " + std::to_string(id) + " not found");
    throw adapter_error("cannot read job " + std::to_string(id), job.error());
  }
  return std::move(job).value();
}

void print_json(const job_info& j) {
  std::cout << admin::job_json_text(admin::job_fields(j), j.args, j.metadata, 2) << '\n';
}

void print_text(const job_info& j) {
  auto field = [](const char* name, const std::string& value) {
    std::cout << "  " << std::left << std::setw(14) << name << value << '\n';
  };
  const std::string none = "-";
  std::cout << "job " << j.id << '\n';
  field("kind", j.kind);
  field("queue", j.queue);
  field("state", std::string{to_string(j.state)} + (j.dead_lettered ? " (dead-lettered)" : ""));
  field("args", j.args);
  field("priority", std::to_string(j.priority));
  field("attempt", std::to_string(j.attempt));
  field("max attempts", std::to_string(j.max_attempts));
  field("run lease", std::to_string(j.run_lease));
  field("run at", format_iso8601(j.run_at));
  field("created at", format_iso8601(j.created_at));
  field("finalized at", j.finalized_at ? format_iso8601(*j.finalized_at) : none);
  field("last error", j.last_error.value_or(none));
  field("progress", j.progress.value_or(none));
  field("dead-lettered", j.dead_lettered ? "yes" : "no");
  field("metadata", j.metadata);
  field("unique key", j.unique_key.value_or(none));
}

int run_show(const context& ctx, std::int64_t id, bool json) {
  auto store = open_store(ctx);
  const auto job = read_or_fail(*store, id);
  if (json) {
    print_json(job);
  } else {
    print_text(job);
  }
  return k_exit_ok;
}

int run_cancel(const context& ctx, std::int64_t id) {
  auto store = open_store(ctx);
  const std::string name = "job " + std::to_string(id);
  auto cancelled = store->cancel_job(id);
  if (!cancelled) {
    if (cancelled.error() == errc::job_not_found) throw command_error(name + " not found");
    throw adapter_error("cannot cancel " + name, cancelled.error());
  }
  if (cancelled.value()) {
    std::cout << name << " cancelled\n";
  } else {
    // Not a failure: the job is already where cancel would put it, out of the queue.
    std::cout << name << " not cancelled: it already finished (" << to_string(read_or_fail(*store, id).state)
              << ")\n";
  }
  return k_exit_ok;
}

int run_retry(const context& ctx, std::int64_t id) {
  auto store = open_store(ctx);
  const std::string name = "job " + std::to_string(id);
  auto retried = store->retry_job(id);
  if (!retried) {
    if (retried.error() == errc::job_not_found) throw command_error(name + " not found");
    throw adapter_error("cannot retry " + name, retried.error());
  }
  if (retried.value()) {
    std::cout << name << " will run again: available now, attempts reset\n";
  } else {
    // Not a failure: an unfinished job will run (or is running) anyway.
    std::cout << name << " not retried: it has not finished (" << to_string(read_or_fail(*store, id).state)
              << ")\n";
  }
  return k_exit_ok;
}

// ---- many jobs: list, bulk retry and cancel ------------------------------------------------------

using admin::job_filter;
using admin::where_of;

int run_list(const context& ctx, const job_filter& f, int limit, std::int64_t after_id, bool json) {
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  const auto page = admin::list_jobs(db, ctx.schema, f, limit, after_id);
  if (json) {
    std::cout << admin::to_json(page).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    return k_exit_ok;
  }
  if (page.jobs.empty()) {
    std::cout << "no jobs\n";
    return k_exit_ok;
  }
  for (const auto& r : page.jobs) {
    std::cout << std::left << std::setw(10) << r.id << ' ' << std::setw(16) << (r.state + (r.dead_lettered ? "*" : ""))
              << ' ' << printable(r.queue) << ' ' << printable(r.kind) << " attempt " << r.attempt << '/'
              << r.max_attempts << " created " << r.created_at << '\n';
  }
  if (page.next_after_id) std::cout << "more: --after-id " << *page.next_after_id << '\n';
  return k_exit_ok;
}

/// Retries (or cancels) every job the filter matches among those it applies to (finished jobs
/// for retry, unfinished ones for cancel), newest first, 500 per statement.
int run_bulk(const context& ctx, const job_filter& f, bool retry, bool dry_run) {
  const char* verb = retry ? "retry" : "cancel";
  if (!f.any()) {
    throw command_error(std::string{"job "} + verb + ": give a job ID, or at least one of --state, --queue, --kind",
                        k_exit_usage);
  }
  const std::string applies = retry ? "state IN ('completed', 'failed', 'cancelled')"
                                    : "state IN ('scheduled', 'available', 'running', 'waiting_external', 'retryable')";
  if (!f.state.empty() && (retry ? f.state != "completed" && f.state != "failed" && f.state != "cancelled"
                                 : f.state == "completed" || f.state == "failed" || f.state == "cancelled")) {
    throw command_error(std::string{"job "} + verb + ": --state " + f.state + " matches no job that can be " +
                            (retry ? "retried (completed, failed or cancelled)" : "cancelled (unfinished)"),
                        k_exit_usage);
  }
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  const std::string s = db.quote_ident(ctx.schema);
  std::vector<std::string> params;
  const std::string where = " WHERE " + applies + where_of(f, params);
  if (dry_run) {
    const auto n = db.query("SELECT count(*) FROM " + s + ".jobs" + where, params, "cannot count jobs");
    std::cout << "would " << verb << ' ' << text_or(n[0][0]) << " job(s) (dry run: nothing changed)\n";
    return k_exit_ok;
  }
  long changed = 0, matched = 0;
  std::string below = "9223372036854775807";
  for (;;) {
    auto page_params = params;
    page_params.push_back(below);
    const auto ids = db.query("SELECT coalesce(array_agg(id ORDER BY id DESC), '{}')::text, min(id), count(*) FROM "
                              "(SELECT id FROM " + s + ".jobs" + where + " AND id < $" +
                                  std::to_string(page_params.size()) + "::bigint ORDER BY id DESC LIMIT 500) p",
                              page_params, "cannot list jobs");
    if (!ids[0][1]) break;
    matched += std::stol(text_or(ids[0][2]));
    below = *ids[0][1];
    // A job that finished, started or vanished in between is not counted (false), never an error.
    // CASE: the action runs only for a job that still exists (it raises TN003 otherwise).
    const auto done = db.query("SELECT count(*) FROM unnest($1::bigint[]) u(id) WHERE CASE WHEN EXISTS (SELECT 1 FROM " +
                                   s + ".jobs j WHERE j.id = u.id) THEN " + s + "." + verb + "_job(u.id) ELSE false END",
                               {*ids[0][0]}, std::string{"cannot "} + verb + " jobs");
    changed += std::stol(text_or(done[0][0]));
  }
  std::cout << (retry ? "retried " : "cancelled ") << changed << " job(s)";
  if (matched != changed) std::cout << " (" << matched - changed << " changed state meanwhile and were left)";
  std::cout << (retry ? ": available now, attempts reset\n" : "\n");
  return k_exit_ok;
}

/// Adds `job <name> ID`, filling `id`.
CLI::App* add_id_command(CLI::App& job, const char* name, const char* help, std::int64_t& id) {
  auto* cmd = job.add_subcommand(name, help);
  cmd->add_option("ID", id, "The job id")->required()->check(check_job_id, "ID");
  return cmd;
}

}  // namespace

void register_job(CLI::App& app, context& ctx) {
  auto* job = app.add_subcommand("job", "Inspect or change jobs");
  job->require_subcommand(1);

  struct job_options {
    std::int64_t id = 0;
    bool json = false;
    bool dry_run = false;
    job_filter filter;
    int limit = 50;
    std::int64_t after_id = 0;
  };
  auto o = std::make_shared<job_options>();  // one of the subcommands runs

  auto* show = add_id_command(*job, "show", "Print every field of a job", o->id);
  show->add_flag("--json", o->json, "Print a JSON object");
  show->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_show(ctx, o->id, o->json); }; });

  auto check_state = [](const std::string& text) -> std::string {
    return parse_job_state(text) ? "" : "'" + printable(text) + "' is not a state: scheduled, available, running, "
                                        "waiting_external, retryable, completed, failed or cancelled";
  };
  auto add_filters = [&](CLI::App* cmd) {
    cmd->add_option("--state", o->filter.state, "Only jobs in this state")->check(check_state, "STATE");
    cmd->add_option("--queue", o->filter.queue, "Only jobs of this queue");
    cmd->add_option("--kind", o->filter.kind, "Only jobs of this kind");
  };

  auto* list = job->add_subcommand("list", "List jobs, newest first (keyset pages: --after-id the last id shown)");
  add_filters(list);
  list->add_option("--limit", o->limit, "Jobs per page")
      ->check([](const std::string& t) { return check_integer(t, 1, 10'000); }, "1..10000")
      ->capture_default_str();
  list->add_option("--after-id", o->after_id, "Only jobs older than this id (the next page)")->check(check_job_id, "ID");
  list->add_flag("--json", o->json, "Print a JSON object");
  list->callback([&ctx, o] {
    ctx.run = [&ctx, o] { return run_list(ctx, o->filter, o->limit, o->after_id, o->json); };
  });

  auto* cancel = job->add_subcommand(
      "cancel", "Cancel a job that has not finished (a running attempt is told to stop), or every unfinished job the "
                "filters match");
  cancel->add_option("ID", o->id, "The job id")->check(check_job_id, "ID");
  add_filters(cancel);
  cancel->add_flag("--dry-run", o->dry_run, "Only count the jobs the filters match");
  cancel->callback([&ctx, o] {
    ctx.run = [&ctx, o] {
      if (o->id == 0) return run_bulk(ctx, o->filter, false, o->dry_run);
      if (o->filter.any() || o->dry_run) throw command_error("job cancel: give either an ID or filters", k_exit_usage);
      return run_cancel(ctx, o->id);
    };
  });

  auto* retry = job->add_subcommand(
      "retry", "Run a finished (completed, failed, cancelled, dead-lettered) job again with fresh attempts, or every "
               "finished job the filters match");
  retry->add_option("ID", o->id, "The job id")->check(check_job_id, "ID");
  add_filters(retry);
  retry->add_flag("--dry-run", o->dry_run, "Only count the jobs the filters match");
  retry->callback([&ctx, o] {
    ctx.run = [&ctx, o] {
      if (o->id == 0) return run_bulk(ctx, o->filter, true, o->dry_run);
      if (o->filter.any() || o->dry_run) throw command_error("job retry: give either an ID or filters", k_exit_usage);
      return run_retry(ctx, o->id);
    };
  });
}

}  // namespace tenure::cli
