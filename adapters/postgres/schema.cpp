#include "tenure/postgres/schema.hpp"


#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "connection.hpp"
#include "migrations.hpp"

namespace tenure::postgres {
namespace {

using detail::connection;
using detail::effect;

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) {
    s.replace(pos, from.size(), to);
  }
}

/// The migration text for one schema. The schema name is validated, so it needs no quoting.
std::string render(const detail::migration& m, std::string_view schema) {
  std::string sql = m.sql;
  replace_all(sql, "@wake_channel@", "'" + std::string{schema} + "_wake'");
  replace_all(sql, "@cancel_channel@", "'" + std::string{schema} + "_cancel'");
  replace_all(sql, "@callback_channel@", "'" + std::string{schema} + "_callback'");
  replace_all(sql, "@schema@", schema);
  return sql;
}

result<int> read_version(connection& c, std::string_view schema) {
  const std::string s{schema};
  auto exists = c.exec_script(
      "SELECT to_regclass(" + c.quote_literal(s + ".schema_version") + ") IS NOT NULL", effect::read);
  if (!exists) return exists.error();
  if (!exists.value().boolean(0, 0)) return 0;
  auto v = c.exec_script("SELECT coalesce(max(version), 0) FROM " + s + ".schema_version",
                         effect::read);
  if (!v) return v.error();
  return static_cast<int>(v.value().int64(0, 0));
}

/// tenure owns its schema: its migrations revoke PUBLIC's rights on the schema and on every
/// function in it. Installed into a schema that already holds the application's objects (or into
/// `public`, which every role uses), that would silently take EXECUTE on the application's own
/// functions and USAGE on the schema away from every other role. So a fresh install goes only
/// into a new schema, or an existing empty one (one a DBA created for tenure, with its owner);
/// a schema tenure already installed is upgraded as usual.
result<void> refuse_foreign_schema(connection& c, const std::string& schema) {
  const std::string name = c.quote_literal(schema);
  auto r = c.exec_script(
      "SELECT n.oid IS NOT NULL, "
      "       to_regclass(" + c.quote_literal(schema + ".schema_version") + ") IS NOT NULL, "
      "       (SELECT count(*) FROM pg_class WHERE relnamespace = n.oid) "
      "     + (SELECT count(*) FROM pg_proc WHERE pronamespace = n.oid) "
      "     + (SELECT count(*) FROM pg_type WHERE typnamespace = n.oid AND typrelid = 0 AND typelem = 0) "
      "FROM (SELECT 1) one LEFT JOIN pg_namespace n ON n.nspname = " + name,
      effect::read);
  if (!r) return r.error();
  const bool exists = r.value().boolean(0, 0), installed = r.value().boolean(0, 1);
  const auto objects = r.value().int64(0, 2);
  if (installed || (exists && objects == 0 && schema != "public") || (!exists && !schema.starts_with("pg_"))) {
    return success();
  }
  if (schema.starts_with("pg_")) {
    return error{errc::invalid_argument,
                 "schema '" + schema + "': names starting with pg_ are reserved for PostgreSQL's own schemas"};
  }
  return error{errc::invalid_argument, "schema '" + schema + "' already exists" +
                (objects > 0 ? " and holds " + std::to_string(objects) + " object(s) tenure did not create"
                             : " and is PostgreSQL's default schema, which every role uses") +
                "; tenure revokes PUBLIC's rights on its schema and on every function in it, so it installs "
                "only into a schema of its own: choose another schema name (the default is tenure), or "
                "create an empty schema for it, owned by the role that runs migrate"};
}

