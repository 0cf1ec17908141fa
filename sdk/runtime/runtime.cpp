// The worker runtime: the facade over its pieces (docs/design.md, "Runtime", for how they stack).
// Threading model:
//  - ctl: one io_context on one thread owns every piece of mutable runtime state (queues,
//    the in-flight table, the completion batcher, timers). Nothing else touches it, but for a
//    claimed attempt's entry, built on the database thread that received the claim before ctl
//    admits it.
//  - db: a thread pool for blocking storage calls; each call posts its answer back to ctl. A
//    claim's answer also posts the claimed handlers to workers from there, after its answer
//    (which admits them) was posted to ctl (execution.hpp).
//  - workers: a thread pool running handlers; each outcome is posted back to ctl.
//  - signal thread: waits on the signal port (LISTEN/NOTIFY), renews the maintenance lease, and
//    posts to ctl.
// An attempt's in-flight entry and its capacity permit are released on ctl only after the
// database answered for it (applied or stale), never before.
#include "tenure/runtime.hpp"

#include <algorithm>
#include <cstdio>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "sdk/runtime/config.hpp"
#include "sdk/runtime/control.hpp"
#include "sdk/runtime/dispatcher.hpp"
#include "sdk/runtime/execution.hpp"
#include "sdk/runtime/heartbeat.hpp"
#include "sdk/runtime/in_flight.hpp"
#include "sdk/runtime/leadership.hpp"
#include "sdk/runtime/maintenance.hpp"
#include "sdk/runtime/metrics.hpp"
#include "sdk/runtime/metrics_server.hpp"
#include "sdk/runtime/settlement.hpp"
#include "sdk/runtime/signals.hpp"
#include "tenure/signal_port.hpp"
#include "tenure/storage_port.hpp"

namespace tenure {

namespace asio = boost::asio;
using std::chrono::milliseconds;

/// The pieces, each standing only on those declared before it (callbacks carry anything that
/// goes the other way).
struct runtime::impl {
  impl(runtime_config c, std::shared_ptr<storage_port> s, std::shared_ptr<signal_port> sig)
      : core(std::move(c), std::move(s)),
        lead(core.cfg, sig != nullptr),
        table(core),
        settle(core, table),
        exec(core, table, settle),
        dispatch(core, table, exec),
        beat(core, table),
        maint(core, table, lead, dispatch, sig != nullptr),
        sigs(core, table, lead, dispatch, std::move(sig)) {
    // A claim awaiting its answer counts: the attempts it takes may already be running.
    core.idle_now = [this] {
      return table.in_flight.empty() && settle.idle() && core.outstanding_ops == 0 && !dispatch.claiming();
    };
  }

