#pragma once
/// \file
/// Settling attempts whose handler returned: ordinary outcomes (fail, retry, snooze, cancel:
/// one guarded write each), completions (batched into set-based flushes), and reconciliation
/// against durable evidence (caller-owned exits, flushes with an unknown outcome). An attempt
/// leaves the in-flight table only once the database answered for it. Stands on control and
/// in_flight; calls nothing above (a permit it frees reaches the dispatcher through
/// in_flight_table::permit_freed). Private to the runtime; control thread only.
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "sdk/runtime/batcher.hpp"
#include "sdk/runtime/in_flight.hpp"

namespace tenure::detail {

/// How a caller-owned handler exited, or (flushed) that the runtime's own completion flush had an
/// unknown outcome. `committed`: a receipt for this attempt whose COMMIT the bridge saw the server
/// answer, the durable evidence itself; every other exit has its evidence read.
struct handler_exit {
  enum class how { receipt, committed, error, threw, cancelled, flushed } what = how::error;
  std::error_code code;  ///< for error / cancelled
  std::string message;   ///< the handler's note, the exception text, or the code's message
  std::optional<std::string> progress;  ///< flushed: the completion's final progress
};

class settlement {
 public:
  settlement(control& core, in_flight_table& table);

  /// A plain handler returned `outcome`. `progress`: a completed outcome's final progress,
  /// already storable JSON text.
  void on_outcome(const entry_ptr& entry, job_outcome outcome, std::optional<std::string> progress = std::nullopt);
  /// A caller-owned handler exited: its evidence decides (a witnessed COMMIT is that evidence).
  void on_handler_exit(const entry_ptr& entry, handler_exit exit);

  /// Runs every batch due now (`now`: even those waiting for their delay).
  void flush_due(bool now) {
    completions.maybe(now);
    evidence.maybe(now);
  }
  /// flush_now(): the next completion flush, now.
  void flush_completions() { completions.run(); }
  bool idle() const { return completions.idle() && evidence.idle(); }
  void cancel_timers() {
    completions.cancel();
    evidence.cancel();
  }

 private:
  struct pending_completion {
    entry_ptr entry;
    std::optional<std::string> progress;
  };
  struct pending_reconcile {
    entry_ptr entry;
    std::shared_ptr<handler_exit> exit;
  };

  // outcomes (settlement.cpp)
  void apply_outcome(const entry_ptr& entry, job_outcome outcome, std::chrono::milliseconds backoff);
  void discard_stale(const entry_ptr& entry);
  /// The database answered for the attempt with `o`: counts it on its queue and observes how
  /// long its handler ran.
  void settled(const entry_ptr& entry, run_outcome o);
  // completion flush (settlement_flush.cpp)
  void push_completion(pending_completion p);
  void flush(std::vector<pending_completion> batch);
  void on_flushed(std::vector<pending_completion> batch, result<std::vector<completion_result>> r,
                  steady_time_point::duration took);
  // evidence (settlement_evidence.cpp)
  void queue_evidence(const entry_ptr& entry, std::shared_ptr<handler_exit> exit);
  void read_evidence(std::vector<pending_reconcile> batch);
  void on_evidence(const entry_ptr& entry, const handler_exit& exit, attempt_evidence evidence);

  control& core;
  in_flight_table& table;
  const runtime_config& cfg;
  live_metrics& m;
  batcher<pending_completion> completions;  ///< completed outcomes waiting for their flush
  batcher<pending_reconcile> evidence;      ///< caller-owned exits waiting for their evidence
  std::chrono::milliseconds flush_backoff{0};
  std::chrono::milliseconds reconcile_backoff{0};
};

}  // namespace tenure::detail
