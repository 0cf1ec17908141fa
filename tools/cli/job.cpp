// tenure job show ID [--json] | job cancel ID | job retry ID
#include <iomanip>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/number_text.hpp"
#include "cli/time_text.hpp"

namespace tenure::cli {
namespace {

/// Reads one job; "job N not found" for an unknown id.
job_info read_or_fail(postgres::store& store, std::int64_t id) {
  auto job = store.read_job(id);
  if (!job) {
    if (job.error() == errc::job_not_found) throw command_error("job " + std::to_string(id) + " not found");
    throw adapter_error("cannot read job " + std::to_string(id), job.error());
  }
  return std::move(job).value();
}

/// Stored JSON as a JSON value (the store hands it over as text); the raw text if it is not JSON.
nlohmann::ordered_json json_value(const std::string& text) {
  auto v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? nlohmann::ordered_json(text) : v;
}

void print_json(const job_info& j) {
  nlohmann::ordered_json out;
  out["id"] = j.id;
  out["kind"] = j.kind;
  out["queue"] = j.queue;
  out["state"] = std::string{to_string(j.state)};
  out["args"] = nullptr;  // replaced below by the text the database holds
  out["priority"] = j.priority;
  out["attempt"] = j.attempt;
  out["max_attempts"] = j.max_attempts;
  out["run_lease"] = j.run_lease;
  out["run_at"] = format_iso8601(j.run_at);
  out["created_at"] = format_iso8601(j.created_at);
  out["finalized_at"] = j.finalized_at ? nlohmann::ordered_json(format_iso8601(*j.finalized_at)) : nullptr;
  out["last_error"] = j.last_error ? nlohmann::ordered_json(*j.last_error) : nullptr;
  out["progress"] = j.progress ? json_value(*j.progress) : nullptr;
  out["dead_lettered"] = j.dead_lettered;
  // args go out as the JSON text the database holds (jsonb's own text, which is valid JSON), not
  // through a parse: a number no double holds (1e1000) or an integer past 64 bits would be
  // changed or lost on the way. Members are printed one by one to splice that text in.
  std::string text = "{";
  bool first = true;
  for (const auto& [key, value] : out.items()) {
    text += first ? "\n  " : ",\n  ";
    first = false;
    text += nlohmann::ordered_json(key).dump() + ": ";
    text += key == "args" ? j.args : value.dump();
  }
  text += "\n}";
  std::cout << text << '\n';
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

/// Adds `job <name> ID`, filling `id`.
CLI::App* add_id_command(CLI::App& job, const char* name, const char* help, std::int64_t& id) {
  auto* cmd = job.add_subcommand(name, help);
  cmd->add_option("ID", id, "The job id")->required()->check(check_job_id, "ID");
  return cmd;
}

}  // namespace

void register_job(CLI::App& app, context& ctx) {
  auto* job = app.add_subcommand("job", "Inspect or change one job");
  job->require_subcommand(1);

  struct job_options {
    std::int64_t id = 0;
    bool json = false;
  };
  auto o = std::make_shared<job_options>();  // one of the three subcommands runs

  auto* show = add_id_command(*job, "show", "Print every field of a job", o->id);
  show->add_flag("--json", o->json, "Print a JSON object");
  show->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_show(ctx, o->id, o->json); }; });

  auto* cancel = add_id_command(
      *job, "cancel", "Cancel a job that has not finished (a running attempt is told to stop)", o->id);
  cancel->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_cancel(ctx, o->id); }; });

  auto* retry = add_id_command(
      *job, "retry", "Run a finished (completed, failed, cancelled) job again with fresh attempts", o->id);
  retry->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_retry(ctx, o->id); }; });
}

}  // namespace tenure::cli
