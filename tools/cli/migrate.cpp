// tenure migrate: install or upgrade the schema.
#include <iostream>

#include "cli/commands.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::cli {
namespace {

int run_migrate(const context& ctx) {
  auto before = postgres::migrate(ctx.dsn(), ctx.schema);
  if (!before) {
    auto e = adapter_error("cannot migrate schema " + ctx.schema, before.error());
    // A schema tenure may not install into is a wrong --schema, as a malformed name is.
    if (before.error() == errc::invalid_argument) throw command_error(e.what(), k_exit_usage);
    throw e;
  }
  const int known = postgres::known_schema_version();
  if (before.value() == known) {
    std::cout << "schema " << ctx.schema << ": already at version " << known << '\n';
  } else {
    std::cout << "schema " << ctx.schema << ": migrated from version " << before.value() << " to " << known
              << '\n';
  }
  return k_exit_ok;
}

}  // namespace

void register_migrate(CLI::App& app, context& ctx) {
  auto* cmd = app.add_subcommand(
      "migrate", "Install or upgrade tenure's schema (idempotent; concurrent runs serialize)");
  cmd->callback([&ctx] { ctx.run = [&ctx] { return run_migrate(ctx); }; });
}

}  // namespace tenure::cli
