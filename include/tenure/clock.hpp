#pragma once
/// \file
/// The clock port. The engine never reads the wall clock directly, so tests drive time.
#include <atomic>
#include <chrono>

#include "tenure/job.hpp"

namespace tenure {

/// Reads the current time. Implementations are thread-safe and never block.
class clock_port {
 public:
  virtual ~clock_port() = default;
  virtual time_point now() const noexcept = 0;
};

/// The real wall clock.
class system_clock final : public clock_port {
 public:
  time_point now() const noexcept override { return clock_type::now(); }
  /// A process-wide instance.
  static const system_clock& instance() noexcept {
    static const system_clock c;
    return c;
  }
};

/// A clock that moves only when told to. Thread-safe.
class manual_clock final : public clock_port {
 public:
  explicit manual_clock(time_point start = time_point{std::chrono::seconds{1'700'000'000}}) noexcept
      : now_(start.time_since_epoch().count()) {}
  time_point now() const noexcept override {
    return time_point{clock_type::duration{now_.load(std::memory_order_acquire)}};
  }
  void advance(clock_type::duration d) noexcept { now_.fetch_add(d.count(), std::memory_order_acq_rel); }
  void set(time_point t) noexcept { now_.store(t.time_since_epoch().count(), std::memory_order_release); }

 private:
  std::atomic<clock_type::duration::rep> now_;
};

}  // namespace tenure
