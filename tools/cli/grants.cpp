// tenure grant-finalizer|grant-worker|grant-producer|grant-callback|grant-admin ROLE: give an existing role its slice.
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::cli {
namespace {

struct grant_command {
  const char* name;
  postgres::grant_kind kind;
  const char* label;
  const char* help;
};

constexpr grant_command k_grants[] = {
    {"grant-finalizer", postgres::grant_kind::finalizer, "finalizer",
     "Let ROLE finalize attempts in its own transactions: EXECUTE on complete_job only"},
    {"grant-worker", postgres::grant_kind::worker, "worker",
     "Let ROLE run workers: every worker function and SELECT on the jobs view"},
    {"grant-producer", postgres::grant_kind::producer, "producer",
     "Let ROLE enqueue jobs: EXECUTE on enqueue, enqueue_batch and the COPY path (enqueue_copy_target, "
     "enqueue_copied_ready, enqueue_copy_stage, enqueue_copied), INSERT on the job columns of specs "
     "(kind, args, queue, priority, max_attempts, metadata) and USAGE on job_id_seq"},
    {"grant-callback", postgres::grant_kind::callback, "callback",
     "Let ROLE (an external system) resolve callbacks: EXECUTE on resume_callback, "
     "extend_callback, complete_callback and fail_callback"},
    {"grant-admin", postgres::grant_kind::admin, "admin",
     "Let ROLE administer queues and schedules: EXECUTE on pause_queue, resume_queue, configure_queue, "
     "list_queues, schedule_upsert, schedule_remove, list_schedules and cron_next"},
};

int run_grant(const context& ctx, const grant_command& g, const std::string& role) {
  // The adapter checks the version too, but tells a newer schema to "run tenure migrate";
  // this check says "upgrade tenure" instead.
  if (auto reserved = postgres::ungrantable_role_reason(role); !reserved.empty()) {
    throw command_error("cannot grant " + std::string{g.label} + " access: " + reserved, k_exit_usage);
  }
  require_current_schema(ctx);
  auto granted = postgres::grant(ctx.dsn(), g.kind, role, ctx.schema);
  if (!granted) {
    throw adapter_error("cannot grant " + std::string{g.label} + " access to role \"" + role + "\"",
                        granted.error());
  }
  std::cout << "granted " << g.label << " access on schema " << ctx.schema << " to role " << role << '\n';
  return k_exit_ok;
}

}  // namespace

void register_grants(CLI::App& app, context& ctx) {
  for (const auto& g : k_grants) {
    auto* cmd = app.add_subcommand(g.name, g.help);
    auto role = std::make_shared<std::string>();
    cmd->add_option("ROLE", *role, "An existing database role")->required();
    cmd->callback([&ctx, &g, role] { ctx.run = [&ctx, &g, role] { return run_grant(ctx, g, *role); }; });
  }
}

}  // namespace tenure::cli
