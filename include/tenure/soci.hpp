#pragma once
/// \file
/// Opt-in bridge to a caller's SOCI session (PostgreSQL backend): transactional enqueue.
/// Link `tenure::soci`. This header includes SOCI; the rest of tenure's public API does not.
///
/// The job is written by the caller's own connection inside whatever transaction is open on it:
/// the caller's COMMIT makes the job exist, its ROLLBACK makes it never have existed. These
/// functions never begin, commit or roll back. Errors are values; SOCI exceptions do not escape.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <soci/soci.h>

#include "tenure/job.hpp"
#include "tenure/result.hpp"

namespace tenure {

/// A libpq URL or conninfo turned into the keyword form SOCI's PostgreSQL backend accepts
/// (`soci::session(soci::postgresql, tenure::soci_connect_string(url))`): SOCI does not take
/// `postgresql://` URLs. errc::invalid_argument for a string libpq cannot parse.
result<std::string> soci_connect_string(std::string_view dsn);

struct sql_options {
  std::string schema = "tenure";  ///< where tenure is installed
};

/// Enqueues one job through `session`. errc::invalid_argument for a bad job (nothing sent);
/// errc::database_unavailable when the connection is gone; the caller's transaction is aborted
/// by the server on any SQL error, as usual in PostgreSQL.
result<std::int64_t> enqueue(soci::session& session, const new_job& job, const sql_options& options = {});

/// Enqueues many jobs with one statement (arrays, not a per-row loop); ids in input order.
/// All or nothing: one invalid job rejects the batch before anything is sent.
result<std::vector<std::int64_t>> enqueue_batch(soci::session& session, std::span<const new_job> jobs,
                                                const sql_options& options = {});

}  // namespace tenure
