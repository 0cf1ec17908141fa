#pragma once
/// \file
/// Test support for *_pgtest: the DSN of the project's private PostgreSQL, a small libpq client
/// for test SQL, and a per-test schema that is migrated on creation and dropped on destruction.
#include <libpq-fe.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tenure::test {

/// TENURE_TEST_DSN, or throws (so the test FAILS, never skips, when no server was given).
std::string test_dsn();
/// TENURE_TEST_POOLER_DSN: a PgBouncer with its default settings in transaction pooling mode in
/// front of the test server (scripts/test starts one with scripts/pgbouncer), or throws.
std::string pooler_dsn();
/// TENURE_TEST_SESSION_POOLER_DSN: the same PgBouncer's session-mode pool of that server, or throws.
std::string session_pooler_dsn();
/// The same DSN, logging in as another role (libpq keyword form).
std::string dsn_with_user(const std::string& dsn, const std::string& user);
/// The same DSN in libpq keyword form ("host=... port=..."); SOCI's backend needs that form.
std::string keyword_dsn(const std::string& dsn);
/// A short random lowercase hex string for unique names.
std::string random_suffix();
/// `digits` random lowercase hex digits, for unique names.
std::string random_hex(int digits);

using cell = std::optional<std::string>;

/// Outcome of one test statement: rows, or the server's SQLSTATE and message.
struct sql_result {
  bool ok = false;
  std::string sqlstate;
  std::string error;
  std::vector<std::vector<cell>> rows;
  const std::string& at(std::size_t row, std::size_t col) const;  ///< throws on NULL
};

/// Column `col` of every row as a PostgreSQL array literal ("{1,2,3}"), to pass back as a
/// parameter (e.g. claimed job ids to complete_batch). Throws on NULL.
std::string array_literal(const sql_result& r, std::size_t col);

/// One libpq connection for test SQL. Not thread-safe (one per thread).
class pg {
 public:
  /// `session_settings`: SET client_min_messages and TimeZone after connecting. Off for a
  /// connection through a transaction-pooling pooler, which would hand them on to other clients.
  explicit pg(const std::string& dsn, bool session_settings = true);
  ~pg();
  pg(const pg&) = delete;
  pg& operator=(const pg&) = delete;

  /// Runs one statement with text parameters; never throws for SQL errors.
  sql_result query(const std::string& sql, const std::vector<cell>& params = {});
  /// Runs SQL and throws std::runtime_error("SQLSTATE ...: message") on any error.
  sql_result exec(const std::string& sql, const std::vector<cell>& params = {});
  /// The first cell of the first row of exec(sql).
  std::string scalar(const std::string& sql, const std::vector<cell>& params = {});
  /// Runs `copy_sql` (a COPY ... FROM STDIN) with `data` in its text format; throws on any error.
  void copy_in(const std::string& copy_sql, const std::string& data);
  PGconn* native() const noexcept { return conn_; }

 private:
  PGconn* conn_ = nullptr;
};

/// A fresh tenure schema for one test, migrated on creation, dropped with CASCADE on destruction.
class scoped_schema {
 public:
  explicit scoped_schema(std::string prefix = "t");
  ~scoped_schema();
  scoped_schema(const scoped_schema&) = delete;
  scoped_schema& operator=(const scoped_schema&) = delete;
  const std::string& name() const noexcept { return name_; }
  const std::string& dsn() const noexcept { return dsn_; }

 private:
  std::string dsn_;
  std::string name_;
};

}  // namespace tenure::test
