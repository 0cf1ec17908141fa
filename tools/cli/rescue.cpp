// tenure rescue [--stale-after SECONDS]: close attempts whose worker stopped heartbeating.
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/number_text.hpp"

namespace tenure::cli {
namespace {

int run_rescue(const context& ctx, double stale_after_seconds) {
  auto store = open_store(ctx);
  const auto stale_after = std::chrono::microseconds{std::llround(stale_after_seconds * 1e6)};
  auto rescued = store->rescue_stale(stale_after);
  if (!rescued) throw adapter_error("cannot rescue stale attempts", rescued.error());
  const auto& list = rescued.value();
  std::cout << "rescued " << list.size() << (list.size() == 1 ? " stale attempt" : " stale attempts")
            << (list.empty() ? "" : ":") << '\n';
  for (const auto& r : list) {
    std::cout << "  job " << r.attempt.job_id << " (queue " << r.queue << ", run lease "
              << r.attempt.run_lease << ") -> " << to_string(r.new_state) << '\n';
  }
  return k_exit_ok;
}

}  // namespace

void register_rescue(CLI::App& app, context& ctx) {
  auto stale_after = std::make_shared<double>(30.0);
  auto* cmd = app.add_subcommand(
      "rescue", "Close attempts with no heartbeat for --stale-after seconds (or past their hard deadline)");
  cmd->add_option("--stale-after", *stale_after, "Seconds without a heartbeat before an attempt is stale")
      ->type_name("SECONDS")
      // a century keeps microseconds in range
      ->check([](const std::string& text) { return check_seconds(text, 100.0 * 365 * 24 * 3600); }, "SECONDS")
      ->capture_default_str();
  cmd->callback(
      [&ctx, stale_after] { ctx.run = [&ctx, stale_after] { return run_rescue(ctx, *stale_after); }; });
}

}  // namespace tenure::cli
