#pragma once
/// \file
/// Lifecycle events the runtime reports to runtime::on_event hooks.
#include <string>
#include <string_view>

#include "tenure/token.hpp"

namespace tenure {

/// Lifecycle events, reported after the transition was durably applied (never for stale results).
/// started: the claim committed; reported before any other event of the attempt, though its
/// handler may already be running (handlers start from the claim's answer, hooks run later on the
/// control thread).
/// parked: the handler returned job_outcome::park and the attempt waits for its callback with no
/// handler (it starts again, as the same attempt, once resumed).
enum class lifecycle_event { started, completed, retried, failed, cancelled, snoozed, rescued, parked };
std::string_view to_string(lifecycle_event e) noexcept;

struct job_event {
  lifecycle_event event;
  attempt_id attempt;
  std::string queue;
  std::string kind;
  std::string message;  ///< error text, reason, or empty
};

}  // namespace tenure
