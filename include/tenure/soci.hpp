#pragma once
/// \file
/// Opt-in bridge to a caller's SOCI session (PostgreSQL backend): transactional enqueue and
/// caller-owned finalization (complete_in_tx).
/// Link `tenure::soci`. This header includes SOCI; the rest of tenure's public API does not.
///
/// The job is written by the caller's own connection inside whatever transaction is open on it:
/// the caller's COMMIT makes the job exist, its ROLLBACK makes it never have existed. These
/// functions never begin, commit or roll back. Errors are values; SOCI exceptions do not escape.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <soci/soci.h>

#include "tenure/finalization.hpp"
#include "tenure/job.hpp"
#include "tenure/result.hpp"
#include "tenure/sql_options.hpp"
#include "tenure/token.hpp"
#include "tenure/tx_bridge.hpp"

namespace tenure {

/// A libpq URL or conninfo turned into the keyword form SOCI's PostgreSQL backend accepts
/// (`soci::session(soci::postgresql, tenure::soci_connect_string(url))`): SOCI does not take
/// `postgresql://` URLs. errc::invalid_argument for a string libpq cannot parse.
result<std::string> soci_connect_string(std::string_view dsn);

/// Enqueues one job through `session`, inside the transaction open on it (a soci::transaction,
/// or BEGIN; without one the statement commits on its own). The same statement, checks and
/// errors as the libpq bridge's enqueue (tenure/libpq.hpp), run on the connection SOCI holds:
/// errc::invalid_argument for a bad job (nothing sent) or one the server refuses (its message as
/// the detail); errc::protocol_error in an aborted transaction; errc::database_unavailable when
/// the connection is gone; the caller's transaction is aborted by the server on any SQL error,
/// as usual in PostgreSQL.
result<std::int64_t> enqueue(soci::session& session, const new_job& job, const sql_options& options = {});

/// Enqueues many jobs with one statement (arrays, not a per-row loop); ids in input order.
/// All or nothing: one invalid job rejects the batch before anything is sent. Inside a
/// transaction, a batch of at least options.copy_threshold keyless jobs goes through COPY on the
/// session's libpq connection, as tenure/libpq.hpp's enqueue_batch() describes.
result<std::vector<std::int64_t>> enqueue_batch(soci::session& session, std::span<const new_job> jobs,
                                                const sql_options& options = {});

/// As enqueue(), telling whether the job was inserted: with a unique_key held by a live job of
/// its queue, nothing is inserted and the answer is that job's id with `inserted` false.
/// Concurrent producers of one key, each in its own transaction, get one job: a producer waits
/// for an uncommitted holder's transaction to end (see README, "Unique jobs").
result<enqueue_result> try_enqueue(soci::session& session, const new_job& job, const sql_options& options = {});

/// As enqueue_batch(), telling for each job whether it was inserted (a key repeated within the
/// batch: the later jobs answer the first one's id, not inserted).
result<std::vector<enqueue_result>> try_enqueue_batch(soci::session& session, std::span<const new_job> jobs,
                                                      const sql_options& options = {});

/// Completes the attempt named by `token` through `session`, inside the transaction the caller
/// opened on it (a soci::transaction, or BEGIN): errc::protocol_error when none is open (an
/// autocommit completion would commit apart from the business writes). errc::stale_attempt when
/// the attempt is no longer live (TN001: the transaction is now aborted; roll it back),
/// errc::malformed_token (TN002), errc::database_unavailable when the connection broke.
result<finalization_receipt> complete_in_tx(soci::session& session, const finalization_token& token,
                                            const finalize_options& options = {});

template <>
struct tx_bridge<soci::session> {
  static result<finalization_receipt> complete(soci::session& session, const finalization_token& token,
                                               const finalize_options& options) {
    return complete_in_tx(session, token, options);
  }
};

}  // namespace tenure
