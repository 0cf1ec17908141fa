#pragma once
/// \file
/// A thin RAII layer over one libpq connection: prepared statements by name, text parameters,
/// and the translation of every failure into a tenure::errc plus a one-line detail.
/// Private to adapters/postgres. Not thread-safe: one thread uses a connection at a time.
#include <libpq-fe.h>

#include <chrono>
#include <span>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "tenure/postgres/session_probe.hpp"
#include "tenure/postgres/sql_text.hpp"
#include "tenure/result.hpp"

namespace tenure::postgres::detail {

/// A statement with a stable name (for prepare, logs and metrics).
struct statement {
  const char* name;
  std::string sql;
};

/// Whether a statement writes. A write whose connection breaks after sending is in doubt.
enum class effect { read, write };

using param = std::optional<std::string>;  ///< nullopt = SQL NULL

struct result_deleter {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};

/// Rows of one statement's answer (text format).
class rows {
 public:
  rows() = default;
  explicit rows(PGresult* r) : res_(r) {}
  int size() const noexcept { return res_ ? PQntuples(res_.get()) : 0; }
  bool is_null(int row, int col) const noexcept { return PQgetisnull(res_.get(), row, col) != 0; }
  std::string_view text(int row, int col) const noexcept {
    return {PQgetvalue(res_.get(), row, col),
            static_cast<std::size_t>(PQgetlength(res_.get(), row, col))};
  }
  std::int64_t int64(int row, int col) const noexcept;
  bool boolean(int row, int col) const noexcept { return text(row, col) == "t"; }
  std::optional<std::string> opt_text(int row, int col) const {
    if (is_null(row, col)) return std::nullopt;
    return std::string{text(row, col)};
  }

 private:
  std::unique_ptr<PGresult, result_deleter> res_;
};

// Declared in the adapter's interface for the bridges (tenure/postgres/sql_text.hpp).
using postgres::errc_from_sqlstate;
using postgres::int_array;
using postgres::interval_text;
using postgres::one_line;
using postgres::text_array;
using postgres::timestamp_text;

/// What a connection may leave on its server session between statements.
enum class session_use {
  /// The connection is a server session of its own for its whole life (a direct connection, or a
  /// pooler in session mode): statements are prepared once by name, settings are made once.
  keep,
  /// Nothing outlives a transaction: a pooler in transaction mode may give every transaction
  /// another server session. Statements go unnamed and no session setting is made; lock_timeout
  /// is set for each statement's own transaction.
  none,
};

class connection {
 public:
  /// Connects (blocking). errc::database_unavailable when the server cannot be reached.
  /// `application_name`, when not empty, names the session in pg_stat_activity (sent at connect,
  /// overriding the DSN's). A positive `lock_timeout` bounds every lock wait of the connection's
  /// statements (SQLSTATE 55P03, transient_conflict). With session_use::keep the session also
  /// gets TimeZone UTC.
  static result<std::unique_ptr<connection>> open(const std::string& dsn, const std::string& application_name = {},
                                                  std::chrono::milliseconds lock_timeout = {},
                                                  session_use use = session_use::keep);
  ~connection();
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  /// Runs a named statement (prepared on first use on this connection).
  result<rows> exec(const statement& st, const std::vector<param>& params, effect e);
  /// Runs SQL text without parameters (may hold several statements). For migrations and DDL.
  result<rows> exec_script(const std::string& sql, effect e);
  /// Runs `copy_sql` (a COPY ... FROM STDIN) with the rows of `jobs` (checked by
  /// check_copy_rows(); for the stage when `stage`), written and sent piece by piece
  /// (write_copy_rows()). A job whose text cannot be written ends the COPY with an error (the
  /// transaction is then aborted), and that error is answered.
  result<void> copy_in(const std::string& copy_sql, std::span<const new_job> jobs, bool stage, effect e);

  /// True when the server process answering differs from the one this connection was given at
  /// connect: a pooler (pgbouncer, ...) sits between, handing out its own backend keys. Any
  /// pooler that moves transactions between server sessions must, or cancel requests would reach
  /// the wrong session. One unnamed statement.
  result<bool> behind_pooler();
  /// Switches a session_use::none connection found to be a session of its own to
  /// session_use::keep, making the session settings now.
  result<void> keep_session();

  bool ok() const noexcept { return conn_ && PQstatus(conn_) == CONNECTION_OK; }
  /// Leaves an aborted or open transaction, if any (after an error mid-transaction).
  void reset_transaction() noexcept;
  PGconn* native() const noexcept { return conn_; }
  /// SQL identifier quoting through libpq.
  std::string quote_ident(std::string_view s) const;
  std::string quote_literal(std::string_view s) const;

 private:
  connection(PGconn* c, std::chrono::milliseconds lock_timeout, session_use use) noexcept
      : conn_(c), lock_timeout_(lock_timeout), use_(use) {}
  result<rows> check(PGresult* r, const char* name, effect e);
  /// session_use::none: the statement unnamed, with lock_timeout set for its own transaction.
  result<rows> exec_unnamed(const statement& st, const std::vector<const char*>& values, effect e);

  PGconn* conn_ = nullptr;
  std::chrono::milliseconds lock_timeout_{};
  session_use use_ = session_use::keep;
  std::unordered_set<std::string> prepared_;
};

/// What `dsn` leads to (see tenure::postgres::probe_session), without logging anything.
result<postgres::session_kind> probe_session(const std::string& dsn, const std::string& application_name,
                                             std::chrono::milliseconds wait);

/// Checks that `dsn` gives a server session of its own, as LISTEN/NOTIFY needs: success for a
/// direct connection (checked by backend key, one round trip) or a session-mode pooler (a test
/// notification arrives); errc::invalid_argument, with the cause and the fix as its detail, when
/// none arrives within `wait` (a pooler in transaction or statement mode). Takes no lock.
result<void> require_session(const std::string& dsn, const std::string& application_name,
                             std::chrono::milliseconds wait);

// ---- text forms of PostgreSQL values ---------------------------------------------------------

/// A time point from epoch microseconds.
inline std::chrono::system_clock::time_point from_epoch_us(std::int64_t us) {
  return std::chrono::system_clock::time_point{std::chrono::microseconds{us}};
}
/// SQL expression turning a timestamptz expression into epoch microseconds (bigint).
inline std::string epoch_us(std::string_view expr) {
  return "floor(extract(epoch from " + std::string{expr} + ") * 1000000)::bigint";
}

}  // namespace tenure::postgres::detail
