#include "connection.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::postgres {
namespace detail {

std::int64_t rows::int64(int row, int col) const noexcept {
  const auto t = text(row, col);
  std::int64_t v = 0;
  std::from_chars(t.data(), t.data() + t.size(), v);
  return v;
}

}  // namespace detail

// ---- the interface shared with the bridges (tenure/postgres/sql_text.hpp) -------------------

errc errc_from_sqlstate(std::string_view s) noexcept {
  if (s == "TN001") return errc::stale_attempt;
  if (s == "TN002") return errc::malformed_token;
  if (s == "TN003") return errc::job_not_found;
  if (s == "TN004") return errc::leadership_lost;
  // Serialization failure, deadlock, lock timeout, and a statement cancelled (statement_timeout,
  // pg_cancel_backend): the transaction was rolled back, the whole operation may be retried.
  if (s == "40001" || s == "40P01" || s == "55P03" || s == "57014") return errc::transient_conflict;
  if (s == "40003") return errc::commit_in_doubt;  // statement completion unknown
  if (s == "42501") return errc::permission_denied;
  // 3F000 invalid schema, 42P01 undefined table, 42883 undefined function: not installed.
  if (s == "3F000" || s == "42P01" || s == "42883") return errc::schema_mismatch;
  // Connection trouble, shutdown, insufficient resources (class 53: disk full, out of memory,
  // too many connections), and a read-only server (a standby, e.g. right after a failover).
  if (s.starts_with("08") || s.starts_with("53") || s == "57P01" || s == "57P02" || s == "57P03" || s == "25006") {
    return errc::database_unavailable;
  }
  // 23505: a request that would break a unique rule tenure enforces (retry_job of a job whose
  // unique key another live job holds).
  if (s.starts_with("22") || s == "42704" || s == "23514" || s == "23505") return errc::invalid_argument;
  return errc::database_error;
}

std::string one_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\n' || c == '\r' || c == '\t') {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

namespace detail {
namespace {

/// The server's message for a failed statement, for a person: the primary message, then its
/// DETAIL and HINT. Not its CONTEXT, which quotes the SQL that ran (the caller's own statements,
/// inside a function).
std::string server_message(const PGresult* r) {
  const char* primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
  if (primary == nullptr) return {};
  std::string msg = one_line(primary);
  if (const char* d = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL)) msg += " (" + one_line(d) + ")";
  if (const char* h = PQresultErrorField(r, PG_DIAG_MESSAGE_HINT)) msg += " Hint: " + one_line(h);
  return msg;
}

}  // namespace

