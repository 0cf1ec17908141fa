#pragma once
/// \file
/// What every `tenure` command shares: the global options, the failure type that becomes the
/// one-line error, and helpers to reach the database.
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "tenure/postgres/store.hpp"

namespace tenure::cli {

inline constexpr int k_exit_ok = 0;
inline constexpr int k_exit_runtime = 1;  ///< the command ran and failed
inline constexpr int k_exit_usage = 2;    ///< the command line itself is wrong

/// A failure already worded for the user. main() prints it as the single line
/// `tenure: <message>` on stderr and exits with `exit_code`. Commands throw it rather than
/// threading results through every helper: the process ends right after anyway.
class command_error : public std::runtime_error {
 public:
  explicit command_error(const std::string& message, int exit_code = k_exit_runtime)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const noexcept { return exit_code_; }

 private:
  int exit_code_;
};

/// The failure of an adapter call, worded as `<what>: <reason>`. The reason is `detail` when
/// the adapter gave one, else the errc message plus the adapter's last held warning (the only
/// place a store call's SQL error text surfaces). `what` may be empty for errors whose detail
/// already says everything (e.g. "cannot connect to the database: ...").
command_error adapter_error(std::string_view what, const tenure::error& ec);

/// Global options and the chosen command. Filled by CLI11 while parsing.
struct context {
  std::string database_url;       ///< --database-url or DATABASE_URL; empty = not given
  std::string schema = "tenure";  ///< --schema or TENURE_SCHEMA
  int verbosity = 0;              ///< -v: info, -vv: debug
  std::function<int()> run;       ///< set by the parse callback of the command that was chosen

  /// The DSN; a usage command_error when neither --database-url nor DATABASE_URL gave one.
  const std::string& dsn() const;
};

/// Prints `tenure: <message>` on stderr as exactly one line (newlines and tabs become spaces).
void print_failure(std::string_view message);

/// Sets libpq defaults suited to a one-shot command, each only when the user has not set it:
/// a connect timeout (a black-holed host must not hang the shell) and an application name. No
/// startup `options`: connection poolers refuse them.
void apply_libpq_defaults();

/// Opens the store and checks the schema version, or throws a command_error naming why not
/// (unreachable database, not migrated, newer schema).
std::unique_ptr<postgres::store> open_store(const context& ctx);

/// Throws a command_error unless the schema is installed at exactly the version this binary
/// knows. For commands that do not go through the store (status, grants).
void require_current_schema(const context& ctx);

}  // namespace tenure::cli
