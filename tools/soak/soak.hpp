#pragma once
/// \file
/// `tenure soak`: a mixed workload against a real server under faults (worker processes
/// SIGKILLed and restarted, backends terminated, the server restarted), then a drain and the
/// end-of-run checks, printed as one JSON line. Everything the workload did is recorded in side
/// tables of the same database (schema `<schema>_rec`), which the checks read.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tenure::cli {
class pg_session;
}

namespace tenure::soak {

struct options {
  std::string dsn;
  double minutes = 1;          ///< how long the workload and the faults run (the drain comes after)
  int workers = 3;             ///< worker processes
  std::string restart_command; ///< restarts the server (e.g. `scripts/pg restart`); empty: that fault is skipped
  std::uint64_t seed = 1;
  double rate = 40;            ///< jobs per second the producers aim at together
  bool keep_schema = false;    ///< keep the schemas even when every check passed
  std::string self_exe;        ///< this binary, spawned as `tenure soak --worker NAME ...`
};

/// The tenure schema of one run and the schema of its side tables.
struct names {
  std::string tenure;  ///< tenure's own tables and functions
  std::string rec;     ///< the soak's records: orders, rolled_back, executions, business, callbacks, finals
};
names names_for(const std::string& tenure_schema);

/// Creates the side schema and its tables, and the trigger on `<tenure>.done` that records every
/// terminal transition in `<rec>.finals` (job_id, run_lease, state).
void create_records(cli::pg_session& db, const names& n);

struct check_limits {
  /// The longest an attempt of the workload may stay open (its handler's longest wait, the hard
  /// deadline, a callback's timeout), plus the rescue bound: older open attempts are stuck.
  std::chrono::seconds attempt_limit{60};
  /// How long an available job may wait for a claim before it counts as lost.
  std::chrono::seconds slack{30};
};

/// The end-of-run checks, in one place: every figure the soak judges, read from the records and
/// tenure's tables. Keys are those of the JSON line; those in must_be_zero() fail the run.
nlohmann::json check(cli::pg_session& db, const names& n, const check_limits& limits);

/// The keys of check()'s answer that must be 0.
const std::vector<std::string>& must_be_zero();

/// True when every must_be_zero() figure of `figures` is 0.
bool passed(const nlohmann::json& figures);

/// Runs the soak; returns the JSON line's object ("ok" says whether every check passed).
nlohmann::json run(const options& opts);

/// `v` to one decimal, for the JSON line's seconds and megabytes.
inline double rounded(double v) { return std::round(v * 10) / 10; }

/// The hidden worker mode: one worker process (handlers for every kind of the workload) until
/// SIGTERM. Prints "ready" on stdout once started. Returns the exit status.
int worker_main(const std::string& dsn, const std::string& tenure_schema, const std::string& name);

}  // namespace tenure::soak
