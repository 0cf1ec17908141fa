#include "sdk/runtime/metrics.hpp"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

namespace tenure::detail {

void live_histogram::observe(std::chrono::nanoseconds d) noexcept {
  const auto ns = std::max<std::int64_t>(d.count(), 0);
  const auto us = ns / 1'000 + (ns % 1'000 != 0);  // le is inclusive: round up to the bound's unit
  const auto it = std::lower_bound(k_histogram_bounds_us.begin(), k_histogram_bounds_us.end(), us);
  buckets_[static_cast<std::size_t>(it - k_histogram_bounds_us.begin())].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
}

histogram_snapshot live_histogram::snapshot() const {
  histogram_snapshot h;
  h.upper_bounds.reserve(k_histogram_bounds_us.size());
  h.cumulative.reserve(k_histogram_bounds_us.size());
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < k_histogram_bounds_us.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    h.upper_bounds.push_back(static_cast<double>(k_histogram_bounds_us[i]) / 1e6);
    h.cumulative.push_back(running);
  }
  h.count = running + buckets_.back().load(std::memory_order_relaxed);
  h.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return h;
}

queue_metrics queue_series::snapshot() const {
  queue_metrics q;
  q.queue = name;
#define TENURE_QSNAP_queue_counter(field) q.field = field.load(std::memory_order_relaxed);
#define TENURE_QSNAP_queue_gauge(field) q.field = field.load(std::memory_order_relaxed);
#define TENURE_QSNAP_counter(field)
#define TENURE_QSNAP_gauge(field)
#define TENURE_QSNAP_state(field)
#define TENURE_QSNAP_METRIC(kind, type, field, name, help) TENURE_QSNAP_##kind(field)
  TENURE_RUNTIME_METRICS(TENURE_QSNAP_METRIC)
#undef TENURE_QSNAP_METRIC
#undef TENURE_QSNAP_state
#undef TENURE_QSNAP_gauge
#undef TENURE_QSNAP_counter
#undef TENURE_QSNAP_queue_gauge
#undef TENURE_QSNAP_queue_counter
  q.pickup_latency = pickup.snapshot();
  for (std::size_t i = 0; i < k_run_outcomes; ++i) q.run_duration[i] = run[i].snapshot();
  q.depth_known = depth_known.load(std::memory_order_acquire);
  if (q.depth_known) {
    q.available = available.load(std::memory_order_relaxed);
    q.scheduled = scheduled.load(std::memory_order_relaxed);
    q.retryable = retryable.load(std::memory_order_relaxed);
    q.running = running.load(std::memory_order_relaxed);
    q.waiting_external = waiting_external.load(std::memory_order_relaxed);
    q.oldest_available_seconds = static_cast<double>(oldest_available_us.load(std::memory_order_relaxed)) / 1e6;
  }
  return q;
}

queue_series& queue_registry::get(std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) it = by_name_.emplace(std::string{name}, std::make_unique<queue_series>(std::string{name})).first;
  return *it->second;
}

std::vector<const queue_series*> queue_registry::all() const {
  std::lock_guard lock(mu_);
  std::vector<const queue_series*> out;
  out.reserve(by_name_.size());
  for (const auto& [name, s] : by_name_) out.push_back(s.get());
  return out;
}

void queue_registry::zero_depths_except(const std::vector<queue_series*>& seen) {
  std::lock_guard lock(mu_);
  for (auto& [name, s] : by_name_) {
    if (std::find(seen.begin(), seen.end(), s.get()) != seen.end()) continue;
    s->available = 0;
    s->scheduled = 0;
    s->retryable = 0;
    s->running = 0;
    s->waiting_external = 0;
    s->oldest_available_us = 0;
    s->depth_known.store(true, std::memory_order_release);
  }
}

void queue_registry::forget_depths() {
  std::lock_guard lock(mu_);
  for (auto& [name, s] : by_name_) s->depth_known.store(false, std::memory_order_release);
}

