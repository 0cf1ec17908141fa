#include "sdk/runtime/control.hpp"

#include <boost/asio/steady_timer.hpp>
#include <future>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

void control::retry_later(milliseconds d, std::function<void()> fn) {
  auto t = std::make_shared<asio::steady_timer>(ctl);
  ++outstanding_ops;
  at(*t, now() + d, [this, t, fn = std::move(fn)](bool) {
    --outstanding_ops;
    fn();
    check_waiters();
  });
}

void control::at(asio::steady_timer& t, steady_time_point due, std::function<void(bool)> fn) {
  constexpr std::chrono::steady_clock::duration k_step = milliseconds{100};
  const auto left = due - now();
  t.expires_after(std::clamp<std::chrono::steady_clock::duration>(left, {}, k_step));
  t.async_wait([this, &t, due, fn = std::move(fn)](const boost::system::error_code& ec) mutable {
    if (ec) {
      fn(false);
    } else if (now() < due) {
      at(t, due, std::move(fn));
    } else {
      fn(true);
    }
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

void control::when(std::function<bool()> ready, std::function<void()> then) {
  if (ready()) {
    then();
    return;
  }
  waiters.push_back({std::move(ready), std::move(then)});
}

void control::check_waiters() {
  for (std::size_t i = 0; i < waiters.size();) {
    if (!waiters[i].ready()) {
      ++i;
      continue;
    }
    auto then = std::move(waiters[i].then);
    waiters.erase(waiters.begin() + static_cast<std::ptrdiff_t>(i));
    then();  // may add waiters: they are looked at too
  }
}

bool control::run_and_wait_until_due(std::function<void(std::function<void()>)> fn, milliseconds timeout) {
  auto p = std::make_shared<std::promise<void>>();
  auto f = p->get_future();
  on_ctl([fn = std::move(fn), p] { fn([p] { p->set_value(); }); });
  // Woken by the completion; the real-time steps only look at the clock again, so that a
  // manual clock in tests decides when the timeout has passed.
  constexpr milliseconds k_step{50};
  const auto until = now() + timeout;
  for (auto t = now(); t < until; t = now()) {
    const auto left = std::chrono::duration_cast<milliseconds>(until - t) + milliseconds{1};
    if (f.wait_for(std::min(left, k_step)) == std::future_status::ready) return true;
  }
  return f.wait_for(milliseconds{0}) == std::future_status::ready;
}

bool control::run_and_wait(std::function<void(std::function<void()>)> fn, milliseconds timeout) {
  auto p = std::make_shared<std::promise<void>>();
  auto f = p->get_future();
  on_ctl([fn = std::move(fn), p] { fn([p] { p->set_value(); }); });
  return f.wait_for(timeout) == std::future_status::ready;
}

}  // namespace tenure::detail
