#include "tenure/token.hpp"

#include <charconv>
#include <limits>

namespace tenure {
namespace {

/// Parses a positive decimal int64 without sign or leading zeros; the whole text must be used.
bool parse_positive(std::string_view s, std::int64_t& out) noexcept {
  if (s.empty() || s.size() > 19 || s.front() == '0') return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && ptr == s.data() + s.size() && out > 0;
}

/// 0..15 for a lowercase hexadecimal digit, -1 otherwise.
int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

constexpr char k_hex_digits[] = "0123456789abcdef";

}  // namespace

result<attempt_secret> attempt_secret::parse(std::string_view hex) noexcept {
  if (hex.size() != 2 * size) return errc::malformed_token;
  bytes_type bytes{};
  for (std::size_t i = 0; i < size; ++i) {
    const int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return errc::malformed_token;
    bytes[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return attempt_secret{bytes};
}

std::string attempt_secret::to_string() const {
  std::string s(2 * size, '0');
  for (std::size_t i = 0; i < size; ++i) {
    s[2 * i] = k_hex_digits[bytes_[i] >> 4];
    s[2 * i + 1] = k_hex_digits[bytes_[i] & 0x0f];
  }
  return s;
}

bool operator==(const attempt_secret& a, const attempt_secret& b) noexcept {
  // No early exit: the time taken says nothing about where the first difference is.
  unsigned diff = 0;
  for (std::size_t i = 0; i < attempt_secret::size; ++i) {
    diff |= static_cast<unsigned>(a.bytes_[i] ^ b.bytes_[i]);
  }
  return diff == 0;
}

result<finalization_token> finalization_token::parse(std::string_view text) noexcept {
  if (text.size() > max_text_size || !text.starts_with(prefix)) return errc::malformed_token;
  text.remove_prefix(prefix.size());
  const auto first = text.find(':');
  if (first == std::string_view::npos) return errc::malformed_token;
  const auto second = text.find(':', first + 1);
  if (second == std::string_view::npos) return errc::malformed_token;
  attempt_id a;
  if (!parse_positive(text.substr(0, first), a.job_id) ||
      !parse_positive(text.substr(first + 1, second - first - 1), a.run_lease)) {
    return errc::malformed_token;
  }
  auto secret = attempt_secret::parse(text.substr(second + 1));
  if (!secret) return errc::malformed_token;
  return finalization_token{a, secret.value()};
}

std::string finalization_token::to_string() const {
  std::string s{prefix};
  s += std::to_string(attempt_.job_id);
  s += ':';
  s += std::to_string(attempt_.run_lease);
  s += ':';
  s += secret_.to_string();
  return s;
}

}  // namespace tenure
