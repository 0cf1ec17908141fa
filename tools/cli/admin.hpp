#pragma once
/// \file
/// The operators' reads and writes that `tenure job`, `tenure queue` and `tenure serve` share:
/// job lists with filters and keyset pages, queues with counts per state, the finished jobs per
/// minute of the last hour, pause and resume, and a job as JSON. Queries throw command_error
/// (through pg_session) when the database refuses; the caller words or maps it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/pg_session.hpp"
#include "tenure/job.hpp"

namespace tenure::cli::admin {

using ordered_json = nlohmann::ordered_json;

/// The settings keys and job states in the order they are shown.
inline constexpr const char* k_setting_keys[] = {"dead_letter",      "hard_deadline",    "backoff_base", "backoff_cap",
                                                 "retain_completed", "retain_cancelled", "retain_failed",
                                                 "max_running",      "rate_per_second",  "rate_burst",   "priority_aging"};
inline constexpr const char* k_state_keys[] = {"scheduled", "available", "running",  "waiting_external",
                                               "retryable", "completed", "failed",   "cancelled"};

/// Which jobs: empty fields match every job.
struct job_filter {
  std::string state, queue, kind;
  bool any() const { return !state.empty() || !queue.empty() || !kind.empty(); }
};

/// " AND ..." for the filter, with its parameters appended to `params` ($n numbered from there).
std::string where_of(const job_filter& f, std::vector<std::string>& params);

/// One line of a job list.
struct job_row {
  std::int64_t id = 0;
  std::string state, queue, kind;
  int attempt = 0, max_attempts = 0;
  std::string created_at;  ///< ISO 8601, UTC, whole seconds
  std::optional<std::string> finalized_at, last_error;
  bool dead_lettered = false;
};

/// A page of jobs, newest first; `next_after_id` is set when the page is full (more may follow).
struct job_page {
  std::vector<job_row> jobs;
  std::optional<std::int64_t> next_after_id;
};

/// Jobs matching `f` with id < after_id (0: from the newest), at most `limit`.
job_page list_jobs(pg_session& db, const std::string& schema, const job_filter& f, int limit, std::int64_t after_id);

/// The JSON of `tenure job list --json` and GET /api/jobs: {"jobs": [...], "next_after_id": N|null}.
ordered_json to_json(const job_page& page);

/// One queue as list_queues() (granted by grant-admin) reports it.
struct queue_row {
  std::string name;
  bool paused = false;
  ordered_json settings;  ///< keys in k_setting_keys order
  ordered_json counts;    ///< jobs per state, in k_state_keys order
  std::optional<double> oldest_available_seconds;
};

/// Every queue (with jobs or settings), or only `only`.
std::vector<queue_row> read_queues(pg_session& db, const std::string& schema,
                                   const std::optional<std::string>& only = std::nullopt);

ordered_json to_json(const queue_row& q);

/// A queue's settings from their jsonb text, keys in k_setting_keys order.
ordered_json ordered_settings(const std::optional<std::string>& text);

/// Jobs that finished in one minute (UTC).
struct minute_count {
  std::string minute;  ///< YYYY-MM-DDTHH:MMZ, the minute's start
  std::int64_t completed = 0, failed = 0;
};

/// The last hour, one entry per minute (60, oldest first, the current minute last): jobs that
/// completed and jobs that failed (dead-lettered included), by finalized_at. Optionally one queue.
std::vector<minute_count> finished_per_minute(pg_session& db, const std::string& schema,
                                              const std::optional<std::string>& queue = std::nullopt);

ordered_json to_json(const std::vector<minute_count>& minutes);

/// pause_queue / resume_queue (granted by grant-admin): true when the flag changed. A name the
/// database refuses raises SQLSTATE class 22 (db.last_sqlstate()).
bool set_paused(pg_session& db, const std::string& schema, const std::string& queue, bool paused);

/// What only a running attempt has: its worker, when it was claimed and its last heartbeat.
struct attempt_info {
  std::optional<std::string> worker, claimed_at, heartbeat_at;
};
attempt_info read_attempt(pg_session& db, const std::string& schema, std::int64_t job_id);

/// A job's fields as JSON, with "args" and "metadata" null: job_json_text() puts the stored texts
/// in their places.
ordered_json job_fields(const job_info& j);

/// `fields` as JSON text (indented by `indent`, -1 for one line) with the values of "args" and
/// "metadata" being `args_text` and `metadata_text` verbatim: jsonb's own text, valid JSON, never
/// parsed (a number no double holds, an integer past 64 bits, would change on the way).
std::string job_json_text(const ordered_json& fields, const std::string& args_text, const std::string& metadata_text,
                          int indent);

/// Stored JSON text as a JSON value; the raw text as a string if it is not JSON.
ordered_json json_value(const std::string& text);

}  // namespace tenure::cli::admin
