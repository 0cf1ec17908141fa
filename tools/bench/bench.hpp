#pragma once
/// \file
/// `tenure bench`: end-to-end scenarios on a real PostgreSQL, printing one JSON line each.
/// A benchmark, never a test: it measures, it does not assert.
#include <string>

#include <nlohmann/json.hpp>

namespace tenure::bench {

struct options {
  std::string dsn;               ///< the database (a fresh schema is created in it and dropped)
  std::string mode = "runtime";  ///< runtime | sql-limit | enqueue-single | caller-owned | prune
  int jobs = 20'000;             ///< jobs to drain (runtime, sql-limit)
  int producers = 16;  ///< enqueue-single: producer connections; caller-owned: handler threads
  double seconds = 5.0;          ///< enqueue-single: how long the producers run (each phase)
  /// enqueue-single: jobs per second all producers together aim at; 0 = each runs flat out.
  double rate = 0;
  int pickup_samples = 200;      ///< runtime: low-load pickup latency samples
  /// runtime: jobs per transaction when the caller's bulk paths (arrays, COPY) are timed side by side.
  int enqueue_batch = 5'000;
  /// runtime: jobs enqueued first into another queue that the runtime does not serve; they wait
  /// through the drain and the pickups (a drain beside a large backlog).
  long waiting = 0;
  /// runtime: how the drained jobs are enqueued: "copy" (the store's bulk path: run rows of up
  /// to 200 ids) or "arrays" (enqueue_batch's arrays: a ready row per job, as smaller batches get).
  std::string drain_enqueue = "copy";
  /// Every runtime's runtime_config::reclaim_dead_rows; -1 keeps the default.
  long reclaim_dead_rows = -1;
  int workers = 4;               ///< sql-limit: concurrent claim/complete connections
  long prune_rows = 1'000'000;   ///< prune: expired finished jobs to delete while the drain runs
  bool keep_schema = false;
  /// enqueue-single: make every enqueue pay for a NOTIFY (as a per-commit NOTIFY design would),
  /// for an A/B against tenure's NOTIFY-only-while-a-worker-sleeps wake-up.
  bool notify_always = false;
  /// caller-owned: the handlers call complete_in_tx and then COMMIT (two round trips) instead of
  /// complete_and_commit (one).
  bool separate_commit = false;
  /// caller-owned: the queue's max_concurrency (attempts claimed at once, running or waiting for a
  /// handler thread); 0 = six per handler thread, so that attempts wait for the threads rather
  /// than the threads for the next claim.
  int max_concurrency = 0;
  /// runtime: a CHECKPOINT before the run, so that no checkpoint an earlier run started is still
  /// writing through this one (needs the pg_checkpoint role or a superuser).
  bool checkpoint_first = false;
  /// runtime: the metadata every job carries (what a claim returns with each job).
  nlohmann::json metadata = nlohmann::json::object();
};

/// Runs one scenario; returns the JSON object it printed. Throws std::runtime_error with a
/// one-line reason on failure.
nlohmann::json run(const options& opts);

}  // namespace tenure::bench
