#pragma once
/// \file
/// The runtime's metrics: the one list every metric comes from, and the snapshot
/// runtime::metrics() returns (process totals, plus a per-queue view with histograms and queue
/// depths).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tenure {

/// Counters and gauges. Monotonic counters never go down while the runtime lives.
/// Every runtime metric, in one list: X(kind, type, field, prometheus name, help). `kind` is
/// counter (a running total), gauge (a level), state (computed when read: leadership),
/// queue_counter or queue_gauge (kept per queue: Prometheus shows one series per queue with a
/// `queue` label; the runtime_metrics field is the sum over the queues, and queue_metrics holds
/// each queue's own). The runtime_metrics and queue_metrics fields, the engine's counters and
/// prometheus_text() (in this order) all come from this list, so a new metric is one line here.
#define TENURE_RUNTIME_METRICS(X)                                                                             \
  X(queue_counter, std::uint64_t, claimed, "claimed_total", "Attempts claimed.")                                   \
  X(queue_counter, std::uint64_t, completed, "completed_total", "Completions durably applied.")                    \
  X(queue_counter, std::uint64_t, stale_rejected, "stale_rejected_total",                                          \
    "Outcomes discarded because the attempt was no longer live.")                                             \
  X(queue_counter, std::uint64_t, retried, "retried_total", "Attempts that failed and will retry.")                \
  X(queue_counter, std::uint64_t, failed, "failed_total", "Jobs failed for good.")                                 \
  X(queue_counter, std::uint64_t, cancelled, "cancelled_total", "Jobs cancelled by their handler.")                \
  X(queue_counter, std::uint64_t, snoozed, "snoozed_total", "Attempts snoozed.")                                   \
  X(queue_counter, std::uint64_t, rescued, "rescued_total", "Attempts rescued by this process as maintenance leader.") \
  X(queue_counter, std::uint64_t, claims, "claims_total", "Claim statements.")                                     \
  X(counter, std::uint64_t, flushes, "flushes_total", "Completion flush statements answered.")               \
  X(counter, std::uint64_t, flushed_items, "flushed_items_total", "Completions carried by answered flushes.") \
  X(counter, std::uint64_t, flush_failures, "flush_failures_total",                                          \
    "Completion flushes that failed and were retried.")                                                       \
  X(counter, std::uint64_t, flush_latency_us_total, "flush_latency_microseconds_total",                      \
    "Summed latency of answered flushes.")                                                                    \
  X(counter, std::uint64_t, heartbeats, "heartbeats_total", "Heartbeat statements.")                         \
  X(counter, std::uint64_t, database_errors, "database_errors_total", "Database calls that failed.")         \
  X(counter, std::uint64_t, reconciliations, "reconciliations_total",                                        \
    "Durable-evidence reads after a caller-owned exit or an unknown outcome.")                                \
  X(counter, std::uint64_t, reconcile_reads, "reconcile_reads_total",                                        \
    "Set-based evidence statements (caller-owned exits, in-doubt flushes).")                                  \
  X(counter, std::uint64_t, protocol_warnings, "protocol_warnings_total",                                    \
    "Handler exits contradicted by durable evidence.")                                                        \
  X(counter, std::uint64_t, cancel_checks, "cancel_checks_total",                                            \
    "Liveness reads for cancel notifications (one per coalesced batch).")                                     \
  X(counter, std::uint64_t, capacity_released, "capacity_released_total",                                    \
    "Permits released while the database could not answer for an attempt.")                                  \
  X(gauge, std::uint64_t, flush_max_size, "flush_max_size", "Largest flush so far.")                         \
  X(queue_gauge, std::int64_t, in_flight, "in_flight", "Attempts held by this process.")                           \
  X(queue_gauge, std::int64_t, permits_held, "permits_held", "Capacity permits held by attempts.")                 \
  X(gauge, std::int64_t, watching, "watching", "Attempts whose permit was released while still reconciling.") \
  X(gauge, std::int64_t, pending_completions, "pending_completions",                                         \
    "Completed outcomes waiting for (or in) a completion flush.")                                             \
  X(state, bool, leader, "leader", "1 when this process runs maintenance.")                                  \
  X(state, std::int64_t, leader_term, "leader_term",                                                         \
    "Term of the maintenance lease this process holds (0 when it holds none).")                              \
  X(counter, std::uint64_t, leadership_lost, "leadership_lost_total",                                        \
    "Maintenance passes the database refused because the lease was lost.")                                    \
  X(counter, std::uint64_t, reclaims, "reclaims_total",                                                      \
    "Claim-path tables whose dead rows the maintenance leader reclaimed (VACUUM on PostgreSQL).")

