#pragma once
/// \file
/// Opt-in bridge to a caller's raw libpq connection: transactional enqueue and caller-owned
/// finalization. Link `tenure::libpq`. Nothing here begins, commits or rolls back: the caller
/// owns the transaction.
#include <cstdint>
#include <span>
#include <vector>

#include <libpq-fe.h>

#include "tenure/finalization.hpp"
#include "tenure/job.hpp"
#include "tenure/result.hpp"
#include "tenure/sql_options.hpp"
#include "tenure/token.hpp"
#include "tenure/tx_bridge.hpp"

namespace tenure {

/// Enqueues one job on `conn` with `<schema>.enqueue(...)` (PQexecParams), inside the
/// transaction the caller opened with BEGIN: its COMMIT makes the job exist, its ROLLBACK makes
/// it never have existed. On a connection outside a transaction block the statement commits on
/// its own (autocommit), as on a SOCI session without a transaction. Before anything is sent:
/// errc::invalid_argument for a bad job (validate()'s detail) or schema name; errc::protocol_error
/// in an aborted transaction or on a busy connection. A statement the server refuses aborts the
/// caller's transaction (roll it back): errc::invalid_argument with the server's message for a
/// job it refuses (SQLSTATE 22023), errc::schema_mismatch when tenure is not installed there,
/// and so on by SQLSTATE (error::sqlstate()). errc::database_unavailable when the connection
/// broke inside the transaction (the transaction is gone with it); errc::commit_in_doubt when it
/// broke in autocommit (the job may exist).
result<std::int64_t> enqueue(PGconn* conn, const new_job& job, const sql_options& options = {});

/// Enqueues many jobs on `conn` with one `<schema>.enqueue_batch(...)` statement over arrays
/// (never a statement per job); ids in input order. All or nothing: one invalid job refuses the
/// batch before anything is sent. Otherwise as enqueue(). Inside a transaction, a batch of at
/// least options.copy_threshold jobs without unique keys goes through COPY instead: jobs to run now
/// straight into `<schema>.specs` (whose constraints check each job as enqueue_batch does) and their
/// ids read back with `<schema>.enqueue_copied_ready(n)`, which also makes them claimable; a batch with a scheduled job into a stage
/// of the session (`<schema>.enqueue_copy_stage()`, a temporary table tenure owns with the same
/// checks) and one `<schema>.enqueue_copied()` moving them into the job tables. Same answer, same
/// all-or-nothing (a job a check refuses aborts the caller's transaction, as any refused statement
/// does).
result<std::vector<std::int64_t>> enqueue_batch(PGconn* conn, std::span<const new_job> jobs,
                                                const sql_options& options = {});

/// As enqueue(), telling whether the job was inserted: with a unique_key held by a live job of
/// its queue, nothing is inserted and the answer is that job's id with `inserted` false.
/// Concurrent producers of one key, each in its own transaction, get one job: a producer waits
/// for an uncommitted holder's transaction to end (see README, "Unique jobs", for REPEATABLE READ and SERIALIZABLE).
result<enqueue_result> try_enqueue(PGconn* conn, const new_job& job, const sql_options& options = {});

/// As enqueue_batch(), telling for each job whether it was inserted (a key repeated within the
/// batch: the later jobs answer the first one's id, not inserted).
result<std::vector<enqueue_result>> try_enqueue_batch(PGconn* conn, std::span<const new_job> jobs,
                                                      const sql_options& options = {});

/// Completes the attempt named by `token` on `conn`, which must be inside a transaction the
/// caller opened with BEGIN (errc::protocol_error otherwise: an autocommit completion would
/// commit apart from the business writes; likewise for an aborted transaction or a busy
/// connection). errc::stale_attempt when the attempt is no longer
/// live (TN001: the transaction is now aborted; roll it back), errc::malformed_token (TN002),
/// errc::database_unavailable when the connection broke (the transaction is lost with it).
result<finalization_receipt> complete_in_tx(PGconn* conn, const finalization_token& token,
                                            const finalize_options& options = {});

/// Completes the attempt named by `token` and commits the caller's transaction on `conn`, in one
/// round trip: `<schema>.complete_job(token)` and COMMIT go to the server together (libpq's
/// pipeline mode), saving the wait between the two that complete_in_tx followed by the caller's
/// COMMIT costs. `conn` must be inside a transaction the caller opened with BEGIN, idle and not
/// in pipeline mode (errc::protocol_error otherwise, nothing sent). Unlike complete_in_tx, this
/// call ends the transaction:
///   - a receipt (`committed()` true): the server answered the COMMIT; the business writes and the
///     completion committed, and the runtime settles the attempt without reading its evidence.
///   - errc::stale_attempt (TN001), errc::malformed_token (TN002) or another refusal of
///     complete_job: the server skipped the COMMIT; this call rolled the transaction back and
///     nothing of it committed.
///   - the COMMIT refused (errc::transient_conflict for a serialization failure, else by SQLSTATE):
///     the transaction is over and nothing of it committed.
///   - errc::commit_in_doubt: the connection broke after the COMMIT was sent, before its answer;
///     whether it committed is unknown (the runtime reconciles the attempt against the database).
result<finalization_receipt> complete_and_commit(PGconn* conn, const finalization_token& token,
                                                 const finalize_options& options = {});

template <>
struct tx_bridge<PGconn*> {
  static result<finalization_receipt> complete(PGconn* conn, const finalization_token& token,
                                               const finalize_options& options) {
    return complete_in_tx(conn, token, options);
  }
  static result<finalization_receipt> complete_and_commit(PGconn* conn, const finalization_token& token,
                                                          const finalize_options& options) {
    return tenure::complete_and_commit(conn, token, options);
  }
};

}  // namespace tenure
