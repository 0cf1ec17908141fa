#include "bench/statement_wal.hpp"

#include <exception>

namespace tenure::bench {

std::optional<statement_wal> statement_wal::open(const std::string& dsn, const std::string& schema) {
  try {
    cli::pg_session s(dsn);
    // The view exists only where the extension is installed, and answers only where the server
    // loaded its library at start; the bench changes neither.
    const auto installed = s.query("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'", {},
                                   "bench: pg_stat_statements");
    if (installed.at(0).at(0) != "1") return std::nullopt;
    s.query("SELECT count(*) FROM pg_stat_statements", {}, "bench: pg_stat_statements");
    return statement_wal(dsn, schema);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

statement_wal::statement_wal(const std::string& dsn, std::string schema) : dsn_(dsn), schema_(std::move(schema)) {}

statement_wal::reading statement_wal::read(std::initializer_list<const char*> functions) {
  std::string names = "{";
  for (const char* f : functions) names += std::string(names.size() > 1 ? "," : "") + f;
  names += "}";
  cli::pg_session s(dsn_);
  // Only top-level statements: a function's WAL is counted once, on the statement that called it.
  const auto rows = s.query(
      "SELECT f, coalesce(sum(p.wal_bytes), 0)::float8 FROM unnest($1::text[]) AS f "
      "LEFT JOIN pg_stat_statements p ON p.toplevel "
      " AND p.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
      " AND strpos(p.query, $2 || '.' || f || '(') > 0 "
      "GROUP BY f",
      {names, schema_}, "bench: statement WAL");
  reading out;
  for (const auto& r : rows) out[*r.at(0)] = std::stod(*r.at(1));
  return out;
}

double wal_per_job(const statement_wal::reading& before, const statement_wal::reading& after,
                   const std::string& function, double jobs) {
  const auto b = before.find(function), a = after.find(function);
  if (a == after.end() || jobs <= 0) return 0;
  return (a->second - (b == before.end() ? 0.0 : b->second)) / jobs;
}

}  // namespace tenure::bench
