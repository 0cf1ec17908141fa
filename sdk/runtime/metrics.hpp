#pragma once
/// \file
/// The runtime's live metrics: one atomic per counter and gauge of TENURE_RUNTIME_METRICS
/// (include/tenure/runtime_metrics.hpp), written from any thread; a snapshot into
/// runtime_metrics; the Prometheus text of a snapshot. Private to the runtime.
#include <atomic>
#include <cstdint>
#include <string>

#include "tenure/runtime.hpp"

namespace tenure::detail {

struct live_metrics {
#define TENURE_LIVE_counter(type, field) std::atomic<type> field{0};
#define TENURE_LIVE_gauge(type, field) std::atomic<type> field{0};
#define TENURE_LIVE_state(type, field)
#define TENURE_LIVE_METRIC(kind, type, field, name, help) TENURE_LIVE_##kind(type, field)
  TENURE_RUNTIME_METRICS(TENURE_LIVE_METRIC)
#undef TENURE_LIVE_METRIC
#undef TENURE_LIVE_state
#undef TENURE_LIVE_gauge
#undef TENURE_LIVE_counter

  /// Counters and gauges as they are now; the state entries (leadership) are left for the
  /// caller to fill in.
  runtime_metrics snapshot() const;
};

/// `r` in Prometheus text exposition format, every metric prefixed with "tenure_".
std::string prometheus_text(const runtime_metrics& r);

}  // namespace tenure::detail
