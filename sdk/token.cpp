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

}  // namespace

result<finalization_token> finalization_token::parse(std::string_view text) noexcept {
  if (text.size() > max_text_size || !text.starts_with(prefix)) return errc::malformed_token;
  text.remove_prefix(prefix.size());
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return errc::malformed_token;
  attempt_id a;
  if (!parse_positive(text.substr(0, colon), a.job_id) ||
      !parse_positive(text.substr(colon + 1), a.run_lease)) {
    return errc::malformed_token;
  }
  return finalization_token{a};
}

std::string finalization_token::to_string() const {
  std::string s{prefix};
  s += std::to_string(attempt_.job_id);
  s += ':';
  s += std::to_string(attempt_.run_lease);
  return s;
}

}  // namespace tenure
