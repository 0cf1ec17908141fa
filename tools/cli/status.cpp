// tenure status [--json]: how many jobs each queue holds, per state.
#include <algorithm>
#include <array>
#include <charconv>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/pg_session.hpp"

namespace tenure::cli {
namespace {

/// Every state, in lifecycle order (the column order of the table and of the JSON objects).
constexpr std::array k_states{job_state::scheduled,        job_state::available, job_state::running,
                              job_state::waiting_external, job_state::retryable, job_state::completed,
                              job_state::failed,           job_state::cancelled};

using counts = std::array<std::int64_t, k_states.size()>;

std::size_t index_of(job_state s) {
  return static_cast<std::size_t>(std::find(k_states.begin(), k_states.end(), s) - k_states.begin());
}

std::int64_t total_of(const counts& c) {
  std::int64_t sum = 0;
  for (auto n : c) sum += n;
  return sum;
}

/// Counts per queue, read in one statement (one snapshot) from the jobs view.
std::map<std::string, counts> read_counts(const context& ctx) {
  require_current_schema(ctx);
  pg_session db(ctx.dsn());
  // Counting scans the terminal history too; fine for an operator command, not for a hot loop.
  const auto rows = db.query(
      "SELECT queue, state, count(*) FROM " + db.quote_ident(ctx.schema) + ".jobs GROUP BY queue, state", {},
      "cannot read job counts");
  std::map<std::string, counts> by_queue;
  for (const auto& row : rows) {
    if (!row[0] || !row[1] || !row[2]) continue;
    auto state = parse_job_state(*row[1]);
    if (!state) throw command_error("the jobs view reports an unknown state '" + *row[1] + "'");
    std::int64_t n = 0;
    std::from_chars(row[2]->data(), row[2]->data() + row[2]->size(), n);
    by_queue.try_emplace(*row[0]).first->second[index_of(state.value())] += n;
  }
  return by_queue;
}

nlohmann::ordered_json to_json(const counts& c) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < k_states.size(); ++i) out[std::string{to_string(k_states[i])}] = c[i];
  out["total"] = total_of(c);
  return out;
}

void print_json(const context& ctx, const std::map<std::string, counts>& by_queue, const counts& all) {
  nlohmann::ordered_json out;
  out["schema"] = ctx.schema;
  out["queues"] = nlohmann::ordered_json::object();
  for (const auto& [queue, c] : by_queue) out["queues"][queue] = to_json(c);
  out["total"] = to_json(all);
  std::cout << out.dump(2) << '\n';
}

/// A table with a column for each state that holds at least one job, and a total.
void print_table(const std::map<std::string, counts>& by_queue, const counts& all) {
  std::vector<std::size_t> columns;
  for (std::size_t i = 0; i < k_states.size(); ++i) {
    if (all[i] != 0) columns.push_back(i);
  }
  std::size_t queue_width = 5;  // "QUEUE"
  for (const auto& [queue, c] : by_queue) queue_width = std::max(queue_width, queue.size());
  std::vector<std::size_t> widths;
  for (auto i : columns) {
    widths.push_back(std::max<std::size_t>(to_string(k_states[i]).size(), std::to_string(all[i]).size()));
  }
  const std::size_t total_width = std::max<std::size_t>(5, std::to_string(total_of(all)).size());

  auto line = [&](const std::string& queue, const std::vector<std::string>& cells, const std::string& total) {
    std::cout << std::left << std::setw(static_cast<int>(queue_width)) << queue << std::right;
    for (std::size_t k = 0; k < cells.size(); ++k) {
      std::cout << "  " << std::setw(static_cast<int>(widths[k])) << cells[k];
    }
    std::cout << "  " << std::setw(static_cast<int>(total_width)) << total << '\n';
  };
  auto cells_of = [&](const counts& c) {
    std::vector<std::string> cells;
    for (auto i : columns) cells.push_back(std::to_string(c[i]));
    return cells;
  };

  std::vector<std::string> header;
  for (auto i : columns) header.emplace_back(to_string(k_states[i]));
  line("QUEUE", header, "total");
  for (const auto& [queue, c] : by_queue) line(queue, cells_of(c), std::to_string(total_of(c)));
  if (by_queue.size() > 1) line("(all)", cells_of(all), std::to_string(total_of(all)));
}

int run_status(const context& ctx, bool json) {
  const auto by_queue = read_counts(ctx);
  counts all{};
  for (const auto& [queue, c] : by_queue) {
    for (std::size_t i = 0; i < all.size(); ++i) all[i] += c[i];
  }
  if (json) {
    print_json(ctx, by_queue, all);
  } else if (by_queue.empty()) {
    std::cout << "no jobs in schema " << ctx.schema << '\n';
  } else {
    print_table(by_queue, all);
  }
  return k_exit_ok;
}

}  // namespace

void register_status(CLI::App& app, context& ctx) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("status", "Count jobs per queue and state");
  cmd->add_flag("--json", *json, "Print a JSON object instead of a table");
  cmd->callback([&ctx, json] { ctx.run = [&ctx, json] { return run_status(ctx, *json); }; });
}

}  // namespace tenure::cli
