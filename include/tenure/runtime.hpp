#pragma once
/// \file
/// The worker runtime: claims jobs, runs handlers, heartbeats, flushes completions in batches,
/// rescues stale attempts (when it is the maintenance leader), honours cancellation, drains on
/// shutdown. Built on Boost.Asio: one control thread owns all runtime state; blocking database
/// calls run on a small pool; handlers run on their own pool.
///
/// Construct it over ports (any storage adapter), or use tenure::postgres::make_runtime().
///
/// The handler-facing types live in their own headers, all included here: runtime_config.hpp,
/// job_outcome.hpp, job_context.hpp (with tx_bridge.hpp), middleware.hpp, events.hpp,
/// runtime_metrics.hpp.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "tenure/events.hpp"
#include "tenure/finalization.hpp"
#include "tenure/job.hpp"
#include "tenure/job_context.hpp"
#include "tenure/job_outcome.hpp"
#include "tenure/log.hpp"
#include "tenure/middleware.hpp"
#include "tenure/result.hpp"
#include "tenure/runtime_config.hpp"
#include "tenure/runtime_metrics.hpp"
#include "tenure/token.hpp"
#include "tenure/tx_bridge.hpp"

namespace tenure {

class storage_port;
class signal_port;

class runtime {
 public:
  using handler = std::function<job_outcome(job_context&)>;
  /// A caller-owned handler: finishes its job itself with ctx.complete_in_tx(tx) and returns the
  /// receipt, or returns an error (errc::invalid_argument: fail for good; anything else: retry
  /// with the queue's backoff, when the durable evidence shows the attempt still open).
  using caller_owned_handler = std::function<result<finalization_receipt>(caller_owned_context&)>;
  using event_hook = std::function<void(const job_event&)>;

  /// Validates the config: errc::invalid_argument, naming the bad setting, for a bad one.
  static result<std::unique_ptr<runtime>> create(runtime_config config,
                                                 std::shared_ptr<storage_port> store,
                                                 std::shared_ptr<signal_port> signals = nullptr);
  ~runtime();  ///< stop()s
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  /// Registers the handler for a job kind (replacing any handler of that kind). Call before
  /// start(): later registrations are ignored, with an error logged.
  void handle(std::string kind, handler fn);
  /// Registers a handler with typed args (nlohmann::json from_json). Args that do not convert
  /// fail the job permanently: they can never succeed.
  template <class Args, class Fn>
  void handle(std::string kind, Fn fn) {
    handle(std::move(kind), handler{[fn = std::move(fn)](job_context& ctx) -> job_outcome {
             Args args;
             try {
               args = ctx.args().get<Args>();
             } catch (const std::exception& e) {
               return job_outcome::fail(std::string{"bad args: "} + e.what());
             }
             return fn(args, ctx);
           }});
  }
  /// Registers a caller-owned handler for a job kind (replacing any handler of that kind); call
  /// before start() (later registrations are ignored, with an error logged). After
  /// every exit (receipt, error, exception, cancellation) the runtime reads the attempt's durable
  /// evidence before it releases anything, except after a receipt of complete_and_commit for the
  /// attempt: the server's answer to that COMMIT is case 1's evidence, already in hand.
  ///  1. completed by this attempt: accepted (a handler that reported an error anyway gets one
  ///     warn-level protocol event);
  ///  2. still open (rolled back, never finalized): the handler's error goes through the retry /
  ///     fail policy; a receipt without evidence is a protocol error, retried likewise;
  ///  3. closed by something else (rescued, cancelled, re-claimed): stale, nothing written;
  ///  4. database unreachable: reconciliation retries with backoff; past reconcile_budget the
  ///     permit is released and a watcher keeps reconciling. Nothing is written without evidence.
  void handle_caller_owned(std::string kind, caller_owned_handler fn);
  /// The same with typed args; args that do not convert fail the job permanently.
  template <class Args, class Fn>
  void handle_caller_owned(std::string kind, Fn fn) {
    handle_caller_owned(std::move(kind),
                        caller_owned_handler{[fn = std::move(fn)](caller_owned_context& ctx) -> result<finalization_receipt> {
                          Args args;
                          try {
                            args = ctx.args().get<Args>();
                          } catch (const std::exception& e) {
                            ctx.note_failure(std::string{"bad args: "} + e.what());
                            return make_error_code(errc::invalid_argument);
                          }
                          return fn(args, ctx);
                        }});
  }
  /// Adds a middleware around every handler call, of every kind (plain and caller-owned):
  /// the first added is the outermost. It runs on the handler's thread, sees the attempt's
  /// context before the handler and its outcome and duration after; it cannot change the
  /// outcome. A middleware that throws, or returns without calling next(), makes the attempt
  /// fail with a retry (logged), as a handler that throws does. See middleware.hpp. Call before
  /// start(); later calls are ignored (with an error logged).
  void use(middleware mw);
  /// Called after each durably applied transition, on the control thread: keep it short. What
  /// a hook throws is logged and swallowed. Register hooks before start(); later calls are
  /// ignored (with an error logged).
  void on_event(event_hook hook);

  /// Writes the queue settings given in the config, then starts claiming.
  /// errc::invalid_argument when no handler is registered; the storage's error when the queue
  /// settings cannot be written.
  result<void> start();
  /// Graceful shutdown (idempotent, noexcept): stop claiming, let handlers finish within
  /// shutdown_timeout while heartbeats continue, flush every pending completion, then return.
  void stop() noexcept;

  /// Counters, gauges and the per-queue view (histograms, queue depths). Any thread.
  runtime_metrics metrics() const;
  /// The metrics in Prometheus text exposition format.
  std::string prometheus_text() const;
  /// What /healthz and /readyz answer (200 when ok, else 503, with `reason` as the body).
  struct probe {
    bool ok = true;
    std::string reason;
  };
  /// Unhealthy once the database has not answered the runtime for longer than unhealthy_after.
  probe health() const;
  /// Ready while the runtime runs: not while start() has not finished, nor once stop() began.
  probe readiness() const;
  /// The bound metrics port (when metrics_port was 0, the one the OS picked).
  std::optional<std::uint16_t> metrics_port() const;
  const runtime_config& config() const noexcept;

  // ---- drivable loops (tests, tools): run one step now on the control thread and wait -----
  void heartbeat_now();
  void flush_now();
  void maintenance_now();
  /// Blocks until nothing is in flight (no attempt held, no claim awaiting its answer) and no
  /// completion is pending, or `timeout` passes.
  bool wait_idle(std::chrono::milliseconds timeout);

 private:
  struct impl;
  explicit runtime(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace tenure
