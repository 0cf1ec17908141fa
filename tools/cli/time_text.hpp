#pragma once
/// \file
/// ISO 8601 text for the command line. (libstdc++ 12 has no std::chrono::parse.)
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

}  // namespace tenure::cli