  detail::control core;
  detail::leadership lead;
  detail::in_flight_table table;
  detail::settlement settle;
  detail::execution exec;
  detail::dispatcher dispatch;
  detail::heartbeat beat;
  detail::maintenance maint;
  detail::signals sigs;
  std::unique_ptr<detail::metrics_server> metrics_http;
  /// For /readyz: ready only between the end of start() and the beginning of stop().
  std::atomic<bool> ready{false};
  std::atomic<bool> leaving{false};  ///< stop() has begun
  bool started = false;
  bool stopped = false;
  std::mutex lifecycle_mu;
};

runtime::runtime(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
runtime::~runtime() { stop(); }

result<std::unique_ptr<runtime>> runtime::create(runtime_config config, std::shared_ptr<storage_port> store,
                                                 std::shared_ptr<signal_port> signals) {
  auto bad = [](std::string why) -> result<std::unique_ptr<runtime>> {
    return error{errc::invalid_argument, std::move(why)};
  };
  if (config.logger) set_logger(config.logger);
  if (!store) return bad("no storage");
  if (auto why = detail::validate_config(config, signals != nullptr)) return bad(std::move(*why));
  auto p = std::make_unique<impl>(std::move(config), std::move(store), std::move(signals));
  {
    std::random_device rd;
    char nonce[17];
    std::snprintf(nonce, sizeof nonce, "%08x%08x", rd(), rd());
    p->lead.holder = p->core.cfg.worker_id.substr(0, 160) + "/" + nonce;
  }
  const auto& cfg = p->core.cfg;
  if (cfg.handler_store_calls > 0) p->exec.store_gate = std::make_shared<detail::call_gate>(cfg.handler_store_calls);
  if (cfg.max_caller_owned > 0) p->exec.owned_gate = std::make_unique<detail::call_gate>(cfg.max_caller_owned);
  return std::unique_ptr<runtime>(new runtime(std::move(p)));
}


void runtime::handle(std::string kind, handler fn) {
  if (impl_->started) {
    tenure::logger()->error("tenure: handle('{}') after start() is ignored: register every handler before start()", kind);
    return;
  }
  impl_->exec.owned_handlers.erase(kind);
  impl_->exec.handlers[std::move(kind)] = std::move(fn);
}
void runtime::handle_caller_owned(std::string kind, caller_owned_handler fn) {
  if (impl_->started) {
    tenure::logger()->error("tenure: handle_caller_owned('{}') after start() is ignored: register every handler before start()",
                  kind);
    return;
  }
  impl_->exec.handlers.erase(kind);
  impl_->exec.owned_handlers[std::move(kind)] = std::move(fn);
}
void runtime::use(middleware mw) {
  if (impl_->started) {
    // Handler threads read the chain without a lock once started.
    tenure::logger()->error("tenure: use() after start() is ignored: add every middleware before start()");
    return;
  }
  if (mw) impl_->exec.middlewares.push_back(std::move(mw));
}
void runtime::on_event(event_hook hook) {
  if (impl_->started) {
    // The control thread reads the hooks without a lock once started.
    tenure::logger()->error("tenure: on_event() after start() is ignored: register every hook before start()");
    return;
  }
  impl_->core.hooks.push_back(std::move(hook));
}
const runtime_config& runtime::config() const noexcept { return impl_->core.cfg; }

result<void> runtime::start() {
  std::lock_guard lock(impl_->lifecycle_mu);
  auto& d = *impl_;
  if (d.started) return success();
  if (d.exec.handlers.empty() && d.exec.owned_handlers.empty()) {
    tenure::logger()->error("tenure: runtime::start() with no handler registered");
    return error{errc::invalid_argument, "no handler registered (call handle() or handle_caller_owned() before start())"};
  }
  for (const auto& q : d.core.cfg.queues) {
    if (!q.hard_deadline && !q.dead_letter && !q.backoff_base && !q.backoff_cap) continue;
    queue_settings st;
    if (q.hard_deadline) st.hard_deadline = std::chrono::duration_cast<std::chrono::microseconds>(*q.hard_deadline);
    st.dead_letter = q.dead_letter.value_or(false);
    if (q.backoff_base) st.backoff_base = std::chrono::duration_cast<std::chrono::microseconds>(*q.backoff_base);
    if (q.backoff_cap) st.backoff_cap = std::chrono::duration_cast<std::chrono::microseconds>(*q.backoff_cap);
    auto written = d.core.store->configure_queue(q.name, st);
    if (!written) {
      tenure::logger()->error("tenure: cannot write the settings of queue {}: {}", q.name, written.error().message());
      return written.error();
    }
  }
  d.core.note_db_answer();  // the silence /healthz measures counts from here
  if (d.core.cfg.metrics_port) {
    auto server = detail::metrics_server::start(
        d.core.cfg.metrics_address, *d.core.cfg.metrics_port, [this] { return prometheus_text(); },
        [this] {
          auto p = health();
          return detail::metrics_server::probe_answer{p.ok, std::move(p.reason)};
        },
        [this] {
          auto p = readiness();
          return detail::metrics_server::probe_answer{p.ok, std::move(p.reason)};
        });
    if (!server) return server.error();
    d.metrics_http = std::move(server).value();
  }
  d.started = true;
  d.core.workers = std::make_unique<asio::thread_pool>(static_cast<std::size_t>(d.core.cfg.handler_threads));
  d.core.ctl_guard.emplace(asio::make_work_guard(d.core.ctl));
  d.core.ctl_thread = std::thread([&d] { d.core.ctl.run(); });
  d.sigs.start();
  d.core.on_ctl([&d] {
    for (auto& q : d.table.queues) d.dispatch.pump(*q);
    d.beat.arm();
    d.maint.arm();
    d.table.arm_capacity_sweep();
  });
  d.ready = true;
  tenure::logger()->info("tenure: runtime {} started on {} queue(s)", d.core.cfg.worker_id, d.table.queues.size());
  return success();
}

void runtime::stop() noexcept {
  try {
    std::lock_guard lock(impl_->lifecycle_mu);
    auto& d = *impl_;
    if (!d.started || d.stopped) return;
    d.stopped = true;
    d.ready = false;
    d.leaving = true;
    tenure::logger()->info("tenure: runtime {} stopping: no new claims, draining", d.core.cfg.worker_id);
    // 1. Stop claiming; handlers keep running and heartbeats continue.
    d.core.run_and_wait(
        [&d](std::function<void()> done) {
          d.core.stopping = true;
          for (auto& q : d.table.queues) {
            q->timer.cancel();
            q->wake_timer.cancel();
          }
          done();
        },
        milliseconds{60'000});
    // 2. Wait for handlers up to the timeout, woken by the last one's exit (or by the answer
    //    of a claim still in flight: it may start handlers yet, which run like the others).
    const bool handlers_done = d.core.run_and_wait_until_due(
        [&d](std::function<void()> done) {
          d.core.when([&d] { return d.core.running_handlers == 0 && !d.dispatch.claiming(); }, std::move(done));
        },
        d.core.cfg.shutdown_timeout);
    if (!handlers_done) {
      d.core.run_and_wait(
          [&d](std::function<void()> done) {
            {
              // Before the warnings below: a claim answered from here on gives back what it took
              // (its database thread reads this under the same lock as it decides to launch).
              std::lock_guard door(d.core.launch_mu);
              d.core.abandoning = true;
            }
            if (d.core.running_handlers > 0) {
              tenure::logger()->warn("tenure: {} handler(s) still running after the shutdown timeout; cancelling them, their "
                           "attempts stay open for rescue",
                           d.core.running_handlers);
            }
            if (d.dispatch.claiming()) {
              tenure::logger()->warn("tenure: a claim is still in flight after the shutdown timeout; the jobs it takes that "
                           "have not started are given back without spending an attempt");
            }
            for (auto& [id, e] : d.table.in_flight) e->cancel();
            done();
          },
          milliseconds{60'000});
    }
    {
      // From here a claim's answer gives its attempts back instead of handing them to the pool.
      std::lock_guard door(d.core.launch_mu);
      d.core.launch_closed = true;
    }
    d.core.workers->join();  // handlers ignoring cancellation are waited for here
    // 3. Flush every pending completion and finish outstanding outcome writes, woken by each
    //    answer (every batch due runs at once while stopping).
    const bool flushed = d.core.run_and_wait_until_due(
        [&d](std::function<void()> done) {
          d.core.when(
              [&d] {
                d.settle.flush_due(true);
                return d.settle.idle() && d.core.outstanding_ops == 0 && !d.dispatch.claiming();
              },
              std::move(done));
        },
        std::max(d.core.cfg.shutdown_timeout, milliseconds{5'000}));
    if (!flushed) {
      tenure::logger()->error("tenure: shutdown could not flush every completion (database unavailable?); those attempts "
                    "stay open and will be rescued and run again");
    }
    // 4. Stop the background loops.
    d.sigs.stop();
    d.core.run_and_wait(
        [&d](std::function<void()> done) {
          d.beat.cancel_timers();
          d.maint.cancel_timers();
          d.table.cancel_timers();
          d.sigs.cancel_timers();
          d.settle.cancel_timers();
          done();
        },
        milliseconds{60'000});
    d.core.ctl_guard.reset();
    d.core.ctl.stop();
    if (d.core.ctl_thread.joinable()) d.core.ctl_thread.join();
    d.core.db.join();
    if (d.metrics_http) d.metrics_http->stop();
    tenure::logger()->info("tenure: runtime {} stopped", d.core.cfg.worker_id);
  } catch (const std::exception& e) {
    tenure::logger()->error("tenure: error during stop: {}", e.what());
  }
}

runtime_metrics runtime::metrics() const {
  auto r = impl_->core.m.snapshot();
  r.leader = impl_->lead.is_leader();
  r.leader_term = r.leader && impl_->sigs.port ? impl_->lead.current_term().value_or(0) : 0;
  return r;
}

std::string runtime::prometheus_text() const { return detail::prometheus_text(metrics()); }

runtime::probe runtime::health() const {
  const auto& core = impl_->core;
  const auto limit = core.cfg.unhealthy_after.value_or(std::max<milliseconds>(milliseconds{30'000}, core.cfg.poll_interval * 3));
  const auto silent = std::chrono::duration_cast<milliseconds>(core.now() - core.db_answered_at());
  if (core.last_db_answer.load(std::memory_order_relaxed) != 0 && silent > limit) {
    return {false, "unhealthy: the database has not answered for " + std::to_string(silent.count()) + " ms (limit " +
                       std::to_string(limit.count()) + " ms)"};
  }
  return {true, "ok"};
}

runtime::probe runtime::readiness() const {
  if (impl_->ready.load()) return {true, "ready"};
  return {false, impl_->leaving.load() ? "not ready: stopping" : "not ready: starting"};
}

std::optional<std::uint16_t> runtime::metrics_port() const {
  if (!impl_->metrics_http) return std::nullopt;
  return impl_->metrics_http->port();
}

void runtime::heartbeat_now() {
  impl_->core.run_and_wait([this](std::function<void()> done) { impl_->beat.beat(std::move(done)); }, milliseconds{60'000});
}

void runtime::flush_now() {
  impl_->core.run_and_wait(
      [this](std::function<void()> done) {
        impl_->settle.flush_completions();
        done();
      },
      milliseconds{60'000});
}

void runtime::maintenance_now() {
  impl_->core.run_and_wait([this](std::function<void()> done) { impl_->maint.pass(std::move(done)); },
                      milliseconds{60'000});
}

bool runtime::wait_idle(milliseconds timeout) {
  return impl_->core.run_and_wait(
      [this](std::function<void()> done) {
        if (impl_->core.idle_now()) {
          done();
          return;
        }
        impl_->core.idle_waiters.push_back(std::move(done));
      },
      timeout);
}

}  // namespace tenure
