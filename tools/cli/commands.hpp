#pragma once
/// \file
/// The command table. Each command lives in its own cli/<name>.cpp and exposes one registration
/// function that adds its CLI11 subcommand and, in the subcommand's parse callback, sets
/// `ctx.run` to the work to do (so main() runs it after parsing, inside its error handling).
///
/// Adding a command (e.g. `tenure bench`): write cli/bench.cpp with `register_bench`, declare it
/// here, add it to k_commands, and list the file in tools/CMakeLists.txt.
#include <CLI/CLI.hpp>

#include "cli/context.hpp"

namespace tenure::cli {

using registrar = void (*)(CLI::App& app, context& ctx);

void register_migrate(CLI::App& app, context& ctx);
void register_grants(CLI::App& app, context& ctx);
void register_enqueue(CLI::App& app, context& ctx);
void register_status(CLI::App& app, context& ctx);
void register_job(CLI::App& app, context& ctx);
void register_queue(CLI::App& app, context& ctx);
void register_maintain(CLI::App& app, context& ctx);
void register_schedule(CLI::App& app, context& ctx);
void register_doctor(CLI::App& app, context& ctx);
void register_bench(CLI::App& app, context& ctx);
void register_trace(CLI::App& app, context& ctx);
void register_soak(CLI::App& app, context& ctx);
void register_serve(CLI::App& app, context& ctx);  // tools/serve/serve.cpp

/// Every command, in the order `tenure --help` lists them.
inline constexpr registrar k_commands[] = {
    &register_migrate, &register_grants, &register_enqueue, &register_status,
    &register_job,     &register_queue,  &register_schedule, &register_maintain, &register_doctor,
    &register_trace,   &register_bench,  &register_soak,    &register_serve,
};

/// The project's private PostgreSQL (scripts/pg start) when run from a source tree, for commands
/// given no --database-url; command_error otherwise.
std::string private_dsn();

}  // namespace tenure::cli
