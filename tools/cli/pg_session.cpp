#include "cli/pg_session.hpp"

#include <libpq-fe.h>

#include <memory>

#include <spdlog/spdlog.h>

#include "cli/context.hpp"

namespace tenure::cli {
namespace {

std::string trimmed(const char* message) {
  std::string s = message ? message : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

pg_session::pg_session(const std::string& dsn) : conn_(PQconnectdb(dsn.c_str())) {
  if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
    std::string why = conn_ ? trimmed(PQerrorMessage(conn_)) : "out of memory";
    if (conn_) PQfinish(conn_);
    conn_ = nullptr;
    throw command_error("cannot connect to the database: " + why);
  }
  // Server NOTICEs go to the debug log (-vv), never onto stderr, where a command prints exactly
  // one line when it fails.
  PQsetNoticeProcessor(
      conn_, [](void*, const char* message) { spdlog::debug("tenure.pg: server notice: {}", trimmed(message)); },
      nullptr);
}

pg_session::~pg_session() {
  if (conn_) PQfinish(conn_);
}

std::vector<pg_session::row> pg_session::query(const std::string& sql, const std::vector<std::string>& params,
                                               const std::string& what) {
  if (statement_timeout_.count() > 0) {
    // BEGIN and SET LOCAL: two round trips more per query, so the limit is the server's own.
    const std::string begin =
        "BEGIN; SET LOCAL statement_timeout = " + std::to_string(statement_timeout_.count());
    std::unique_ptr<PGresult, decltype(&PQclear)> started(PQexec(conn_, begin.c_str()), &PQclear);
    if (!started || PQresultStatus(started.get()) != PGRES_COMMAND_OK) {
      last_sqlstate_.clear();
      throw command_error(what + ": " + trimmed(PQerrorMessage(conn_)));
    }
    std::vector<row> rows;
    try {
      rows = run(sql, params, what);
    } catch (const command_error&) {
      PQclear(PQexec(conn_, "ROLLBACK"));
      throw;
    }
    std::unique_ptr<PGresult, decltype(&PQclear)> done(PQexec(conn_, "COMMIT"), &PQclear);
    if (!done || PQresultStatus(done.get()) != PGRES_COMMAND_OK) {
      const char* state = done ? PQresultErrorField(done.get(), PG_DIAG_SQLSTATE) : nullptr;
      last_sqlstate_ = state ? state : "";
      throw command_error(what + ": " + trimmed(PQerrorMessage(conn_)));
    }
    return rows;
  }
  return run(sql, params, what);
}

std::vector<pg_session::row> pg_session::run(const std::string& sql, const std::vector<std::string>& params,
                                             const std::string& what) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  std::unique_ptr<PGresult, decltype(&PQclear)> res(
      PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                   nullptr, 0),
      &PQclear);
  if (!res ||
      (PQresultStatus(res.get()) != PGRES_TUPLES_OK && PQresultStatus(res.get()) != PGRES_COMMAND_OK)) {
    const char* message = res ? PQresultErrorField(res.get(), PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    const char* state = res ? PQresultErrorField(res.get(), PG_DIAG_SQLSTATE) : nullptr;
    last_sqlstate_ = state ? state : "";
    throw command_error(what + ": " + (message ? std::string{message} : trimmed(PQerrorMessage(conn_))));
  }
  std::vector<row> rows;
  const int n = PQntuples(res.get());
  const int cols = PQnfields(res.get());
  rows.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    row values_of_row;
    values_of_row.reserve(static_cast<std::size_t>(cols));
    for (int c = 0; c < cols; ++c) {
      if (PQgetisnull(res.get(), r, c)) {
        values_of_row.emplace_back(std::nullopt);
      } else {
        values_of_row.emplace_back(
            std::string{PQgetvalue(res.get(), r, c), static_cast<std::size_t>(PQgetlength(res.get(), r, c))});
      }
    }
    rows.push_back(std::move(values_of_row));
  }
  return rows;
}

std::string pg_session::quote_ident(const std::string& name) const {
  char* quoted = PQescapeIdentifier(conn_, name.data(), name.size());
  if (quoted == nullptr) throw command_error("cannot quote identifier '" + name + "'");
  std::string out = quoted;
  PQfreemem(quoted);
  return out;
}

}  // namespace tenure::cli
