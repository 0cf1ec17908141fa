// tenure doctor [--json] [--stale-after SECONDS] [--max-queue-age D] [--retention-grace D]:
// checks an installation and says what to do about each finding. Exit 0 when every check is ok,
// 1 when a finding needs attention (warning or error), 2 for usage errors.
#include <charconv>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/doctor_checks.hpp"
#include "cli/number_text.hpp"
#include "cli/time_text.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::cli {
namespace doctor {

const char* to_string(severity s) noexcept {
  switch (s) {
    case severity::ok: return "ok";
    case severity::warning: return "warning";
    case severity::error: return "error";
  }
  return "error";
}

findings capped(const std::string& check, findings problems, const std::string& all_clear) {
  if (problems.empty()) return {finding{check, severity::ok, all_clear}};
  if (problems.size() <= k_max_findings_per_check) return problems;
  severity worst = severity::ok;
  for (auto i = k_max_findings_per_check; i < problems.size(); ++i) worst = std::max(worst, problems[i].level);
  const auto more = problems.size() - k_max_findings_per_check;
  problems.resize(k_max_findings_per_check);
  problems.push_back({check, worst, "and " + std::to_string(more) + " more finding(s) of this check",
                      "fix the ones above, then run tenure doctor again", {{"more", more}}});
  return problems;
}

std::string age_text(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  const auto s = static_cast<long long>(std::floor(seconds));
  if (s < 60) return std::to_string(s) + "s";
  const auto part = [](long long big, const char* big_unit, long long small, const char* small_unit) {
    return std::to_string(big) + big_unit + (small ? " " + std::to_string(small) + small_unit : "");
  };
  if (s < 3600) return part(s / 60, "m", s % 60, "s");
  if (s < 86400) return part(s / 3600, "h", s % 3600 / 60, "m");
  return part(s / 86400, "d", s % 86400 / 3600, "h");
}

std::string interval_literal(std::chrono::microseconds d) { return std::to_string(d.count()) + " microseconds"; }

double seconds_of(const std::optional<std::string>& text) {
  if (!text) return 0;
  double v = 0;
  std::from_chars(text->data(), text->data() + text->size(), v);
  return v;
}

long long integer_of(const std::optional<std::string>& text) {
  if (!text) return 0;
  long long v = 0;
  std::from_chars(text->data(), text->data() + text->size(), v);
  return v;
}

std::string text_of(const std::optional<std::string>& text) { return text.value_or(""); }

}  // namespace doctor

