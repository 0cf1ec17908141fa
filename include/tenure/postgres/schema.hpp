#pragma once
/// \file
/// Installing and checking tenure's PostgreSQL schema, and granting roles their slice of it.
///
/// All functions open their own short connection, block until done, and never throw. On failure
/// they return a tenure::error: its code, and a one-line explanation (with the fix) as its detail.
#include <string>
#include <string_view>
#include <vector>

#include "tenure/result.hpp"
#include "tenure/schema_name.hpp"

namespace tenure::postgres {

/// The newest schema version this binary knows (the number of embedded migrations).
int known_schema_version() noexcept;

/// True for a schema name tenure accepts: tenure::valid_schema_name (tenure/schema_name.hpp),
/// [a-z_][a-z0-9_]{0,53}, so that its notification channels fit PostgreSQL's 63-byte names.
bool valid_schema_name(std::string_view schema) noexcept;

/// Installs or upgrades the schema (default `tenure`) to known_schema_version(). Idempotent:
/// a database already at that version is left untouched. Concurrent migrators serialize on an
/// advisory lock. A database at a newer version is refused with errc::schema_mismatch. A fresh
/// install goes only into a new or empty schema (tenure revokes PUBLIC's rights on everything in
/// its schema): `public`, names starting with `pg_`, and a schema that already holds other
/// objects are refused with errc::invalid_argument before anything is changed. So is, on a fresh
/// install and an upgrade alike, a schema that another role than the one running migrate
/// controls (check_schema_control()).
/// Returns the version before the call (0 = was not installed).
result<int> migrate(std::string_view dsn, std::string_view schema = "tenure");

/// Whether only the connecting role (current_user, the role that runs migrate) controls `schema`:
/// tenure's SECURITY DEFINER functions run with their owner's rights, so a role that could replace
/// them or what they call could act with those rights. errc::invalid_argument, with the reason
/// and the fix as its detail, when the schema is owned by another role (a group role current_user
/// is a member of included); when a role other than superusers and members of the schema's owner
/// holds CREATE on it (directly, through a group, or through PUBLIC); when a table, sequence,
/// view, index, function or type in it is owned by another role; or when a role other than its
/// owner holds TRIGGER on a table in it. Members of current_user are not counted: they can act
/// as it anyway. A schema that does not exist passes. migrate() runs this check before changing
/// anything; a health check can run it on its own.
result<void> check_schema_control(std::string_view dsn, std::string_view schema = "tenure");

/// The installed version (0 when the schema is not installed).
result<int> installed_schema_version(std::string_view dsn, std::string_view schema = "tenure");

/// Roles tenure knows how to grant.
enum class grant_kind {
  finalizer,  ///< USAGE + EXECUTE on complete_job only
  producer,   ///< USAGE + EXECUTE on enqueue, enqueue_batch and the COPY path, INSERT on six columns of ready
  worker,     ///< everything a worker runtime calls, plus SELECT on the jobs view
  callback,   ///< USAGE + EXECUTE on resume/extend/complete/fail_callback (external systems)
  admin,      ///< USAGE + EXECUTE on pause_queue, resume_queue, configure_queue, list_queues, schedule_upsert,
              ///< schedule_remove, list_schedules, cron_next (operators)
};

/// What grant() gives a role of one kind besides USAGE on the schema: EXECUTE on `functions`
/// (name and argument types as SQL spells them, e.g. "complete_job(text, jsonb)"), SELECT on
/// `selects` (a view and a table), INSERT on the columns `inserts` names ("ready.kind"), and
/// USAGE on `sequences`, all in the tenure schema. A health check compares the privileges roles
/// hold with these.
struct grant_list {
  std::vector<std::string> functions;
  std::vector<std::string> selects;
  std::vector<std::string> inserts;
  std::vector<std::string> sequences;
};
grant_list grants_of(grant_kind kind);

/// Why `role` may not be granted tenure's rights, or an empty string when it may: PUBLIC (every
/// role; "public" in any case, as PostgreSQL reads even the quoted name "public" as PUBLIC), the
/// names PostgreSQL reserves (none, current_user, current_role, session_user, in any case), names
/// starting with pg_ (PostgreSQL's predefined roles, in any case), and the empty name.
std::string ungrantable_role_reason(std::string_view role);

/// Grants an existing role its slice. errc::invalid_argument for an unknown role, and, before
/// connecting, for a name ungrantable_role_reason() refuses.
result<void> grant(std::string_view dsn, grant_kind kind, std::string_view role,
                   std::string_view schema = "tenure");

}  // namespace tenure::postgres
