#include "cli/time_text.hpp"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <ctime>

namespace tenure::cli {
namespace {

/// Reads exactly `digits` decimal digits at `pos`.
std::optional<int> read_number(std::string_view s, std::size_t& pos, int digits) {
  if (pos + static_cast<std::size_t>(digits) > s.size()) return std::nullopt;
  int v = 0;
  for (int i = 0; i < digits; ++i) {
    const char c = s[pos + static_cast<std::size_t>(i)];
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  pos += static_cast<std::size_t>(digits);
  return v;
}

bool eat(std::string_view s, std::size_t& pos, char c) {
  if (pos < s.size() && s[pos] == c) {
    ++pos;
    return true;
  }
  return false;
}

}  // namespace

std::optional<time_point> parse_iso8601(std::string_view s) {
  using namespace std::chrono;
  std::size_t pos = 0;
  const auto year = read_number(s, pos, 4);
  if (!year || !eat(s, pos, '-')) return std::nullopt;
  const auto month = read_number(s, pos, 2);
  if (!month || !eat(s, pos, '-')) return std::nullopt;
  const auto day = read_number(s, pos, 2);
  if (!day) return std::nullopt;
  const year_month_day date{std::chrono::year{*year}, std::chrono::month{static_cast<unsigned>(*month)},
                            std::chrono::day{static_cast<unsigned>(*day)}};
  if (!date.ok()) return std::nullopt;

  int hour = 0, minute = 0, second = 0;
  microseconds fraction{0};
  if (eat(s, pos, 'T') || eat(s, pos, ' ')) {
    const auto h = read_number(s, pos, 2);
    if (!h || !eat(s, pos, ':')) return std::nullopt;
    const auto m = read_number(s, pos, 2);
    if (!m) return std::nullopt;
    hour = *h;
    minute = *m;
    if (eat(s, pos, ':')) {
      const auto sec = read_number(s, pos, 2);
      if (!sec) return std::nullopt;
      second = *sec;
      if (eat(s, pos, '.') || eat(s, pos, ',')) {
        int digits = 0;
        std::int64_t us = 0;
        while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
          if (digits < 6) us = us * 10 + (s[pos] - '0');
          ++digits;
          ++pos;
        }
        if (digits == 0) return std::nullopt;
        for (int i = digits; i < 6; ++i) us *= 10;
        fraction = microseconds{us};
      }
    }
    // 60 would be a leap second; system_clock cannot name it.
    if (hour > 23 || minute > 59 || second > 59) return std::nullopt;
  }

  minutes offset{0};
  if (pos < s.size()) {
    if (s[pos] == 'Z' || s[pos] == 'z') {
      ++pos;
    } else if (s[pos] == '+' || s[pos] == '-') {
      const int sign = s[pos] == '-' ? -1 : 1;
      ++pos;
      const auto oh = read_number(s, pos, 2);
      if (!oh) return std::nullopt;
      int om = 0;
      if (pos < s.size()) {
        eat(s, pos, ':');
        const auto m = read_number(s, pos, 2);
        if (!m) return std::nullopt;
        om = *m;
      }
      if (*oh > 23 || om > 59) return std::nullopt;
      offset = minutes{sign * (*oh * 60 + om)};
    }
  }
  if (pos != s.size()) return std::nullopt;

  // The text names local time at `offset`; UTC is that minus the offset. Summed in
  // microseconds, which reach far beyond any year typed here, then range-checked: the clock
  // counts nanoseconds in 64 bits (years 1678..2262) and would silently wrap.
  const microseconds since_epoch =
      sys_days{date}.time_since_epoch() + hours{hour} + minutes{minute} + seconds{second} + fraction - offset;
  if (since_epoch < duration_cast<microseconds>(clock_type::duration::min()) ||
      since_epoch > duration_cast<microseconds>(clock_type::duration::max())) {
    return std::nullopt;
  }
  return time_point{duration_cast<clock_type::duration>(since_epoch)};
}

std::string format_iso8601(time_point t) {
  using namespace std::chrono;
  const auto us = duration_cast<microseconds>(t.time_since_epoch());
  const auto day = floor<days>(us);
  const year_month_day date{sys_days{day}};
  const hh_mm_ss<microseconds> time{us - day};
  char buf[48];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02lldZ", static_cast<int>(date.year()),
                static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                static_cast<int>(time.hours().count()), static_cast<int>(time.minutes().count()),
                static_cast<long long>(time.seconds().count()));
  std::string out = buf;
  // Microseconds only when present: most run_at values a human typed are whole seconds.
  if (time.subseconds().count() != 0) {
    std::snprintf(buf, sizeof buf, ".%06lld", static_cast<long long>(time.subseconds().count()));
    out.insert(out.size() - 1, buf);
  }
  return out;
}

namespace {
struct duration_unit {
  std::string_view suffix;
  std::int64_t us;
};
// Longest suffix first: "ms" before "m" and "s".
constexpr duration_unit k_units[] = {{"ms", 1'000}, {"s", 1'000'000}, {"m", 60'000'000},
                                     {"h", 3'600'000'000}, {"d", 86'400'000'000}};
constexpr std::int64_t k_max_duration_us = 36'500LL * 86'400'000'000LL;
}  // namespace

std::optional<std::chrono::microseconds> parse_duration(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 15) return std::nullopt;
  const std::string_view suffix = text.substr(digits);
  for (const auto& u : k_units) {
    if (suffix != u.suffix) continue;
    std::int64_t n = 0;
    for (std::size_t i = 0; i < digits; ++i) n = n * 10 + (text[i] - '0');  // 15 digits cannot overflow
    if (n > k_max_duration_us / u.us) return std::nullopt;
    return std::chrono::microseconds{n * u.us};
  }
  return std::nullopt;
}

std::string check_duration(const std::string& text) {
  if (parse_duration(text)) return {};
  return "'" + printable(text) +
         "' is not a duration: use a whole number and a unit, ms, s, m, h or d (e.g. 0s, 90s, 15m, 2h, 7d), "
         "at most 36500d";
}

std::string format_duration(std::chrono::microseconds d) {
  const std::int64_t us = d.count();
  if (us == 0) return "0s";
  for (auto it = std::rbegin(k_units); it != std::rend(k_units); ++it) {
    if (us % it->us == 0) return std::to_string(us / it->us) + std::string{it->suffix};
  }
  return std::to_string(us) + "us";
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  auto hex_byte = [&](unsigned char b) {
    std::snprintf(buf, sizeof buf, "\\x%02X", b);
    out += buf;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b == '\\') {
      out += "\\\\";
      ++i;
      continue;
    }
    if (b < 0x20 || b == 0x7F) {
      hex_byte(b);
      ++i;
      continue;
    }
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes, no overlongs,
    // no surrogates, nothing past U+10FFFF.
    int len = 0;
    char32_t cp = 0;
    if (b >= 0xC2 && b <= 0xDF) len = 2, cp = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, cp = b & 0x0F;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, cp = b & 0x07;
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= text.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]);
      ok = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (ok) {
      ok = !(len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) && !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF));
    }
    if (!ok) {
      hex_byte(b);
      ++i;
      continue;
    }
    const bool control = (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
                         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F || cp == 0x061C;
    if (control) {
      std::snprintf(buf, sizeof buf, "\\u{%04X}", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(text.substr(i, static_cast<std::size_t>(len)));
    }
    i += static_cast<std::size_t>(len);
  }
  return out;
}

}  // namespace tenure::cli