result<std::unique_ptr<connection>> connection::open(const std::string& dsn, const std::string& application_name,
                                                     std::chrono::milliseconds lock_timeout, session_use use) {
  // Defaults that bound every wait on a dead or silent server, placed before the DSN so that
  // whatever the DSN (or PGCONNECT_TIMEOUT) says wins: a connect that hangs gives up after 10 s,
  // and an established connection whose peer vanished without a word (a dropped network path, a
  // failover) is noticed within ~30 s (TCP keepalives, and an unacknowledged send), instead of
  // after the kernel's two hours. None of them limits how long a statement may run.
  std::vector<const char*> keys{"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                                "tcp_user_timeout"};
  std::vector<const char*> values{"1", "10", "5", "3", "30000"};
  if (std::getenv("PGCONNECT_TIMEOUT") == nullptr) {  // an explicit default would override it
    keys.push_back("connect_timeout");
    values.push_back("10");
  }
  keys.push_back("dbname");  // expanded: the DSN's own settings override everything above
  values.push_back(dsn.c_str());
  if (!application_name.empty()) {
    // A startup parameter, not a SET: poolers (pgbouncer) take it at connect and keep it with
    // the client whichever server session serves it.
    keys.push_back("application_name");
    values.push_back(application_name.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PGconn* c = PQconnectdbParams(keys.data(), values.data(), /*expand_dbname=*/1);
  if (c == nullptr || PQstatus(c) != CONNECTION_OK) {
    std::string msg = c ? one_line(PQerrorMessage(c)) : "out of memory";
    if (c) PQfinish(c);
    return error{errc::database_unavailable, "cannot connect to the database: " + msg};
  }
  // Server NOTICEs go to the log at debug level, never to the program's stderr.
  PQsetNoticeProcessor(
      c, [](void*, const char* message) { tenure::logger()->debug("tenure.pg: server notice: {}", one_line(message)); },
      nullptr);
  std::unique_ptr<connection> conn{new connection(c, lock_timeout, session_use::none)};
  if (use == session_use::keep) {
    auto kept = conn->keep_session();
    if (!kept) return kept.error();
  }
  return conn;
}

result<void> connection::keep_session() {
  // UTC everywhere: timestamps cross this boundary as text or epoch microseconds. (Every value
  // tenure sends carries its offset and every one it reads is epoch microseconds, so a
  // connection without a session of its own does without it.)
  std::string setup = "SET TimeZone = 'UTC'";
  if (lock_timeout_.count() > 0) setup += "; SET lock_timeout = " + std::to_string(lock_timeout_.count());
  auto done = exec_script(setup, effect::read);
  if (!done) return done.error();
  use_ = session_use::keep;
  return success();
}

result<bool> connection::behind_pooler() {
  if (!ok()) return errc::database_unavailable;
  auto r = check(PQexecParams(conn_, "SELECT pg_catalog.pg_backend_pid()", 0, nullptr, nullptr, nullptr, nullptr, 0),
                 "backend_pid", effect::read);
  if (!r) return r.error();
  return r.value().int64(0, 0) != PQbackendPID(conn_);
}

connection::~connection() {
  if (conn_) PQfinish(conn_);
}

result<rows> connection::check(PGresult* r, const char* name, effect e) {
  const auto status = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) return rows{r};
  // Copied: the field points into `r`, which is cleared below.
  const char* state_field = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  const std::string state = state_field ? state_field : "";
  std::string msg = r ? server_message(r) : std::string{};
  if (msg.empty()) msg = one_line(r ? PQresultErrorMessage(r) : PQerrorMessage(conn_));
  if (msg.empty()) msg = one_line(PQerrorMessage(conn_));
  if (r) PQclear(r);
  if (state.empty() || PQstatus(conn_) != CONNECTION_OK) {
    // No SQLSTATE: the connection broke. A write may already have been applied.
    tenure::logger()->warn("tenure.pg: statement {} lost its connection: {}", name, msg);
    return error{e == effect::write ? errc::commit_in_doubt : errc::database_unavailable, msg, state};
  }
  const errc code = errc_from_sqlstate(state);
  if (code == errc::database_error) {
    tenure::logger()->error("tenure.pg: statement {} failed with SQLSTATE {}: {}", name, state, msg);
  } else if (code == errc::database_unavailable && e == effect::write && PQstatus(conn_) != CONNECTION_OK) {
    // Server shutting down or the backend was terminated while our statement ran, and the
    // session went with it: a write may have committed before the answer was lost.
    tenure::logger()->warn("tenure.pg: statement {} interrupted (SQLSTATE {}): {}", name, state, msg);
    return error{errc::commit_in_doubt, msg, state};
  }
  // Otherwise the server answered with an error on a live session (a read-only standby after a
  // failover, 25006; disk full or out of memory, class 53): the statement certainly failed.
  return error{code, msg, state};
}

result<rows> connection::exec(const statement& st, const std::vector<param>& params, effect e) {
  if (!ok()) return errc::database_unavailable;
  if (use_ == session_use::keep && !prepared_.contains(st.name)) {
    PGresult* r = PQprepare(conn_, st.name, st.sql.c_str(), 0, nullptr);
    auto prepared = check(r, st.name, effect::read);
    if (!prepared) return prepared.error();
    prepared_.insert(st.name);
  }
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) {
    // libpq takes C strings: a NUL byte would cut the value short without a word. PostgreSQL
    // text cannot hold one anyway, so the value is refused (as 22021 would be), never truncated.
    if (p && p->find('\0') != std::string::npos) {
      tenure::logger()->warn("tenure.pg: statement {} not sent: a parameter contains a NUL character", st.name);
      return error{errc::invalid_argument, "a text value contains a NUL character, which PostgreSQL cannot store"};
    }
    values.push_back(p ? p->c_str() : nullptr);
  }
  if (use_ == session_use::none) return exec_unnamed(st, values, e);
  PGresult* r = PQexecPrepared(conn_, st.name, static_cast<int>(values.size()), values.data(),
                               nullptr, nullptr, 0);
  return check(r, st.name, e);
}

result<void> connection::copy_in(const std::string& copy_sql, std::span<const new_job> jobs, bool stage, effect e) {
  if (!ok()) return errc::database_unavailable;
  PGresult* started = PQexec(conn_, copy_sql.c_str());
  if (PQresultStatus(started) != PGRES_COPY_IN) {
    auto r = check(started, "enqueue COPY", e);
    if (!r) return r.error();
    return errc::protocol_error;  // a COPY that answered like another statement
  }
  PQclear(started);
  // A blocking connection sends each piece before the next is written: the server reads the first
  // rows while the last are written.
  const auto sent = write_copy_rows(jobs, stage, [this](std::string_view chunk) {
    return PQputCopyData(conn_, chunk.data(), static_cast<int>(chunk.size())) == 1;
  });
  const bool all_sent = sent && sent.value();
  const bool ended_ok = PQputCopyEnd(conn_, all_sent ? nullptr : "tenure: the rows could not be sent") == 1;
  PGresult* ended = PQgetResult(conn_);
  while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);
  if (!sent) {
    PQclear(ended);
    return sent.error();
  }
  if (all_sent && ended_ok && PQresultStatus(ended) == PGRES_COMMAND_OK) {
    PQclear(ended);
    return success();
  }
  auto r = check(ended, "enqueue COPY", e);
  if (!r) return r.error();
  return error{errc::database_unavailable, "the COPY's rows could not be sent"};
}

