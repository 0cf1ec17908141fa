// The worker runtime. Threading model:
//  - ctl_: one io_context on one thread owns every piece of mutable runtime state (queues,
//    the in-flight table, the completion batcher, timers). Nothing else touches it.
//  - db_: a thread pool for blocking storage calls; each call posts its answer back to ctl_.
//  - workers_: a thread pool running handlers; each outcome is posted back to ctl_.
//  - signal thread: waits on the signal port (LISTEN/NOTIFY), renews the maintenance lease, and
//    posts to ctl_.
// An attempt's in-flight entry and its capacity permit are released on ctl_ only after the
// database answered for it (applied or stale), never before.
#include "tenure/runtime.hpp"

#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <algorithm>
#include <cctype>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "sdk/runtime/attempt_entry.hpp"
#include "sdk/runtime/batcher.hpp"
#include "sdk/runtime/metrics_server.hpp"
#include "sdk/runtime/storable.hpp"
#include "sdk/signal_port.hpp"
#include "sdk/storage_port.hpp"

namespace tenure {

namespace asio = boost::asio;
using detail::attempt_entry;
using entry_ptr = std::shared_ptr<attempt_entry>;
using std::chrono::steady_clock;

// ---- the runtime -------------------------------------------------------------------------------

namespace {

struct atomic_metrics {
  std::atomic<std::uint64_t> claimed{0}, completed{0}, stale_rejected{0}, retried{0}, failed{0},
      cancelled{0}, snoozed{0}, rescued{0}, claims{0}, flushes{0}, flushed_items{0}, flush_failures{0},
      flush_max_size{0}, flush_latency_us_total{0}, heartbeats{0}, database_errors{0}, reconciliations{0},
      protocol_warnings{0}, capacity_released{0}, reconcile_reads{0}, cancel_checks{0};
  std::atomic<std::int64_t> in_flight{0}, permits_held{0}, watching{0}, pending_completions{0};
};

std::string default_worker_id() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  return std::string{host} + ":" + std::to_string(::getpid());
}

constexpr milliseconds k_first_idle_step{2};
constexpr milliseconds k_sleep_after_step{4};
/// Notifications are hints that any role able to connect can send: a wake-up starts a claim
/// no sooner than this after the queue's last claim answered, and cancel hints are checked
/// against the database at most once per k_cancel_check_gap, so a flood costs O(1) statements
/// per interval.
constexpr milliseconds k_wake_gap{20};
constexpr milliseconds k_cancel_check_gap{50};

/// Exponential backoff for retrying database work: 50 ms doubling to 5 s.
milliseconds next_backoff(milliseconds current) {
  if (current.count() == 0) return milliseconds{50};
  return std::min(milliseconds{5'000}, current * 2);
}

}  // namespace

struct runtime::impl {
  struct queue_state {
    queue_state(asio::io_context& io, queue_options o)
        : opt(std::move(o)), free(opt.max_concurrency), timer(io), wake_timer(io) {}
    queue_options opt;
    int free;               ///< capacity permits not held by an attempt or a claim in progress
    bool claiming = false;  ///< a claim statement is in flight
    bool drained = false;   ///< the last claim found fewer jobs than it asked for
    bool wake_pending = false;  ///< a wake-up is owed one claim (after the one in flight, or k_wake_gap)
    bool wake_timer_armed = false;
    bool pump_posted = false;
    milliseconds idle_step{0};
    milliseconds error_backoff{0};
    steady_clock::time_point last_answer{};  ///< when the last claim statement answered
    asio::steady_timer timer;
    asio::steady_timer wake_timer;
  };

  struct pending_completion {
    entry_ptr entry;
    std::optional<std::string> progress;
  };
  struct handler_exit;
  struct pending_reconcile {
    entry_ptr entry;
    std::shared_ptr<handler_exit> exit;
  };

  impl(runtime_config c, std::shared_ptr<sdk::storage_port> s, std::shared_ptr<sdk::signal_port> sig)
      : cfg(std::move(c)),
        store(std::move(s)),
        signals(std::move(sig)),
        db(4),
        completions(ctl, [this](std::vector<pending_completion> b) { flush(std::move(b)); }),
        evidence(ctl, [this](std::vector<pending_reconcile> b) { read_evidence(std::move(b)); }),
        heartbeat_timer(ctl),
        maintenance_timer(ctl),
        capacity_timer(ctl),
        cancel_check_timer(ctl) {
    completions.configure(static_cast<std::size_t>(cfg.completion_batch), cfg.flush_delay);
    evidence.configure(static_cast<std::size_t>(cfg.completion_batch), cfg.flush_delay);
    for (const auto& q : cfg.queues) {
      queues.push_back(std::make_unique<queue_state>(ctl, q));
      by_name[q.name] = queues.back().get();
    }
  }

  runtime_config cfg;
  std::shared_ptr<sdk::storage_port> store;
  std::shared_ptr<sdk::signal_port> signals;
  std::unordered_map<std::string, handler> handlers;
  std::unordered_map<std::string, caller_owned_handler> owned_handlers;
  std::vector<event_hook> hooks;
  std::shared_ptr<detail::call_gate> store_gate;  ///< handler-side store calls (may be null)
  std::unique_ptr<detail::call_gate> owned_gate;  ///< caller-owned handlers running (may be null)
  atomic_metrics m;

  // Maintenance leadership (with a signal port): the lease this runtime holds, and until when it
  // may act on it by its own steady clock (ttl counted from when it asked, so never past the
  // database's expiry). Written by the signal thread (renewals) and the control thread (a pass the
  // database refused, an expiry it noticed); read by both and by metrics().
  mutable std::mutex lead_mu;
  std::int64_t lead_term = 0;  ///< 0: not the leader
  steady_clock::time_point lead_until{};
  std::string lead_holder;  ///< "<worker_id>/<random>": unique to this runtime instance
  std::atomic<std::uint64_t> leadership_lost{0};

  asio::io_context ctl;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> ctl_guard;
  std::thread ctl_thread;
  asio::thread_pool db;
  std::unique_ptr<asio::thread_pool> workers;

  // ---- control-thread state ----
  std::vector<std::unique_ptr<queue_state>> queues;
  std::unordered_map<std::string, queue_state*> by_name;
  std::map<attempt_id, entry_ptr> in_flight;
  detail::batcher<pending_completion> completions;  ///< completed outcomes waiting for their flush
  detail::batcher<pending_reconcile> evidence;       ///< caller-owned exits waiting for their evidence
  milliseconds reconcile_backoff{0};
  asio::steady_timer heartbeat_timer;
  asio::steady_timer maintenance_timer;
  asio::steady_timer capacity_timer;
  milliseconds flush_backoff{0};
  /// Attempts in flight here that a cancel notification named, waiting for their liveness check.
  std::set<attempt_id> cancel_hints;
  asio::steady_timer cancel_check_timer;
  bool cancel_check_running = false;
  bool cancel_check_armed = false;
  steady_clock::time_point last_cancel_check{};
  milliseconds cancel_check_backoff{0};
  bool heartbeat_running = false;
  bool maintenance_running = false;
  int running_handlers = 0;
  int outstanding_ops = 0;  ///< fail/snooze/cancel/reconcile calls not answered yet
  bool stopping = false;    ///< no new claims
  bool abandoning = false;  ///< past the shutdown timeout: late outcomes are left for rescue
  std::vector<std::function<void()>> idle_waiters;

  std::thread signal_thread;
  std::atomic<bool> signal_stop{false};
  std::unique_ptr<detail::metrics_server> metrics_http;
  bool started = false;
  bool stopped = false;
  std::mutex lifecycle_mu;

  milliseconds staleness() const { return cfg.staleness.value_or(cfg.heartbeat_interval * 3); }
  milliseconds reconcile_budget() const { return cfg.reconcile_budget.value_or(staleness()); }

  template <class Fn>
  void on_ctl(Fn&& fn) {
    asio::post(ctl, std::forward<Fn>(fn));
  }

  /// Runs `call` on the database pool and `done(result)` back on the control thread.
  template <class Call, class Done>
  void on_db(Call&& call, Done&& done) {
    asio::post(db, [this, call = std::forward<Call>(call), done = std::forward<Done>(done)]() mutable {
      auto r = call();
      asio::post(ctl, [r = std::move(r), done = std::move(done)]() mutable { done(std::move(r)); });
    });
  }

  void emit(lifecycle_event e, const claimed_attempt& c, std::string message = {}) {
    if (hooks.empty()) return;
    job_event ev{e, c.attempt, c.queue, c.kind, std::move(message)};
    for (auto& h : hooks) {
      try {
        h(ev);
      } catch (const std::exception& ex) {
        tenure::logger()->error("tenure: lifecycle hook threw on {} job {} lease {}: {}", to_string(e), c.attempt.job_id,
                      c.attempt.run_lease, ex.what());
      } catch (...) {
        tenure::logger()->error("tenure: lifecycle hook threw a non-standard exception on {} job {} lease {}", to_string(e),
                      c.attempt.job_id, c.attempt.run_lease);
      }
    }
  }

  // ---- dispatch ----

  void schedule_pump(queue_state& q) {
    if (q.pump_posted) return;
    q.pump_posted = true;
    on_ctl([this, &q] {
      q.pump_posted = false;
      pump(q);
    });
  }

  void pump(queue_state& q) {
    if (stopping || q.claiming || q.free <= 0) return;
    const int n = std::min(q.free, cfg.claim_batch);
    q.free -= n;  // permits first, then one claim statement for up to that many jobs
    q.claiming = true;
    q.wake_pending = false;
    q.timer.cancel();
    m.claims.fetch_add(1, std::memory_order_relaxed);
    // Join the waiters (so producers NOTIFY) only once eager polling has found nothing for a
    // few milliseconds: while jobs keep coming, producers pay for no NOTIFY at all.
    const bool going_to_sleep = q.idle_step >= k_sleep_after_step;
    on_db([this, &q, n, going_to_sleep] { return store->claim(q.opt.name, n, cfg.worker_id, going_to_sleep); },
          [this, &q, n](result<std::vector<claimed_attempt>> r) { on_claimed(q, n, std::move(r)); });
  }

  void arm_queue_timer(queue_state& q, milliseconds d) {
    q.timer.expires_after(d);
    q.timer.async_wait([this, &q](const boost::system::error_code& ec) {
      if (!ec) pump(q);
    });
  }

  void on_claimed(queue_state& q, int asked, result<std::vector<claimed_attempt>> r) {
    q.claiming = false;
    q.last_answer = steady_clock::now();
    if (!r) {
      q.free += asked;
      m.database_errors.fetch_add(1, std::memory_order_relaxed);
      q.error_backoff = next_backoff(q.error_backoff);
      tenure::logger()->warn("tenure: claim on queue {} failed ({}); retrying in {} ms", q.opt.name, r.error().message(),
                   q.error_backoff.count());
      if (!stopping) arm_queue_timer(q, std::min(q.error_backoff, cfg.poll_interval));
      return;
    }
    q.error_backoff = milliseconds{0};
    auto& got = r.value();
    if (abandoning) {
      // Claimed while stop() was giving up on handlers: nothing will run them here, so they
      // go back at once, without spending an attempt (and without holding permits).
      q.free += asked;
      for (auto& c : got) give_back(std::move(c));
      return;
    }
    q.free += asked - static_cast<int>(got.size());
    for (auto& c : got) start_attempt(std::move(c));
    if (static_cast<int>(got.size()) == asked) {
      q.drained = false;
      q.idle_step = milliseconds{0};
      pump(q);  // more may be waiting
      return;
    }
    q.drained = true;
    if (stopping) return;
    if (q.wake_pending) {
      // A wake-up arrived while this claim was in flight: its job may have committed after the
      // claim's snapshot, so one more claim runs (no sooner than k_wake_gap from now).
      claim_for_wake(q);
      return;
    }
    // Drained. Poll eagerly at first (2 ms, then 4 ms): under steady load the next jobs are
    // found this way and no producer pays for a NOTIFY. After that the claim joins the waiters
    // and the worker sleeps, woken by NOTIFY, polling less and less often (the doubling steps
    // also catch a wake-up that raced the registration) up to poll_interval.
    if (!got.empty() || q.idle_step.count() == 0) {
      q.idle_step = k_first_idle_step;
    } else {
      q.idle_step = std::min(cfg.poll_interval, q.idle_step * 2);
    }
    arm_queue_timer(q, std::min(q.idle_step, cfg.poll_interval));
  }

  /// Snoozes an attempt that will not run here back to its queue (no attempt spent).
  void give_back(claimed_attempt c) {
    ++outstanding_ops;
    on_db([this, a = c.attempt] { return store->snooze(a, sdk::microseconds{0}); },
          [this, c = std::move(c)](result<void> r) {
            --outstanding_ops;
            if (r) {
              tenure::logger()->info("tenure: job {} lease {} queue {} was claimed as the runtime stopped; given back", c.attempt.job_id,
                           c.attempt.run_lease, c.queue);
            } else {
              tenure::logger()->warn("tenure: job {} lease {} queue {} was claimed as the runtime stopped and could not be given "
                           "back ({}); it stays open and is rescued after staleness",
                           c.attempt.job_id, c.attempt.run_lease, c.queue, r.error().message());
            }
            check_idle();
          });
  }

  /// A claim statement is in flight on some queue: its answer may still start handlers.
  bool claiming() const {
    return std::any_of(queues.begin(), queues.end(), [](const auto& q) { return q->claiming; });
  }

  /// A wake-up for `queue` (a NOTIFY, a rescue, a reconnect). NOTIFY needs no privilege, so a
  /// wake-up is only a hint: it never resets the idle polling (a claim that finds jobs does),
  /// and wake-ups are coalesced into at most one claim per queue per k_wake_gap after the last
  /// claim answered, however many arrive.
  void on_wake(const std::string& queue) {
    auto it = by_name.find(queue);
    if (it == by_name.end()) return;
    auto& q = *it->second;
    if (q.claiming) {
      q.wake_pending = true;
      return;
    }
    claim_for_wake(q);
  }

  void claim_for_wake(queue_state& q) {
    const auto since = steady_clock::now() - q.last_answer;
    if (since >= k_wake_gap) {
      pump(q);
      return;
    }
    q.wake_pending = true;
    if (q.wake_timer_armed) return;
    q.wake_timer_armed = true;
    q.wake_timer.expires_after(k_wake_gap - since);
    q.wake_timer.async_wait([this, &q](const boost::system::error_code& ec) {
      q.wake_timer_armed = false;
      if (!ec && q.wake_pending && !q.claiming) pump(q);
    });
  }

  void start_attempt(claimed_attempt c) {
    auto entry = std::make_shared<attempt_entry>(std::move(c));
    entry->store = store;
    entry->store_gate = store_gate;
    const auto& a = entry->claim;
    in_flight.emplace(a.attempt, entry);
    m.in_flight.fetch_add(1, std::memory_order_relaxed);
    m.permits_held.fetch_add(1, std::memory_order_relaxed);
    m.claimed.fetch_add(1, std::memory_order_relaxed);
    ++running_handlers;
    emit(lifecycle_event::started, a);
    if (auto owned = owned_handlers.find(a.kind); owned != owned_handlers.end()) {
      entry->caller_owned = true;
      run_caller_owned(entry, owned->second);
      return;
    }
    auto it = handlers.find(a.kind);
    if (it == handlers.end()) {
      // No handler here for this kind: give the attempt back (snooze) so a worker that has one
      // can take it, without spending an attempt.
      tenure::logger()->error("tenure: no handler for kind '{}' (job {} lease {} queue {}); snoozing it 60 s", a.kind,
                    a.attempt.job_id, a.attempt.run_lease, a.queue);
      on_outcome(entry, job_outcome::snooze(milliseconds{60'000}));
      return;
    }
    asio::post(*workers, [this, entry, &fn = it->second] {
      job_outcome outcome = job_outcome::completed();
      try {
        if (auto problem = entry->args_problem()) {
          outcome = job_outcome::fail(std::move(*problem));  // never retried: the args stay the same
        } else {
          job_context ctx{entry};
          outcome = fn(ctx);
        }
      } catch (const std::exception& e) {
        outcome = job_outcome::retry(std::string{"handler threw: "} + e.what());
      } catch (...) {
        outcome = job_outcome::retry("handler threw a non-standard exception");
      }
      // The final progress becomes storable JSON text here, off the control thread.
      std::optional<std::string> progress;
      if (outcome.what() == job_outcome::kind::completed && outcome.progress()) {
        progress = entry->storable_progress(*outcome.progress(), "final progress");
      }
      on_ctl([this, entry, outcome = std::move(outcome), progress = std::move(progress)]() mutable {
        on_outcome(entry, std::move(outcome), std::move(progress));
      });
    });
  }

  // ---- caller-owned handlers ----

  /// What is known of an attempt whose evidence is to be read: how its caller-owned handler
  /// exited, or (flushed) that the runtime's own completion flush had an unknown outcome.
  struct handler_exit {
    enum class how { receipt, error, threw, cancelled, flushed } what = how::error;
    std::error_code code;  ///< for error / cancelled
    std::string message;   ///< the handler's note, the exception text, or the code's message
    std::optional<std::string> progress;  ///< flushed: the completion's final progress
  };
  static const char* to_text(handler_exit::how h) {
    switch (h) {
      case handler_exit::how::receipt: return "returned a receipt";
      case handler_exit::how::error: return "returned an error";
      case handler_exit::how::threw: return "threw";
      case handler_exit::how::cancelled: return "was cancelled";
      case handler_exit::how::flushed: return "completed (flush outcome unknown)";
    }
    return "exited";
  }

  static const char* to_text(job_outcome::kind k) {
    switch (k) {
      case job_outcome::kind::completed: return "completed";
      case job_outcome::kind::retry: return "retry";
      case job_outcome::kind::snooze: return "snooze";
      case job_outcome::kind::fail: return "fail";
      case job_outcome::kind::cancel: return "cancel";
    }
    return "unknown";
  }

  struct skip_handler {};

  void run_caller_owned(const entry_ptr& entry, const caller_owned_handler& fn) {
    asio::post(*workers, [this, entry, &fn] {
      if (auto problem = entry->args_problem()) {
        // The handler never starts, so nothing of the caller's can have finalized the attempt:
        // it fails through the runtime's own guarded write, as a plain handler's failure does.
        on_ctl([this, entry, problem = std::move(*problem)]() mutable {
          entry->caller_owned = false;
          on_outcome(entry, job_outcome::fail(std::move(problem)));
        });
        return;
      }
      handler_exit exit;
      {
        detail::gate_hold slot{owned_gate.get()};
        try {
          if (entry->is_cancelled()) {
            // Cancelled, rescued or abandoned while waiting for a slot: never start the handler.
            exit.what = handler_exit::how::cancelled;
            exit.code = make_error_code(errc::stale_attempt);
            exit.message = "cancelled before its handler started";
            throw skip_handler{};
          }
          caller_owned_context ctx{entry, cfg.sql_schema};
          auto r = fn(ctx);
          if (r) {
            exit.what = handler_exit::how::receipt;
            if (!(r.value().attempt() == entry->claim.attempt)) {
              // A receipt for another attempt proves nothing about this one: evidence decides.
              exit.message = "receipt names another attempt";
            }
          } else {
            exit.what = entry->is_cancelled() ? handler_exit::how::cancelled : handler_exit::how::error;
            exit.code = r.error();
            std::lock_guard lock(entry->mu);
            exit.message = entry->failure_note.empty() ? r.error().message() : entry->failure_note;
          }
        } catch (const skip_handler&) {
        } catch (const std::exception& e) {
          exit.what = handler_exit::how::threw;
          exit.message = std::string{"handler threw: "} + e.what();
        } catch (...) {
          exit.what = handler_exit::how::threw;
          exit.message = "handler threw a non-standard exception";
        }
      }
      on_ctl([this, entry, exit = std::move(exit)]() mutable { on_handler_exit(entry, std::move(exit)); });
    });
  }

  void on_handler_exit(const entry_ptr& entry, handler_exit exit) {
    --running_handlers;
    entry->handler_done = true;
    entry->done_at = steady_clock::now();
    if (abandoning) {
      const auto& a = entry->claim;
      tenure::logger()->warn("tenure: job {} lease {} queue {} (caller-owned) exited after the shutdown timeout; not "
                   "reconciled here, its attempt is settled by its own transaction or by rescue",
                   a.attempt.job_id, a.attempt.run_lease, a.queue);
      release(entry);
      return;
    }
    queue_evidence(entry, std::make_shared<handler_exit>(std::move(exit)));
  }

  /// Queues the attempt for reconciliation: its durable evidence is read (with others, in one
  /// set-based statement) and acted on (DESIGN.md section 6, cases 1-4).
  void queue_evidence(const entry_ptr& entry, std::shared_ptr<handler_exit> exit) {
    evidence.push({entry, std::move(exit)}, stopping);
  }

  void read_evidence(std::vector<pending_reconcile> batch) {
    const auto n = batch.size();
    std::vector<attempt_id> ids;
    ids.reserve(n);
    for (const auto& p : batch) ids.push_back(p.entry->claim.attempt);
    ++outstanding_ops;
    on_db([this, ids = std::move(ids)] { return store->reconcile(std::span<const attempt_id>{ids}); },
          [this, batch = std::move(batch)](result<std::vector<sdk::attempt_evidence>> r) mutable {
            --outstanding_ops;
            if (!r || r.value().size() != batch.size()) {
              // Case 4: no evidence, so nothing is written. Keep asking with backoff; past the
              // budget each attempt's permit goes back to its queue (the light watcher).
              const auto why = r ? std::string{"answer of the wrong size"} : r.error().message();
              m.database_errors.fetch_add(1, std::memory_order_relaxed);
              reconcile_backoff = next_backoff(reconcile_backoff);
              std::string jobs;
              for (std::size_t i = 0; i < batch.size() && i < 5; ++i) {
                const auto& a = batch[i].entry->claim.attempt;
                jobs += (i ? ", " : "") + std::to_string(a.job_id) + "/" + std::to_string(a.run_lease);
              }
              if (batch.size() > 5) jobs += ", ...";
              for (auto& p : batch) check_capacity(p.entry);
              if (abandoning) {
                tenure::logger()->error("tenure: no evidence before shutdown for {} attempt(s) (job/lease {}): {}; they are "
                              "settled by their own transactions or by rescue",
                              batch.size(), jobs, why);
                evidence.answered();
                for (auto& p : batch) release(p.entry);
                return;
              }
              tenure::logger()->warn("tenure: reconciling {} attempt(s) (job/lease {}) failed ({}); retrying in {} ms", batch.size(),
                           jobs, why, reconcile_backoff.count());
              evidence.put_back(std::move(batch));  // further reads wait for the retry
              retry_later(reconcile_backoff, [this] { evidence.retry(); });
              return;
            }
            evidence.answered();
            m.reconciliations.fetch_add(batch.size(), std::memory_order_relaxed);
            m.reconcile_reads.fetch_add(1, std::memory_order_relaxed);
            reconcile_backoff = milliseconds{0};
            for (std::size_t i = 0; i < batch.size(); ++i) on_evidence(batch[i].entry, *batch[i].exit, r.value()[i]);
            evidence.maybe(stopping);
          });
  }

  void on_evidence(const entry_ptr& entry, const handler_exit& exit, sdk::attempt_evidence evidence) {
    const auto& c = entry->claim;
    switch (evidence) {
      case sdk::attempt_evidence::completed_by_this:
        // Case 1: durable state wins, whatever the handler said.
        if (exit.what != handler_exit::how::receipt && exit.what != handler_exit::how::flushed) {
          m.protocol_warnings.fetch_add(1, std::memory_order_relaxed);
          tenure::logger()->warn("tenure: protocol: job {} lease {} queue {} is durably completed by this attempt but its "
                       "handler {} ({}); accepting the completion",
                       c.attempt.job_id, c.attempt.run_lease, c.queue, to_text(exit.what), exit.message);
        }
        m.completed.fetch_add(1, std::memory_order_relaxed);
        emit(lifecycle_event::completed, c);
        release(entry);
        return;
      case sdk::attempt_evidence::open: {
        if (exit.what == handler_exit::how::flushed) {
          // The in-doubt completion did not land after all: flush it again.
          push_completion({entry, exit.progress});
          return;
        }
        // Case 2: rolled back or never finalized: the ordinary retry / fail policy.
        job_outcome outcome = job_outcome::retry(exit.message);
        if (exit.what == handler_exit::how::receipt) {
          m.protocol_warnings.fetch_add(1, std::memory_order_relaxed);
          tenure::logger()->error("tenure: protocol: job {} lease {} queue {}: the handler returned a receipt but the attempt "
                        "is still open (its transaction did not commit){}; retrying it",
                        c.attempt.job_id, c.attempt.run_lease, c.queue, exit.message.empty() ? "" : ", " + exit.message);
          outcome = job_outcome::retry("protocol error: receipt without a durable completion");
        } else if (exit.what == handler_exit::how::error && exit.code == errc::invalid_argument) {
          outcome = job_outcome::fail(exit.message);
        }
        apply_outcome(entry, std::move(outcome), milliseconds{0});
        return;
      }
      case sdk::attempt_evidence::closed_by_other:
      case sdk::attempt_evidence::unknown_job:
        // Case 3: rescued, cancelled or re-claimed: stale, change nothing.
        discard_stale(entry);
        return;
    }
  }

  /// Runs `fn` on the control thread after `d`, counted as outstanding work.
  void retry_later(milliseconds d, std::function<void()> fn) {
    auto t = std::make_shared<asio::steady_timer>(ctl, d);
    ++outstanding_ops;
    t->async_wait([this, t, fn = std::move(fn)](const boost::system::error_code&) {
      --outstanding_ops;
      fn();
    });
  }

  /// An attempt whose handler returned holds its permit until the database answered for it. Past
  /// the reconcile budget (counted from the handler's exit), or past the attempt's rescue
  /// deadline (after which another worker may rightly run the job), the permit is released so
  /// other jobs can run; the entry stays (heartbeated, still reconciling or flushing). Nothing
  /// is written without evidence. Called on every failed answer and by the capacity sweep, so a
  /// read that hangs does not keep the permit either.
  void check_capacity(const entry_ptr& entry) {
    if (!entry->permit_held || !entry->handler_done || !entry->done_at) return;
    const auto now = steady_clock::now();
    if (now - *entry->done_at < reconcile_budget() && now - entry->last_live < staleness()) return;
    const auto& c = entry->claim;
    const auto ms = [](steady_clock::duration d) { return std::chrono::duration_cast<milliseconds>(d).count(); };
    // Two reasons, worded apart: the database took longer than the reconcile budget to answer
    // for the outcome, or the attempt was last confirmed live longer ago than the staleness
    // (its rescue deadline), however recently its handler returned (a process that was paused).
    const std::string why =
        now - *entry->done_at >= reconcile_budget()
            ? fmt::format("the database has not answered for its outcome in the {} ms since its handler returned "
                          "(reconcile budget {} ms)",
                          ms(now - *entry->done_at), ms(reconcile_budget()))
            : fmt::format("the database last confirmed it live {} ms ago, past its staleness of {} ms (another "
                          "worker may rescue it now); its handler returned {} ms ago",
                          ms(now - entry->last_live), ms(staleness()), ms(now - *entry->done_at));
    tenure::logger()->warn("tenure: job {} lease {} queue {}: {}; releasing its capacity permit, still {} (nothing is "
                 "written without evidence)",
                 c.attempt.job_id, c.attempt.run_lease, c.queue, why,
                 entry->caller_owned ? "reconciling" : "retrying");
    m.watching.fetch_add(1, std::memory_order_relaxed);
    m.capacity_released.fetch_add(1, std::memory_order_relaxed);
    release_permit(entry);
  }

  /// Looks at every finished attempt still held, on a timer (see check_capacity).
  void arm_capacity_sweep() {
    const auto every = std::clamp(reconcile_budget() / 4, milliseconds{10}, milliseconds{1'000});
    capacity_timer.expires_after(every);
    capacity_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      std::vector<entry_ptr> done;
      for (const auto& [id, e] : in_flight) {
        if (e->handler_done && e->permit_held) done.push_back(e);
      }
      for (const auto& e : done) check_capacity(e);
      arm_capacity_sweep();
    });
  }

  void release_permit(const entry_ptr& entry) {
    if (!entry->permit_held) return;
    entry->permit_held = false;
    m.permits_held.fetch_sub(1, std::memory_order_relaxed);
    if (auto it = by_name.find(entry->claim.queue); it != by_name.end()) {
      auto& q = *it->second;
      ++q.free;
      if (!q.drained) schedule_pump(q);
    }
  }

  // ---- outcomes ----

  /// `progress`: a completed outcome's final progress, already storable JSON text.
  void on_outcome(const entry_ptr& entry, job_outcome outcome, std::optional<std::string> progress = std::nullopt) {
    --running_handlers;
    entry->handler_done = true;
    entry->done_at = steady_clock::now();
    const auto& a = entry->claim;
    if (abandoning) {
      tenure::logger()->warn("tenure: job {} lease {} queue {} finished after the shutdown timeout; its attempt stays "
                   "open for rescue",
                   a.attempt.job_id, a.attempt.run_lease, a.queue);
      release(entry);
      return;
    }
    if (outcome.what() == job_outcome::kind::completed) {
      push_completion({entry, std::move(progress)});
      return;
    }
    apply_outcome(entry, std::move(outcome), milliseconds{0});
  }

  /// Fail / retry / snooze / cancel: one guarded statement each. The entry is held until the
  /// database answered; on a database error the call is retried with backoff until staleness
  /// has passed (after that, rescue owns the attempt).
  void apply_outcome(const entry_ptr& entry, job_outcome outcome, milliseconds backoff) {
    ++outstanding_ops;
    const auto a = entry->claim.attempt;
    const auto kind = outcome.what();
    on_db(
        [this, a, outcome, message = detail::storable_text(outcome.message())]() -> result<job_state> {
          switch (outcome.what()) {
            case job_outcome::kind::retry: {
              std::optional<sdk::microseconds> after;
              if (outcome.delay()) after = std::chrono::duration_cast<sdk::microseconds>(*outcome.delay());
              return store->fail(a, message, sdk::fail_disposition::retry, after);
            }
            case job_outcome::kind::fail:
              return store->fail(a, message, sdk::fail_disposition::permanent);
            case job_outcome::kind::snooze: {
              auto r = store->snooze(a, std::chrono::duration_cast<sdk::microseconds>(*outcome.delay()));
              if (!r) return r.error();
              return job_state::scheduled;
            }
            case job_outcome::kind::cancel: {
              auto r = store->cancel_attempt(a, message);
              if (!r) return r.error();
              return job_state::cancelled;
            }
            case job_outcome::kind::completed: break;
          }
          return errc::protocol_error;
        },
        [this, entry, outcome, backoff, kind](result<job_state> r) mutable {
          --outstanding_ops;
          const auto& c = entry->claim;
          if (r) {
            switch (r.value()) {
              case job_state::retryable:
                m.retried.fetch_add(1, std::memory_order_relaxed);
                emit(lifecycle_event::retried, c, outcome.message());
                tenure::logger()->info("tenure: job {} lease {} queue {} will retry: {}", c.attempt.job_id,
                             c.attempt.run_lease, c.queue, outcome.message());
                break;
              case job_state::failed:
                m.failed.fetch_add(1, std::memory_order_relaxed);
                emit(lifecycle_event::failed, c, outcome.message());
                tenure::logger()->warn("tenure: job {} lease {} queue {} failed: {}", c.attempt.job_id, c.attempt.run_lease,
                             c.queue, outcome.message());
                break;
              case job_state::scheduled:
                m.snoozed.fetch_add(1, std::memory_order_relaxed);
                emit(lifecycle_event::snoozed, c);
                break;
              case job_state::cancelled:
                m.cancelled.fetch_add(1, std::memory_order_relaxed);
                emit(lifecycle_event::cancelled, c, outcome.message());
                break;
              default: break;
            }
            release(entry);
            return;
          }
          if (r.error() == errc::stale_attempt && entry->caller_owned) {
            // The attempt was open when its evidence was read, and closed before this write: by
            // rescue or cancel (stale), or by the caller's own transaction committing late
            // (completed). Only the evidence can tell.
            auto exit = std::make_shared<handler_exit>();
            exit->what = handler_exit::how::error;
            exit->message = "the attempt closed while its outcome was being recorded";
            queue_evidence(entry, std::move(exit));
            return;
          }
          if (r.error() == errc::stale_attempt) {
            m.stale_rejected.fetch_add(1, std::memory_order_relaxed);
            tenure::logger()->debug("tenure: stale outcome discarded for job {} lease {} queue {}", c.attempt.job_id,
                          c.attempt.run_lease, c.queue);
            release(entry);
            return;
          }
          m.database_errors.fetch_add(1, std::memory_order_relaxed);
          if (r.error() == errc::invalid_argument) {
            // Refused for good (the same write would be refused on every retry): nothing is
            // written, and the attempt is left to rescue, which retries it by the queue's policy.
            tenure::logger()->error("tenure: the database refused the {} outcome of job {} lease {} queue {} as invalid; not "
                          "retrying it: the attempt stays open and is rescued after staleness",
                          to_text(kind), c.attempt.job_id, c.attempt.run_lease, c.queue);
            release(entry);
            return;
          }
          const auto next = next_backoff(backoff);
          // Keep the entry and retry: the attempt stays ours until the database answers. An
          // unknown outcome is retried too; if the first call had landed, the retry is stale.
          if (r.error() == errc::commit_in_doubt) entry->in_doubt = true;
          check_capacity(entry);
          if (abandoning) {
            tenure::logger()->error("tenure: could not record the {} outcome of job {} lease {} queue {} before shutdown "
                          "({}); the attempt stays open for rescue",
                          kind == job_outcome::kind::retry ? "retry" : "final", c.attempt.job_id,
                          c.attempt.run_lease, c.queue, r.error().message());
            release(entry);
            return;
          }
          tenure::logger()->warn("tenure: recording outcome of job {} lease {} failed ({}); retrying in {} ms",
                       c.attempt.job_id, c.attempt.run_lease, r.error().message(), next.count());
          retry_later(next, [this, entry, outcome, next]() mutable { apply_outcome(entry, std::move(outcome), next); });
        });
  }

  void release(const entry_ptr& entry) {
    const auto& c = entry->claim;
    if (in_flight.erase(c.attempt) == 0) return;
    m.in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (entry->permit_held) {
      release_permit(entry);
    } else {
      m.watching.fetch_sub(1, std::memory_order_relaxed);  // its permit went earlier (check_capacity)
    }
    check_idle();
  }

  // ---- completion batcher ----

  void flush(std::vector<pending_completion> batch) {
    const auto n = batch.size();
    std::vector<sdk::completion> items;
    items.reserve(n);
    for (const auto& p : batch) items.push_back({p.entry->claim.attempt, p.progress});
    const auto started_at = steady_clock::now();
    on_db([this, items = std::move(items)] { return store->complete(items); },
          [this, batch = std::move(batch), started_at](result<std::vector<sdk::completion_result>> r) mutable {
            on_flushed(std::move(batch), std::move(r), steady_clock::now() - started_at);
          });
  }

  /// A completed outcome joins the batcher; it leaves it only once a flush has answered for it.
  /// While stopping, it is flushed at once instead of after flush_delay.
  void push_completion(pending_completion p) {
    m.pending_completions.fetch_add(1, std::memory_order_relaxed);
    completions.push(std::move(p), stopping);
  }

  void on_flushed(std::vector<pending_completion> batch, result<std::vector<sdk::completion_result>> r,
                  steady_clock::duration took) {
    if (!r && r.error() == errc::invalid_argument) {
      // Refused for good: the same statement would be refused on every retry, and every later
      // completion would wait behind it. Flush the items one by one to find the refused one;
      // a single refused item is not retried and its attempt is left to rescue.
      m.flush_failures.fetch_add(1, std::memory_order_relaxed);
      m.database_errors.fetch_add(1, std::memory_order_relaxed);
      if (batch.size() > 1) {
        tenure::logger()->warn("tenure: the database refused a completion flush of {} as invalid; flushing them one by one",
                     batch.size());
        completions.put_back_one_by_one(std::move(batch));
        completions.retry();
        return;
      }
      completions.answered();
      m.pending_completions.fetch_sub(1, std::memory_order_relaxed);
      const auto& c = batch.front().entry->claim;
      tenure::logger()->error("tenure: the database refused the completion of job {} lease {} queue {} as invalid; not retrying "
                    "it: the attempt stays open and is rescued after staleness",
                    c.attempt.job_id, c.attempt.run_lease, c.queue);
      release(batch.front().entry);
      completions.maybe(stopping);
      return;
    }
    if (!r) {
      // The attempts stay open (and heartbeated); the flush is retried. Never lost, never
      // double-completed: after an unknown outcome, a stale answer is checked against evidence.
      m.flush_failures.fetch_add(1, std::memory_order_relaxed);
      m.database_errors.fetch_add(1, std::memory_order_relaxed);
      const bool doubt = r.error() == errc::commit_in_doubt;
      for (auto& p : batch) {
        p.entry->in_doubt = p.entry->in_doubt || doubt;
        check_capacity(p.entry);
      }
      flush_backoff = next_backoff(flush_backoff);
      tenure::logger()->warn("tenure: completion flush of {} failed ({}); retrying in {} ms", batch.size(),
                   r.error().message(), flush_backoff.count());
      completions.put_back(std::move(batch));  // further flushes wait for the retry
      auto t = std::make_shared<asio::steady_timer>(ctl, flush_backoff);
      t->async_wait([this, t](const boost::system::error_code&) { completions.retry(); });
      return;
    }
    completions.answered();
    flush_backoff = milliseconds{0};
    const auto size = batch.size();
    m.pending_completions.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
    m.flushes.fetch_add(1, std::memory_order_relaxed);
    m.flushed_items.fetch_add(size, std::memory_order_relaxed);
    m.flush_latency_us_total.fetch_add(
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(took).count()),
        std::memory_order_relaxed);
    auto max = m.flush_max_size.load(std::memory_order_relaxed);
    while (size > max && !m.flush_max_size.compare_exchange_weak(max, size)) {
    }
    const auto& results = r.value();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const auto& entry = batch[i].entry;
      const bool applied = i < results.size() && results[i].applied;
      if (applied) {
        m.completed.fetch_add(1, std::memory_order_relaxed);
        emit(lifecycle_event::completed, entry->claim);
        release(entry);
      } else if (entry->in_doubt) {
        // An earlier flush of it had an unknown outcome: was this "stale" our own completion?
        auto exit = std::make_shared<handler_exit>();
        exit->what = handler_exit::how::flushed;
        exit->progress = batch[i].progress;
        queue_evidence(entry, std::move(exit));
      } else {
        discard_stale(entry);
      }
    }
    completions.maybe(stopping);
  }

  void discard_stale(const entry_ptr& entry) {
    const auto& c = entry->claim;
    m.stale_rejected.fetch_add(1, std::memory_order_relaxed);
    tenure::logger()->debug("tenure: stale completion discarded for job {} lease {} queue {}", c.attempt.job_id,
                  c.attempt.run_lease, c.queue);
    release(entry);
  }

  // ---- heartbeat ----

  void arm_heartbeat() {
    heartbeat_timer.expires_after(cfg.heartbeat_interval);
    heartbeat_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      heartbeat([] {});
      arm_heartbeat();
    });
  }

  void heartbeat(std::function<void()> done) {
    if (heartbeat_running || in_flight.empty()) {
      done();
      return;
    }
    heartbeat_running = true;
    std::vector<attempt_id> attempts;
    std::vector<std::optional<std::string>> progress;
    std::vector<entry_ptr> entries;
    bool any_progress = false;
    for (const auto& [id, e] : in_flight) {
      attempts.push_back(id);
      progress.push_back(e->take_progress());
      any_progress = any_progress || progress.back().has_value();
      entries.push_back(e);
    }
    if (!any_progress) progress.clear();
    m.heartbeats.fetch_add(1, std::memory_order_relaxed);
    on_db([this, attempts, progress] { return store->heartbeat(attempts, progress); },
          [this, entries = std::move(entries), progress, done = std::move(done)](result<std::vector<attempt_id>> r) {
            heartbeat_running = false;
            if (!r) {
              m.database_errors.fetch_add(1, std::memory_order_relaxed);
              tenure::logger()->warn("tenure: heartbeat of {} attempts failed: {}", entries.size(), r.error().message());
              if (r.error() == errc::invalid_argument && !progress.empty()) {
                // Refused for good: the progress it carried would be refused again with every
                // later heartbeat, so it is dropped; the next heartbeat goes without it.
                tenure::logger()->error("tenure: the database refused the progress carried by a heartbeat as invalid; "
                              "dropping it so heartbeats go on");
                done();
                return;
              }
              for (std::size_t i = 0; i < progress.size(); ++i) {
                if (progress[i]) entries[i]->restore_progress(*progress[i]);
              }
              done();
              return;
            }
            std::set<attempt_id> live(r.value().begin(), r.value().end());
            const auto now = steady_clock::now();
            for (const auto& e : entries) {
              if (live.contains(e->claim.attempt)) e->last_live = now;
              // An attempt whose handler already returned is settled by its own flush or write
              // (which may just have closed it, racing this heartbeat): nothing to cancel.
              if (e->handler_done || !in_flight.contains(e->claim.attempt)) continue;
              if (!live.contains(e->claim.attempt) && !e->is_cancelled()) {
                const auto& c = e->claim;
                tenure::logger()->warn("tenure: job {} lease {} queue {} is no longer live (rescued or cancelled); "
                             "cancelling its handler",
                             c.attempt.job_id, c.attempt.run_lease, c.queue);
                e->cancel();
              }
            }
            done();
          });
  }

  // ---- maintenance ----

  void arm_maintenance() {
    maintenance_timer.expires_after(cfg.maintenance_interval);
    maintenance_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      maintenance([] {});
      arm_maintenance();
    });
  }

  milliseconds lease_ttl() const { return cfg.maintenance_lease.value_or(cfg.maintenance_interval * 3); }

  /// The term of the lease held, while this process may still act on it.
  std::optional<std::int64_t> current_term() const {
    std::lock_guard lock(lead_mu);
    if (lead_term == 0 || steady_clock::now() >= lead_until) return std::nullopt;
    return lead_term;
  }

  bool is_leader() const { return cfg.maintenance && (!signals || current_term().has_value()); }

  /// The database granted (or renewed) `term` for a request sent at `asked`.
  void hold_lease(std::int64_t term, steady_clock::time_point asked) {
    std::lock_guard lock(lead_mu);
    const auto until = asked + lease_ttl();
    if (term != lead_term && until > steady_clock::now()) {
      tenure::logger()->info("tenure: worker {} is now the maintenance leader (term {})", cfg.worker_id, term);
    }
    lead_term = term;
    lead_until = until;
  }

  /// Stops acting as leader of `term` (0: whatever term is held), logging why once.
  void drop_lease(std::int64_t term, const std::string& why) {
    std::lock_guard lock(lead_mu);
    if (lead_term == 0 || (term != 0 && term != lead_term)) return;
    tenure::logger()->warn("tenure: worker {} is no longer the maintenance leader (term {}): {}", cfg.worker_id, lead_term, why);
    lead_term = 0;
  }

  /// The term to fence this pass with, or nullopt when this process must not lead now. A lease
  /// past its local expiry (a pause, or renewals that failed) is dropped here, said once.
  std::optional<std::int64_t> term_for_pass() {
    std::lock_guard lock(lead_mu);
    if (lead_term == 0) return std::nullopt;
    if (steady_clock::now() < lead_until) return lead_term;
    tenure::logger()->warn("tenure: worker {} is no longer the maintenance leader (term {}): its lease ({} ms) expired before "
                 "it was renewed",
                 cfg.worker_id, lead_term, lease_ttl().count());
    lead_term = 0;
    return std::nullopt;
  }

  void maintenance(std::function<void()> done) {
    if (maintenance_running || !cfg.maintenance) {
      done();
      return;
    }
    std::optional<sdk::leader_lease> lease;
    if (signals) {
      const auto term = term_for_pass();
      if (!term) {
        done();
        return;
      }
      lease = sdk::leader_lease{lead_holder, *term};
    }
    maintenance_running = true;
    const auto stale_after = std::chrono::duration_cast<sdk::microseconds>(staleness());
    // The leader knows its own running attempts are alive: it refreshes them right before the
    // rescue, so a slow heartbeat (a busy pool, a slow connect) never makes it rescue itself.
    std::vector<attempt_id> own;
    for (const auto& [id, e] : in_flight) {
      if (!e->handler_done) own.push_back(id);
    }
    on_db(
        [this, stale_after, own = std::move(own), lease]() -> result<std::vector<sdk::rescued_attempt>> {
          if (!own.empty()) {
            auto refreshed = store->heartbeat(own);
            if (!refreshed) return refreshed.error();
          }
          // With leadership, the pass is fenced: the database runs it only for the current term.
          if (lease) return store->maintain(*lease, stale_after);
          auto promoted = store->promote_due();
          if (!promoted) return promoted.error();
          return store->rescue_stale(stale_after);
        },
        [this, done = std::move(done), lease](result<std::vector<sdk::rescued_attempt>> r) {
          maintenance_running = false;
          if (!r && r.error() == errc::leadership_lost) {
            leadership_lost.fetch_add(1, std::memory_order_relaxed);
            drop_lease(lease ? lease->term : 0,
                       "the database refused its maintenance pass: the lease expired or another worker took it "
                       "over; nothing was changed");
            done();
            return;
          }
          if (!r) {
            m.database_errors.fetch_add(1, std::memory_order_relaxed);
            tenure::logger()->warn("tenure: maintenance failed: {}", r.error().message());
            done();
            return;
          }
          for (const auto& res : r.value()) {
            m.rescued.fetch_add(1, std::memory_order_relaxed);
            tenure::logger()->warn("tenure: rescued job {} lease {} queue {} (no heartbeat for {} ms or past its deadline) "
                         "-> {}",
                         res.attempt.job_id, res.attempt.run_lease, res.queue, staleness().count(),
                         tenure::to_string(res.new_state));
            claimed_attempt c;
            c.attempt = res.attempt;
            c.queue = res.queue;
            if (auto it = in_flight.find(res.attempt); it != in_flight.end()) {
              c = it->second->claim;
              it->second->cancel();  // its late outcome will be stale
            }
            emit(lifecycle_event::rescued, c, std::string{tenure::to_string(res.new_state)});
            if (res.new_state == job_state::available) on_wake(res.queue);
          }
          done();
        });
  }

  // ---- cancel hints ----

  /// A cancel notification named `a`. Any role can send one, so it only asks for a check: the
  /// handler is cancelled once the database says the attempt is no longer live.
  void on_cancel_hint(const attempt_id& a) {
    auto it = in_flight.find(a);
    if (it == in_flight.end() || it->second->handler_done || it->second->is_cancelled()) return;
    cancel_hints.insert(a);
    check_cancel_hints();
  }

  /// Reads the evidence of every hinted attempt in one statement, at most once per
  /// k_cancel_check_gap (longer after a failed read); hints that arrive meanwhile wait for the next.
  void check_cancel_hints() {
    if (cancel_check_running || cancel_check_armed || cancel_hints.empty()) return;
    const auto gap = std::max(k_cancel_check_gap, cancel_check_backoff);
    const auto since = steady_clock::now() - last_cancel_check;
    if (since < gap) {
      cancel_check_armed = true;
      cancel_check_timer.expires_after(gap - since);
      cancel_check_timer.async_wait([this](const boost::system::error_code& ec) {
        cancel_check_armed = false;
        if (!ec) check_cancel_hints();
      });
      return;
    }
    std::vector<attempt_id> ids;
    std::vector<entry_ptr> entries;
    for (const auto& a : cancel_hints) {
      auto it = in_flight.find(a);
      if (it == in_flight.end() || it->second->handler_done || it->second->is_cancelled()) continue;
      ids.push_back(a);
      entries.push_back(it->second);
    }
    cancel_hints.clear();
    if (ids.empty()) return;
    cancel_check_running = true;
    m.cancel_checks.fetch_add(1, std::memory_order_relaxed);
    on_db([this, ids] { return store->reconcile(std::span<const attempt_id>{ids}); },
          [this, entries = std::move(entries)](result<std::vector<sdk::attempt_evidence>> r) {
            cancel_check_running = false;
            last_cancel_check = steady_clock::now();
            if (!r || r.value().size() != entries.size()) {
              m.database_errors.fetch_add(1, std::memory_order_relaxed);
              cancel_check_backoff = next_backoff(cancel_check_backoff);
              tenure::logger()->warn("tenure: checking {} cancel notification(s) against the database failed ({}); retrying "
                           "in {} ms (the heartbeat also finds attempts no longer live)",
                           entries.size(), r ? std::string{"answer of the wrong size"} : r.error().message(),
                           std::max(k_cancel_check_gap, cancel_check_backoff).count());
              for (const auto& e : entries) cancel_hints.insert(e->claim.attempt);
              check_cancel_hints();
              return;
            }
            cancel_check_backoff = milliseconds{0};
            for (std::size_t i = 0; i < entries.size(); ++i) {
              const auto& e = entries[i];
              const auto& c = e->claim;
              if (r.value()[i] == sdk::attempt_evidence::open) {
                tenure::logger()->debug("tenure: cancel notification for job {} lease {} queue {} ignored: the attempt is "
                              "still live", c.attempt.job_id, c.attempt.run_lease, c.queue);
                continue;
              }
              if (e->handler_done || e->is_cancelled() || !in_flight.contains(c.attempt)) continue;
              tenure::logger()->info("tenure: job {} lease {} queue {} was cancelled or rescued; cancelling its handler",
                           c.attempt.job_id, c.attempt.run_lease, c.queue);
              e->cancel();
            }
            check_cancel_hints();  // hints that arrived while this read was in flight
          });
  }

  // ---- signals ----

  void signal_loop() {
    milliseconds backoff{0};
    auto next_lead_try = steady_clock::now();
    while (!signal_stop.load()) {
      if (!signals->connected()) {
        // The lease is not tied to this session: it stays usable until it expires by our clock.
        auto c = signals->connect();
        if (!c) {
          backoff = next_backoff(backoff);
          tenure::logger()->warn("tenure: LISTEN connection failed ({}); polling meanwhile, retrying in {} ms",
                       c.error().message(), backoff.count());
          const auto until = steady_clock::now() + backoff;
          while (!signal_stop.load() && steady_clock::now() < until) std::this_thread::sleep_for(milliseconds{20});
          continue;
        }
        if (backoff.count() > 0) tenure::logger()->info("tenure: LISTEN connection restored");
        backoff = milliseconds{0};
        // Notifications sent while we were away are lost: look at every queue once.
        on_ctl([this] {
          for (auto& q : queues) on_wake(q->opt.name);
        });
      }
      if (cfg.maintenance && steady_clock::now() >= next_lead_try) {
        // Renewed every maintenance_interval, well within the ttl (at least 2 x that interval).
        const auto asked = steady_clock::now();
        auto l = signals->try_lead(lead_holder, lease_ttl());
        if (l && l.value()) {
          hold_lease(*l.value(), asked);
        } else if (l) {
          drop_lease(0, "another worker holds the lease");
        }
        // (A failed renewal keeps the lease until it expires by our clock: the pool may still work.)
        next_lead_try = asked + cfg.maintenance_interval;
      }
      const auto until_lead = std::chrono::duration_cast<milliseconds>(next_lead_try - steady_clock::now());
      auto r = signals->wait(cfg.maintenance ? std::clamp(until_lead, milliseconds{1}, milliseconds{100})
                                             : milliseconds{100});
      if (!r) continue;
      if (r.value().empty()) continue;
      // Every notification is a hint (any role that can connect may send one): one batch of
      // them, duplicates merged, goes to the control thread as one task.
      std::set<std::string> wakes;
      std::set<attempt_id> cancels, resumes;
      for (auto& s : r.value()) {
        switch (s.what) {
          case sdk::signal::kind::wake: wakes.insert(std::move(s.queue)); break;
          case sdk::signal::kind::cancel: cancels.insert(s.attempt); break;
          case sdk::signal::kind::resume: resumes.insert(s.attempt); break;
        }
      }
      on_ctl([this, wakes = std::move(wakes), cancels = std::move(cancels), resumes = std::move(resumes)] {
        for (const auto& q : wakes) on_wake(q);
        for (const auto& a : cancels) on_cancel_hint(a);
        for (const auto& a : resumes) {
          // A waiting handler polls its callback now (context.cpp bounds how often).
          if (auto it = in_flight.find(a); it != in_flight.end() && !it->second->handler_done) it->second->poke();
        }
      });
    }
    // A stopping leader ends its lease, so that the next worker need not wait for it to expire.
    std::int64_t held = 0;
    {
      std::lock_guard lock(lead_mu);
      held = lead_term;
      lead_term = 0;
    }
    if (held != 0 && signals->connected()) signals->resign(lead_holder, held);
  }

  // ---- idle / shutdown ----

  bool idle_now() const {
    return in_flight.empty() && completions.idle() && evidence.idle() && outstanding_ops == 0;
  }

  void check_idle() {
    if (idle_waiters.empty() || !idle_now()) return;
    auto waiters = std::move(idle_waiters);
    idle_waiters.clear();
    for (auto& w : waiters) w();
  }

  /// Runs `fn` on the control thread and waits for it to call its completion, or `timeout`.
  bool run_and_wait(std::function<void(std::function<void()>)> fn, milliseconds timeout) {
    auto p = std::make_shared<std::promise<void>>();
    auto f = p->get_future();
    on_ctl([fn = std::move(fn), p] { fn([p] { p->set_value(); }); });
    return f.wait_for(timeout) == std::future_status::ready;
  }
};

