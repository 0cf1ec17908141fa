#pragma once
/// \file
/// What the PostgreSQL store and the driver bridges share, and what any other code that talks to
/// tenure's SQL contract through its own driver may use: the mapping of a SQLSTATE to a
/// tenure::errc, and the text forms of the values tenure's functions take. Pure functions, no
/// connection, thread-safe.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tenure/result.hpp"

namespace tenure::postgres {

/// Maps a SQLSTATE to a tenure error code: TN001 stale_attempt, TN002 malformed_token, TN003
/// job_not_found, class 40 and 55P03/57014 transient_conflict, class 08/53 and shutdowns
/// database_unavailable, class 22 invalid_argument, 42501 permission_denied, ...
errc errc_from_sqlstate(std::string_view sqlstate) noexcept;

/// A driver's or server's message on one log line: libpq's span several, indented with tabs.
std::string one_line(std::string_view text);

/// '{1,2,3}' for bigint[] / int[].
std::string int_array(const std::vector<std::int64_t>& v);
/// '{"a","b\"c",NULL}' for text[] / jsonb[]: every element quoted and escaped.
std::string text_array(const std::vector<std::optional<std::string>>& v);
/// '1500000 microseconds' for interval.
std::string interval_text(std::chrono::microseconds d);
/// UTC timestamptz text with microseconds.
std::string timestamp_text(std::chrono::system_clock::time_point t);

}  // namespace tenure::postgres
