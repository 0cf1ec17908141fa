#pragma once
/// \file
/// Handler middleware: code the runtime runs around every handler call (tracing, logging
/// context, timing). Register it with runtime::use() before start().
///
/// A middleware is called on the handler's own thread with the attempt's context and a `next`
/// that runs the rest of the chain (the middleware registered after it, then the handler):
///
///     rt->use([](tenure::job_context& ctx, tenure::attempt_next& next) {
///       // before: ctx.job_id(), ctx.kind(), ctx.queue(), ctx.attempt(), ctx.run_lease(),
///       //         ctx.metadata() (e.g. a W3C traceparent)
///       const tenure::attempt_report& r = next();   // runs the handler
///       // after: r.outcome, r.message, r.duration
///     });
///
/// It runs for every attempt whose handler is called, plain or caller-owned; not for an attempt
/// given back because this process has no handler for its kind, nor for a caller-owned attempt
/// cancelled while it waited for its slot (its handler never starts).
///
/// Order: the first middleware registered is the outermost: its code before next() runs first
/// and its code after next() runs last. Everything runs on the handler's thread, so a
/// thread-local set before next() (a trace context) is seen by the handler.
///
/// The outcome: middleware observes it and cannot change it. The runtime applies what the
/// handler decided, unless a middleware throws or returns without calling next(): the attempt
/// then fails with a retry (the queue's backoff, while attempts remain), with an error logged
/// and recorded as the attempt's error, even when the handler had succeeded (its outcome is
/// discarded, never silently). So a middleware must call next() exactly once (later calls
/// return the same report without running anything again) and should not throw after next().
/// next() itself never throws: whatever the rest of the chain throws becomes a retry report.
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace tenure {

class job_context;

/// What an attempt's handler call came to, as middleware sees it after next().
enum class attempt_outcome {
  completed,     ///< job_outcome::completed
  retry,         ///< job_outcome::retry / retry_after, or the handler (or a middleware inside) threw
  failed,        ///< job_outcome::fail, or args that cannot be read
  cancelled,     ///< job_outcome::cancel
  snoozed,       ///< job_outcome::snooze
  caller_owned,  ///< a caller-owned handler returned; the database's evidence settles the attempt
  parked,        ///< job_outcome::park: the attempt waits for its callback with no handler
};

std::string_view to_string(attempt_outcome o) noexcept;

/// The report next() returns.
struct attempt_report {
  attempt_outcome outcome = attempt_outcome::completed;
  /// retry and failed: the error recorded with the attempt; cancelled: the reason; caller_owned:
  /// the error the handler returned (empty when it returned a receipt).
  std::string message;
  /// How long the handler call took, on runtime_config::clock (steady_now()). The same for every
  /// middleware of the chain: the handler alone, not the middleware inside this one. Zero when
  /// the handler did not run.
  std::chrono::nanoseconds duration{0};
};

namespace detail {
class middleware_chain;
}

/// Runs the rest of a middleware chain. Only the runtime makes one.
class attempt_next {
 public:
  /// Runs the rest of the chain once, and returns its report; a second call returns the same
  /// report without running anything. Never throws.
  const attempt_report& operator()();
  /// True once called.
  bool called() const noexcept { return called_; }

  attempt_next(const attempt_next&) = delete;
  attempt_next& operator=(const attempt_next&) = delete;

 private:
  friend class detail::middleware_chain;
  attempt_next(detail::middleware_chain& chain, std::size_t index) noexcept : chain_(&chain), index_(index) {}

  detail::middleware_chain* chain_;
  std::size_t index_;
  bool called_ = false;
  attempt_report report_;
};

/// A middleware: see the file comment for what it may and may not do.
using middleware = std::function<void(job_context& ctx, attempt_next& next)>;

}  // namespace tenure
