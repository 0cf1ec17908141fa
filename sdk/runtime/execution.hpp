#pragma once
/// \file
/// Running handlers: a claimed attempt joins the in-flight table and its handler runs on the
/// handler pool (plain handlers, and caller-owned handlers behind their gate); each exit is
/// handed to settlement on the control thread. Stands on control, in_flight and settlement.
/// Private to the runtime; start() is control-thread only, handlers are registered before start.
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

  /// Holds the claimed attempt and runs its handler.
  void start(claimed_attempt c);

 private:
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
