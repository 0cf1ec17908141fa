#pragma once
// Polling for a condition that another thread (a runtime, a worker process) makes true.
#include <chrono>
#include <thread>
#include <utility>

namespace tenure::test {

/// Polls `cond` every `step` until it holds or `timeout` passes; returns its last answer.
template <class Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout = std::chrono::seconds{20},
                std::chrono::milliseconds step = std::chrono::milliseconds{1}) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(step);
  }
  return cond();
}

/// eventually() for conditions that cost a query or a read: every 20 ms unless said.
template <class Cond>
bool poll_until(Cond cond, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every = std::chrono::milliseconds{20}) {
  return eventually(std::move(cond), timeout, every);
}

}  // namespace tenure::test
