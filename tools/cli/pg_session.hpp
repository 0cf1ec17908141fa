#pragma once
/// \file
/// A bare libpq connection for the few read queries the storage port has no reason to offer
/// (e.g. status counts over the jobs view). Failures throw command_error.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

struct pg_conn;

namespace tenure::cli {

class pg_session {
 public:
  using row = std::vector<std::optional<std::string>>;  ///< text values; nullopt = NULL

  /// Connects; command_error "cannot connect to the database: ..." when it cannot.
  explicit pg_session(const std::string& dsn);
  ~pg_session();
  pg_session(const pg_session&) = delete;
  pg_session& operator=(const pg_session&) = delete;

  /// Runs one read-only statement with text parameters; `what` starts the error line.
  std::vector<row> query(const std::string& sql, const std::vector<std::string>& params,
                         const std::string& what);

  /// From now on every query() runs in its own transaction with `SET LOCAL statement_timeout`:
  /// a statement the server has not finished within `limit` is cancelled there (SQLSTATE 57014),
  /// lock waits included. Local to each transaction, so it holds behind a transaction pooler and
  /// leaves nothing on a pooled server connection. Zero turns it off.
  void set_statement_timeout(std::chrono::milliseconds limit) { statement_timeout_ = limit; }

  /// The SQLSTATE of the last statement that failed ("" when none did, or the connection broke).
  const std::string& last_sqlstate() const noexcept { return last_sqlstate_; }

  /// A safely quoted SQL identifier.
  std::string quote_ident(const std::string& name) const;

 private:
  std::vector<row> run(const std::string& sql, const std::vector<std::string>& params, const std::string& what);

  pg_conn* conn_ = nullptr;
  std::string last_sqlstate_;
  std::chrono::milliseconds statement_timeout_{0};
};

}  // namespace tenure::cli
