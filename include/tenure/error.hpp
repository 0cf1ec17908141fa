#pragma once
/// \file
/// tenure's error codes and the conditions that say what a caller should do about them.
///
/// Runtime paths report expected failures as values: `tenure::result<T>` carries either a T or a
/// `tenure::error`: an `std::error_code` (tenure's category, or another library's) plus what the
/// code alone cannot say: the detail (the server's message, the offending field of an invalid
/// job) and the SQLSTATE when the database raised it. Compare an error with an `errc` for the
/// exact failure, or with a `condition` for the decision (retry? reconcile? give up? fix the call?).
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

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
  /// The store (or its configuration) does not offer the operation: e.g. external callbacks or
  /// progress on a store without them. The call is valid; this store cannot serve it.
  unsupported = 14,
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

/// A failure as a value: the code (compare it with an errc or a condition, as any
/// std::error_code) and its detail. Copies share the detail (cheap to pass on).
class error : public std::error_code {
 public:
  error() noexcept = default;
  error(errc e) noexcept : std::error_code(make_error_code(e)) {}  // NOLINT: implicit by design
  error(std::error_code code) noexcept : std::error_code(code) {}  // NOLINT: implicit by design
  template <class Enum>
    requires std::is_error_code_enum_v<Enum>
  error(Enum e) noexcept : std::error_code(make_error_code(e)) {}  // NOLINT: implicit by design
  /// `detail`: what went wrong, for a person (one line). `sqlstate`: the SQLSTATE the database
  /// raised, when it did.
  error(std::error_code code, std::string detail, std::string sqlstate = {});
  error(errc e, std::string detail, std::string sqlstate = {}) : error(make_error_code(e), std::move(detail), std::move(sqlstate)) {}

  const std::error_code& code() const noexcept { return *this; }
  /// What went wrong beyond the code, or empty.
  const std::string& detail() const noexcept;
  /// The SQLSTATE the database raised (five characters), or empty.
  const std::string& sqlstate() const noexcept;
  /// The code's message, then ": " and the detail when there is one (SQLSTATE in brackets).
  std::string message() const;

 private:
  struct info {
    std::string detail;
    std::string sqlstate;
  };
  std::shared_ptr<const info> info_;
};

/// Outcome's hook: reading the value of a failed result throws std::system_error with the detail.
[[noreturn]] void outcome_throw_as_system_error_with_payload(const error& e);
/// Outcome's hook: a tenure::error is an error code.
inline const std::error_code& make_error_code(const error& e) noexcept { return e.code(); }

}  // namespace tenure

template <>
struct std::is_error_code_enum<tenure::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<tenure::condition> : std::true_type {};