/// Who besides the role on `c` (current_user) can change what tenure's SECURITY DEFINER functions
/// in `schema` run: those functions call each other, and read and write tenure's tables, with
/// their owner's rights, so whoever can replace one of them, add an object they resolve to, or
/// hang a trigger on a table they write, runs code with those rights. Checked, on an existing
/// schema:
///  - the schema is owned by current_user itself. A schema's owner may drop any object in it
///    (and create a replacement); a schema owned by a group role current_user is a member of
///    would be just as much every other member's.
///  - no role holds CREATE on it but superusers and members of its owner (pg_has_role ... USAGE,
///    which can act as the owner anyway): CREATE on the schema, granted to the role or to a group
///    or PUBLIC, lets a role add functions beside tenure's.
///  - every table, sequence, view, index, function and type in it is owned by current_user: the
///    owner of a function may replace its body, the owner of a table may add triggers to it.
///  - no role but a table's owner holds TRIGGER on a table in it.
/// Members of current_user are not counted: they can act as current_user already, by a grant of
/// its rights someone who could act as it made. Returns the reason (one line, with the fix), or
/// an empty string when none of this holds; a schema that does not exist is fine.
result<std::string> schema_control_problem(connection& c, const std::string& schema) {
  const std::string name = c.quote_literal(schema);
  auto r = c.exec_script(
      "WITH n AS (SELECT oid, nspowner, nspacl FROM pg_namespace WHERE nspname = " + name + "), "
      "me AS (SELECT oid FROM pg_roles WHERE rolname = current_user), "
      "creators AS (SELECT r.rolname FROM n, pg_roles r "
      "             WHERE has_schema_privilege(r.oid, n.oid, 'CREATE') AND NOT r.rolsuper "
      "               AND NOT pg_has_role(r.oid, n.nspowner, 'USAGE')), "
      "foreign_owned AS ("
      "  SELECT format('%s %s owned by %s', CASE c.relkind WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' "
      "                WHEN 'v' THEN 'view' ELSE 'table' END, c.oid::regclass, pg_get_userbyid(c.relowner)) AS what "
      "    FROM n, me, pg_class c WHERE c.relnamespace = n.oid AND c.relowner <> me.oid "
      "  UNION ALL SELECT format('function %s owned by %s', p.oid::regprocedure, pg_get_userbyid(p.proowner)) "
      "    FROM n, me, pg_proc p WHERE p.pronamespace = n.oid AND p.proowner <> me.oid "
      "  UNION ALL SELECT format('type %s owned by %s', t.oid::regtype, pg_get_userbyid(t.typowner)) "
      "    FROM n, me, pg_type t WHERE t.typnamespace = n.oid AND t.typrelid = 0 AND t.typelem = 0 "
      "     AND t.typowner <> me.oid), "
      "triggerers AS (SELECT DISTINCT format('%s on %s', CASE a.grantee WHEN 0 THEN 'PUBLIC' "
      "                      ELSE pg_get_userbyid(a.grantee) END, c.oid::regclass) AS what "
      "    FROM n, pg_class c, aclexplode(c.relacl) a "
      "   WHERE c.relnamespace = n.oid AND a.privilege_type = 'TRIGGER' AND a.grantee <> c.relowner) "
      "SELECT (SELECT pg_get_userbyid(n.nspowner) FROM n, me WHERE n.nspowner <> me.oid), current_user, "
      "       (SELECT count(*) FROM creators), "
      "       (SELECT string_agg(rolname, ', ') FROM (SELECT rolname FROM creators ORDER BY rolname LIMIT 5) f), "
      "       (SELECT count(*) FROM foreign_owned), "
      "       (SELECT string_agg(what, ', ') FROM (SELECT what FROM foreign_owned ORDER BY what LIMIT 3) f), "
      "       (SELECT string_agg(what, ', ') FROM (SELECT what FROM triggerers ORDER BY what LIMIT 5) f), "
      "       EXISTS (SELECT 1 FROM n, aclexplode(n.nspacl) a WHERE a.grantee = 0 AND a.privilege_type = 'CREATE')",
      effect::read);
  if (!r) return r.error();
  const auto& row = r.value();
  const std::string me{row.text(0, 1)};
  const std::string rights = "; tenure's SECURITY DEFINER functions in it run with the rights of their owner, '" +
                             me + "' (the role running migrate), and ";
  if (!row.is_null(0, 0)) {
    const std::string owner{row.text(0, 0)};
    return "schema '" + schema + "' is owned by role '" + owner + "', not by '" + me + "'" + rights +
           "a schema's owner may drop and replace any of them: run migrate as '" + owner +
           "', or make '" + me + "' the owner (ALTER SCHEMA " + schema + " OWNER TO " + c.quote_ident(me) + ")";
  }
  if (row.int64(0, 2) > 0) {
    const auto n = row.int64(0, 2);
    const std::string who = row.boolean(0, 7) ? "every role (CREATE is granted to PUBLIC)"
                                              : "role(s) " + std::string{row.text(0, 3)} +
                                                    (n > 5 ? " and " + std::to_string(n - 5) + " more" : "");
    return who + " may create objects in schema '" + schema + "' (CREATE on the schema)" + rights +
           "a role that may add functions beside them may change what they call: REVOKE CREATE ON SCHEMA " +
           schema + " FROM the role(s) or PUBLIC";
  }
  if (row.int64(0, 4) > 0) {
    const auto n = row.int64(0, 4);
    return std::to_string(n) + " object(s) in schema '" + schema + "' are owned by other roles than '" + me +
           "' (" + std::string{row.text(0, 5)} + (n > 3 ? ", ..." : "") + ")" + rights +
           "the owner of a function may replace it, the owner of a table may add triggers to it: run migrate as "
           "the role that installed tenure, or make '" + me + "' the owner of every object in the schema";
  }
  if (!row.is_null(0, 6)) {
    return "role(s) hold TRIGGER on tenure's tables in schema '" + schema + "' (" + std::string{row.text(0, 6)} +
           ")" + rights + "a trigger on a table they write runs with those rights: REVOKE TRIGGER from them";
  }
  return std::string{};
}

