#pragma once
/// \file
/// The signal port: wake-ups and cancellations over one dedicated database session
/// (LISTEN/NOTIFY on PostgreSQL), and the maintenance leadership lease.
///
/// Used by one runtime thread only (not thread-safe). Every method blocks. A lost connection
/// loses any notifications sent meanwhile: after `connect()` succeeds again the runtime polls
/// every queue once. Leadership is not tied to the session: it is a lease with an expiry kept by
/// the database's clock, so a paused or vanished leader stops leading once its lease expires.
///
/// Signals are hints, never facts: on PostgreSQL any role that can connect may NOTIFY these
/// channels. The runtime checks a cancel against the attempt's durable evidence before it
/// cancels a handler, and coalesces wake and resume signals so a flood costs bounded work.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tenure/result.hpp"
#include "tenure/token.hpp"

namespace tenure {

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
  /// Acquires or renews the maintenance lease for `holder` (unique to one runtime instance) for
  /// `ttl`, counted by the database's clock from when it handles the request. Returns the term
  /// held, or nullopt when another holder's lease has not expired. A holder renews its unexpired
  /// lease with the same term; an expired lease goes to whoever asks first with a new term. The
  /// caller must count the lease as lost `ttl` after it sent the request (by its own steady
  /// clock), renewed or not. errc::database_unavailable when the session is down or too slow.
  virtual result<std::optional<std::int64_t>> try_lead(const std::string& holder, std::chrono::milliseconds ttl) = 0;
  /// Ends `holder`'s lease of `term` now, so that another worker need not wait for it to expire
  /// (a stopping runtime). Best effort: a lease not released simply expires.
  virtual void resign(const std::string& holder, std::int64_t term) noexcept = 0;
};

}  // namespace tenure
