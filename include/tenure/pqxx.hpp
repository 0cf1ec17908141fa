#pragma once
/// \file
/// Opt-in bridge to a caller's libpqxx transaction: transactional enqueue and caller-owned
/// finalization. Link `tenure::pqxx`. Nothing here commits or aborts: the caller owns the
/// transaction.
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <pqxx/pqxx>

#include "tenure/finalization.hpp"
#include "tenure/job.hpp"
#include "tenure/result.hpp"
#include "tenure/sql_options.hpp"
#include "tenure/token.hpp"
#include "tenure/tx_bridge.hpp"

namespace tenure {

/// Enqueues one job inside `tx` (a pqxx::work or another pqxx transaction): the caller's commit
/// makes the job exist, an abort makes it never have existed. On a pqxx::nontransaction the
/// statement commits on its own (autocommit). The same statement, checks and errors as the libpq
/// bridge's enqueue (tenure/libpq.hpp): errc::invalid_argument for a bad job (nothing sent) or one
/// the server refuses (its message as the detail, SQLSTATE 22023); errc::protocol_error in an
/// aborted transaction; errc::database_unavailable when the connection broke inside the
/// transaction, errc::commit_in_doubt when it broke in autocommit. pqxx exceptions do not escape.
result<std::int64_t> enqueue(pqxx::transaction_base& tx, const new_job& job, const sql_options& options = {});

/// Enqueues many jobs inside `tx` with one `<schema>.enqueue_batch(...)` statement over arrays;
/// ids in input order. All or nothing: one invalid job refuses the batch before anything is sent.
/// Inside a pqxx::work on a UTF-8 session, a batch of at least options.copy_threshold keyless jobs
/// goes through COPY (pqxx::stream_to into `specs` or the session's stage), as tenure/libpq.hpp's
/// enqueue_batch() describes.
result<std::vector<std::int64_t>> enqueue_batch(pqxx::transaction_base& tx, std::span<const new_job> jobs,
                                                const sql_options& options = {});

/// As enqueue(), telling whether the job was inserted: with a unique_key held by a live job of
/// its queue, nothing is inserted and the answer is that job's id with `inserted` false.
/// Concurrent producers of one key, each in its own transaction, get one job: a producer waits
/// for an uncommitted holder's transaction to end (see README, "Unique jobs").
result<enqueue_result> try_enqueue(pqxx::transaction_base& tx, const new_job& job, const sql_options& options = {});

/// As enqueue_batch(), telling for each job whether it was inserted (a key repeated within the
/// batch: the later jobs answer the first one's id, not inserted).
result<std::vector<enqueue_result>> try_enqueue_batch(pqxx::transaction_base& tx, std::span<const new_job> jobs,
                                                      const sql_options& options = {});

/// Completes the attempt named by `token` inside `tx` (a pqxx::work or another real pqxx
/// transaction; a pqxx::nontransaction autocommits, so it is refused with errc::protocol_error).
/// errc::stale_attempt when the attempt is no longer live (TN001: the transaction
/// is now aborted; let it abort), errc::malformed_token (TN002), errc::database_unavailable when
/// the connection broke. pqxx exceptions do not escape.
result<finalization_receipt> complete_in_tx(pqxx::transaction_base& tx, const finalization_token& token,
                                            const finalize_options& options = {});

template <class Tx>
struct tx_bridge<Tx, std::enable_if_t<std::is_base_of_v<pqxx::transaction_base, Tx>>> {
  static_assert(!std::is_same_v<Tx, pqxx::nontransaction>,
                "complete_in_tx needs a real transaction (pqxx::work): a nontransaction autocommits the "
                "completion apart from the business writes");
  static result<finalization_receipt> complete(pqxx::transaction_base& tx, const finalization_token& token,
                                               const finalize_options& options) {
    return complete_in_tx(tx, token, options);
  }
};

}  // namespace tenure
