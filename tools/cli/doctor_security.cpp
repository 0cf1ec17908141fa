// tenure doctor: the schema's version, who controls it, who may reach it, and what its SECURITY
// DEFINER functions resolve names against.
#include <algorithm>
#include <string>

#include "cli/context.hpp"
#include "cli/doctor_checks.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::cli::doctor {
namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : "\n") + i;
  return out;
}

/// Everything any `tenure grant-*` gives, as newline-separated lists for the privilege query:
/// function signatures, relations granted SELECT, and "<privilege> <relation>[.<column>]" for the
/// column and sequence grants.
struct granted_lists {
  std::string functions, selects, others;
};
granted_lists granted_by_any_kind() {
  std::vector<std::string> functions, selects, others;
  for (auto kind : {postgres::grant_kind::finalizer, postgres::grant_kind::producer, postgres::grant_kind::worker,
                    postgres::grant_kind::callback, postgres::grant_kind::admin}) {
    auto list = postgres::grants_of(kind);
    functions.insert(functions.end(), list.functions.begin(), list.functions.end());
    selects.insert(selects.end(), list.selects.begin(), list.selects.end());
    for (const auto& c : list.inserts) others.push_back("INSERT " + c);
    for (const auto& q : list.sequences) others.push_back("USAGE " + q);
  }
  return {joined(functions), joined(selects), joined(others)};
}

// Every ACL entry on the schema and on what is in it, for PUBLIC or a role that is not the
// object's owner, with the revoke statement (less its grantee) that takes it away. A NULL ACL
// is the object's default (acldefault): for a function, EXECUTE for PUBLIC.
//   $1 schema, $2 functions (newline-separated signatures), $3 relations (newline-separated),
//   $4 column and sequence grants ("INSERT ready.kind", "USAGE job_id_seq"; newline-separated),
//      allowed only to a role that may also run enqueue_batch (they come with grant-producer)
constexpr const char* k_privileges_sql = R"SQL(
WITH n AS (SELECT oid, nspname, nspowner, nspacl FROM pg_catalog.pg_namespace WHERE nspname = $1),
allowed_f AS (SELECT pg_catalog.to_regprocedure(pg_catalog.quote_ident($1) || '.' || f)::oid AS oid
                FROM pg_catalog.unnest(pg_catalog.string_to_array($2, E'\n')) f),
allowed_r AS (SELECT pg_catalog.to_regclass(pg_catalog.quote_ident($1) || '.' || r)::oid AS oid
                FROM pg_catalog.unnest(pg_catalog.string_to_array($3, E'\n')) r),
allowed_o AS (SELECT pg_catalog.string_to_array($4, E'\n') AS list),
-- The column and sequence grants are a producer's: allowed to the roles that may run enqueue_batch.
producers AS (SELECT r.oid FROM pg_catalog.pg_roles r,
                     pg_catalog.to_regprocedure(pg_catalog.quote_ident($1) ||
                       '.enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[], text[])') f(fn)
               WHERE f.fn IS NOT NULL AND pg_catalog.has_function_privilege(r.oid, f.fn, 'EXECUTE')),
