#include "sdk/runtime/leadership.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

std::optional<std::int64_t> leadership::current_term() const {
  std::lock_guard lock(mu);
  if (term == 0 || clock.steady_now() >= until) return std::nullopt;
  return term;
}

void leadership::hold(std::int64_t t, steady_time_point asked) {
  std::lock_guard lock(mu);
  const auto u = asked + lease_ttl();
  if (t != term && u > clock.steady_now()) {
    tenure::logger()->info("tenure: worker {} is now the maintenance leader (term {})", cfg.worker_id, t);
  }
  term = t;
  until = u;
}

void leadership::drop(std::int64_t t, const std::string& why) {
  std::lock_guard lock(mu);
  if (term == 0 || (t != 0 && t != term)) return;
  tenure::logger()->warn("tenure: worker {} is no longer the maintenance leader (term {}): {}", cfg.worker_id, term, why);
  term = 0;
}

std::optional<std::int64_t> leadership::term_for_pass() {
  std::lock_guard lock(mu);
  if (term == 0) return std::nullopt;
  if (clock.steady_now() < until) return term;
  tenure::logger()->warn("tenure: worker {} is no longer the maintenance leader (term {}): its lease ({} ms) expired before "
               "it was renewed",
               cfg.worker_id, term, lease_ttl().count());
  term = 0;
  return std::nullopt;
}

std::int64_t leadership::give_up() {
  std::lock_guard lock(mu);
  const auto held = term;
  term = 0;
  return held;
}

}  // namespace tenure::detail
