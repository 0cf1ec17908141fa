#include "cli/number_text.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace tenure::cli {

namespace {

/// A plain decimal: digits, an optional fraction and exponent; finite. nullopt otherwise.
std::optional<double> plain_decimal(const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string::npos;
  const auto [ptr, ec] = std::from_chars(text.data(), end, v, std::chars_format::general);
  if (!plain || ec != std::errc{} || ptr != end || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// `v` as a person writes it: 0.1, 3600, 1000000 (never 0.100000 or 1e+06).
std::string number_words(double v) {
  char buf[64];
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  return ec == std::errc{} ? std::string(buf, ptr) : std::to_string(v);
}

}  // namespace

std::string check_seconds(const std::string& text, double max) {
  const auto v = plain_decimal(text);
  if (!v) return "'" + text + "' is not a number of seconds (e.g. 30 or 0.5)";
  if (*v < 0 || *v > max) {
    return "'" + text + "' is out of range: must be from 0 to " + number_words(max) + " seconds";
  }
  return {};
}

std::string check_number(const std::string& text, double min, double max, const std::string& unit) {
  const std::string range = "from " + number_words(min) + " to " + number_words(max) + " " + unit;
  const auto v = plain_decimal(text);
  if (!v) return "'" + text + "' is not a number: must be " + range;
  if (*v < min || *v > max) return "'" + text + "' is out of range: must be " + range;
  return {};
}

std::string check_integer(const std::string& text, long long min, long long max, const std::string& range) {
  const std::string words =
      range.empty() ? "a whole number from " + std::to_string(min) + " to " + std::to_string(max) : range;
  long long v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v, 10);
  const bool digits = !text.empty() && text.find_first_not_of("0123456789", text[0] == '-' ? 1 : 0) == std::string::npos;
  if (!digits || ec == std::errc::invalid_argument || ptr != end) {
    return "'" + text + "' is not a whole number: must be " + words;
  }
  if (ec != std::errc{} || v < min || v > max) return "'" + text + "' is out of range: must be " + words;
  return {};
}

std::string check_job_id(const std::string& text) {
  std::int64_t id = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, id, 10);
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || ec != std::errc{} || ptr != end || id <= 0) {
    return "'" + text + "' is not a job id (a positive integer up to 9223372036854775807)";
  }
  return {};
}

namespace {

/// Reads the whole document once and remembers the first integer literal that did not fit.
struct integer_checker : nlohmann::json_sax<nlohmann::json> {
  std::string too_big;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t& literal) override {
    // An integer literal (no fraction, no exponent) arrives here only when it overflowed 64 bits.
    if (too_big.empty() && literal.find_first_of(".eE") == std::string::npos) too_big = literal;
    return true;
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

std::string check_json_integers(const std::string& text) {
  integer_checker checker;
  try {
    nlohmann::json::sax_parse(text, &checker);
  } catch (const nlohmann::json::exception&) {
    return {};  // malformed: the parser says so, with the position
  }
  if (checker.too_big.empty()) return {};
  return "the integer " + checker.too_big +
         " does not fit in 64 bits and would be stored rounded; pass it as a JSON string";
}

}  // namespace tenure::cli