acl AS (
  SELECT 'schema'::text AS kind, pg_catalog.quote_ident(n.nspname) AS object, n.nspowner AS owner,
         a.grantee, a.privilege_type, a.is_grantable, a.privilege_type = 'USAGE' AS allowed,
         pg_catalog.format('REVOKE %s ON SCHEMA %I', a.privilege_type, n.nspname) AS revoke
    FROM n, pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n'::"char", n.nspowner))) a
  UNION ALL
  SELECT CASE p.prokind WHEN 'p' THEN 'procedure' ELSE 'function' END, p.oid::pg_catalog.regprocedure::text,
         p.proowner, a.grantee, a.privilege_type, a.is_grantable,
         a.privilege_type = 'EXECUTE' AND p.oid IN (SELECT oid FROM allowed_f WHERE oid IS NOT NULL),
         pg_catalog.format('REVOKE %s ON %s %s', a.privilege_type,
                           CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, p.oid::pg_catalog.regprocedure)
    FROM n JOIN pg_catalog.pg_proc p ON p.pronamespace = n.oid,
         pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f'::"char", p.proowner))) a
  UNION ALL
  SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                        ELSE 'table' END,
         c.oid::pg_catalog.regclass::text, c.relowner, a.grantee, a.privilege_type, a.is_grantable,
         (a.privilege_type = 'SELECT' AND c.oid IN (SELECT oid FROM allowed_r WHERE oid IS NOT NULL))
         OR (a.privilege_type || ' ' || c.relname = ANY ((SELECT list FROM allowed_o)::text[])
             AND a.grantee IN (SELECT oid FROM producers)),
         pg_catalog.format('REVOKE %s ON %s %s', a.privilege_type,
                           CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.oid::pg_catalog.regclass)
    FROM n JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f'),
         pg_catalog.aclexplode(coalesce(c.relacl,
                                        pg_catalog.acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char",
                                                              c.relowner))) a
  UNION ALL
  SELECT 'column', pg_catalog.format('%s.%I', c.oid::pg_catalog.regclass, t.attname), c.relowner,
         a.grantee, a.privilege_type, a.is_grantable,
         a.privilege_type || ' ' || c.relname || '.' || t.attname = ANY ((SELECT list FROM allowed_o)::text[])
           AND a.grantee IN (SELECT oid FROM producers),
         pg_catalog.format('REVOKE %s (%I) ON TABLE %s', a.privilege_type, t.attname, c.oid::pg_catalog.regclass)
    FROM n JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid
           JOIN pg_catalog.pg_attribute t ON t.attrelid = c.oid AND t.attnum > 0 AND NOT t.attisdropped
                                         AND t.attacl IS NOT NULL,
         pg_catalog.aclexplode(t.attacl) a
  UNION ALL
  SELECT 'default privileges',
         pg_catalog.format('%s created later by %s in schema %I', o.plural, pg_catalog.pg_get_userbyid(d.defaclrole),
                           n.nspname),
         d.defaclrole, a.grantee, a.privilege_type, a.is_grantable, false,
         pg_catalog.format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA %I REVOKE %s ON %s',
                           pg_catalog.pg_get_userbyid(d.defaclrole), n.nspname, a.privilege_type, upper(o.plural))
    FROM n JOIN pg_catalog.pg_default_acl d ON d.defaclnamespace = n.oid
           CROSS JOIN LATERAL (SELECT CASE d.defaclobjtype WHEN 'r' THEN 'tables' WHEN 'S' THEN 'sequences'
                                      WHEN 'f' THEN 'functions' WHEN 'T' THEN 'types' ELSE 'schemas' END AS plural) o,
         pg_catalog.aclexplode(d.defaclacl) a
)
SELECT kind, object, CASE grantee WHEN 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(grantee) END,
       privilege_type, is_grantable, allowed, revoke,
       CASE grantee WHEN 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(grantee)) END
  FROM acl
 WHERE grantee <> owner AND (grantee = 0 OR NOT allowed OR is_grantable)
 ORDER BY kind, object, 3, privilege_type
)SQL";

/// The search_path a proconfig entry sets, split into its schemas (quotes and spaces removed).
std::vector<std::string> path_entries(const std::string& value) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    cur.erase(std::remove(cur.begin(), cur.end(), '"'), cur.end());
    const auto first = cur.find_first_not_of(' ');
    const auto last = cur.find_last_not_of(' ');
    out.push_back(first == std::string::npos ? "" : cur.substr(first, last - first + 1));
    cur.clear();
  };
  for (char c : value) {
    if (c == ',') {
      flush();
    } else {
      cur += c;
    }
  }
  flush();
  return out;
}

}  // namespace

findings check_schema_version(const settings& s, int& installed) {
  auto version = postgres::installed_schema_version(s.dsn, s.schema);
  if (!version) throw adapter_error("cannot read the schema version", version.error());
  installed = version.value();
  const int known = postgres::known_schema_version();
  finding f{"schema_version"};
  f.details = {{"installed", installed}, {"expected", known}};
  if (installed == known) {
    f.found = "schema " + s.schema + " is at version " + std::to_string(known) + ", the version this binary carries";
  } else if (installed == 0) {
    f.level = severity::error;
    f.found = "schema " + s.schema + " is not installed";
    f.fix = "run tenure migrate";
  } else if (installed < known) {
    f.level = severity::error;
    f.found = "schema " + s.schema + " is at version " + std::to_string(installed) + ", older than this binary's " +
              std::to_string(known);
    f.fix = "run tenure migrate (with this binary) to upgrade the schema";
  } else {
    f.level = severity::error;
    f.found = "schema " + s.schema + " is at version " + std::to_string(installed) + ", newer than this binary's " +
              std::to_string(known);
    f.fix = "upgrade the tenure binary (and the runtimes linked with an older tenure)";
  }
  return {f};
}

