#pragma once
/// \file
/// The runtime's metrics: the one list every metric comes from, and the snapshot
/// runtime::metrics() returns.
#include <cstdint>

namespace tenure {

/// Counters and gauges. Monotonic counters never go down while the runtime lives.
/// Every runtime metric, in one list: X(kind, type, field, prometheus name, help). `kind` is
/// counter (a running total), gauge (a level), or state (computed when read: leadership). The
/// runtime_metrics fields, the engine's counters and prometheus_text() (in this order) all come
/// from this list, so a new metric is one line here.
#define TENURE_RUNTIME_METRICS(X)                                                                             \
  X(counter, std::uint64_t, claimed, "claimed_total", "Attempts claimed.")                                   \
  X(counter, std::uint64_t, completed, "completed_total", "Completions durably applied.")                    \
  X(counter, std::uint64_t, stale_rejected, "stale_rejected_total",                                          \
    "Outcomes discarded because the attempt was no longer live.")                                             \
  X(counter, std::uint64_t, retried, "retried_total", "Attempts that failed and will retry.")                \
  X(counter, std::uint64_t, failed, "failed_total", "Jobs failed for good.")                                 \
  X(counter, std::uint64_t, cancelled, "cancelled_total", "Jobs cancelled by their handler.")                \
  X(counter, std::uint64_t, snoozed, "snoozed_total", "Attempts snoozed.")                                   \
  X(counter, std::uint64_t, rescued, "rescued_total", "Attempts rescued by this process as maintenance leader.") \
  X(counter, std::uint64_t, claims, "claims_total", "Claim statements.")                                     \
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
  X(gauge, std::int64_t, in_flight, "in_flight", "Attempts held by this process.")                           \
  X(gauge, std::int64_t, permits_held, "permits_held", "Capacity permits held by attempts.")                 \
  X(gauge, std::int64_t, watching, "watching", "Attempts whose permit was released while still reconciling.") \
  X(gauge, std::int64_t, pending_completions, "pending_completions",                                         \
    "Completed outcomes waiting for (or in) a completion flush.")                                             \
  X(state, bool, leader, "leader", "1 when this process runs maintenance.")                                  \
  X(state, std::int64_t, leader_term, "leader_term",                                                         \
    "Term of the maintenance lease this process holds (0 when it holds none).")                              \
  X(counter, std::uint64_t, leadership_lost, "leadership_lost_total",                                        \
    "Maintenance passes the database refused because the lease was lost.")

/// A snapshot of the runtime's metrics (see TENURE_RUNTIME_METRICS for what each one counts).
/// pending_completions after stop(): the completions it could not flush (their attempts stay
/// open for rescue). watching: attempts past their reconcile budget, permit released, still
/// reconciling.
struct runtime_metrics {
#define TENURE_RUNTIME_METRIC_FIELD(kind, type, field, name, help) type field{};
  TENURE_RUNTIME_METRICS(TENURE_RUNTIME_METRIC_FIELD)
#undef TENURE_RUNTIME_METRIC_FIELD
};

}  // namespace tenure