/// schema_control_problem() as a refusal: errc::invalid_argument with the reason as its detail.
result<void> refuse_uncontrolled_schema(connection& c, const std::string& schema) {
  TENURE_TRY(auto problem, schema_control_problem(c, schema));
  if (problem.empty()) return success();
  return error{errc::invalid_argument, std::move(problem)};
}

result<std::unique_ptr<connection>> connect_checked(std::string_view dsn, std::string_view schema) {
  if (!valid_schema_name(schema)) {
    return error{errc::invalid_argument,
                 "invalid schema name '" + std::string{schema} + "' (use [a-z_][a-z0-9_]*, at most 54 characters)"};
  }
  // Short connections that run a few statements and transactions: nothing to keep on a session,
  // so they work through a transaction-pooling pooler too.
  return connection::open(std::string{dsn}, {}, {}, detail::session_use::none);
}

}  // namespace

int known_schema_version() noexcept { return static_cast<int>(detail::embedded_migrations().size()); }

bool valid_schema_name(std::string_view schema) noexcept { return tenure::valid_schema_name(schema); }

result<int> installed_schema_version(std::string_view dsn, std::string_view schema) {
  TENURE_TRY(auto c, connect_checked(dsn, schema));
  return read_version(*c, schema);
}

result<void> check_schema_control(std::string_view dsn, std::string_view schema) {
  TENURE_TRY(auto c, connect_checked(dsn, schema));
  return refuse_uncontrolled_schema(*c, std::string{schema});
}

result<int> migrate(std::string_view dsn, std::string_view schema) {
  return detail::migrate_up_to(dsn, schema, known_schema_version());
}

