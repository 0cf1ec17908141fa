#pragma once
/// \file
/// The clock port. The engine and the stores never read a clock directly, so tests drive time.
#include <atomic>
#include <chrono>

#include "tenure/job.hpp"

namespace tenure {

/// A monotonic reading: what durations, deadlines and backoffs are measured with.
using steady_time_point = std::chrono::steady_clock::time_point;

/// Reads the current time. Implementations are thread-safe and never block.
class clock_port {
 public:
  virtual ~clock_port() = default;
  /// The wall clock (what stores write into rows).
  virtual time_point now() const noexcept = 0;
  /// A monotonic clock, never going back: the runtime measures staleness, budgets, backoffs,
  /// lease expiry and coalescing gaps with it.
  virtual steady_time_point steady_now() const noexcept = 0;
};

/// The real clocks.
class system_clock final : public clock_port {
 public:
  time_point now() const noexcept override { return clock_type::now(); }
  steady_time_point steady_now() const noexcept override { return std::chrono::steady_clock::now(); }
  /// A process-wide instance.
  static const system_clock& instance() noexcept {
    static const system_clock c;
    return c;
  }
};

/// A clock that moves only when told to. advance() moves both readings together; set() moves
/// only the wall reading (the monotonic one never goes back). Thread-safe.
class manual_clock final : public clock_port {
 public:
  explicit manual_clock(time_point start = time_point{std::chrono::seconds{1'700'000'000}}) noexcept
      : now_(start.time_since_epoch().count()),
        steady_(std::chrono::duration_cast<steady_time_point::duration>(std::chrono::hours{24}).count()) {}
  time_point now() const noexcept override {
    return time_point{clock_type::duration{now_.load(std::memory_order_acquire)}};
  }
  steady_time_point steady_now() const noexcept override {
    return steady_time_point{steady_time_point::duration{steady_.load(std::memory_order_acquire)}};
  }
  /// Moves both readings forward by `d` (a negative `d` moves only the wall reading back).
  void advance(clock_type::duration d) noexcept {
    now_.fetch_add(d.count(), std::memory_order_acq_rel);
    if (d.count() > 0) {
      steady_.fetch_add(std::chrono::duration_cast<steady_time_point::duration>(d).count(),
                        std::memory_order_acq_rel);
    }
  }
  void set(time_point t) noexcept { now_.store(t.time_since_epoch().count(), std::memory_order_release); }

 private:
  std::atomic<clock_type::duration::rep> now_;
  std::atomic<steady_time_point::duration::rep> steady_;
};

}  // namespace tenure
