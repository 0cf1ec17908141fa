#include "cli/context.hpp"

#include <cstdio>
#include <cstdlib>

#include "cli/logging.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::cli {
namespace {

/// libpq prefixes server messages with their severity; the user needs the sentence.
std::string strip_severity(std::string s) {
  for (std::string_view severity : {"ERROR:", "FATAL:", "PANIC:"}) {
    if (s.starts_with(severity)) {
      s.erase(0, severity.size());
      s.erase(0, s.find_first_not_of(' '));
      break;
    }
  }
  return s;
}

std::string reason_for(std::error_code ec) {
  if (ec == errc::commit_in_doubt) {
    return "the connection broke after the request was sent; it may or may not have been applied "
           "(check before retrying)";
  }
  std::string reason = ec.message();
  if (auto held = last_held_warning()) reason += " (" + *held + ")";
  return reason;
}

}  // namespace

command_error adapter_error(std::string_view what, const tenure::error& ec) {
  std::string reason;
  if (ec.detail().empty() || ec == errc::commit_in_doubt) {
    reason = reason_for(ec);
  } else if (ec == errc::database_error) {
    // The server's own words, after what kind of failure it is.
    reason = ec.code().message() + ": " + strip_severity(ec.detail());
  } else {
    reason = strip_severity(ec.detail());
  }
  // The adapter's connect and schema-version failures already read as whole sentences naming
  // the schema; a prefix would only bury the part the user looks for.
  if (what.empty() || ec == errc::schema_mismatch || reason.starts_with("cannot connect to the database")) {
    return command_error(reason);
  }
  return command_error(std::string{what} + ": " + reason);
}

const std::string& context::dsn() const {
  if (database_url.empty()) {
    throw command_error("no database given: pass --database-url URL or set DATABASE_URL", k_exit_usage);
  }
  return database_url;
}

void print_failure(std::string_view message) {
  // libpq messages carry newlines and tab-indented hints; one line must stay one line.
  std::string line = "tenure: ";
  for (char c : message) {
    const bool space = c == ' ' || c == '\n' || c == '\r' || c == '\t';
    if (!space) {
      line += c;
    } else if (line.back() != ' ') {
      line += ' ';
    }
  }
  while (line.back() == ' ') line.pop_back();
  line += '\n';
  std::fputs(line.c_str(), stderr);
}

void apply_libpq_defaults() {
  ::setenv("PGCONNECT_TIMEOUT", "10", /*overwrite=*/0);
  ::setenv("PGAPPNAME", "tenure-cli", /*overwrite=*/0);
  // No startup `options` (PGOPTIONS) of tenure's own: poolers refuse them (pgbouncer: "unsupported
  // startup parameter: options"). Server notices go to the debug log instead.
}

std::unique_ptr<postgres::store> open_store(const context& ctx) {
  postgres::store_options options;
  options.dsn = ctx.dsn();
  options.schema = ctx.schema;
  options.pool_size = 1;  // one statement at a time
  options.application_name = "tenure-cli";
  // A statement or two per run: nothing to gain from preparing them, and nothing is left on a
  // server session, so every command works through a transaction-pooling pooler.
  options.pool_mode = postgres::pool_mode::transaction;
  auto opened = postgres::store::open(std::move(options));
  if (!opened) {
    // The store's details (unreachable, not migrated, newer schema) are whole sentences.
    throw adapter_error("", opened.error());
  }
  return std::move(opened).value();
}

void require_current_schema(const context& ctx) {
  auto installed = postgres::installed_schema_version(ctx.dsn(), ctx.schema);
  if (!installed) {
    throw adapter_error("cannot read the schema version", installed.error());
  }
  const int version = installed.value();
  const int known = postgres::known_schema_version();
  const std::string schema = "tenure schema '" + ctx.schema + "'";
  if (version == 0) throw command_error(schema + " is not installed (run tenure migrate)");
  if (version != known) {
    // Same wording as the store's check, so every command says it the same way.
    throw command_error(schema + " is at version " + std::to_string(version) + " but this binary expects " +
                        std::to_string(known) +
                        (version < known ? " (run tenure migrate)" : " (upgrade tenure)"));
  }
}

}  // namespace tenure::cli
