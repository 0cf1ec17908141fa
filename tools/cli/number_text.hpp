#pragma once
/// \file
/// Numbers typed on the command line, checked strictly before CLI11 converts them: CLI11's own
/// conversions accept "nan", "inf" and hexadecimal ("0x10"), and clamp integers that overflow
/// instead of refusing them. Each check returns "" when the text is fine, else the reason.
#include <string>

namespace tenure::cli {

/// A plain decimal number of seconds (digits, an optional fraction and exponent), finite, from 0
/// to `max`.
std::string check_seconds(const std::string& text, double max);

/// A whole number in base 10 (digits with an optional leading '-') from `min` to `max`. The reason
/// says the allowed range in words: "must be a whole number from 1 to 100" unless `range` words it
/// ("1 (highest) to 4 (lowest)").
std::string check_integer(const std::string& text, long long min, long long max, const std::string& range = "");

/// A plain decimal number (as check_seconds reads it), finite, from `min` to `max`; `unit` (e.g.
/// "seconds", "jobs per second") follows the range in the reason.
std::string check_number(const std::string& text, double min, double max, const std::string& unit);

/// A job id: base-10 digits only, 1 .. 9223372036854775807.
std::string check_job_id(const std::string& text);

/// JSON text whose integers all fit in 64 bits: "" or the reason. Larger integer literals would
/// be stored rounded through a double (12345678901234567890123 -> 1.2345678901234568e22), so
/// they are refused instead. Malformed JSON is left to the parser's own message ("").
std::string check_json_integers(const std::string& text);

}  // namespace tenure::cli
