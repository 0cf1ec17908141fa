// The trace recorder's database side: install, remove and read it with a libpq connection of its own.
#include <libpq-fe.h>

#include <memory>
#include <string>
#include <vector>

#include "tenure/schema_name.hpp"
#include "trace/trace.hpp"

namespace tenure::trace {

extern const char* const k_recorder_sql;  // recorder.sql, embedded by CMake

namespace {

using conn_ptr = std::unique_ptr<PGconn, decltype(&PQfinish)>;
using res_ptr = std::unique_ptr<PGresult, decltype(&PQclear)>;

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (auto p = text.find(from); p != std::string::npos; p = text.find(from, p + to.size())) text.replace(p, from.size(), to);
  return text;
}

result<conn_ptr> connect(const std::string& dsn, const std::string& schema) {
  if (!valid_schema_name(schema)) return tenure::error{errc::invalid_argument, "not a valid schema name: " + schema};
  conn_ptr c{PQconnectdb(dsn.c_str()), &PQfinish};
  if (PQstatus(c.get()) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(c.get());
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    return tenure::error{errc::database_unavailable, "cannot connect to the database: " + msg};
  }
  return c;
}

/// Runs `sql` (parameters as text); the error names `what`.
result<res_ptr> run(PGconn* c, const std::string& sql, const std::vector<std::string>& params, const std::string& what) {
  std::vector<const char*> values;
  for (const auto& p : params) values.push_back(p.c_str());
  res_ptr r{params.empty() ? PQexec(c, sql.c_str())
                           : PQexecParams(c, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(),
                                          nullptr, nullptr, 0),
            &PQclear};
  const auto st = PQresultStatus(r.get());
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
  std::string msg = PQresultErrorMessage(r.get());
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
  return tenure::error{errc::database_error, what + ": " + msg, state != nullptr ? state : ""};
}

result<bool> is_installed(PGconn* c, const std::string& schema) {
  TENURE_TRY(auto r, run(c, "SELECT to_regclass($1) IS NOT NULL", {schema + ".trace_events"}, "trace"));
  return std::string{PQgetvalue(r.get(), 0, 0)} == "t";
}

}  // namespace

std::string recorder_sql(const std::string& schema) { return replace_all(k_recorder_sql, "@schema@", schema); }

result<void> install(const std::string& dsn, const std::string& schema, const std::vector<business_table>& business) {
  TENURE_TRY(auto c, connect(dsn, schema));
  TENURE_TRYV(run(c.get(), "BEGIN; SET LOCAL client_min_messages = warning", {}, "trace install"));
  TENURE_TRY(bool present, is_installed(c.get(), schema));
  if (!present) {
    TENURE_TRY(auto has_tenure, run(c.get(), "SELECT to_regclass($1) IS NOT NULL", {schema + ".claims"}, "trace install"));
    if (std::string{PQgetvalue(has_tenure.get(), 0, 0)} != "t") {
      return tenure::error{errc::schema_mismatch, "no tenure schema " + schema + " to trace (run tenure migrate first)"};
    }
    TENURE_TRYV(run(c.get(), recorder_sql(schema), {}, "trace install"));
  }
  for (const auto& b : business) {
    // The table is resolved by the server (regclass) and every name is quoted by format():
    // nothing given on the command line is spliced into SQL.
    for (const auto& col : {b.job_column, b.lease_column}) {
      TENURE_TRY(auto has, run(c.get(),
                               "SELECT count(*) FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1::regclass "
                               "AND a.attname = $2 AND NOT a.attisdropped",
                               {b.name, col}, "business table " + b.name));
      if (std::string{PQgetvalue(has.get(), 0, 0)} != "1") {
        return tenure::error{errc::invalid_argument, "business table " + b.name + " has no column " + col};
      }
    }
    TENURE_TRYV(run(c.get(),
                    "SELECT pg_catalog.set_config('tenure_trace.table', $1, true), "
                    "pg_catalog.set_config('tenure_trace.trigger', $2, true), "
                    "pg_catalog.set_config('tenure_trace.schema', $3, true), "
                    "pg_catalog.set_config('tenure_trace.job', $4, true), "
                    "pg_catalog.set_config('tenure_trace.lease', $5, true)",
                    {b.name, "tenure_trace_" + schema, schema, b.job_column, b.lease_column}, "trace install"));
    TENURE_TRYV(run(c.get(),
                    "DO $do$ DECLARE t regclass := pg_catalog.current_setting('tenure_trace.table')::regclass; "
                    "g text := pg_catalog.current_setting('tenure_trace.trigger'); BEGIN "
                    "EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS %I ON %s', g, t); "
                    "EXECUTE pg_catalog.format('CREATE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW EXECUTE FUNCTION "
                    "%I.trace_business_row(%L, %L)', g, t, pg_catalog.current_setting('tenure_trace.schema'), "
                    "pg_catalog.current_setting('tenure_trace.job'), pg_catalog.current_setting('tenure_trace.lease')); "
                    "END $do$",
                    {}, "business table " + b.name));
    TENURE_TRYV(run(c.get(),
                    "INSERT INTO " + schema + ".trace_business (name, job_column, lease_column) VALUES ($1, $2, $3) "
                    "ON CONFLICT (name) DO UPDATE SET job_column = excluded.job_column, lease_column = excluded.lease_column",
                    {b.name, b.job_column, b.lease_column}, "trace install"));
  }
  TENURE_TRYV(run(c.get(), "COMMIT", {}, "trace install"));
  return success();
}

