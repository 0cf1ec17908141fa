// tenure enqueue KIND [--args JSON] [--queue Q] [--priority N] [--run-at TIME | --delay SECONDS]
//                     [--max-attempts N] [--metadata JSON] [--unique-key K]
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/number_text.hpp"
#include "cli/time_text.hpp"

namespace tenure::cli {
namespace {

/// A century: far enough for any delay, near enough that microseconds cannot overflow.
constexpr double k_max_seconds = 100.0 * 365 * 24 * 3600;

struct enqueue_options {
  std::string kind;
  std::string args = "{}";
  std::string queue = "default";
  int priority = k_default_priority;
  std::string run_at;
  double delay_seconds = -1;  ///< < 0: not given
  int max_attempts = k_default_max_attempts;
  std::string metadata = "{}";
  std::optional<std::string> unique_key;
};

/// Parses --args or --metadata (`option`): a JSON object; a command_error naming the parse
/// position otherwise.
nlohmann::json parse_object(const std::string& text, const std::string& option) {
  if (auto why = check_json_integers(text); !why.empty()) throw command_error(option + ": " + why);
  nlohmann::json args;
  try {
    args = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range (1e400)
    // what() is "[json.exception.parse_error.101] parse error at line 1, column 6: ..."; the
    // bracketed id means nothing to a user.
    std::string message = e.what();
    if (const auto end = message.find("] ");
        message.starts_with("[json.exception") && end != std::string::npos) {
      message.erase(0, end + 2);
    }
    throw command_error(option + " is not valid JSON: " + message);
  }
  // Handlers read named fields: args and metadata are objects, as the database requires.
  if (!args.is_object()) {
    throw command_error(option + " must be a JSON object (e.g. {\"id\": 42}), not a JSON " + args.type_name());
  }
  return args;
}

std::optional<time_point> run_at_of(const enqueue_options& o) {
  if (!o.run_at.empty()) {
    return parse_iso8601(o.run_at);  // checked while parsing the command line
  }
  if (o.delay_seconds > 0) {
    const auto delay = std::chrono::microseconds{std::llround(o.delay_seconds * 1e6)};
    return std::chrono::time_point_cast<clock_type::duration>(clock_type::now() + delay);
  }
  return std::nullopt;
}

int run_enqueue(const context& ctx, const enqueue_options& o) {
  // Everything the user typed is checked before the database is touched: a bad job writes
  // nothing.
  new_job job;
  job.kind = o.kind;
  job.args = parse_object(o.args, "--args");
  job.metadata = parse_object(o.metadata, "--metadata");
  job.queue = o.queue;
  job.priority = o.priority;
  job.run_at = run_at_of(o);
  job.max_attempts = o.max_attempts;
  job.unique_key = o.unique_key;
  if (auto valid = validate(job); !valid) {
    if (valid.error().detail().starts_with("metadata")) throw command_error("--" + valid.error().detail());
    if (valid.error().detail().starts_with("unique_key")) {
      throw command_error("--unique-key" + valid.error().detail().substr(std::string_view{"unique_key"}.size()));
    }
    throw command_error("invalid job: KIND must be 1.." + std::to_string(k_max_kind_size) +
                        " characters and --queue 1.." + std::to_string(k_max_queue_size) +
                        ", without control characters");
  }

  auto store = open_store(ctx);
  auto done = store->try_enqueue(job);
  if (!done) throw adapter_error("cannot enqueue the job", done.error());
  // Only the id on stdout: `id=$(tenure enqueue ...)` must just work, whoever holds the key.
  std::cout << done.value().id << '\n';
  if (job.unique_key) {
    std::cerr << (done.value().inserted ? "enqueued job " : "not enqueued: live job ") << done.value().id
              << (done.value().inserted ? " holding unique key '" : " holds unique key '") << *job.unique_key
              << "' in queue " << job.queue << '\n';
  }
  return k_exit_ok;
}

}  // namespace

void register_enqueue(CLI::App& app, context& ctx) {
  auto o = std::make_shared<enqueue_options>();
  auto* cmd = app.add_subcommand("enqueue", "Enqueue one job and print its id");
  cmd->add_option("KIND", o->kind, "The job kind (what handler runs it)")->required();
  cmd->add_option("--args", o->args, "Job arguments as JSON")->capture_default_str();
  cmd->add_option("--queue", o->queue, "Queue name")->capture_default_str();
  cmd->add_option("--priority", o->priority, "1 (highest) .. 4 (lowest)")
      ->check([](const std::string& text) { return check_integer(text, k_min_priority, k_max_priority,
                                                                 "1 (highest) to 4 (lowest)"); },
              "1..4")
      ->capture_default_str();
  auto* run_at = cmd->add_option("--run-at", o->run_at,
                                 "Run no earlier than this ISO 8601 time (UTC unless it has an offset)")
                     ->type_name("TIME")
                     ->check(
                         [](const std::string& text) -> std::string {
                           if (parse_iso8601(text)) return {};
                           return "not an ISO 8601 time before 2262 (e.g. 2030-01-31T08:00:00Z or 2030-01-31 "
                                  "09:00+01:00)";
                         },
                         "ISO 8601");
  auto* delay = cmd->add_option("--delay", o->delay_seconds, "Run no earlier than SECONDS from now")
                    ->type_name("SECONDS")
                    ->check([](const std::string& text) { return check_seconds(text, k_max_seconds); }, "SECONDS");
  run_at->excludes(delay);
  cmd->add_option("--max-attempts", o->max_attempts, "Executions before the job fails for good")
      ->check([](const std::string& text) { return check_integer(text, 1, std::numeric_limits<int>::max()); },
              "1..2147483647")
      ->capture_default_str();
  cmd->add_option("--metadata", o->metadata,
                  "Job metadata as a JSON object, e.g. a W3C trace context: {\"traceparent\": \"00-...\"}")
      ->capture_default_str();
  cmd->add_option("--unique-key", o->unique_key,
                  "At most one live job of the queue holds key K: while one does, print its id and enqueue "
                  "nothing (stderr says which happened)")
      ->type_name("K");
  cmd->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_enqueue(ctx, *o); }; });
}

}  // namespace tenure::cli
