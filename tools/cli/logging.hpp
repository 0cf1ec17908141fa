#pragma once
/// \file
/// Logging for a command-line tool. The adapter logs through spdlog's default logger; a command
/// must still print exactly one line when it fails, so by default warnings are held back and
/// either folded into that line or printed after a success.
#include <optional>
#include <string>
#include <vector>

namespace tenure::cli {

/// verbosity 0: warn and above are held in memory (see below), nothing else is kept.
/// verbosity 1: info and above straight to stderr; 2 or more: debug.
void setup_logging(int verbosity);

/// The most recent held warning or error, without the adapter's "tenure.pg: " prefix and without
/// libpq's CONTEXT trail.
std::optional<std::string> last_held_warning();

/// Removes and returns every held message, oldest first.
std::vector<std::string> take_held_warnings();

}  // namespace tenure::cli
