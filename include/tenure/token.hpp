#pragma once
/// \file
/// The finalization token: an opaque, versioned name for one attempt, (job_id, run_lease).
///
/// Portable text form, version 1: `tn1:<job_id>:<run_lease>` where both numbers are positive
/// decimal 64-bit integers without sign or leading zeros. At most `max_text_size` characters.
/// Any other string is malformed (errc::malformed_token, SQLSTATE TN002 in SQL). The SQL functions
/// parse exactly the same grammar; see README "Finalization tokens".
#include <cstdint>
#include <string>
#include <string_view>

#include "tenure/result.hpp"

namespace tenure {

/// Names one attempt: the job and the run lease its claim advanced to.
struct attempt_id {
  std::int64_t job_id = 0;
  std::int64_t run_lease = 0;
  friend bool operator==(const attempt_id&, const attempt_id&) = default;
  friend auto operator<=>(const attempt_id&, const attempt_id&) = default;
};

/// Opaque, copyable token naming one attempt. Cheap to pass around; thread-compatible.
class finalization_token {
 public:
  static constexpr std::string_view prefix = "tn1:";
  static constexpr std::size_t max_text_size = 64;

  finalization_token() = default;
  explicit finalization_token(attempt_id a) noexcept : attempt_(a) {}

  /// Parses the portable text form. Never throws; any bad input is errc::malformed_token.
  static result<finalization_token> parse(std::string_view text) noexcept;
  /// The portable text form (`tn1:<job_id>:<run_lease>`).
  std::string to_string() const;

  const attempt_id& attempt() const noexcept { return attempt_; }
  std::int64_t job_id() const noexcept { return attempt_.job_id; }
  std::int64_t run_lease() const noexcept { return attempt_.run_lease; }
  friend bool operator==(const finalization_token&, const finalization_token&) = default;

 private:
  attempt_id attempt_;
};

}  // namespace tenure
