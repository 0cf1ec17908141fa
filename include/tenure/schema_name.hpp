#pragma once
/// \file
/// The one rule for the name of the schema tenure lives in, shared by migrations, stores, bridges
/// and the runtime's configuration.
#include <cstddef>
#include <string_view>

namespace tenure {

/// Longest schema name: tenure's notification channels are named <schema>_wake, _cancel and
/// _callback, and PostgreSQL names stop at 63 bytes (63 - len("_callback") = 54).
inline constexpr std::size_t max_schema_name_size = 54;

/// True for a schema name tenure accepts: [a-z_][a-z0-9_]*, at most max_schema_name_size
/// characters (a plain identifier that needs no quoting anywhere).
bool valid_schema_name(std::string_view schema) noexcept;

}  // namespace tenure
