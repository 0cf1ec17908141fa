// The `tenure` command: operate a tenure deployment from a shell.
//
// Contract for every command: success prints to stdout and exits 0; failure prints exactly one
// line `tenure: ...` on stderr and exits 1 (runtime) or 2 (usage). Nothing escapes as an
// exception or a stack trace. Commands live in cli/*.cpp (see cli/commands.hpp).
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "cli/context.hpp"
#include "cli/logging.hpp"
#include "tenure/postgres/schema.hpp"

#ifndef TENURE_VERSION
#define TENURE_VERSION "unknown"
#endif

namespace tenure::cli {
namespace {

std::string version_text() {
  return "tenure " TENURE_VERSION " (schema version " + std::to_string(postgres::known_schema_version()) +
         ")";
}

void add_global_options(CLI::App& app, context& ctx) {
  app.add_option("--database-url", ctx.database_url, "PostgreSQL connection URL or libpq conninfo")
      ->envname("DATABASE_URL");
  app.add_option("--schema", ctx.schema, "Schema tenure lives in")
      ->envname("TENURE_SCHEMA")
      ->capture_default_str()
      ->check(
          [](const std::string& name) -> std::string {
            return postgres::valid_schema_name(name) ? ""
                                                     : "use lower case letters, digits and _ (not first), at most 54 characters";
          },
          "NAME");
  app.add_flag("-v,--verbose", ctx.verbosity, "Log to stderr: -v info, -vv debug");
}

/// Runs the command line; throws only what main() catches below.
int run(int argc, char** argv) {
  context ctx;
  CLI::App app{"tenure: a durable job queue in PostgreSQL", "tenure"};
  app.set_version_flag("--version", version_text());
  app.fallthrough();  // before the commands are added: they inherit it, so global options go anywhere
  app.require_subcommand(1);
  // Inherited by every command, whose own --help does not list the global options.
  app.footer("Global options (--database-url, --schema, -v) go before or after the command.");
  add_global_options(app, ctx);
  for (auto add_command : k_commands) add_command(app, ctx);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: stdout, exit 0
  } catch (const CLI::ParseError& e) {
    // CLI11 would print several lines and exit 1xx; usage errors here are one line and exit 2.
    print_failure(std::string{e.what()} + " (see tenure --help)");
    return k_exit_usage;
  }

  setup_logging(ctx.verbosity);
  apply_libpq_defaults();
  try {
    const int code = ctx.run ? ctx.run() : k_exit_usage;
    // Warnings held back during a successful command are still worth seeing.
    for (const auto& warning : take_held_warnings()) print_failure("warning: " + warning);
    return code;
  } catch (const command_error& e) {
    print_failure(e.what());
    return e.exit_code();
  }
}

}  // namespace
}  // namespace tenure::cli

int main(int argc, char** argv) {
  // Last line of defence: whatever slipped through still ends as one line and exit 1.
  try {
    return tenure::cli::run(argc, argv);
  } catch (const std::exception& e) {
    tenure::cli::print_failure(std::string{"internal error: "} + e.what());
  } catch (...) {
    tenure::cli::print_failure("internal error");
  }
  return tenure::cli::k_exit_runtime;
}
