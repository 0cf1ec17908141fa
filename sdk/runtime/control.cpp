#include "sdk/runtime/control.hpp"

#include <boost/asio/steady_timer.hpp>
#include <future>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

void control::retry_later(milliseconds d, std::function<void()> fn) {
  auto t = std::make_shared<asio::steady_timer>(ctl, d);
  ++outstanding_ops;
  t->async_wait([this, t, fn = std::move(fn)](const boost::system::error_code&) {
    --outstanding_ops;
    fn();
  });
}

void control::emit(lifecycle_event e, const claimed_attempt& c, std::string message) {
  if (hooks.empty()) return;
  job_event ev{e, c.attempt, c.queue, c.kind, std::move(message)};
  for (auto& h : hooks) {
    try {
      h(ev);
    } catch (const std::exception& ex) {
      tenure::logger()->error("tenure: lifecycle hook threw on {} job {} lease {} queue {}: {}", to_string(e),
                              c.attempt.job_id, c.attempt.run_lease, c.queue, ex.what());
    } catch (...) {
      tenure::logger()->error("tenure: lifecycle hook threw a non-standard exception on {} job {} lease {} queue {}",
                              to_string(e), c.attempt.job_id, c.attempt.run_lease, c.queue);
    }
  }
}

void control::check_idle() {
  if (idle_waiters.empty() || !idle_now()) return;
  auto waiters = std::move(idle_waiters);
  idle_waiters.clear();
  for (auto& w : waiters) w();
}

bool control::run_and_wait(std::function<void(std::function<void()>)> fn, milliseconds timeout) {
  auto p = std::make_shared<std::promise<void>>();
  auto f = p->get_future();
  on_ctl([fn = std::move(fn), p] { fn([p] { p->set_value(); }); });
  return f.wait_for(timeout) == std::future_status::ready;
}

}  // namespace tenure::detail
