#pragma once
/// \file
/// The runtime's live metrics: one atomic per counter and gauge of TENURE_RUNTIME_METRICS
/// (include/tenure/runtime_metrics.hpp), written from any thread; the per-queue series
/// (queue_counter / queue_gauge entries, the latency histograms, the queue depths), created once
/// per queue and then reached through a pointer the attempt carries (no lookup, no lock per
/// job); a snapshot into runtime_metrics; the Prometheus text of a snapshot. Private to the
/// runtime.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tenure/runtime_metrics.hpp"

namespace tenure::detail {

/// Histogram upper bounds, in microseconds (Prometheus shows them in seconds): 1 ms to 1 h.
inline constexpr std::array<std::int64_t, 18> k_histogram_bounds_us{
    1'000,      2'500,      5'000,       10'000,      25'000,     50'000,      100'000,       250'000,      500'000,
    1'000'000, 2'500'000, 5'000'000, 10'000'000, 30'000'000, 60'000'000, 300'000'000, 900'000'000, 3'600'000'000};

/// A histogram of durations: one relaxed atomic per bucket (not cumulative; the last one is
/// +Inf) and the sum. observe() is lock-free and allocates nothing. Any thread.
class live_histogram {
 public:
  /// Counts `d` (a negative one, e.g. from clock skew, counts as zero).
  void observe(std::chrono::nanoseconds d) noexcept;
  histogram_snapshot snapshot() const;

 private:
  std::array<std::atomic<std::uint64_t>, k_histogram_bounds_us.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

/// One queue's live series. Its address never changes once created.
struct queue_series {
  explicit queue_series(std::string n) : name(std::move(n)) {}
  const std::string name;
#define TENURE_QLIVE_queue_counter(type, field) std::atomic<type> field{0};
#define TENURE_QLIVE_queue_gauge(type, field) std::atomic<type> field{0};
#define TENURE_QLIVE_counter(type, field)
#define TENURE_QLIVE_gauge(type, field)
#define TENURE_QLIVE_state(type, field)
#define TENURE_QLIVE_METRIC(kind, type, field, name, help) TENURE_QLIVE_##kind(type, field)
  TENURE_RUNTIME_METRICS(TENURE_QLIVE_METRIC)
#undef TENURE_QLIVE_METRIC
#undef TENURE_QLIVE_state
#undef TENURE_QLIVE_gauge
#undef TENURE_QLIVE_counter
#undef TENURE_QLIVE_queue_gauge
#undef TENURE_QLIVE_queue_counter
  live_histogram pickup;
  std::array<live_histogram, k_run_outcomes> run;
  void observe_run(run_outcome o, std::chrono::nanoseconds d) noexcept { run[static_cast<std::size_t>(o)].observe(d); }

  // Queue depths, written by the maintenance leader's pass (control thread), read by snapshots.
  std::atomic<bool> depth_known{false};
  std::atomic<std::int64_t> available{0}, scheduled{0}, retryable{0}, running{0}, waiting_external{0};
  std::atomic<std::int64_t> oldest_available_us{0};

  queue_metrics snapshot() const;
};

/// The queues' series by name. get() creates a queue's series on first use (under a mutex: it
/// runs once per queue on the hot path, and on the maintenance path for queues seen there), so
/// there are at most as many as queues this process has met.
class queue_registry {
 public:
  queue_series& get(std::string_view name);
  /// Every series, ordered by name (under the mutex).
  std::vector<const queue_series*> all() const;
  /// Every series whose queue is not in `seen` loses its depth (set to zero, still known): the
  /// leader's last count found no unfinished job there.
  void zero_depths_except(const std::vector<queue_series*>& seen);
  /// Every series' depth becomes unknown (this process stopped counting: it no longer leads).
  void forget_depths();

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<queue_series>, std::less<>> by_name_;
};

struct live_metrics {
#define TENURE_LIVE_counter(type, field) std::atomic<type> field{0};
#define TENURE_LIVE_gauge(type, field) std::atomic<type> field{0};
#define TENURE_LIVE_state(type, field)
#define TENURE_LIVE_queue_counter(type, field)
#define TENURE_LIVE_queue_gauge(type, field)
#define TENURE_LIVE_METRIC(kind, type, field, name, help) TENURE_LIVE_##kind(type, field)
  TENURE_RUNTIME_METRICS(TENURE_LIVE_METRIC)
#undef TENURE_LIVE_METRIC
#undef TENURE_LIVE_queue_gauge
#undef TENURE_LIVE_queue_counter
#undef TENURE_LIVE_state
#undef TENURE_LIVE_gauge
#undef TENURE_LIVE_counter

  queue_registry queues;

  /// Counters and gauges as they are now, the per-queue ones summed and listed per queue; the
  /// state entries (leadership) are left for the caller to fill in.
  runtime_metrics snapshot() const;
};

/// `r` in Prometheus text exposition format (0.0.4), every metric prefixed with "tenure_".
std::string prometheus_text(const runtime_metrics& r);

/// `v` escaped as a label value of the text exposition format: backslash, double quote and
/// line feed become \\, \" and \n.
std::string escape_label_value(std::string_view v);

}  // namespace tenure::detail