result<int> detail::migrate_up_to(std::string_view dsn, std::string_view schema, int up_to) {
  TENURE_TRY(auto c, connect_checked(dsn, schema));
  const std::string s{schema};
  const int known = known_schema_version();

  // One transaction: concurrent migrators wait on the advisory lock, then see the new version.
  auto locked = c->exec_script(
      "BEGIN; SELECT pg_advisory_xact_lock(hashtext(" + c->quote_literal("tenure.migrate:" + s) + "));",
      effect::write);
  if (!locked) {
    c->reset_transaction();
    return locked.error();
  }
  if (auto foreign = refuse_foreign_schema(*c, s); !foreign) {
    c->reset_transaction();
    return foreign.error();
  }
  // Before anything is created or replaced: a fresh install and an upgrade alike.
  if (auto uncontrolled = refuse_uncontrolled_schema(*c, s); !uncontrolled) {
    c->reset_transaction();
    return uncontrolled.error();
  }
  auto begin = c->exec_script(
      "CREATE SCHEMA IF NOT EXISTS " + s + "; CREATE TABLE IF NOT EXISTS " + s +
          ".schema_version (version int PRIMARY KEY, name text NOT NULL, "
          "applied_at timestamptz NOT NULL DEFAULT now()); REVOKE ALL ON " + s +
          ".schema_version FROM PUBLIC;",
      effect::write);
  if (!begin) {
    c->reset_transaction();
    return begin.error();
  }
  auto before = read_version(*c, s);
  if (!before) {
    c->reset_transaction();
    return before.error();
  }
  if (before.value() > known) {
    c->reset_transaction();
    return error{errc::schema_mismatch, "database schema '" + s + "' is at version " +
                                            std::to_string(before.value()) + ", newer than this tenure binary knows (" +
                                            std::to_string(known) + "); upgrade tenure before using this database"};
  }
  for (const auto& m : detail::embedded_migrations()) {
    if (m.version <= before.value() || m.version > up_to) continue;
    auto applied = c->exec_script(render(m, s), effect::write);
    if (applied) {
      applied = c->exec_script("INSERT INTO " + s + ".schema_version (version, name) VALUES (" +
                                   std::to_string(m.version) + ", " + c->quote_literal(m.name) + ")",
                               effect::write);
    }
    if (!applied) {
      c->reset_transaction();
      const auto& failed = applied.error();
      return error{failed.code(), "migration " + std::string{m.name} + " failed: " + failed.detail(), failed.sqlstate()};
    }
    tenure::logger()->info("tenure: applied migration {} to schema {}", m.name, s);
  }
  auto commit = c->exec_script("COMMIT", effect::write);
  if (!commit) return commit.error();
  return before.value();
}

std::string ungrantable_role_reason(std::string_view role) {
  std::string lower{role};
  for (char& ch : lower) {
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  }
  const std::string quoted = "role name '" + std::string{role} + "'";
  if (lower.empty()) return "the role name is empty";
  // The role is quoted as an identifier, but PostgreSQL reads "public" as PUBLIC all the same;
  // "PUBLIC" would name a role that only a mistake creates.
  if (lower == "public") {
    return quoted + " means every role (PUBLIC): tenure grants only to a named role, so that only "
                    "roles given access have it";
  }
  if (lower == "none" || lower == "current_user" || lower == "current_role" || lower == "session_user") {
    return quoted + " is reserved by PostgreSQL: name the role itself";
  }
  if (lower.starts_with("pg_")) {
    return quoted + ": names starting with pg_ are PostgreSQL's predefined roles, which many roles may be "
                    "members of: create a role for the purpose and grant to it";
  }
  return {};
}

