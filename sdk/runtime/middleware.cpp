// Handler middleware (runtime::use): the chain each attempt runs on its handler thread.
#include "sdk/runtime/middleware.hpp"

#include <exception>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure {

std::string_view to_string(attempt_outcome o) noexcept {
  switch (o) {
    case attempt_outcome::completed: return "completed";
    case attempt_outcome::retry: return "retry";
    case attempt_outcome::failed: return "failed";
    case attempt_outcome::cancelled: return "cancelled";
    case attempt_outcome::snoozed: return "snoozed";
    case attempt_outcome::caller_owned: return "caller_owned";
    case attempt_outcome::parked: return "parked";
  }
  return "unknown";
}

const attempt_report& attempt_next::operator()() {
  if (!called_) {
    called_ = true;
    report_ = chain_->run_from(index_ + 1);
  }
  return report_;
}

}  // namespace tenure

namespace tenure::detail {

middleware_chain::middleware_chain(const std::vector<middleware>& layers, job_context& ctx, const clock_port& clock,
                                   std::function<attempt_report()> handler) noexcept
    : layers_(layers), ctx_(ctx), clock_(clock), handler_(std::move(handler)) {}

attempt_report middleware_chain::run() { return run_from(0); }

attempt_report middleware_chain::fail(std::string why) noexcept {
  try {
    tenure::logger()->error("tenure: {} (job {} lease {} kind {} queue {}); the attempt is retried", why,
                            ctx_.job_id(), ctx_.run_lease(), ctx_.kind(), ctx_.queue());
    if (!failure_) failure_ = why;
    attempt_report r;
    r.outcome = attempt_outcome::retry;
    r.message = std::move(why);
    return r;
  } catch (...) {
    if (!failure_) failure_.emplace();
    return attempt_report{attempt_outcome::retry, {}, {}};
  }
}

attempt_report middleware_chain::run_from(std::size_t index) noexcept {
  if (index >= layers_.size()) {
    const auto start = clock_.steady_now();
    attempt_report r;
    try {
      r = handler_();
    } catch (...) {
      // The runtime's handler wrapper catches what handlers throw; this is only a safety net.
      return fail("the handler call threw past its wrapper");
    }
    r.duration = clock_.steady_now() - start;
    return r;
  }
  attempt_next next{*this, index};
  try {
    layers_[index](ctx_, next);
  } catch (const std::exception& e) {
    return fail("middleware " + std::to_string(index + 1) + " threw: " + e.what());
  } catch (...) {
    return fail("middleware " + std::to_string(index + 1) + " threw a non-standard exception");
  }
  if (!next.called()) {
    return fail("middleware " + std::to_string(index + 1) + " returned without calling next(): the handler did not run");
  }
  return next.report_;
}

attempt_report report_of(const job_outcome& o) {
  attempt_report r;
  switch (o.what()) {
    case job_outcome::kind::completed: r.outcome = attempt_outcome::completed; break;
    case job_outcome::kind::retry: r.outcome = attempt_outcome::retry; break;
    case job_outcome::kind::snooze: r.outcome = attempt_outcome::snoozed; break;
    case job_outcome::kind::fail: r.outcome = attempt_outcome::failed; break;
    case job_outcome::kind::cancel: r.outcome = attempt_outcome::cancelled; break;
    case job_outcome::kind::park: r.outcome = attempt_outcome::parked; break;
  }
  r.message = o.message();
  return r;
}

}  // namespace tenure::detail
