#include "sdk/runtime/config.hpp"

#include "tenure/schema_name.hpp"

#include <unistd.h>

#include <cstdio>
#include <set>

namespace tenure::detail {

namespace {

std::string default_worker_id() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  return std::string{host} + ":" + std::to_string(::getpid());
}

}  // namespace

std::optional<std::string> validate_config(runtime_config& config, bool has_signals) {
  auto bad = [](std::string why) -> std::optional<std::string> { return why; };
  const bool signals = has_signals;
  if (config.queues.empty()) return bad("no queues configured");
  std::set<std::string> names;
  for (const auto& q : config.queues) {
    if (q.name.empty()) return bad("a queue has an empty name");
    if (q.max_concurrency < 1) return bad("queue " + q.name + ": max_concurrency must be at least 1");
    if (!names.insert(q.name).second) return bad("queue " + q.name + " is configured twice");
  }
  if (config.heartbeat_interval.count() <= 0) return bad("heartbeat_interval must be positive");
  const auto staleness = config.staleness.value_or(config.heartbeat_interval * 3);
  if (staleness < config.heartbeat_interval * 2) {
    return bad("staleness (" + std::to_string(staleness.count()) + " ms) must be at least 2 x heartbeat_interval (" +
               std::to_string(config.heartbeat_interval.count()) + " ms)");
  }
  if (config.claim_batch < 1 || config.claim_batch > 10'000) return bad("claim_batch must be 1..10000");
  if (config.completion_batch < 1 || config.completion_batch > 10'000) return bad("completion_batch must be 1..10000");
  if (config.flush_delay.count() < 0) return bad("flush_delay must not be negative");
  if (config.poll_interval.count() <= 0) return bad("poll_interval must be positive");
  if (config.maintenance_interval.count() <= 0) return bad("maintenance_interval must be positive");
  if (config.reclaim_dead_rows < 0) return bad("reclaim_dead_rows must be 0 (never) or positive");
  if (config.unhealthy_after && *config.unhealthy_after < config.poll_interval * 2) {
    return bad("unhealthy_after (" + std::to_string(config.unhealthy_after->count()) +
               " ms) must be at least 2 x poll_interval (" + std::to_string(config.poll_interval.count()) + " ms)");
  }
  if (config.maintenance_lease) {
    const auto ttl = *config.maintenance_lease;
    if (ttl < config.maintenance_interval * 2) {
      return bad("maintenance_lease (" + std::to_string(ttl.count()) + " ms) must be at least 2 x maintenance_interval (" +
                 std::to_string(config.maintenance_interval.count()) + " ms)");
    }
    if (ttl > std::chrono::hours{1}) return bad("maintenance_lease must be at most one hour");
  } else if (signals && config.maintenance && config.maintenance_interval * 3 > std::chrono::hours{1}) {
    // (Without a signal port there is no lease: tests drive maintenance by hand.)
    return bad("maintenance_lease (default 3 x maintenance_interval) must be at most one hour: set it explicitly");
  }
  if (config.shutdown_timeout.count() < 0) return bad("shutdown_timeout must not be negative");
  if (config.reconcile_budget && config.reconcile_budget->count() < 0) return bad("reconcile_budget must not be negative");
  if (config.max_caller_owned < 0) return bad("max_caller_owned must not be negative");
  if (config.handler_store_calls < 0) return bad("handler_store_calls must not be negative");
  if (!valid_schema_name(config.sql_schema)) {
    return bad("sql_schema '" + config.sql_schema + "' is not a schema name tenure accepts ([a-z_][a-z0-9_]*, at most " +
               std::to_string(max_schema_name_size) + " characters)");
  }
  if (config.worker_id.empty()) config.worker_id = default_worker_id();
  if (config.handler_threads <= 0) {
    config.handler_threads = 0;
    for (const auto& q : config.queues) config.handler_threads += q.max_concurrency;
  }
  return std::nullopt;
}

}  // namespace tenure::detail
