#pragma once
/// \file
/// What a handler sees of its attempt: job_context (ordinary handlers) and caller_owned_context
/// (caller-owned handlers, which finish their job with complete_in_tx in their own transaction).
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "tenure/finalization.hpp"
#include "tenure/result.hpp"
#include "tenure/token.hpp"
#include "tenure/tx_bridge.hpp"

namespace tenure {

namespace detail {
struct attempt_entry;
}

/// What a handler sees of its attempt. Valid for the duration of the handler call only.
/// Thread-safe: `is_cancelled` and `set_progress` may be called from any thread.
class job_context {
 public:
  explicit job_context(std::shared_ptr<detail::attempt_entry> entry);
  std::int64_t job_id() const noexcept;
  std::int64_t run_lease() const noexcept;
  int attempt() const noexcept;  ///< executions so far, this one included
  int max_attempts() const noexcept;
  const std::string& kind() const noexcept;
  const std::string& queue() const noexcept;
  /// The job's args (parsed once).
  const nlohmann::json& args() const;
  /// The job's metadata (new_job::metadata, e.g. a W3C `traceparent`), parsed once: a JSON
  /// object, `{}` when the producer set none. Metadata this process cannot represent (a number
  /// beyond a double's range) reads as `{}`, with a warning logged; the job still runs.
  const nlohmann::json& metadata() const;
  finalization_token token() const noexcept;
  /// True once the attempt was cancelled by an admin, rescued, found stale by a heartbeat, or the
  /// runtime is shutting down past its timeout. A handler should stop soon after.
  bool is_cancelled() const noexcept;
  /// Sleeps up to `d`, returning early (true) when the attempt is cancelled.
  bool wait_cancelled(std::chrono::milliseconds d) const;
  /// Buffers progress locally; the next heartbeat flushes it, guarded by (job_id, run_lease).
  /// Progress is stored as {"percent": n, "message": "...", "metadata": ...} (empty message and
  /// null metadata left out). It is visible in tenure.jobs / `tenure job show`, and kept with the
  /// job when the attempt retries, snoozes or is rescued (see previous_progress()). NUL characters
  /// and invalid UTF-8 become U+FFFD (with a warning logged): PostgreSQL cannot store them.
  void set_progress(int percent, std::string message = {}, nlohmann::json metadata = nullptr);
  /// Flushes buffered progress now, with a heartbeat, in one statement guarded by
  /// (job_id, run_lease); blocks on the database (call it from the handler). true: applied.
  /// false: the attempt is stale (rescued, cancelled or finished elsewhere); the context is then
  /// cancelled. A database error is returned as is and the progress stays buffered for the next
  /// heartbeat.
  result<bool> flush_progress();
  /// The progress the job's earlier attempts left behind (the checkpoint to resume from), or
  /// nullopt on a first run or when no earlier attempt reported progress. Never this attempt's
  /// own progress. Read from the database on first call, then cached. errc::stale_attempt when
  /// the attempt is no longer live.
  result<std::optional<nlohmann::json>> previous_progress();
  /// The payload this attempt was resumed with when this call of the handler continues a parked
  /// attempt (job_outcome::park, then tenure.resume_callback); nullopt on a normal start. The
  /// continuation has the parked attempt's number but its own run lease and secret. No
  /// database call.
  std::optional<nlohmann::json> resumed_with() const;

