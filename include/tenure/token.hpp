#pragma once
/// \file
/// The finalization token: an opaque, versioned name for one attempt, (job_id, run_lease), and
/// the secret the server drew for that attempt when it was claimed.
///
/// Portable text form, version 2: `tn2:<job_id>:<run_lease>:<secret>` where both numbers are
/// positive decimal 64-bit integers without sign or leading zeros and `<secret>` is 32 lowercase
/// hexadecimal digits (16 bytes). At most `max_text_size` characters. Any other string is
/// malformed (errc::malformed_token, SQLSTATE TN002 in SQL), and so is every version-1 token
/// (`tn1:<job_id>:<run_lease>`, which carried no secret). The SQL functions parse exactly the
/// same grammar; see README "Finalization tokens".
///
/// (job_id, run_lease) is guessable: ids and leases count up. The secret is what makes a token
/// the right to finalize its attempt: the server draws it at claim time (122 random bits), keeps
/// it with the attempt's receipt and compares it in constant time. Treat token text as a
/// credential: pass it to whoever must finalize the attempt, and do not log it.
#include <array>
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

/// The per-attempt secret: 16 bytes the store draws when it claims the attempt (PostgreSQL:
/// `gen_random_uuid()`, a version-4 UUID with 122 random bits). A default-constructed secret is
/// all zero and matches no attempt. Equality takes the same time whatever the bytes.
class attempt_secret {
 public:
  static constexpr std::size_t size = 16;
  using bytes_type = std::array<std::uint8_t, size>;

  attempt_secret() = default;
  explicit attempt_secret(const bytes_type& bytes) noexcept : bytes_(bytes) {}

  /// Parses exactly 32 lowercase hexadecimal digits. Never throws; anything else is
  /// errc::malformed_token.
  static result<attempt_secret> parse(std::string_view hex) noexcept;
  /// 32 lowercase hexadecimal digits.
  std::string to_string() const;

  const bytes_type& bytes() const noexcept { return bytes_; }
  /// Constant time: every byte is compared, whatever the first difference.
  friend bool operator==(const attempt_secret& a, const attempt_secret& b) noexcept;

 private:
  bytes_type bytes_{};
};

/// Opaque, copyable token naming one attempt and carrying its secret. Cheap to pass around;
/// thread-compatible. Claims hand them out (claimed_attempt::token(), job_context::token());
/// one built from a guessed attempt and any other secret finalizes nothing (TN001).
class finalization_token {
 public:
  static constexpr std::string_view prefix = "tn2:";
  /// "tn2:" + two 19-digit numbers + two colons + 32 hex digits is 76; a little room for the
  /// next version.
  static constexpr std::size_t max_text_size = 80;

  finalization_token() = default;
  finalization_token(attempt_id a, attempt_secret s) noexcept : attempt_(a), secret_(s) {}

  /// Parses the portable text form. Never throws; any bad input, a `tn1:` token included, is
  /// errc::malformed_token.
  static result<finalization_token> parse(std::string_view text) noexcept;
  /// The portable text form (`tn2:<job_id>:<run_lease>:<secret>`).
  std::string to_string() const;

  const attempt_id& attempt() const noexcept { return attempt_; }
  std::int64_t job_id() const noexcept { return attempt_.job_id; }
  std::int64_t run_lease() const noexcept { return attempt_.run_lease; }
  const attempt_secret& secret() const noexcept { return secret_; }
  friend bool operator==(const finalization_token&, const finalization_token&) = default;

 private:
  attempt_id attempt_;
  attempt_secret secret_;
};

}  // namespace tenure
