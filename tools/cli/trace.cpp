// tenure trace install|remove|check: records every committed state transition of the schema's jobs
// (opt-in triggers, tools/trace/recorder.sql) and checks the recorded trace against the
// properties of models/caller_finalization.pml (tools/trace/checker.cpp).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "trace/trace.hpp"

namespace tenure::cli {
namespace {

/// TABLE or TABLE:JOB_COLUMN:LEASE_COLUMN.
trace::business_table parse_business(const std::string& spec) {
  trace::business_table b;
  const auto first = spec.find(':');
  b.name = spec.substr(0, first);
  if (first != std::string::npos) {
    const auto second = spec.find(':', first + 1);
    if (second == std::string::npos) throw command_error("--business " + spec + ": use TABLE or TABLE:JOB_COLUMN:LEASE_COLUMN", k_exit_usage);
    b.job_column = spec.substr(first + 1, second - first - 1);
    b.lease_column = spec.substr(second + 1);
  }
  if (b.name.empty() || b.job_column.empty() || b.lease_column.empty()) {
    throw command_error("--business " + spec + ": use TABLE or TABLE:JOB_COLUMN:LEASE_COLUMN", k_exit_usage);
  }
  return b;
}

int run_install(const context& ctx, const std::vector<std::string>& business) {
  std::vector<trace::business_table> tables;
  for (const auto& spec : business) tables.push_back(parse_business(spec));
  if (auto r = trace::install(ctx.dsn(), ctx.schema, tables); !r) throw adapter_error("cannot install the trace recorder", r.error());
  std::cout << "trace recorder installed in schema " << ctx.schema;
  for (const auto& b : tables) std::cout << "; watching " << b.name << " (" << b.job_column << ", " << b.lease_column << ")";
  std::cout << std::endl;
  return k_exit_ok;
}

int run_remove(const context& ctx) {
  if (auto r = trace::remove(ctx.dsn(), ctx.schema); !r) throw adapter_error("cannot remove the trace recorder", r.error());
  std::cout << "trace recorder removed from schema " << ctx.schema << std::endl;
  return k_exit_ok;
}

int run_check(const context& ctx, std::size_t max_violations) {
  auto r = trace::check_database(ctx.dsn(), ctx.schema);
  if (!r) throw adapter_error("cannot check the trace", r.error());
  std::cout << trace::to_json(r.value(), max_violations).dump(2) << std::endl;
  if (r.value().ok()) return k_exit_ok;
  const auto& first = r.value().violations.front();
  throw command_error(std::to_string(r.value().violations.size()) + " violation(s); the first breaks property " +
                      std::to_string(first.property) + " (" + first.rule + "): " + first.message);
}

}  // namespace

void register_trace(CLI::App& app, context& ctx) {
  auto* cmd = app.add_subcommand("trace", "Record every committed job state transition and check it against the protocol's properties");
  cmd->require_subcommand(1);

  auto business = std::make_shared<std::vector<std::string>>();
  auto* install = cmd->add_subcommand("install", "Install the recorder (triggers on tenure's tables; idempotent)");
  install->add_option("--business", *business,
                      "Also watch a business table whose rows name their attempt (default columns job_id, run_lease)")
      ->type_name("TABLE[:JOB_COLUMN:LEASE_COLUMN]");
  install->callback([&ctx, business] { ctx.run = [&ctx, business] { return run_install(ctx, *business); }; });

  auto* remove = cmd->add_subcommand("remove", "Remove the recorder and the trace it recorded");
  remove->callback([&ctx] { ctx.run = [&ctx] { return run_remove(ctx); }; });

  auto max = std::make_shared<std::size_t>(20);
  auto* check = cmd->add_subcommand("check", "Check the recorded trace; prints a JSON summary, exits 1 on a violation");
  check->add_option("--max-violations", *max, "Violations listed in the summary")->capture_default_str();
  check->callback([&ctx, max] { ctx.run = [&ctx, max] { return run_check(ctx, *max); }; });
}

}  // namespace tenure::cli
