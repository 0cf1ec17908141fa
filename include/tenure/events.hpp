#pragma once
/// \file
/// Lifecycle events the runtime reports to runtime::on_event hooks.
#include <string>
#include <string_view>

#include "tenure/token.hpp"

namespace tenure {

/// Lifecycle events, reported after the transition was durably applied (never for stale results).
enum class lifecycle_event { started, completed, retried, failed, cancelled, snoozed, rescued };
std::string_view to_string(lifecycle_event e) noexcept;

struct job_event {
  lifecycle_event event;
  attempt_id attempt;
  std::string queue;
  std::string kind;
  std::string message;  ///< error text, reason, or empty
};

}  // namespace tenure