namespace {

using namespace doctor;

struct doctor_options {
  bool json = false;
  double stale_after_seconds = 30.0;
  std::string max_queue_age = "5m";
  std::string retention_grace = "1h";
};

/// Runs one check; a check that cannot run (no rights to read what it needs, a query the server
/// refuses) becomes an error finding of that check, and the others still run.
void run_check(findings& out, const char* check, const std::function<findings()>& body) {
  try {
    auto found = body();
    out.insert(out.end(), std::make_move_iterator(found.begin()), std::make_move_iterator(found.end()));
  } catch (const command_error& e) {
    const std::string why = e.what();
    out.push_back({check, severity::error, "could not check: " + why,
                   why.find("permission denied") != std::string::npos
                       ? "run tenure doctor as the role that owns the schema (the one that runs tenure migrate)"
                       : "fix what stopped the check (run with -vv for the database's messages), then run tenure "
                         "doctor again"});
  }
}

findings run_checks(const settings& s) {
  findings out;
  int installed = 0;
  // Unreachable database: the one-line failure of every command (exit 1), not a report.
  for (auto& f : check_schema_version(s, installed)) out.push_back(std::move(f));
  if (installed != 0) {
    pg_session db(s.dsn);
    run_check(out, "schema_control", [&] { return check_schema_control(s); });
    run_check(out, "privileges", [&] { return check_privileges(db, s); });
    run_check(out, "security_definer", [&] { return check_security_definer(db, s); });
    // The job checks read tables and columns of the version this binary carries.
    const bool current = installed == postgres::known_schema_version();
    for (const char* check : {"stale_attempts", "queue_age", "retention"}) {
      if (current) continue;
      out.push_back({check, severity::warning,
                     "not checked: the schema is at version " + std::to_string(installed) + ", not " +
                         std::to_string(postgres::known_schema_version()),
                     "bring the schema and the binary to the same version, then run tenure doctor again"});
    }
    if (current) {
      run_check(out, "stale_attempts", [&] { return check_stale_attempts(db, s); });
      run_check(out, "queue_age", [&] { return check_queue_age(db, s); });
      run_check(out, "retention", [&] { return check_retention(db, s); });
    }
    run_check(out, "vacuum", [&] { return check_vacuum(db, s); });
  }
  run_check(out, "pooler", [&] { return check_pooler(s); });
  return out;
}

void print_json(const settings& s, const findings& all, severity worst) {
  nlohmann::ordered_json out;
  out["schema"] = s.schema;
  out["healthy"] = worst == severity::ok;
  out["severity"] = to_string(worst);
  auto list = nlohmann::ordered_json::array();
  for (const auto& f : all) {
    nlohmann::ordered_json item;
    item["check"] = f.check;
    item["severity"] = to_string(f.level);
    item["found"] = f.found;
    item["fix"] = f.fix.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(f.fix);
    item["details"] = f.details;
    list.push_back(std::move(item));
  }
  out["findings"] = std::move(list);
  std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
}

/// One line per finding, its fix indented below; database values escaped by printable().
void print_text(const settings& s, const findings& all) {
  std::cout << "tenure doctor: schema " << printable(s.schema) << '\n';
  std::size_t problems = 0;
  for (const auto& f : all) {
    const std::string tag = std::string{"["} + to_string(f.level) + "]";
    std::cout << tag << std::string(10 - tag.size(), ' ') << f.check << ": " << printable(f.found) << '\n';
    if (!f.fix.empty()) std::cout << std::string(10, ' ') << "fix: " << printable(f.fix) << '\n';
    if (f.level != severity::ok) ++problems;
  }
  std::cout << (problems == 0 ? std::string{"healthy: every check is ok"}
                              : std::to_string(problems) + " finding(s) need attention")
            << '\n';
}

int run_doctor(const context& ctx, const doctor_options& o) {
  settings s;
  s.dsn = ctx.dsn();
  s.schema = ctx.schema;
  s.stale_after = std::chrono::microseconds{std::llround(o.stale_after_seconds * 1e6)};
  s.max_queue_age = *parse_duration(o.max_queue_age);
  s.retention_grace = *parse_duration(o.retention_grace);
  const auto all = run_checks(s);
  severity worst = severity::ok;
  for (const auto& f : all) worst = std::max(worst, f.level);
  if (o.json) {
    print_json(s, all, worst);
  } else {
    print_text(s, all);
  }
  return worst == severity::ok ? k_exit_ok : k_exit_runtime;
}

}  // namespace

void register_doctor(CLI::App& app, context& ctx) {
  auto o = std::make_shared<doctor_options>();
  auto* cmd = app.add_subcommand(
      "doctor",
      "Check the installation (schema version, privileges, SECURITY DEFINER functions, stale attempts, queue "
      "backlog, retention, vacuum, pooler) and say what to do: exit 0 healthy, 1 when something needs attention");
  cmd->add_flag("--json", o->json, "Print a JSON document instead of text");
  cmd->add_option("--stale-after", o->stale_after_seconds,
                  "Seconds without a heartbeat after which an open attempt counts as stale (the rescue threshold)")
      ->type_name("SECONDS")
      ->check([](const std::string& text) { return check_seconds(text, 100.0 * 365 * 24 * 3600); }, "SECONDS")
      ->capture_default_str();
  cmd->add_option("--max-queue-age", o->max_queue_age,
                  "Warn when a queue's oldest available job has waited longer than D (e.g. 30s, 5m, 2h)")
      ->type_name("D")
      ->check(check_duration, "D")
      ->capture_default_str();
  cmd->add_option("--retention-grace", o->retention_grace,
                  "Warn about finished jobs kept longer than their retention plus D (pruning runs now and then)")
      ->type_name("D")
      ->check(check_duration, "D")
      ->capture_default_str();
  cmd->callback([&ctx, o] { ctx.run = [&ctx, o] { return run_doctor(ctx, *o); }; });
}

}  // namespace tenure::cli