grant_list grants_of(grant_kind kind) {
  grant_list out;
  switch (kind) {
    case grant_kind::finalizer:
      out.functions = {"complete_job(text, jsonb)"};
      break;
    case grant_kind::producer:
      out.functions = {"enqueue(text, jsonb, text, int, timestamptz, int, jsonb, text)",
                       "enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[], text[])",
                       "enqueue_copy_stage()", "enqueue_copied()", "enqueue_copy_target(boolean)",
                       "enqueue_copied_ready(int)"};
      out.inserts = {"specs.kind", "specs.args", "specs.queue", "specs.priority", "specs.max_attempts", "specs.metadata"};
      out.sequences = {"job_id_seq"};
      break;
    case grant_kind::callback:
      out.functions = {"resume_callback(uuid, jsonb)", "extend_callback(uuid, interval)",
                       "complete_callback(uuid, jsonb)", "fail_callback(uuid, text, boolean)"};
      break;
    case grant_kind::admin:
      out.functions = {"pause_queue(text)", "resume_queue(text)", "configure_queue(text, jsonb)", "list_queues()",
                       "schedule_upsert(text, text, text, jsonb, text, text)", "schedule_remove(text)",
                       "list_schedules()", "cron_next(text, timestamptz, text)"};
      break;
    case grant_kind::worker:
      out.functions = {"claim(text, int, text)",
                       "claim_attempts(text, int, text, text)",
                       "heartbeat(text)",
                       "heartbeat_batch(bigint[], bigint[], jsonb[])",
                       "complete_job(text, jsonb)",
                       "complete_batch(bigint[], bigint[], jsonb[], uuid[])",
                       "fail_job(text, text, boolean)",
                       "fail_attempt(bigint, bigint, text, boolean, interval)",
                       "snooze_attempt(bigint, bigint, interval)",
                       "cancel_attempt(bigint, bigint, text)",
                       "rescue_stale(interval)",
                       "rescue_attempts(interval)",
                       "promote_due(text, int)",
                       "acquire_leadership(text, interval)",
                       "release_leadership(text, bigint)",
                       "maintain(text, bigint, interval)",
                       "attempt_evidence(bigint, bigint)",
                       "attempt_evidence_batch(bigint[], bigint[])",
                       "attempt_checkpoint(bigint, bigint)",
                       "register_callback(bigint, bigint, interval)",
                       "await_callback(bigint, bigint, uuid)",
                       "park_callback(bigint, bigint, uuid)",
                       "worker_idle(text, text)",
                       "worker_busy(text, text)",
                       "queue_depths()"};
      out.selects = {"jobs", "schema_version"};
      break;
  }
  return out;
}

result<void> grant(std::string_view dsn, grant_kind kind, std::string_view role, std::string_view schema) {
  if (auto reserved = ungrantable_role_reason(role); !reserved.empty()) {
    return error{errc::invalid_argument, std::move(reserved)};
  }
  TENURE_TRY(auto c, connect_checked(dsn, schema));
  TENURE_TRY(auto version, read_version(*c, schema));
  if (version != known_schema_version()) {
    return error{errc::schema_mismatch, "schema '" + std::string{schema} + "' is at version " +
                                            std::to_string(version) + ", expected " +
                                            std::to_string(known_schema_version()) +
                                            (version < known_schema_version() ? " (run tenure migrate)" : " (upgrade tenure)")};
  }
  const std::string s{schema};
  const std::string r = c->quote_ident(role);
  const auto list = grants_of(kind);
  std::string sql = "BEGIN; GRANT USAGE ON SCHEMA " + s + " TO " + r + ";";
  for (const auto& f : list.functions) sql += " GRANT EXECUTE ON FUNCTION " + s + "." + f + " TO " + r + ";";
  for (const auto& t : list.selects) sql += " GRANT SELECT ON " + s + "." + t + " TO " + r + ";";
  for (const auto& column : list.inserts) {
    const auto dot = column.find('.');
    sql += " GRANT INSERT (" + column.substr(dot + 1) + ") ON TABLE " + s + "." + column.substr(0, dot) + " TO " + r + ";";
  }
  for (const auto& q : list.sequences) sql += " GRANT USAGE ON SEQUENCE " + s + "." + q + " TO " + r + ";";
  sql += " COMMIT;";
  auto done = c->exec_script(sql, effect::write);
  if (!done) {
    c->reset_transaction();
    return done.error();
  }
  return success();
}

}  // namespace tenure::postgres
