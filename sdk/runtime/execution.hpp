#pragma once
/// \file
/// Running handlers: a claimed attempt's handler runs on the handler pool (plain handlers, and
/// caller-owned handlers behind their gate) and its entry joins the in-flight table; each exit is
/// handed to settlement on the control thread. Stands on control, in_flight and settlement.
/// Private to the runtime; handlers are registered before start.
///
/// A claim's answer is handed over where it arrives, on a database thread: prepare() builds each
/// entry, then the claim's control-thread continuation is posted, then run() posts the handler of
/// each entry this process has one for (has_handler()) to the pool: the answer reaches
/// a handler without passing through the control thread. The continuation admits the entries
/// (admit()). Its post precedes every handler's, so a handler's exit, posted to the control
/// thread when it returns, always finds its entry admitted. That rests on the control thread
/// being one thread that runs posts in order, and on every exit being posted (never dispatched).
/// The `started` event is emitted at admission: before any outcome event of the attempt, but not
/// necessarily before its handler began.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdk/runtime/settlement.hpp"

namespace tenure::detail {

class execution {
 public:
  execution(control& core, in_flight_table& table, settlement& settle);

  std::unordered_map<std::string, runtime::handler> handlers;
  std::unordered_map<std::string, runtime::caller_owned_handler> owned_handlers;
  std::shared_ptr<call_gate> store_gate;  ///< handler-side store calls (may be null)
  std::unique_ptr<call_gate> owned_gate;  ///< caller-owned handlers running (may be null)
  std::vector<middleware> middlewares;    ///< runtime::use(), outermost first

  /// The entry of a claimed attempt. Any thread.
  entry_ptr prepare(claimed_attempt c) const;
  /// Whether this process has a handler for the entry's kind (registered before start, so any
  /// thread may ask).
  bool has_handler(const attempt_entry& entry) const;
  /// Posts the handler of an entry that has one to the pool, after its admission was posted.
  /// Any thread.
  void run(const entry_ptr& entry);
  /// Holds the attempt (in-flight table, running count, `started` event) of a claim whose
  /// handlers were launched; one without a handler here is snoozed back. Control thread.
  void admit(const entry_ptr& entry);

 private:
  void run_plain(const entry_ptr& entry, const runtime::handler& fn);
  void run_caller_owned(const entry_ptr& entry, const runtime::caller_owned_handler& fn);
  /// Runs the middleware around `call` (the handler); the error to retry with when a middleware
  /// threw or skipped next(), else nullopt.
  std::optional<std::string> with_middleware(job_context& ctx, const std::function<attempt_report()>& call);

  control& core;
  in_flight_table& table;
  settlement& settle;
  const runtime_config& cfg;
};

}  // namespace tenure::detail