/// A histogram of durations in seconds, as Prometheus shows it: cumulative counts per upper
/// bound (`le`), their count and sum.
struct histogram_snapshot {
  std::vector<double> upper_bounds;       ///< seconds, ascending; +Inf is implied (count)
  std::vector<std::uint64_t> cumulative;  ///< observations <= each bound (same size as upper_bounds)
  std::uint64_t count = 0;                ///< every observation (the +Inf bucket)
  double sum = 0;                         ///< seconds
};

/// How an attempt ended, as the database answered for it: the `outcome` label of
/// tenure_run_duration_seconds.
enum class run_outcome { completed, retried, failed, cancelled, snoozed, stale };
inline constexpr std::size_t k_run_outcomes = 6;
constexpr std::string_view to_string(run_outcome o) noexcept {
  constexpr std::array<std::string_view, k_run_outcomes> names{"completed", "retried", "failed",
                                                              "cancelled", "snoozed", "stale"};
  return names[static_cast<std::size_t>(o)];
}

/// One queue's metrics. Series exist for the runtime's own queues from create(), and for any
/// other queue once this process has seen it (rescued one of its attempts, or counted it).
struct queue_metrics {
  std::string queue;
#define TENURE_QUEUE_METRIC_FIELD_queue_counter(type, field) type field{};
#define TENURE_QUEUE_METRIC_FIELD_queue_gauge(type, field) type field{};
#define TENURE_QUEUE_METRIC_FIELD_counter(type, field)
#define TENURE_QUEUE_METRIC_FIELD_gauge(type, field)
#define TENURE_QUEUE_METRIC_FIELD_state(type, field)
#define TENURE_QUEUE_METRIC_FIELD(kind, type, field, name, help) TENURE_QUEUE_METRIC_FIELD_##kind(type, field)
  TENURE_RUNTIME_METRICS(TENURE_QUEUE_METRIC_FIELD)
#undef TENURE_QUEUE_METRIC_FIELD
#undef TENURE_QUEUE_METRIC_FIELD_state
#undef TENURE_QUEUE_METRIC_FIELD_gauge
#undef TENURE_QUEUE_METRIC_FIELD_counter
#undef TENURE_QUEUE_METRIC_FIELD_queue_gauge
#undef TENURE_QUEUE_METRIC_FIELD_queue_counter
  /// From the job becoming available (its run_at, or created_at when later, by the database's
  /// clock) to its attempt starting in a handler (by runtime_config::clock's wall reading).
  histogram_snapshot pickup_latency;
  /// From handler start to its exit, by how the attempt ended (index: run_outcome), observed
  /// once the database answered for the outcome.
  std::array<histogram_snapshot, k_run_outcomes> run_duration;
  /// The queue's jobs per unfinished state, as the maintenance leader last counted them (once
  /// per maintenance pass); depth_known is false in a process that has not counted them.
  bool depth_known = false;
  std::int64_t available = 0;
  std::int64_t scheduled = 0;
  std::int64_t retryable = 0;
  std::int64_t running = 0;
  std::int64_t waiting_external = 0;
  double oldest_available_seconds = 0;  ///< age of the oldest available job (0 when none)
};

/// A snapshot of the runtime's metrics (see TENURE_RUNTIME_METRICS for what each one counts).
/// pending_completions after stop(): the completions it could not flush (their attempts stay
/// open for rescue). watching: attempts past their reconcile budget, permit released, still
/// reconciling. The per-queue fields are the sums over `queues`.
struct runtime_metrics {
#define TENURE_RUNTIME_METRIC_FIELD(kind, type, field, name, help) type field{};
  TENURE_RUNTIME_METRICS(TENURE_RUNTIME_METRIC_FIELD)
#undef TENURE_RUNTIME_METRIC_FIELD
  /// Per queue, ordered by name.
  std::vector<queue_metrics> queues;
  /// The queue named `name`, or nullptr.
  const queue_metrics* queue(std::string_view name) const noexcept {
    for (const auto& q : queues) {
      if (q.queue == name) return &q;
    }
    return nullptr;
  }
};

}  // namespace tenure
