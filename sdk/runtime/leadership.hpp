#pragma once
/// \file
/// Maintenance leadership (with a signal port): the lease this runtime holds, and until when it
/// may act on it by the runtime's monotonic clock (ttl counted from when it asked, so never past the
/// database's expiry). Written by the signal thread (renewals) and the control thread (a pass
/// the database refused, an expiry it noticed); read by both and by metrics(). Thread-safe.
/// Stands on nothing but the config. Private to the runtime.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "tenure/clock.hpp"
#include "tenure/runtime.hpp"

namespace tenure::detail {

class leadership {
 public:
  /// `leased`: a signal port runs the lease; without one, maintenance (when enabled) always leads.
  leadership(const runtime_config& cfg, bool leased) : cfg(cfg), clock(*cfg.clock), leased(leased) {}

  /// "<worker_id>/<random>": unique to this runtime instance.
  std::string holder;

  std::chrono::milliseconds lease_ttl() const { return cfg.maintenance_lease.value_or(cfg.maintenance_interval * 3); }
  /// The term of the lease held, while this process may still act on it.
  std::optional<std::int64_t> current_term() const;
  bool is_leader() const { return cfg.maintenance && (!leased || current_term().has_value()); }
  /// The database granted (or renewed) `term` for a request sent at `asked`.
  void hold(std::int64_t term, steady_time_point asked);
  /// Stops acting as leader of `term` (0: whatever term is held), logging why once.
  void drop(std::int64_t term, const std::string& why);
  /// The term to fence this pass with, or nullopt when this process must not lead now. A lease
  /// past its local expiry (a pause, or renewals that failed) is dropped here, said once.
  std::optional<std::int64_t> term_for_pass();
  /// Gives up the term held (0 when none), without a word: the caller resigns it.
  std::int64_t give_up();

 private:
  const runtime_config& cfg;
  const clock_port& clock;  ///< its steady_now() tells when the lease expires here
  const bool leased;
  mutable std::mutex mu;
  std::int64_t term = 0;  ///< 0: not the leader
  steady_time_point until{};
};

}  // namespace tenure::detail