  // ---- external callbacks (sequential: register, hand the id out, wait; repeat if needed) ----
  /// Registers a callback for an external system, guarded by (job_id, run_lease), and returns
  /// its fresh id (a UUID) to hand out. Registering again rotates the id (the old one becomes
  /// unknown). `timeout`: how long the attempt may wait for it once parked (then it is rescued:
  /// retried while attempts remain, else failed). errc::stale_attempt when the attempt is no
  /// longer live (the context is then cancelled).
  result<std::string> register_callback(std::chrono::milliseconds timeout);
  /// Parks the attempt as waiting_external (same run lease; heartbeat staleness and the hard
  /// deadline suspended; the callback timeout armed) and blocks until tenure.resume_callback
  /// resumes it, returning the payload. A resume that arrived before this call returns at once.
  /// The handler keeps its capacity permit meanwhile. Wakes on the resume NOTIFY, and polls with
  /// backoff (20 ms .. 1 s) in case a NOTIFY is lost. errc::stale_attempt when the attempt was
  /// cancelled, rescued (callback timeout), finished from outside (complete/fail_callback) or
  /// the id was rotated; the context is then cancelled and the handler's outcome is discarded.
  /// errc::shutting_down when the runtime's shutdown timeout cancelled the handler while the
  /// attempt was still parked (it stays open until resumed or timed out). After a resume the
  /// attempt's original hard deadline, if any, applies again.
  result<nlohmann::json> wait_for_callback(const std::string& callback_id);
  // To wait without keeping the thread, return job_outcome::park(callback_id) instead.

 protected:
  std::shared_ptr<detail::attempt_entry> entry_;
};

/// The context of a caller-owned handler: everything a job_context has, plus complete_in_tx.
class caller_owned_context : public job_context {
 public:
  caller_owned_context(std::shared_ptr<detail::attempt_entry> entry, std::string sql_schema);
  /// The schema the bridges call.
  const std::string& sql_schema() const noexcept { return schema_; }

  /// Completes this attempt inside the caller's open transaction `tx` (a soci::session&, a
  /// PGconn* or a pqxx transaction, with its bridge header included): runs the guarded
  /// `<schema>.complete_job(token, progress)` on it, never begins, commits or rolls back.
  /// `progress`, when given, is the job's final progress; else progress buffered with
  /// set_progress() and not yet flushed is used, else the last flushed one is kept.
  /// errc::stale_attempt when the attempt is no longer live: the server raised TN001 and the
  /// caller's transaction is aborted (roll it back). errc::protocol_error when `tx` has no
  /// open transaction (or an aborted one). The receipt only proves the statement ran: the caller must still COMMIT,
  /// and the runtime checks durable evidence after the handler returns either way.
  template <class Tx>
  result<finalization_receipt> complete_in_tx(Tx&& tx, std::optional<nlohmann::json> progress = std::nullopt) {
    return tx_bridge<std::remove_cvref_t<Tx>>::complete(std::forward<Tx>(tx), token(),
                                                        finalize_options_for(std::move(progress)));
  }

  /// As complete_in_tx, then commits `tx` in the same round trip, for a bridge that can (the libpq
  /// bridge: a PGconn* inside BEGIN, see tenure/libpq.hpp). This call ends the transaction: a
  /// receipt means the server committed it; a refused completion or COMMIT leaves nothing committed
  /// (the transaction is rolled back); errc::commit_in_doubt when the answer to the COMMIT was lost.
  /// The receipt is `committed()`: the server's answer to the COMMIT is the durable evidence, so
  /// the runtime settles the attempt without reading it again (any other exit is read).
  template <class Tx>
  result<finalization_receipt> complete_and_commit(Tx&& tx, std::optional<nlohmann::json> progress = std::nullopt) {
    using bridge = tx_bridge<std::remove_cvref_t<Tx>>;
    static_assert(requires(Tx&& t, const finalization_token& tok, const finalize_options& o) {
                    bridge::complete_and_commit(std::forward<Tx>(t), tok, o);
                  }, "complete_and_commit: this transaction type's bridge cannot commit for the caller; "
                     "use complete_in_tx and commit the transaction yourself (or a PGconn* with tenure/libpq.hpp)");
    return bridge::complete_and_commit(std::forward<Tx>(tx), token(), finalize_options_for(std::move(progress)));
  }

  /// The error text recorded with the retry or failure when the handler returns an error (and
  /// the attempt turns out to be still open). Default: the error code's message.
  void note_failure(std::string why);

  /// The options complete_in_tx passes to a bridge (schema and final progress).
  finalize_options finalize_options_for(std::optional<nlohmann::json> progress);

 private:
  std::string schema_;
};

}  // namespace tenure
