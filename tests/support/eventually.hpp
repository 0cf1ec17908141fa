#pragma once
// Polling for a condition that another thread (a runtime, a worker process) makes true.
#include <chrono>
#include <thread>

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

}  // namespace tenure::test
