#pragma once
/// \file
/// runtime::create's checks of a runtime_config, and the defaults it fills in. Stands on
/// nothing. Private to the runtime.
#include <optional>
#include <string>

#include "tenure/runtime.hpp"

namespace tenure::detail {

/// Checks `config` (`has_signals`: a signal port is given); nullopt when it is valid, else why
/// not. A valid config gets its defaults: worker_id (host:pid) and handler_threads (the sum of
/// the queues' max_concurrency).
std::optional<std::string> validate_config(runtime_config& config, bool has_signals);

}  // namespace tenure::detail