// ---- runtime API ---------------------------------------------------------------------------------

runtime::runtime(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
runtime::~runtime() { stop(); }

result<std::unique_ptr<runtime>> runtime::create(runtime_config config, std::shared_ptr<sdk::storage_port> store,
                                                 std::shared_ptr<sdk::signal_port> signals, std::string* detail) {
  auto bad = [&](std::string why) -> result<std::unique_ptr<runtime>> {
    if (detail) *detail = std::move(why);
    return errc::invalid_argument;
  };
  if (config.logger) set_logger(config.logger);
  if (!store) return bad("no storage");
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
  {
    // The same rule the SQL side enforces: a plain lower-case identifier.
    const auto& sc = config.sql_schema;
    const bool ok = !sc.empty() && sc.size() <= 63 && (std::islower(static_cast<unsigned char>(sc[0])) || sc[0] == '_') &&
                    std::all_of(sc.begin(), sc.end(), [](char ch) {
                      return std::islower(static_cast<unsigned char>(ch)) || std::isdigit(static_cast<unsigned char>(ch)) ||
                             ch == '_';
                    });
    if (!ok) return bad("sql_schema '" + sc + "' is not a plain lower-case identifier");
  }
  if (config.worker_id.empty()) config.worker_id = default_worker_id();
  if (config.handler_threads <= 0) {
    config.handler_threads = 0;
    for (const auto& q : config.queues) config.handler_threads += q.max_concurrency;
  }
  auto p = std::make_unique<impl>(std::move(config), std::move(store), std::move(signals));
  {
    std::random_device rd;
    char nonce[17];
    std::snprintf(nonce, sizeof nonce, "%08x%08x", rd(), rd());
    p->lead_holder = p->cfg.worker_id.substr(0, 160) + "/" + nonce;
  }
  if (p->cfg.handler_store_calls > 0) p->store_gate = std::make_shared<detail::call_gate>(p->cfg.handler_store_calls);
  if (p->cfg.max_caller_owned > 0) p->owned_gate = std::make_unique<detail::call_gate>(p->cfg.max_caller_owned);
  return std::unique_ptr<runtime>(new runtime(std::move(p)));
}

void runtime::handle(std::string kind, handler fn) {
  if (impl_->started) {
    tenure::logger()->error("tenure: handle('{}') after start() is ignored: register every handler before start()", kind);
    return;
  }
  impl_->owned_handlers.erase(kind);
  impl_->handlers[std::move(kind)] = std::move(fn);
}
void runtime::handle_caller_owned(std::string kind, caller_owned_handler fn) {
  if (impl_->started) {
    tenure::logger()->error("tenure: handle_caller_owned('{}') after start() is ignored: register every handler before start()",
                  kind);
    return;
  }
  impl_->handlers.erase(kind);
  impl_->owned_handlers[std::move(kind)] = std::move(fn);
}
void runtime::on_event(event_hook hook) {
  if (impl_->started) {
    // The control thread reads the hooks without a lock once started.
    tenure::logger()->error("tenure: on_event() after start() is ignored: register every hook before start()");
    return;
  }
  impl_->hooks.push_back(std::move(hook));
}
const runtime_config& runtime::config() const noexcept { return impl_->cfg; }

result<void> runtime::start() {
  std::lock_guard lock(impl_->lifecycle_mu);
  auto& d = *impl_;
  if (d.started) return success();
  if (d.handlers.empty() && d.owned_handlers.empty()) {
    tenure::logger()->error("tenure: runtime::start() with no handler registered");
    return errc::invalid_argument;
  }
  for (const auto& q : d.cfg.queues) {
    if (!q.hard_deadline && !q.dead_letter && !q.backoff_base && !q.backoff_cap) continue;
    sdk::queue_settings st;
    if (q.hard_deadline) st.hard_deadline = std::chrono::duration_cast<sdk::microseconds>(*q.hard_deadline);
    st.dead_letter = q.dead_letter.value_or(false);
    if (q.backoff_base) st.backoff_base = std::chrono::duration_cast<sdk::microseconds>(*q.backoff_base);
    if (q.backoff_cap) st.backoff_cap = std::chrono::duration_cast<sdk::microseconds>(*q.backoff_cap);
    auto written = d.store->configure_queue(q.name, st);
    if (!written) {
      tenure::logger()->error("tenure: cannot write the settings of queue {}: {}", q.name, written.error().message());
      return written.error();
    }
  }
  if (d.cfg.metrics_port) {
    auto server = detail::metrics_server::start(d.cfg.metrics_address, *d.cfg.metrics_port,
                                                [this] { return prometheus_text(); });
    if (!server) return server.error();
    d.metrics_http = std::move(server).value();
  }
  d.started = true;
  d.workers = std::make_unique<asio::thread_pool>(static_cast<std::size_t>(d.cfg.handler_threads));
  d.ctl_guard.emplace(asio::make_work_guard(d.ctl));
  d.ctl_thread = std::thread([&d] { d.ctl.run(); });
  if (d.signals) d.signal_thread = std::thread([&d] { d.signal_loop(); });
  d.on_ctl([&d] {
    for (auto& q : d.queues) d.pump(*q);
    d.arm_heartbeat();
    d.arm_maintenance();
    d.arm_capacity_sweep();
  });
  tenure::logger()->info("tenure: runtime {} started on {} queue(s)", d.cfg.worker_id, d.queues.size());
  return success();
}

void runtime::stop() noexcept {
  try {
    std::lock_guard lock(impl_->lifecycle_mu);
    auto& d = *impl_;
    if (!d.started || d.stopped) return;
    d.stopped = true;
    tenure::logger()->info("tenure: runtime {} stopping: no new claims, draining", d.cfg.worker_id);
    // 1. Stop claiming; handlers keep running and heartbeats continue.
    d.run_and_wait(
        [&d](std::function<void()> done) {
          d.stopping = true;
          for (auto& q : d.queues) {
            q->timer.cancel();
            q->wake_timer.cancel();
          }
          done();
        },
        milliseconds{60'000});
    // 2. Wait for handlers up to the timeout.
    const auto deadline = steady_clock::now() + d.cfg.shutdown_timeout;
    auto handlers_done = [&d] {
      auto p = std::make_shared<std::promise<bool>>();
      auto f = p->get_future();
      // A claim still in flight may start handlers yet: they run like the others.
      d.on_ctl([&d, p] { p->set_value(d.running_handlers == 0 && !d.claiming()); });
      return f.get();
    };
    while (!handlers_done() && steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds{5});
    if (!handlers_done()) {
      d.run_and_wait(
          [&d](std::function<void()> done) {
            if (d.running_handlers > 0) {
              tenure::logger()->warn("tenure: {} handler(s) still running after the shutdown timeout; cancelling them, their "
                           "attempts stay open for rescue",
                           d.running_handlers);
            }
            if (d.claiming()) {
              tenure::logger()->warn("tenure: a claim is still in flight after the shutdown timeout; what it takes is given "
                           "back without spending an attempt");
            }
            d.abandoning = true;
            for (auto& [id, e] : d.in_flight) e->cancel();
            done();
          },
          milliseconds{60'000});
    }
    d.workers->join();  // handlers ignoring cancellation are waited for here
    // 3. Flush every pending completion and finish outstanding outcome writes.
    const auto flush_deadline = steady_clock::now() + std::max(d.cfg.shutdown_timeout, milliseconds{5'000});
    for (;;) {
      auto p = std::make_shared<std::promise<bool>>();
      auto f = p->get_future();
      d.on_ctl([&d, p] {
        d.completions.maybe(true);
        d.evidence.maybe(true);
        p->set_value(d.completions.idle() && d.evidence.idle() && d.outstanding_ops == 0 && !d.claiming());
      });
      if (f.get()) break;
      if (steady_clock::now() >= flush_deadline) {
        tenure::logger()->error("tenure: shutdown could not flush every completion (database unavailable?); those attempts "
                      "stay open and will be rescued and run again");
        break;
      }
      std::this_thread::sleep_for(milliseconds{2});
    }
    // 4. Stop the background loops.
    d.signal_stop = true;
    if (d.signal_thread.joinable()) d.signal_thread.join();
    d.run_and_wait(
        [&d](std::function<void()> done) {
          d.heartbeat_timer.cancel();
          d.maintenance_timer.cancel();
          d.capacity_timer.cancel();
          d.cancel_check_timer.cancel();
          d.completions.cancel();
          d.evidence.cancel();
          done();
        },
        milliseconds{60'000});
    d.ctl_guard.reset();
    d.ctl.stop();
    if (d.ctl_thread.joinable()) d.ctl_thread.join();
    d.db.join();
    if (d.metrics_http) d.metrics_http->stop();
    tenure::logger()->info("tenure: runtime {} stopped", d.cfg.worker_id);
  } catch (const std::exception& e) {
    tenure::logger()->error("tenure: error during stop: {}", e.what());
  }
}

runtime_metrics runtime::metrics() const {
  const auto& m = impl_->m;
  runtime_metrics r;
  r.claimed = m.claimed;
  r.completed = m.completed;
  r.stale_rejected = m.stale_rejected;
  r.retried = m.retried;
  r.failed = m.failed;
  r.cancelled = m.cancelled;
  r.snoozed = m.snoozed;
  r.rescued = m.rescued;
  r.claims = m.claims;
  r.flushes = m.flushes;
  r.flushed_items = m.flushed_items;
  r.flush_failures = m.flush_failures;
  r.flush_max_size = m.flush_max_size;
  r.flush_latency_us_total = m.flush_latency_us_total;
  r.heartbeats = m.heartbeats;
  r.database_errors = m.database_errors;
  r.reconciliations = m.reconciliations;
  r.reconcile_reads = m.reconcile_reads;
  r.protocol_warnings = m.protocol_warnings;
  r.capacity_released = m.capacity_released;
  r.cancel_checks = m.cancel_checks;
  r.in_flight = m.in_flight;
  r.permits_held = m.permits_held;
  r.watching = m.watching;
  r.pending_completions = m.pending_completions;
  r.leader = impl_->is_leader();
  r.leader_term = r.leader && impl_->signals ? impl_->current_term().value_or(0) : 0;
  r.leadership_lost = impl_->leadership_lost.load(std::memory_order_relaxed);
  return r;
}

std::string runtime::prometheus_text() const {
  const auto r = metrics();
  std::string out;
  auto counter = [&](const char* name, const char* help, std::uint64_t v) {
    out += std::string{"# HELP tenure_"} + name + " " + help + "\n# TYPE tenure_" + name + " counter\ntenure_" + name +
           " " + std::to_string(v) + "\n";
  };
  auto gauge = [&](const char* name, const char* help, std::int64_t v) {
    out += std::string{"# HELP tenure_"} + name + " " + help + "\n# TYPE tenure_" + name + " gauge\ntenure_" + name +
           " " + std::to_string(v) + "\n";
  };
  counter("claimed_total", "Attempts claimed.", r.claimed);
  counter("completed_total", "Completions durably applied.", r.completed);
  counter("stale_rejected_total", "Outcomes discarded because the attempt was no longer live.", r.stale_rejected);
  counter("retried_total", "Attempts that failed and will retry.", r.retried);
  counter("failed_total", "Jobs failed for good.", r.failed);
  counter("cancelled_total", "Jobs cancelled by their handler.", r.cancelled);
  counter("snoozed_total", "Attempts snoozed.", r.snoozed);
  counter("rescued_total", "Attempts rescued by this process as maintenance leader.", r.rescued);
  counter("claims_total", "Claim statements.", r.claims);
  counter("flushes_total", "Completion flush statements answered.", r.flushes);
  counter("flushed_items_total", "Completions carried by answered flushes.", r.flushed_items);
  counter("flush_failures_total", "Completion flushes that failed and were retried.", r.flush_failures);
  counter("flush_latency_microseconds_total", "Summed latency of answered flushes.", r.flush_latency_us_total);
  counter("heartbeats_total", "Heartbeat statements.", r.heartbeats);
  counter("database_errors_total", "Database calls that failed.", r.database_errors);
  counter("reconciliations_total", "Durable-evidence reads after a caller-owned exit or an unknown outcome.",
          r.reconciliations);
  counter("reconcile_reads_total", "Set-based evidence statements (caller-owned exits, in-doubt flushes).",
          r.reconcile_reads);
  counter("protocol_warnings_total", "Handler exits contradicted by durable evidence.", r.protocol_warnings);
  counter("cancel_checks_total", "Liveness reads for cancel notifications (one per coalesced batch).",
          r.cancel_checks);
  counter("capacity_released_total", "Permits released while the database could not answer for an attempt.",
          r.capacity_released);
  gauge("flush_max_size", "Largest flush so far.", static_cast<std::int64_t>(r.flush_max_size));
  gauge("in_flight", "Attempts held by this process.", r.in_flight);
  gauge("permits_held", "Capacity permits held by attempts.", r.permits_held);
  gauge("watching", "Attempts whose permit was released while still reconciling.", r.watching);
  gauge("pending_completions", "Completed outcomes waiting for (or in) a completion flush.", r.pending_completions);
  gauge("leader", "1 when this process runs maintenance.", r.leader ? 1 : 0);
  gauge("leader_term", "Term of the maintenance lease this process holds (0 when it holds none).", r.leader_term);
  counter("leadership_lost_total", "Maintenance passes the database refused because the lease was lost.",
          r.leadership_lost);
  return out;
}

std::optional<std::uint16_t> runtime::metrics_port() const {
  if (!impl_->metrics_http) return std::nullopt;
  return impl_->metrics_http->port();
}

void runtime::heartbeat_now() {
  impl_->run_and_wait([this](std::function<void()> done) { impl_->heartbeat(std::move(done)); }, milliseconds{60'000});
}

void runtime::flush_now() {
  impl_->run_and_wait(
      [this](std::function<void()> done) {
        impl_->completions.run();
        done();
      },
      milliseconds{60'000});
}

void runtime::maintenance_now() {
  impl_->run_and_wait([this](std::function<void()> done) { impl_->maintenance(std::move(done)); },
                      milliseconds{60'000});
}

bool runtime::wait_idle(milliseconds timeout) {
  return impl_->run_and_wait(
      [this](std::function<void()> done) {
        if (impl_->idle_now()) {
          done();
          return;
        }
        impl_->idle_waiters.push_back(std::move(done));
      },
      timeout);
}

}  // namespace tenure
