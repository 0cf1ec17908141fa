#pragma once
/// \file
/// Caller-owned finalization: a handler finishes its job inside the caller's own PostgreSQL
/// transaction, together with its business writes (docs/design.md section 6).
///
/// A caller-owned handler (runtime::handle_caller_owned) returns
/// `result<finalization_receipt>`. A receipt can only be made by a bridge's `complete_in_tx`,
/// which runs the guarded `<schema>.complete_job(token)` on the caller's connection inside the
/// caller's open transaction (it never begins, commits or rolls back). A stale attempt raises
/// TN001 on the server, which aborts the caller's transaction: the business writes and a rejected
/// completion can never commit apart. The bridges:
///   - `tenure/soci.hpp`  (target tenure::soci):  soci::session& inside a soci::transaction
///   - `tenure/libpq.hpp` (target tenure::libpq): PGconn* inside BEGIN
///   - `tenure/pqxx.hpp`  (target tenure::pqxx):  pqxx::work& (any pqxx transaction)
/// Any other language calls `SELECT * FROM tenure.complete_job('<token text>')` itself.
///
/// Whatever the handler returns, the runtime then reads the attempt's durable evidence before it
/// releases anything: the database, not the handler's return value, decides. The one exception
/// is a receipt whose COMMIT the bridge itself saw the server answer (`committed()`, made by
/// libpq's `complete_and_commit`): that answer is the durable evidence, and the runtime settles
/// the attempt as completed without reading it again.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tenure/job.hpp"
#include "tenure/result.hpp"
#include "tenure/token.hpp"

namespace tenure {

namespace detail {
struct receipt_access;  // defined by the bridges only: handlers cannot make a receipt themselves
}

/// Proof that `complete_job` accepted an attempt inside some transaction: the attempt and the
/// terminal evidence the database returned. Unless `committed()`, it says nothing about whether
/// that transaction then committed; the runtime checks that against durable evidence.
class finalization_receipt {
 public:
  const attempt_id& attempt() const noexcept { return token_.attempt(); }
  /// The token `complete_job` accepted (with its secret).
  const finalization_token& token() const noexcept { return token_; }
  /// `completed_at` as the server recorded it (its transaction's start time).
  time_point completed_at() const noexcept { return completed_at_; }
  /// Whether the call that made this receipt also sent the transaction's COMMIT and the server
  /// answered it (`complete_and_commit`): the completion and the business writes are committed.
  /// False for `complete_in_tx`, whose transaction the caller still commits (or not).
  bool committed() const noexcept { return committed_; }

 private:
  friend struct detail::receipt_access;
  finalization_receipt(const finalization_token& t, time_point at, bool committed) noexcept
      : token_(t), completed_at_(at), committed_(committed) {}
  finalization_token token_;
  time_point completed_at_;
  bool committed_ = false;
};

/// Where and how a bridge calls the SQL contract.
struct finalize_options {
  std::string schema = "tenure";  ///< where tenure is installed
  /// Final progress stored with the completed job (JSON). Empty: the attempt's last flushed
  /// progress is kept.
  std::optional<nlohmann::json> progress;
};


}  // namespace tenure
