#pragma once
/// \file
/// tenure's error codes and the conditions that say what a caller should do about them.
///
/// Runtime paths report expected failures as values: `tenure::result<T>` carries either a T or a
/// `std::error_code` whose category is tenure's. Compare a code with an `errc` for the exact
/// failure, or with a `condition` for the decision (retry? reconcile? give up? fix the call?).
#include <system_error>

namespace tenure {

/// Exact failure codes. Values are stable (they appear in logs and metrics).
enum class errc {
  /// The attempt (job_id, run_lease) is no longer live: rescued, cancelled, re-claimed or already
  /// finished. Its write touched zero rows and was discarded. SQLSTATE TN001.
  stale_attempt = 1,
  /// A finalization token that is empty, truncated, oversized, of an unknown version or not
  /// well-formed. SQLSTATE TN002.
  malformed_token = 2,
  /// No job with that id exists (in any state).
  job_not_found = 3,
  /// The database could not be reached or the connection broke before an answer. Nothing is known
  /// to have been written; retrying later is safe.
  database_unavailable = 4,
  /// A COMMIT was sent but its answer was lost: it may or may not have been applied. Never retry
  /// blindly; reconcile against durable evidence.
  commit_in_doubt = 5,
  /// A caller supplied a bad argument (bad priority, empty kind, invalid JSON, ...).
  invalid_argument = 6,
  /// The database schema is at a version this binary does not know, or is not installed.
  schema_mismatch = 7,
  /// The database raised an error tenure did not expect (a bug or a misconfiguration).
  database_error = 8,
  /// The database aborted the transaction to break a deadlock or serialization conflict; the
  /// whole operation may be retried.
  transient_conflict = 9,
  /// The peer (handler, caller, database) broke the protocol, e.g. a receipt without evidence.
  protocol_error = 10,
  /// The operation was refused because the component is shutting down.
  shutting_down = 11,
  /// The caller lacks a privilege (e.g. a finalizer-only role reading tenure tables).
  permission_denied = 12,
  /// A maintenance pass of a leader whose lease expired or was taken over (a newer term exists):
  /// refused, nothing changed. The process must stop acting as leader. SQLSTATE TN004.
  leadership_lost = 13,
};

/// Broad conditions: what to do about a failure.
enum class condition {
  retryable = 1,    ///< try again later: nothing was applied
  in_doubt = 2,     ///< outcome unknown: reconcile before deciding anything
  permanent = 3,    ///< will fail the same way again: discard or report
  usage_error = 4,  ///< the call itself is wrong: fix the caller
};

const std::error_category& error_category() noexcept;
const std::error_category& condition_category() noexcept;

std::error_code make_error_code(errc e) noexcept;
std::error_condition make_error_condition(condition c) noexcept;

}  // namespace tenure

template <>
struct std::is_error_code_enum<tenure::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<tenure::condition> : std::true_type {};
