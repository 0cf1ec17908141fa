#pragma once
/// \file
/// The middleware chain of one attempt (runtime::use): runs the registered middleware around the
/// handler call on the handler's thread. Private to the runtime.
#include <optional>
#include <string>
#include <vector>

#include "tenure/clock.hpp"
#include "tenure/job_context.hpp"
#include "tenure/job_outcome.hpp"
#include "tenure/middleware.hpp"

namespace tenure::detail {

class middleware_chain {
 public:
  /// `handler` runs the handler and reports what it decided; it must not throw.
  middleware_chain(const std::vector<middleware>& layers, job_context& ctx, const clock_port& clock,
                   std::function<attempt_report()> handler) noexcept;
  middleware_chain(const middleware_chain&) = delete;
  middleware_chain& operator=(const middleware_chain&) = delete;

  /// Runs every layer around the handler; returns the outermost layer's report.
  attempt_report run();
  /// Set when a middleware threw or returned without calling next(): the error the attempt
  /// retries with instead of the handler's outcome (the first such error).
  const std::optional<std::string>& failure() const noexcept { return failure_; }

 private:
  friend class tenure::attempt_next;
  /// The report of layer `index` onwards (the handler when index == layers.size()). Never throws.
  attempt_report run_from(std::size_t index) noexcept;
  attempt_report fail(std::string why) noexcept;

  const std::vector<middleware>& layers_;
  job_context& ctx_;
  const clock_port& clock_;
  std::function<attempt_report()> handler_;
  std::optional<std::string> failure_;
};

/// The report a plain handler's outcome makes.
attempt_report report_of(const job_outcome& o);

}  // namespace tenure::detail
