// tenure bench [--jobs N] [--mode runtime|sql-limit|enqueue-single|caller-owned|prune] [--prune-rows N] [--producers P] [--seconds S]
//              [--rate R] [--metadata JSON]
// Runs an end-to-end scenario on the database (a fresh schema, dropped afterwards) and prints
// one JSON line. Without --database-url / DATABASE_URL it starts the project's private
// PostgreSQL (scripts/pg) when run from a source tree.
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "cli/commands.hpp"
#include "cli/number_text.hpp"

namespace tenure::cli {

std::string private_dsn() {
#ifdef TENURE_SOURCE_DIR
  const std::string script = std::string{TENURE_SOURCE_DIR} + "/scripts/pg start";
  if (FILE* p = ::popen(script.c_str(), "r")) {
    char buf[512] = {0};
    std::string out;
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    if (::pclose(p) == 0) {
      while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
      if (!out.empty()) return out;
    }
  }
#endif
  throw command_error("no database: give --database-url or DATABASE_URL (or run from a source tree with scripts/pg)");
}

void register_bench(CLI::App& app, context& ctx) {
  auto opts = std::make_shared<bench::options>();
  auto* cmd = app.add_subcommand("bench", "Measure throughput and latency on a real database (one JSON line)");
  cmd->add_option("--mode", opts->mode, "runtime | sql-limit | enqueue-single | caller-owned | prune")
      ->check(
          [](const std::string& text) -> std::string {
            for (const char* mode : {"runtime", "sql-limit", "enqueue-single", "caller-owned", "prune"}) {
              if (text == mode) return {};
            }
            return "'" + text + "' is not a mode: must be runtime, sql-limit, enqueue-single, caller-owned or prune";
          },
          "MODE")
      ->capture_default_str();
  cmd->add_option("--jobs", opts->jobs, "Jobs to drain")->check([](const std::string& t) { return check_integer(t, 1, 100'000'000); }, "1..100000000")->capture_default_str();
  cmd->add_option("--producers", opts->producers,
                  "enqueue-single: producer connections; caller-owned: handler threads (own connections)")
      ->check([](const std::string& t) { return check_integer(t, 1, 256); }, "1..256")
      ->capture_default_str();
  cmd->add_option("--seconds", opts->seconds, "enqueue-single: how long producers run")
      ->check([](const std::string& t) { return check_number(t, 0.1, 3600, "seconds"); }, "0.1..3600")
      ->capture_default_str();
  cmd->add_option("--rate", opts->rate,
                  "enqueue-single: jobs/s the producers aim at together (0 = flat out); latency at a given load")
      ->check([](const std::string& t) {
        return check_number(t, 0, 1'000'000, "jobs per second (0 = as fast as they can)");
      }, "0..1000000")
      ->capture_default_str();
  cmd->add_option("--pickup-samples", opts->pickup_samples, "runtime: low-load pickup samples")
      ->check([](const std::string& t) { return check_integer(t, 1, 100'000); }, "1..100000")
      ->capture_default_str();
  cmd->add_option("--enqueue-batch", opts->enqueue_batch,
                  "runtime: jobs per transaction of the caller's bulk enqueue paths (arrays and COPY), timed side by side")
      ->check([](const std::string& t) { return check_integer(t, 1, 1'000'000); }, "1..1000000")
      ->capture_default_str();
  cmd->add_option("--waiting", opts->waiting,
                  "runtime: jobs enqueued first into another queue, left waiting through the drain and the pickups")
      ->check([](const std::string& t) { return check_integer(t, 0, 100'000'000); }, "0..100000000")
      ->capture_default_str();
  cmd->add_option("--drain-enqueue", opts->drain_enqueue,
                  "runtime: how the drained jobs are enqueued: copy (run rows of 200 ids) or arrays (a ready row per job)")
      ->check(CLI::IsMember({"copy", "arrays"}))
      ->capture_default_str();
  cmd->add_option("--reclaim-dead-rows", opts->reclaim_dead_rows,
                  "every runtime's reclaim_dead_rows (0: the leader never vacuums; default: the runtime's)")
      ->check([](const std::string& t) { return check_integer(t, 0, 1'000'000'000); }, "0..1000000000");
  cmd->add_option("--workers", opts->workers, "sql-limit: connections")->check([](const std::string& t) { return check_integer(t, 1, 64); }, "1..64")->capture_default_str();
  cmd->add_option("--prune-rows", opts->prune_rows, "prune: expired finished jobs the leader deletes during the drain")
      ->check([](const std::string& t) { return check_integer(t, 1, 100'000'000); }, "1..100000000")
      ->capture_default_str();
  auto metadata_text = std::make_shared<std::string>();
  cmd->add_option("--metadata", *metadata_text, "runtime: metadata (a JSON object) every job carries")
      ->check([](const std::string& t) -> std::string {
        const auto v = nlohmann::json::parse(t, nullptr, /*allow_exceptions=*/false);
        return v.is_object() ? std::string{} : "must be a JSON object";
      }, "JSON");
  cmd->add_flag("--keep-schema", opts->keep_schema, "Keep the bench schema for inspection");
  cmd->add_flag("--separate-commit", opts->separate_commit,
                "caller-owned: handlers call complete_in_tx, then COMMIT (two round trips), not complete_and_commit");
  cmd->add_option("--max-concurrency", opts->max_concurrency,
                  "caller-owned: the queue's max_concurrency, attempts claimed at once (0 = six per handler thread)")
      ->check([](const std::string& t) { return check_integer(t, 0, 100'000); }, "0..100000")
      ->capture_default_str();
  cmd->add_flag("--checkpoint-first", opts->checkpoint_first,
                "runtime: CHECKPOINT before the run, so that no earlier run's checkpoint writes through it");
  cmd->add_flag("--notify-always", opts->notify_always,
                "enqueue-single: every enqueue pays for a NOTIFY (the per-commit design, for comparison)");
  cmd->callback([&ctx, opts, metadata_text] {
    if (!metadata_text->empty()) opts->metadata = nlohmann::json::parse(*metadata_text);
    ctx.run = [&ctx, opts] {
      opts->dsn = ctx.database_url.empty() ? private_dsn() : ctx.database_url;
      try {
        std::cout << bench::run(*opts).dump() << std::endl;
      } catch (const command_error&) {
        throw;
      } catch (const std::exception& e) {
        throw command_error(e.what());
      }
      return k_exit_ok;
    };
  });
}

}  // namespace tenure::cli