runtime_metrics live_metrics::snapshot() const {
  runtime_metrics r;
#define TENURE_SNAP_counter(field) r.field = field.load(std::memory_order_relaxed);
#define TENURE_SNAP_gauge(field) r.field = field.load(std::memory_order_relaxed);
#define TENURE_SNAP_state(field)
#define TENURE_SNAP_queue_counter(field)
#define TENURE_SNAP_queue_gauge(field)
#define TENURE_SNAP_METRIC(kind, type, field, name, help) TENURE_SNAP_##kind(field)
  TENURE_RUNTIME_METRICS(TENURE_SNAP_METRIC)
#undef TENURE_SNAP_METRIC
#undef TENURE_SNAP_queue_gauge
#undef TENURE_SNAP_queue_counter
#undef TENURE_SNAP_state
#undef TENURE_SNAP_gauge
#undef TENURE_SNAP_counter
  for (const auto* s : queues.all()) {
    auto q = s->snapshot();
#define TENURE_SUM_queue_counter(field) r.field += q.field;
#define TENURE_SUM_queue_gauge(field) r.field += q.field;
#define TENURE_SUM_counter(field)
#define TENURE_SUM_gauge(field)
#define TENURE_SUM_state(field)
#define TENURE_SUM_METRIC(kind, type, field, name, help) TENURE_SUM_##kind(field)
    TENURE_RUNTIME_METRICS(TENURE_SUM_METRIC)
#undef TENURE_SUM_METRIC
#undef TENURE_SUM_state
#undef TENURE_SUM_gauge
#undef TENURE_SUM_counter
#undef TENURE_SUM_queue_gauge
#undef TENURE_SUM_queue_counter
    r.queues.push_back(std::move(q));
  }
  return r;
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

void header(std::string& out, std::string_view name, std::string_view help, std::string_view type) {
  out += fmt::format("# HELP tenure_{} {}\n# TYPE tenure_{} {}\n", name, help, name, type);
}

/// The label set {queue="..."[,extra]} of one queue's series.
std::string labels(const queue_metrics& q, std::string_view extra = {}) {
  std::string l = "{queue=\"" + escape_label_value(q.queue) + "\"";
  if (!extra.empty()) (l += ",") += extra;
  return l + "}";
}

void histogram(std::string& out, std::string_view name, const histogram_snapshot& h, const std::string& label_text) {
  // label_text: the queue's labels without braces, e.g. queue="a",outcome="completed"
  for (std::size_t i = 0; i < h.upper_bounds.size(); ++i) {
    out += fmt::format("tenure_{}_bucket{{{},le=\"{}\"}} {}\n", name, label_text, h.upper_bounds[i], h.cumulative[i]);
  }
  out += fmt::format("tenure_{}_bucket{{{},le=\"+Inf\"}} {}\n", name, label_text, h.count);
  out += fmt::format("tenure_{}_sum{{{}}} {}\n", name, label_text, h.sum);
  out += fmt::format("tenure_{}_count{{{}}} {}\n", name, label_text, h.count);
}

}  // namespace

std::string prometheus_text(const runtime_metrics& r) {
  std::string out;
  out.reserve(4'096 + r.queues.size() * 8'192);
#define TENURE_PROM_counter(field, name, help) \
  header(out, name, help, "counter");          \
  out += fmt::format("tenure_{} {}\n", name, static_cast<std::uint64_t>(r.field));
#define TENURE_PROM_gauge(field, name, help) \
  header(out, name, help, "gauge");          \
  out += fmt::format("tenure_{} {}\n", name, static_cast<std::int64_t>(r.field));
#define TENURE_PROM_state(field, name, help) TENURE_PROM_gauge(field, name, help)
#define TENURE_PROM_queue_counter(field, name, help)                                                   \
  header(out, name, help, "counter");                                                                  \
  for (const auto& q : r.queues) out += fmt::format("tenure_{}{} {}\n", name, labels(q), q.field);
#define TENURE_PROM_queue_gauge(field, name, help)                                                     \
  header(out, name, help, "gauge");                                                                    \
  for (const auto& q : r.queues) out += fmt::format("tenure_{}{} {}\n", name, labels(q), q.field);
#define TENURE_PROM_METRIC(kind, type, field, name, help) TENURE_PROM_##kind(field, name, help)
  TENURE_RUNTIME_METRICS(TENURE_PROM_METRIC)
#undef TENURE_PROM_METRIC
#undef TENURE_PROM_queue_gauge
#undef TENURE_PROM_queue_counter
#undef TENURE_PROM_state
#undef TENURE_PROM_gauge
#undef TENURE_PROM_counter

  header(out, "pickup_latency_seconds",
         "From a job becoming available (run_at, or created_at when later) to its attempt starting in a handler.",
         "histogram");
  for (const auto& q : r.queues) {
    histogram(out, "pickup_latency_seconds", q.pickup_latency, "queue=\"" + escape_label_value(q.queue) + "\"");
  }
  header(out, "run_duration_seconds", "From handler start to handler exit, by how the attempt ended.", "histogram");
  for (const auto& q : r.queues) {
    for (std::size_t i = 0; i < k_run_outcomes; ++i) {
      histogram(out, "run_duration_seconds", q.run_duration[i],
                "queue=\"" + escape_label_value(q.queue) + "\",outcome=\"" +
                    std::string{to_string(static_cast<run_outcome>(i))} + "\"");
    }
  }
  header(out, "queue_depth", "Jobs of the queue per unfinished state, as the maintenance leader last counted them.",
         "gauge");
  for (const auto& q : r.queues) {
    if (!q.depth_known) continue;
    const std::pair<const char*, std::int64_t> states[] = {{"available", q.available},
                                                           {"scheduled", q.scheduled},
                                                           {"retryable", q.retryable},
                                                           {"running", q.running},
                                                           {"waiting_external", q.waiting_external}};
    for (const auto& [state, n] : states) {
      out += fmt::format("tenure_queue_depth{} {}\n", labels(q, fmt::format("state=\"{}\"", state)), n);
    }
  }
  header(out, "queue_oldest_available_seconds",
         "Age of the queue's oldest available job (0 when none), as the maintenance leader last counted it.", "gauge");
  for (const auto& q : r.queues) {
    if (q.depth_known) out += fmt::format("tenure_queue_oldest_available_seconds{} {}\n", labels(q), q.oldest_available_seconds);
  }
  return out;
}

}  // namespace tenure::detail
