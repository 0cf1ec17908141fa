#pragma once
/// \file
/// The checks of `tenure doctor`. Each check reads the database (catalogs, statistics, tenure's
/// tables) through a pg_session and returns its findings: at least one, `ok` when nothing is
/// wrong. Values read from the database (role, queue, worker names) go into the findings as they
/// are; the printer makes them safe for a terminal. A check that cannot run (a role without the
/// rights to read what it needs) throws command_error; doctor turns that into an error finding.
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/pg_session.hpp"

namespace tenure::cli::doctor {

enum class severity { ok, warning, error };

const char* to_string(severity s) noexcept;

struct finding {
  std::string check;        ///< the check's name (schema_version, privileges, ...)
  severity level = severity::ok;
  std::string found;        ///< what was found, one sentence
  std::string fix;          ///< what to do ("" for ok)
  nlohmann::ordered_json details = nlohmann::ordered_json::object();  ///< the values, for --json
};

using findings = std::vector<finding>;

/// What the checks are run against.
struct settings {
  std::string dsn;
  std::string schema;
  std::chrono::microseconds stale_after{std::chrono::seconds{30}};   ///< --stale-after
  std::chrono::microseconds max_queue_age{std::chrono::minutes{5}};  ///< --max-queue-age
  std::chrono::microseconds retention_grace{std::chrono::hours{1}};  ///< --retention-grace
  std::chrono::milliseconds session_wait{2000};  ///< how long the pooler probe waits for its notification
};

/// At most this many findings per check; the rest are summed up in one more.
inline constexpr std::size_t k_max_findings_per_check = 50;

// ---- the schema and who may reach it (doctor_security.cpp) ---------------------------------------

/// schema_version: installed vs this binary's. `installed` receives the installed version (0: none).
findings check_schema_version(const settings& s, int& installed);
/// schema_control: postgres::check_schema_control (who may replace what tenure's functions run).
findings check_schema_control(const settings& s);
/// privileges: every ACL entry on the schema, its functions, tables, views, sequences and columns,
/// and the schema's default privileges, for PUBLIC or beyond what `tenure grant-*` gives.
findings check_privileges(pg_session& db, const settings& s);
/// security_definer: SECURITY DEFINER functions in the schema without search_path pinned to
/// pg_catalog, pg_temp.
findings check_security_definer(pg_session& db, const settings& s);

// ---- the jobs and the tables (doctor_health.cpp) ----------------------------------------------

/// stale_attempts: open attempts past their staleness, as rescue_attempts() decides it.
findings check_stale_attempts(pg_session& db, const settings& s);
/// queue_age: the oldest available job of each queue against --max-queue-age.
findings check_queue_age(pg_session& db, const settings& s);
/// retention: finished jobs kept past their queue's retention (and the prune floor) + grace.
findings check_retention(pg_session& db, const settings& s);
/// vacuum: autovacuum on (globally, and on tenure's tables), dead rows on the hot tables.
findings check_vacuum(pg_session& db, const settings& s);
/// pooler: whether the connection has a server session of its own, as the runtime needs.
findings check_pooler(const settings& s);

// ---- shared helpers ------------------------------------------------------------------------------

/// One finding per entry of `problems` (at most k_max_findings_per_check, then one that counts the
/// rest at the worst severity left), or one ok finding saying `all_clear`.
findings capped(const std::string& check, findings problems, const std::string& all_clear);

/// Seconds as a short duration ("45s", "3m 20s", "2h 5m", "3d 4h").
std::string age_text(double seconds);

/// PostgreSQL interval text for a duration ("1500000 microseconds").
std::string interval_literal(std::chrono::microseconds d);

/// A number of seconds from a query's text value (0 for NULL or garbage).
double seconds_of(const std::optional<std::string>& text);
/// An integer from a query's text value (0 for NULL or garbage).
long long integer_of(const std::optional<std::string>& text);
/// The text of a query's value ("" for NULL).
std::string text_of(const std::optional<std::string>& text);

}  // namespace tenure::cli::doctor
