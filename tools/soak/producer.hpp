#pragma once
/// \file
/// The soak's producers: each enqueues the workload's kinds at its share of the rate, in business
/// transactions of its own (an order row beside each job), some rolled back on purpose.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "soak/soak.hpp"

namespace tenure::soak {

/// The jobs whose transaction rolled back (on purpose, or after a failed statement before
/// COMMIT): they never existed, and the checks must find none of them. Thread-safe.
class rolled_back_jobs {
 public:
  void add(std::int64_t job_id);
  std::vector<std::int64_t> all();

 private:
  std::mutex mu_;
  std::vector<std::int64_t> ids_;
};

struct producer_share {
  int index = 0;      ///< this producer among `producers`
  int producers = 1;  ///< the rate is shared among them
};

/// Enqueues until `producing` turns false; failures (an outage) count in `errors`. About one
/// transaction in 100 is a bulk batch over COPY; those committed count in `bulk_batches`.
void produce(const options& opts, const names& n, producer_share share, const std::atomic<bool>& producing,
             std::atomic<long>& errors, rolled_back_jobs& rolled_back, std::atomic<long>& bulk_batches);

}  // namespace tenure::soak