result<rows> connection::exec_unnamed(const statement& st, const std::vector<const char*>& values, effect e) {
  const int n = static_cast<int>(values.size());
  if (lock_timeout_.count() <= 0) {
    return check(PQexecParams(conn_, st.sql.c_str(), n, nullptr, values.data(), nullptr, nullptr, 0), st.name, e);
  }
  // The lock_timeout setting and the statement in one pipeline with one sync: one round trip and
  // one implicit transaction, so the setting ends with the statement's transaction and nothing
  // is left on a server session a pooler hands on to another client.
  const std::string timeout = std::to_string(lock_timeout_.count());
  const char* setting[1] = {timeout.c_str()};
  const bool sent =
      PQenterPipelineMode(conn_) == 1 &&
      PQsendQueryParams(conn_, "SELECT pg_catalog.set_config('lock_timeout', $1, true)", 1, nullptr, setting,
                        nullptr, nullptr, 0) == 1 &&
      PQsendQueryParams(conn_, st.sql.c_str(), n, nullptr, values.data(), nullptr, nullptr, 0) == 1 &&
      PQpipelineSync(conn_) == 1;
  // Results in order: the setting's, the statement's, then an error of the implicit COMMIT if it
  // failed, then the sync. Each query's results end with one NULL.
  std::vector<std::unique_ptr<PGresult, result_deleter>> got;
  bool synced = false;
  for (int ends = 0; sent && ends < 3;) {
    PGresult* r = PQgetResult(conn_);
    if (r == nullptr) {
      if (PQstatus(conn_) != CONNECTION_OK) break;
      ++ends;
      continue;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      synced = true;
      break;
    }
    got.emplace_back(r);
  }
  if (PQexitPipelineMode(conn_) != 1) {
    // Results still pending (a send failed half way): a connection in that state is not reused.
    tenure::logger()->warn("tenure.pg: statement {}: connection left in pipeline mode, closing it", st.name);
    PQfinish(conn_);
    conn_ = nullptr;
    return error{e == effect::write ? errc::commit_in_doubt : errc::database_unavailable,
                 "connection left in pipeline mode"};
  }
  if (!synced) {
    // The sync never came back: the transaction's end is unknown (a write may have committed).
    return check(nullptr, st.name, e);
  }
  for (auto& r : got) {
    const auto status = PQresultStatus(r.get());
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) return check(r.release(), st.name, e);
  }
  if (got.size() != 2) {
    tenure::logger()->error("tenure.pg: statement {}: {} results in its pipeline, expected 2", st.name, got.size());
    return error{errc::database_error, "unexpected answer to a pipelined statement"};
  }
  return rows{got[1].release()};
}

result<rows> connection::exec_script(const std::string& sql, effect e) {
  if (!ok()) return errc::database_unavailable;
  return check(PQexec(conn_, sql.c_str()), "script", e);
}

void connection::reset_transaction() noexcept {
  if (ok() && PQtransactionStatus(conn_) != PQTRANS_IDLE) PQclear(PQexec(conn_, "ROLLBACK"));
}

std::string connection::quote_ident(std::string_view s) const {
  char* q = PQescapeIdentifier(conn_, s.data(), s.size());
  std::string out = q ? q : "";
  PQfreemem(q);
  return out;
}

std::string connection::quote_literal(std::string_view s) const {
  char* q = PQescapeLiteral(conn_, s.data(), s.size());
  std::string out = q ? q : "";
  PQfreemem(q);
  return out;
}

}  // namespace detail

std::string int_array(const std::vector<std::int64_t>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  s += '}';
  return s;
}

std::vector<std::int64_t> int_array_values(std::string_view text) {
  std::vector<std::int64_t> out;
  std::int64_t cur = 0;
  bool in_number = false, negative = false;
  for (const char c : std::string{text} + ",") {
    if (c >= '0' && c <= '9') {
      cur = cur * 10 + (c - '0');
      in_number = true;
    } else if (in_number) {
      out.push_back(negative ? -cur : cur);
      cur = 0;
      in_number = negative = false;
    } else {
      negative = c == '-';
    }
  }
  return out;
}

std::string text_array(const std::vector<std::optional<std::string>>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    if (!v[i]) {
      s += "NULL";
      continue;
    }
    s += '"';
    for (char c : *v[i]) {
      if (c == '"' || c == '\\') s += '\\';
      s += c;
    }
    s += '"';
  }
  s += '}';
  return s;
}

std::optional<std::string> json_text(const nlohmann::json& v) {
  if (v.is_null()) return "{}";
  try {
    return v.dump();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string interval_text(std::chrono::microseconds d) {
  return std::to_string(d.count()) + " microseconds";
}

std::string timestamp_text(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  auto secs = static_cast<std::time_t>(us / 1'000'000);
  long frac = static_cast<long>(us % 1'000'000);
  if (frac < 0) {
    frac += 1'000'000;
    secs -= 1;
  }
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%06ld+00", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
  return buf;
}

}  // namespace tenure::postgres
