#pragma once
/// \file
/// Opt-in bridge to a caller's raw libpq connection: caller-owned finalization. Link
/// `tenure::libpq`. Nothing here begins, commits or rolls back: the caller owns the transaction.
#include <libpq-fe.h>

#include "tenure/finalization.hpp"
#include "tenure/result.hpp"
#include "tenure/token.hpp"
#include "tenure/tx_bridge.hpp"

namespace tenure {

/// Completes the attempt named by `token` on `conn`, which must be inside a transaction the
/// caller opened with BEGIN (errc::protocol_error otherwise: an autocommit completion would
/// commit apart from the business writes; likewise for an aborted transaction or a busy
/// connection). errc::stale_attempt when the attempt is no longer
/// live (TN001: the transaction is now aborted; roll it back), errc::malformed_token (TN002),
/// errc::database_unavailable when the connection broke (the transaction is lost with it).
result<finalization_receipt> complete_in_tx(PGconn* conn, const finalization_token& token,
                                            const finalize_options& options = {});

template <>
struct tx_bridge<PGconn*> {
  static result<finalization_receipt> complete(PGconn* conn, const finalization_token& token,
                                               const finalize_options& options) {
    return complete_in_tx(conn, token, options);
  }
};

}  // namespace tenure
