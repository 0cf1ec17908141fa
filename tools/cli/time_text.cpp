#include "cli/time_text.hpp"

#include <cctype>
#include <chrono>
#include <cstdio>
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

}  // namespace tenure::cli
