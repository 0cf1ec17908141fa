#include "support/pg.hpp"

#include <cstdlib>
#include <memory>
#include <random>

#include "tenure/postgres/schema.hpp"

namespace tenure::test {

std::string test_dsn() {
  const char* dsn = std::getenv("TENURE_TEST_DSN");
  if (dsn == nullptr || *dsn == '\0') {
    throw std::runtime_error(
        "TENURE_TEST_DSN is not set: this test needs the project's PostgreSQL (run scripts/test, or "
        "export TENURE_TEST_DSN=$(scripts/pg start))");
  }
  return dsn;
}

namespace {
std::string required_env(const char* name, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    throw std::runtime_error(std::string{name} + " is not set: this test needs " + what +
                             " (run scripts/test, or export " + name + "=$(scripts/pgbouncer " +
                             (std::string{name}.find("SESSION") != std::string::npos ? "session-url" : "start") + "))");
  }
  return v;
}
}  // namespace

std::string pooler_dsn() {
  return required_env("TENURE_TEST_POOLER_DSN", "a PgBouncer in transaction pooling mode");
}
std::string session_pooler_dsn() {
  return required_env("TENURE_TEST_SESSION_POOLER_DSN", "a PgBouncer session-mode pool");
}

namespace {
std::string rebuild(const std::string& dsn, const std::string* user) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(dsn.c_str(), &err);
  if (opts == nullptr) {
    std::string msg = err ? err : "bad DSN";
    PQfreemem(err);
    throw std::runtime_error(msg);
  }
  auto quote = [](const std::string& v) {
    // Plain values stay unquoted: SOCI's own connect-string parser does not take quotes.
    if (!v.empty() && v.find_first_of(" '\\=") == std::string::npos) return v;
    std::string q = "'";
    for (char c : v) {
      if (c == '\'' || c == '\\') q += '\\';
      q += c;
    }
    return q + "'";
  };
  std::string out;
  for (auto* o = opts; o->keyword != nullptr; ++o) {
    if (o->val == nullptr || (user && std::string{o->keyword} == "user")) continue;
    out += std::string{o->keyword} + "=" + quote(o->val) + " ";
  }
  PQconninfoFree(opts);
  return user ? out + "user=" + quote(*user) : out;
}
}  // namespace

std::string dsn_with_user(const std::string& dsn, const std::string& user) { return rebuild(dsn, &user); }
std::string keyword_dsn(const std::string& dsn) { return rebuild(dsn, nullptr); }

std::string array_literal(const sql_result& r, std::size_t col) {
  std::string out = "{";
  for (std::size_t i = 0; i < r.rows.size(); ++i) out += (i ? "," : "") + r.at(i, col);
  return out + "}";
}

std::string random_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  auto v = rng();
  for (int i = 0; i < 10; ++i, v >>= 4) s += hex[v & 0xf];
  return s;
}

std::string random_hex(int digits) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s;
  for (int i = 0; i < digits; ++i) s += "0123456789abcdef"[rng() % 16];
  return s;
}

const std::string& sql_result::at(std::size_t row, std::size_t col) const {
  const auto& c = rows.at(row).at(col);
  if (!c) throw std::runtime_error("NULL cell");
  return *c;
}

pg::pg(const std::string& dsn, bool session_settings) : conn_(PQconnectdb(dsn.c_str())) {
  if (PQstatus(conn_) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(conn_);
    PQfinish(conn_);
    conn_ = nullptr;
    throw std::runtime_error("cannot connect: " + msg);
  }
  if (session_settings) PQclear(PQexec(conn_, "SET client_min_messages = warning; SET TimeZone = 'UTC'"));
}

pg::~pg() {
  if (conn_) PQfinish(conn_);
}

sql_result pg::query(const std::string& sql, const std::vector<cell>& params) {
  std::vector<const char*> values;
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  std::unique_ptr<PGresult, decltype(&PQclear)> r{
      params.empty() ? PQexec(conn_, sql.c_str())
                     : PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr,
                                    values.data(), nullptr, nullptr, 0),
      &PQclear};
  sql_result out;
  const auto st = PQresultStatus(r.get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
    out.sqlstate = state ? state : "";
    out.error = PQresultErrorMessage(r.get());
    if (out.error.empty()) out.error = PQerrorMessage(conn_);
    return out;
  }
  out.ok = true;
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    std::vector<cell> row;
    for (int j = 0; j < PQnfields(r.get()); ++j) {
      if (PQgetisnull(r.get(), i, j)) {
        row.emplace_back(std::nullopt);
      } else {
        row.emplace_back(std::string{PQgetvalue(r.get(), i, j),
                                     static_cast<std::size_t>(PQgetlength(r.get(), i, j))});
      }
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

sql_result pg::exec(const std::string& sql, const std::vector<cell>& params) {
  auto r = query(sql, params);
  if (!r.ok) throw std::runtime_error("SQLSTATE " + r.sqlstate + ": " + r.error + " in: " + sql);
  return r;
}

std::string pg::scalar(const std::string& sql, const std::vector<cell>& params) {
  auto r = exec(sql, params);
  if (r.rows.empty() || r.rows[0].empty()) throw std::runtime_error("no rows from: " + sql);
  return r.rows[0][0].value_or("<NULL>");
}

void pg::copy_in(const std::string& copy_sql, const std::string& data) {
  PGresult* r = PQexec(conn_, copy_sql.c_str());
  const bool started = PQresultStatus(r) == PGRES_COPY_IN;
  std::string error = started ? "" : PQresultErrorMessage(r);
  PQclear(r);
  if (!started) throw std::runtime_error("COPY did not start: " + error + " in: " + copy_sql);
  if (PQputCopyData(conn_, data.data(), static_cast<int>(data.size())) != 1 || PQputCopyEnd(conn_, nullptr) != 1) {
    throw std::runtime_error(std::string{"COPY data not sent: "} + PQerrorMessage(conn_));
  }
  bool ok = true;
  while ((r = PQgetResult(conn_)) != nullptr) {
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      ok = false;
      error = PQresultErrorMessage(r);
    }
    PQclear(r);
  }
  if (!ok) throw std::runtime_error("COPY failed: " + error + " in: " + copy_sql);
}

scoped_schema::scoped_schema(std::string prefix)
    : dsn_(test_dsn()), name_(std::move(prefix) + "_" + random_suffix()) {
  auto m = tenure::postgres::migrate(dsn_, name_);
  if (!m) throw std::runtime_error("migrate " + name_ + " failed: " + m.error().message());
}

scoped_schema::~scoped_schema() {
  try {
    pg c{dsn_};
    c.query("DROP SCHEMA IF EXISTS " + name_ + " CASCADE");
  } catch (...) {
    // Best effort: a test that stopped the server must not also crash here.
  }
}

}  // namespace tenure::test
