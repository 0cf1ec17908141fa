#include "sdk/runtime/execution.hpp"

#include "sdk/runtime/middleware.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::detail {

using std::chrono::milliseconds;

std::optional<std::string> execution::with_middleware(job_context& ctx, const std::function<attempt_report()>& call) {
  middleware_chain chain{middlewares, ctx, *cfg.clock, call};
  chain.run();
  return chain.failure();
}

execution::execution(control& c, in_flight_table& t, settlement& s) : core(c), table(t), settle(s), cfg(c.cfg) {}

entry_ptr execution::prepare(claimed_attempt c) const {
  auto entry = table.make_entry(std::move(c));
  entry->store_gate = store_gate;
  entry->caller_owned = owned_handlers.contains(entry->claim.kind);
  return entry;
}

bool execution::has_handler(const attempt_entry& entry) const {
  return entry.caller_owned || handlers.contains(entry.claim.kind);
}

void execution::run(const entry_ptr& entry) {
  const auto& kind = entry->claim.kind;
  if (entry->caller_owned) {
    run_caller_owned(entry, owned_handlers.at(kind));
  } else {
    run_plain(entry, handlers.at(kind));
  }
}

void execution::admit(const entry_ptr& entry) {
  table.admit(entry);
  const auto& a = entry->claim;
  ++core.running_handlers;
  core.emit(lifecycle_event::started, a);
  if (has_handler(*entry)) {
    // Launched where it was claimed, possibly as stop() was giving up on handlers: asked to stop.
    if (core.abandoning) entry->cancel();
    return;
  }
  // No handler here for this kind: give the attempt back (snooze) so a worker that has one can
  // take it, without spending an attempt.
  tenure::logger()->error("tenure: no handler for kind '{}' (job {} lease {} queue {}); snoozing it 60 s", a.kind,
                a.attempt.job_id, a.attempt.run_lease, a.queue);
  settle.on_outcome(entry, job_outcome::snooze(milliseconds{60'000}));
}

void execution::run_plain(const entry_ptr& entry, const runtime::handler& fn) {
  asio::post(*core.workers, [this, entry, &fn] {
    entry->starting();
    job_outcome outcome = job_outcome::completed();
    job_context ctx{entry};
    const auto call = [&] {
      try {
        if (auto problem = entry->args_problem()) {
          outcome = job_outcome::fail(std::move(*problem));  // never retried: the args stay the same
        } else {
          outcome = fn(ctx);
        }
      } catch (const std::exception& e) {
        outcome = job_outcome::retry(std::string{"handler threw: "} + e.what());
      } catch (...) {
        outcome = job_outcome::retry("handler threw a non-standard exception");
      }
      return report_of(outcome);
    };
    if (middlewares.empty()) {
      call();
    } else if (auto failure = with_middleware(ctx, call)) {
      outcome = job_outcome::retry(std::move(*failure));  // the handler's outcome is discarded
    }
    // The final progress becomes storable JSON text here, off the control thread.
    std::optional<std::string> progress;
    if (outcome.what() == job_outcome::kind::completed && outcome.progress()) {
      progress = entry->storable_progress(*outcome.progress(), "final progress");
    }
    core.on_ctl([this, entry, outcome = std::move(outcome), progress = std::move(progress)]() mutable {
      settle.on_outcome(entry, std::move(outcome), std::move(progress));
      core.check_waiters();
    });
  });
}

void execution::run_caller_owned(const entry_ptr& entry, const runtime::caller_owned_handler& fn) {
  asio::post(*core.workers, [this, entry, &fn] {
    entry->starting();
    if (auto problem = entry->args_problem()) {
      // The handler never starts, so nothing of the caller's can have finalized the attempt:
      // it fails through the runtime's own guarded write, as a plain handler's failure does.
      core.on_ctl([this, entry, problem = std::move(*problem)]() mutable {
        entry->caller_owned = false;
        settle.on_outcome(entry, job_outcome::fail(std::move(problem)));
        core.check_waiters();
      });
      return;
    }
    handler_exit exit;
    {
      detail::gate_hold slot{owned_gate.get()};
      if (entry->is_cancelled()) {
        // Cancelled, rescued or abandoned while waiting for a slot: never start the handler.
        exit.what = handler_exit::how::cancelled;
        exit.code = make_error_code(errc::stale_attempt);
        exit.message = "cancelled before its handler started";
      } else {
        caller_owned_context ctx{entry, cfg.sql_schema};
        const auto call = [&] {
          try {
            auto r = fn(ctx);
            if (r) {
              exit.what = handler_exit::how::receipt;
              if (!(r.value().attempt() == entry->claim.attempt)) {
                // A receipt for another attempt proves nothing about this one: evidence decides.
                exit.message = "receipt names another attempt";
              } else if (r.value().committed()) {
                exit.what = handler_exit::how::committed;  // the server answered its COMMIT
              }
            } else {
              exit.what = entry->is_cancelled() ? handler_exit::how::cancelled : handler_exit::how::error;
              exit.code = r.error();
              std::lock_guard lock(entry->mu);
              exit.message = entry->failure_note.empty() ? r.error().message() : entry->failure_note;
            }
          } catch (const std::exception& e) {
            exit.what = handler_exit::how::threw;
            exit.message = std::string{"handler threw: "} + e.what();
          } catch (...) {
            exit.what = handler_exit::how::threw;
            exit.message = "handler threw a non-standard exception";
          }
          return attempt_report{attempt_outcome::caller_owned, exit.message, {}};
        };
        if (middlewares.empty()) {
          call();
        } else if (auto failure = with_middleware(ctx, call)) {
          // As a handler exception: the durable evidence decides (a COMMIT the handler made stands).
          exit.what = handler_exit::how::threw;
          exit.code = {};
          exit.message = std::move(*failure);
        }
      }
    }
    core.on_ctl([this, entry, exit = std::move(exit)]() mutable {
      settle.on_handler_exit(entry, std::move(exit));
      core.check_waiters();
    });
  });
}

}  // namespace tenure::detail
