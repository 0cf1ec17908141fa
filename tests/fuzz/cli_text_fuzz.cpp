// The `tenure` command's number, duration and time parsing (tools/cli/number_text.hpp,
// tools/cli/time_text.hpp), and printable(), which makes user data safe on a terminal.
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "cli/number_text.hpp"
#include "cli/time_text.hpp"
#include "fuzz_check.hpp"

namespace {

using namespace tenure::cli;

/// The whole text as a long long by strtoll (base 10), or false.
bool reference_integer(const std::string& s, long long& v) {
  if (s.empty() || s[0] == ' ' || s[0] == '+' || (s[0] != '-' && (s[0] < '0' || s[0] > '9'))) return false;
  errno = 0;
  char* end = nullptr;
  v = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && end == s.c_str() + s.size();
}

/// The whole text as a finite double by strtod, or false.
bool reference_double(const std::string& s, double& v) {
  if (s.empty() || s.find_first_not_of("0123456789.eE+-") != std::string::npos) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(v);
}

void integers(const std::string& text, long long min, long long max) {
  long long v = 0;
  const bool parsed = reference_integer(text, v) && text.find_first_not_of("-0123456789") == std::string::npos;
  const bool accepted = check_integer(text, min, max).empty();
  // Accepted: a base-10 integer in range, which prints back as an accepted number. Refused:
  // not a plain integer, or out of range.
  FUZZ_CHECK(accepted == (parsed && v >= min && v <= max));
  if (accepted) FUZZ_CHECK(check_integer(std::to_string(v), min, max).empty());

  const bool id_ok = check_job_id(text).empty();
  FUZZ_CHECK(id_ok == (parsed && v > 0 && text[0] != '-'));
}

void decimals(const std::string& text, double max) {
  double v = 0;
  const bool parsed = reference_double(text, v);
  if (check_seconds(text, max).empty()) FUZZ_CHECK(parsed && v >= 0 && v <= max);
  if (check_number(text, 0.5, max, "jobs per second").empty()) FUZZ_CHECK(parsed && v >= 0.5 && v <= max);
}

void times(const std::string& text) {
  const auto t = parse_iso8601(text);
  if (!t) return;
  // Accepted: it prints in the canonical form, which reads back as the same instant.
  const std::string printed = format_iso8601(*t);
  const auto back = parse_iso8601(printed);
  FUZZ_CHECK(back && *back == *t);
  FUZZ_CHECK(format_iso8601(*back) == printed);
  FUZZ_CHECK(printed.size() >= 20 && printed.back() == 'Z' && printed[10] == 'T');
}

void durations(const std::string& text) {
  const auto d = parse_duration(text);
  FUZZ_CHECK(check_duration(text).empty() == d.has_value());
  if (!d) return;
  // In range, and the printed form reads back as the same duration.
  FUZZ_CHECK(d->count() >= 0 && *d <= std::chrono::hours{24} * 36500);
  const auto back = parse_duration(format_duration(*d));
  FUZZ_CHECK(back && *back == *d);
}

void printables(const std::string& text) {
  const std::string out = printable(text);
  // Valid UTF-8 with no control character, no bidirectional control; plain text unchanged.
  bool bad = false;
  FUZZ_CHECK(tenure::fuzz::for_each_code_point(out, [&](std::uint32_t cp) {
    bad |= cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
           (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F || cp == 0x061C;
  }));
  FUZZ_CHECK(!bad);
  if (text.find_first_not_of(" !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]^_`abcdefghijklmnopqrstuvwxyz{|}~") ==
      std::string::npos) {
    FUZZ_CHECK(out == text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text{reinterpret_cast<const char*>(data) + 1, size - 1};
  switch (data[0] % 8) {
    case 0: integers(text, 1, 4); break;
    case 1: integers(text, LLONG_MIN, LLONG_MAX); break;
    case 2: integers(text, -5, 1000000); break;
    case 3: decimals(text, 86400); break;
    case 4: times(text); break;
    case 5: durations(text); break;
    case 6: printables(text); break;
    default: (void)check_json_integers(text); break;
  }
  return 0;
}
