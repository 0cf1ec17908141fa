#pragma once
/// \file
/// Installing and checking tenure's PostgreSQL schema, and granting roles their slice of it.
///
/// All functions open their own short connection, block until done, and never throw. On failure
/// they return an errc and, when `detail` is given, a one-line human explanation in it.
#include <string>
#include <string_view>

#include "tenure/result.hpp"

namespace tenure::postgres {

/// The newest schema version this binary knows (the number of embedded migrations).
int known_schema_version() noexcept;

/// True for a schema name tenure accepts: [a-z_][a-z0-9_]{0,53}. At most 54 characters, so that
/// its notification channels (<schema>_wake, _cancel, _callback) fit PostgreSQL's 63-byte names.
bool valid_schema_name(std::string_view schema) noexcept;

/// Installs or upgrades the schema (default `tenure`) to known_schema_version(). Idempotent:
/// a database already at that version is left untouched. Concurrent migrators serialize on an
/// advisory lock. A database at a newer version is refused with errc::schema_mismatch. A fresh
/// install goes only into a new or empty schema (tenure revokes PUBLIC's rights on everything in
/// its schema): `public`, names starting with `pg_`, and a schema that already holds other
/// objects are refused with errc::invalid_argument before anything is changed.
/// Returns the version before the call (0 = was not installed).
result<int> migrate(std::string_view dsn, std::string_view schema = "tenure",
                    std::string* detail = nullptr);

/// The installed version (0 when the schema is not installed).
result<int> installed_schema_version(std::string_view dsn, std::string_view schema = "tenure",
                                     std::string* detail = nullptr);

/// Roles tenure knows how to grant.
enum class grant_kind {
  finalizer,  ///< USAGE + EXECUTE on complete_job only
  producer,   ///< USAGE + EXECUTE on enqueue and enqueue_batch
  worker,     ///< everything a worker runtime calls, plus SELECT on the jobs view
  callback,   ///< USAGE + EXECUTE on resume/extend/complete/fail_callback (external systems)
};

/// Grants an existing role its slice. errc::invalid_argument for an unknown role.
result<void> grant(std::string_view dsn, grant_kind kind, std::string_view role,
                   std::string_view schema = "tenure", std::string* detail = nullptr);

}  // namespace tenure::postgres
