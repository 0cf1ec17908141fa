#pragma once
/// \file
/// WAL written by one kind of statement, read from `pg_stat_statements`: how the bench splits a
/// drain's WAL between the claims, the completions and the rest while they run side by side.
#include <initializer_list>
#include <map>
#include <optional>
#include <string>

#include "cli/pg_session.hpp"

namespace tenure::bench {

/// Sums `pg_stat_statements.wal_bytes` per SQL function of one schema, as a difference between two
/// readings (the server's counters are never reset: other users of the view keep theirs).
/// Available only where the server preloads `pg_stat_statements` and the extension is installed in
/// the bench's database (scripts/pg does both for its `postgres` database); the bench never
/// installs or removes it.
class statement_wal {
 public:
  /// std::nullopt when the server does not load pg_stat_statements or the role may not read it.
  static std::optional<statement_wal> open(const std::string& dsn, const std::string& schema);
  /// WAL bytes so far of the statements calling `schema.<function>(`, for each function named.
  using reading = std::map<std::string, double>;
  reading read(std::initializer_list<const char*> functions);

 private:
  statement_wal(const std::string& dsn, std::string schema);
  std::string dsn_;
  std::string schema_;
};

/// WAL bytes per job between two readings, for `function` (0 when it never ran).
double wal_per_job(const statement_wal::reading& before, const statement_wal::reading& after,
                   const std::string& function, double jobs);

}  // namespace tenure::bench
