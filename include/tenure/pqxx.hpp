#pragma once
/// \file
/// Opt-in bridge to a caller's libpqxx transaction: caller-owned finalization. Link
/// `tenure::pqxx`. Nothing here commits or aborts: the caller owns the transaction.
#include <type_traits>

#include <pqxx/pqxx>

#include "tenure/finalization.hpp"
#include "tenure/result.hpp"
#include "tenure/token.hpp"
#include "tenure/tx_bridge.hpp"

namespace tenure {

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
