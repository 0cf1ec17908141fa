#pragma once
/// \file
/// ISO 8601 text for the command line. (libstdc++ 12 has no std::chrono::parse.)
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "tenure/job.hpp"

namespace tenure::cli {

/// Parses `YYYY-MM-DD`, optionally followed by `T` or a space and `HH:MM[:SS[.fraction]]`,
/// optionally followed by `Z` or an offset `+HH[:MM]` / `-HH[:MM]`. Without an offset the time is
/// UTC (the adapter's sessions run in UTC too). Fractions beyond microseconds are truncated.
/// nullopt for anything else, including out-of-range fields (month 13, 25:00, Feb 30) and times
/// time_point cannot hold (it counts nanoseconds: years 1678..2261 are safe).
std::optional<time_point> parse_iso8601(std::string_view text);

/// `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` in UTC; the fraction only when it is not zero.
std::string format_iso8601(time_point t);

/// A duration typed on the command line: a whole number and a unit, `ms`, `s`, `m` (minutes), `h`
/// or `d` (24 hours): `0s`, `250ms`, `90s`, `15m`, `2h`, `7d`. At most 36500d. "" when the text is
/// fine, else the reason (for CLI11's check).
std::string check_duration(const std::string& text);
/// The duration check_duration accepted; nullopt for anything it refuses.
std::optional<std::chrono::microseconds> parse_duration(std::string_view text);
/// A duration in the largest unit that states it exactly (`90s`, `2h`, `7d`, `1500ms`).
std::string format_duration(std::chrono::microseconds d);

/// User data (queue names, kinds, errors) made safe to print on a terminal: control characters
/// (C0, DEL, C1), bidirectional overrides and invalid UTF-8 are written as `\xNN` / `\u{NNNN}`,
/// and a backslash as `\\`, so a name can neither move the cursor, recolour the screen, reorder
/// the line nor pass for another name.
std::string printable(std::string_view text);

}  // namespace tenure::cli
