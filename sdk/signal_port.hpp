#pragma once
/// \file
/// The signal port: wake-ups, cancellations and maintenance leadership over one dedicated
/// database session (LISTEN/NOTIFY and a session advisory lock on PostgreSQL).
///
/// Used by one runtime thread only (not thread-safe), except `interrupt()`. Every method blocks.
/// A lost connection loses leadership and any notifications sent meanwhile: after `connect()`
/// succeeds again the runtime polls every queue once.
///
/// Signals are hints, never facts: on PostgreSQL any role that can connect may NOTIFY these
/// channels. The runtime checks a cancel against the attempt's durable evidence before it
/// cancels a handler, and coalesces wake and resume signals so a flood costs bounded work.
#include <chrono>
#include <string>
#include <vector>

#include "tenure/result.hpp"
#include "tenure/token.hpp"

namespace tenure::sdk {

struct signal {
  /// wake: a queue may have work. cancel: an attempt may have been cancelled, rescued or finished
  /// from outside. resume: an attempt's external callback may have been resumed (its waiting
  /// handler should poll now). A payload that does not parse is dropped by the port.
  enum class kind { wake, cancel, resume } what = kind::wake;
  std::string queue;   ///< for wake
  attempt_id attempt;  ///< for cancel and resume
};

class signal_port {
 public:
  virtual ~signal_port() = default;
  /// (Re)connects and subscribes. errc::database_unavailable when the server cannot be reached.
  virtual result<void> connect() = 0;
  virtual bool connected() const noexcept = 0;
  /// Waits up to `timeout` for signals; returns what arrived (possibly nothing).
  /// errc::database_unavailable when the connection broke (call connect() again).
  virtual result<std::vector<signal>> wait(std::chrono::milliseconds timeout) = 0;
  /// Tries to become (or stay) the maintenance leader. true while this session holds the lock.
  virtual result<bool> try_lead() = 0;
};

}  // namespace tenure::sdk
