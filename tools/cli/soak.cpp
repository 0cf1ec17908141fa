// tenure soak --minutes M [--workers N] [--restart-command CMD] [--seed S] [--rate R] [--keep-schema]
// Runs a mixed workload under faults against a real server, drains it and prints one JSON line
// of figures; exits 1 when a must-be-0 figure is not 0 (see soak/soak.hpp and README "Soak").
// `tenure soak --worker NAME --schema S` (hidden) is one of the worker processes it spawns.
#include <unistd.h>

#include <climits>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/number_text.hpp"
#include "soak/soak.hpp"

namespace tenure::cli {

void register_soak(CLI::App& app, context& ctx) {
  auto opts = std::make_shared<soak::options>();
  auto worker = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "soak",
      "Run a mixed workload under faults (workers SIGKILLed, backends terminated, server restarts), drain it, "
      "and print one JSON line; exit 1 when a job was lost or finalized twice (README: Soak)");
  cmd->add_option("--minutes", opts->minutes, "How long the workload and the faults run (a drain follows)")
      ->check([](const std::string& t) { return check_number(t, 0.1, 24 * 60, "minutes"); }, "0.1..1440")
      ->capture_default_str();
  cmd->add_option("--workers", opts->workers, "Worker processes")
      ->check([](const std::string& t) { return check_integer(t, 1, 16); }, "1..16")
      ->capture_default_str();
  cmd->add_option("--restart-command", opts->restart_command,
                  "Shell command that restarts the server (e.g. 'scripts/pg restart'); without it that fault is skipped");
  cmd->add_option("--seed", opts->seed, "Seed of the workload mix and the fault schedule")->capture_default_str();
  cmd->add_option("--rate", opts->rate, "Jobs per second the producers aim at together")
      ->check([](const std::string& t) { return check_number(t, 0.1, 10'000, "jobs per second"); }, "0.1..10000")
      ->capture_default_str();
  cmd->add_flag("--keep-schema", opts->keep_schema, "Keep the run's schemas even when every check passed");
  cmd->add_option("--worker", *worker, "")->group("");  // hidden: the worker process mode
  cmd->callback([&ctx, opts, worker] {
    ctx.run = [&ctx, opts, worker] {
      if (!worker->empty()) {
        if (ctx.database_url.empty()) throw command_error("soak --worker needs --database-url");
        return soak::worker_main(ctx.database_url, ctx.schema, *worker);
      }
      opts->dsn = ctx.database_url.empty() ? private_dsn() : ctx.database_url;
      char exe[PATH_MAX] = {0};
      const auto len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
      if (len <= 0) throw command_error("soak: cannot find its own executable");
      opts->self_exe.assign(exe, static_cast<std::size_t>(len));
      nlohmann::json out;
      try {
        out = soak::run(*opts);
      } catch (const command_error&) {
        throw;
      } catch (const std::exception& e) {
        throw command_error(e.what());
      }
      std::cout << out.dump() << std::endl;
      if (!out.at("ok").get<bool>()) {
        std::string failed;
        for (const auto& key : soak::must_be_zero()) {
          if (out.at(key).get<long>() != 0) failed += " " + key + "=" + std::to_string(out.at(key).get<long>());
        }
        if (!out.at("drained").get<bool>()) failed += " drained=false";
        if (out.value("trace_violations", 0L) != 0) {
          failed += " trace_violations=" + std::to_string(out.at("trace_violations").get<long>());
        }
        throw command_error("soak: checks failed:" + failed + " (records kept in schema " +
                            out.at("schema").get<std::string>() + "_rec)");
      }
      return k_exit_ok;
    };
  });
}

}  // namespace tenure::cli