result<void> remove(const std::string& dsn, const std::string& schema) {
  TENURE_TRY(auto c, connect(dsn, schema));
  TENURE_TRYV(run(c.get(), "BEGIN; SET LOCAL client_min_messages = warning", {}, "trace remove"));
  TENURE_TRY(bool present, is_installed(c.get(), schema));
  if (present) {
    TENURE_TRY(auto tables, run(c.get(), "SELECT name FROM " + schema + ".trace_business", {}, "trace remove"));
    for (int i = 0; i < PQntuples(tables.get()); ++i) {
      TENURE_TRYV(run(c.get(),
                      "SELECT pg_catalog.set_config('tenure_trace.table', $1, true), "
                      "pg_catalog.set_config('tenure_trace.trigger', $2, true)",
                      {PQgetvalue(tables.get(), i, 0), "tenure_trace_" + schema}, "trace remove"));
      TENURE_TRYV(run(c.get(),
                      "DO $do$ BEGIN IF pg_catalog.to_regclass(pg_catalog.current_setting('tenure_trace.table')) IS NOT "
                      "NULL THEN EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS %I ON %s', "
                      "pg_catalog.current_setting('tenure_trace.trigger'), "
                      "pg_catalog.to_regclass(pg_catalog.current_setting('tenure_trace.table'))); END IF; END $do$",
                      {}, "trace remove"));
    }
  }
  std::string sql;
  for (const char* t : {"ready", "runs", "deferred", "claims", "closures", "dead_letter"}) {
    for (const char* g : {"trace_insert", "trace_delete", "trace_update"}) {
      sql += std::string{"DROP TRIGGER IF EXISTS "} + g + " ON " + schema + "." + t + ";\n";
    }
  }
  sql += "DROP TRIGGER IF EXISTS trace_waiting ON " + schema + ".attempt_state;\n";
  sql += "DROP TRIGGER IF EXISTS trace_waiting_update ON " + schema + ".attempt_state;\n";
  sql += "DROP TABLE IF EXISTS " + schema + ".trace_events, " + schema + ".trace_commits, " + schema +
         ".trace_business;\n";
  sql += "DROP SEQUENCE IF EXISTS " + schema + ".trace_commit_seq;\n";
  sql += "DROP FUNCTION IF EXISTS " + schema + ".trace_rows(), " + schema + ".trace_row(), " + schema + ".trace_runs(), " + schema +
         ".trace_business_row(), " + schema + ".trace_commit(), " + schema + ".trace_caller(text), " + schema +
         ".trace_who(text);\n";
  TENURE_TRYV(run(c.get(), sql, {}, "trace remove"));
  TENURE_TRYV(run(c.get(), "COMMIT", {}, "trace remove"));
  return success();
}

result<std::vector<event>> load(const std::string& dsn, const std::string& schema, bool* business_watched) {
  TENURE_TRY(auto c, connect(dsn, schema));
  TENURE_TRY(bool present, is_installed(c.get(), schema));
  if (!present) return tenure::error{errc::invalid_argument, "no trace recorder in schema " + schema + " (tenure trace install)"};
  // One snapshot for the events and the watched tables.
  TENURE_TRYV(run(c.get(), "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", {}, "trace"));
  TENURE_TRY(auto watched, run(c.get(), "SELECT count(*) FROM " + schema + ".trace_business", {}, "trace"));
  if (business_watched != nullptr) *business_watched = std::string{PQgetvalue(watched.get(), 0, 0)} != "0";
  TENURE_TRY(auto r, run(c.get(),
                         "SELECT c.commit_seq, e.seq, e.xid::text, e.tbl, e.op::text, e.job_id, e.run_lease, e.state, "
                         "e.flag, e.who, e.app FROM " + schema + ".trace_events e JOIN " + schema +
                             ".trace_commits c ON c.xid = e.xid ORDER BY c.commit_seq, e.seq",
                         {}, "trace"));
  std::vector<event> out;
  const int n = PQntuples(r.get());
  out.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto v = [&](int col) { return std::string{PQgetvalue(r.get(), i, col)}; };
    event e;
    e.commit_seq = std::stoll(v(0));
    e.seq = std::stoll(v(1));
    e.xid = v(2);
    e.tbl = v(3);
    e.op = v(4).empty() ? '?' : v(4)[0];
    e.job_id = std::stoll(v(5));
    e.run_lease = std::stoll(v(6));
    e.state = v(7);
    e.flag = v(8) == "t";
    e.who = v(9);
    e.app = v(10);
    out.push_back(std::move(e));
  }
  TENURE_TRYV(run(c.get(), "COMMIT", {}, "trace"));
  return out;
}

result<report> check_database(const std::string& dsn, const std::string& schema) {
  bool business_watched = false;
  TENURE_TRY(auto events, load(dsn, schema, &business_watched));
  return check(derive(events, business_watched));
}

}  // namespace tenure::trace