findings check_schema_control(const settings& s) {
  auto checked = postgres::check_schema_control(s.dsn, s.schema);
  if (checked) {
    return {finding{"schema_control", severity::ok, "only the role running doctor controls schema " + s.schema}};
  }
  if (checked.error() != errc::invalid_argument) {
    throw adapter_error("cannot check who controls the schema", checked.error());
  }
  // The detail is one line: the problem, why it matters, then after ": " what to do.
  const std::string& why = checked.error().detail();
  const auto rights = why.find("; tenure's SECURITY DEFINER");
  const auto colon = rights == std::string::npos ? std::string::npos : why.find(": ", rights);
  if (colon == std::string::npos) {
    return {finding{"schema_control", severity::error, why, "see what was found"}};
  }
  return {finding{"schema_control", severity::error, why.substr(0, colon), why.substr(colon + 2)}};
}

findings check_privileges(pg_session& db, const settings& s) {
  const auto [functions, selects, others] = granted_by_any_kind();
  const auto rows = db.query(k_privileges_sql, {s.schema, functions, selects, others}, "cannot read the privileges");
  findings problems;
  for (const auto& r : rows) {
    const std::string kind = text_of(r[0]), object = text_of(r[1]), role = text_of(r[2]), privilege = text_of(r[3]);
    const bool grantable = text_of(r[4]) == "t", allowed = text_of(r[5]) == "t", is_public = role == "PUBLIC";
    std::string revoke = text_of(r[6]);
    finding f{"privileges"};
    f.details = {{"role", role}, {"object_type", kind}, {"object", object}, {"privilege", privilege},
                 {"grantable", grantable}};
    const std::string who = is_public ? "PUBLIC (every role)" : "role " + role;
    const std::string what = privilege + " on " + (kind == "default privileges" ? "" : kind + " ") + object;
    if (is_public) {
      f.level = severity::error;
      f.found = who + " holds " + what;
    } else if (allowed) {  // a privilege grant-* gives, but with the right to pass it on
      f.level = severity::warning;
      f.found = who + " holds " + what + " WITH GRANT OPTION: it may give it to any role";
      revoke.replace(0, 7, "REVOKE GRANT OPTION FOR ");
    } else {
      f.level = privilege == "SELECT" ? severity::warning : severity::error;
      f.found = who + " holds " + what + ", which no tenure grant-* gives";
    }
    f.fix = revoke + " FROM " + text_of(r[7]) + (revoke.starts_with("ALTER DEFAULT") ? "" : " CASCADE") +
            "; give roles access only through tenure grant-*";
    problems.push_back(std::move(f));
  }
  return capped("privileges", std::move(problems),
                "no role holds more on schema " + s.schema + " than tenure grant-* gives, and PUBLIC holds nothing");
}

findings check_security_definer(pg_session& db, const settings& s) {
  const auto rows = db.query(
      "SELECT p.oid::pg_catalog.regprocedure::text, "
      "       (SELECT pg_catalog.substr(c, 13) FROM pg_catalog.unnest(p.proconfig) c "
      "         WHERE c LIKE 'search\\_path=%' LIMIT 1) "
      "  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
      " WHERE n.nspname = $1 AND p.prosecdef ORDER BY 1",
      {s.schema}, "cannot read the SECURITY DEFINER functions");
  findings problems;
  for (const auto& r : rows) {
    const std::string fn = text_of(r[0]);
    finding f{"security_definer"};
    f.details = {{"function", fn}, {"search_path", r[1] ? nlohmann::ordered_json(*r[1]) : nlohmann::ordered_json()}};
    const std::string fix = "ALTER FUNCTION " + fn +
                            " SET search_path = pg_catalog, pg_temp (and schema-qualify every name in its body), "
                            "or DROP FUNCTION " + fn + " if tenure did not create it";
    if (!r[1]) {
      f.level = severity::error;
      f.found = "SECURITY DEFINER function " + fn +
                " has no search_path of its own: it resolves names through its caller's search_path, with its "
                "owner's rights";
      f.fix = fix;
      problems.push_back(std::move(f));
      continue;
    }
    const auto path = path_entries(*r[1]);
    const auto catalog = [](const std::string& e) { return e == "pg_catalog"; };
    const bool pinned =
        !path.empty() && path.back() == "pg_temp" && std::all_of(path.begin(), path.end() - 1, catalog);
    if (pinned) continue;
    f.level = severity::warning;
    f.found = "SECURITY DEFINER function " + fn + " runs with search_path = " + *r[1] +
              ", not pinned to pg_catalog, pg_temp (pg_temp last)";
    f.fix = fix;
    problems.push_back(std::move(f));
  }
  return capped("security_definer", std::move(problems),
                std::to_string(rows.size()) + " SECURITY DEFINER function(s) in schema " + s.schema +
                    ", each with search_path = pg_catalog, pg_temp");
}

}  // namespace tenure::cli::doctor
