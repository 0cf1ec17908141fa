#pragma once
/// \file
/// What the PostgreSQL store and the driver bridges share, and what any other code that talks to
/// tenure's SQL contract through its own driver may use: the mapping of a SQLSTATE to a
/// tenure::errc, and the text forms of the values tenure's functions take. Pure functions, no
/// connection, thread-safe.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tenure/job.hpp"
#include "tenure/result.hpp"

namespace tenure::postgres {

/// Maps a SQLSTATE to a tenure error code: TN001 stale_attempt, TN002 malformed_token, TN003
/// job_not_found, class 40 and 55P03/57014 transient_conflict, class 08/53 and shutdowns
/// database_unavailable, class 22 invalid_argument, 42501 permission_denied, ...
errc errc_from_sqlstate(std::string_view sqlstate) noexcept;

/// A driver's or server's message on one log line: libpq's span several, indented with tabs.
std::string one_line(std::string_view text);

/// '{1,2,3}' for bigint[] / int[].
std::string int_array(const std::vector<std::int64_t>& v);
/// The numbers of a bigint[]'s text ('{41,-7}', or a bare '42'), in order; anything between them
/// separates them.
std::vector<std::int64_t> int_array_values(std::string_view text);
/// '{"a","b\"c",NULL}' for text[] / jsonb[]: every element quoted and escaped.
std::string text_array(const std::vector<std::optional<std::string>>& v);
/// JSON text of a job's args or metadata for jsonb ('{}' for null); nullopt when it cannot be
/// serialized (a string that is not UTF-8).
std::optional<std::string> json_text(const nlohmann::json& v);
/// '1500000 microseconds' for interval.
std::string interval_text(std::chrono::microseconds d);
/// UTC timestamptz text with microseconds.
std::string timestamp_text(std::chrono::system_clock::time_point t);

/// The bulk enqueue over COPY (schema migration 22): `jobs` as the rows of COPY's text format for
/// the stage `<schema>.enqueue_copy_stage()` names, `ord` 1..n in input order, in the columns
/// enqueue_copy_statement() lists. errc::invalid_argument with validate()'s detail for a job it
/// refuses, or for a job with a unique_key (keys go through enqueue_batch).
result<std::string> enqueue_copy_rows(std::span<const new_job> jobs);
/// `COPY <stage> (ord, kind, args, queue, priority, run_at, max_attempts, metadata) FROM STDIN`
/// for the stage name enqueue_copy_stage() answered; errc::protocol_error for any other text
/// (only `pg_temp.tenure_enqueue_<digits>` is ever pasted into SQL).
result<std::string> enqueue_copy_statement(std::optional<std::string_view> stage);

/// The bulk enqueue straight into the job table (`specs` since schema 24; `ready` in schema 23):
/// `jobs` as the rows of COPY's text format in the six job columns, in input order (the ids are
/// drawn row by row as COPY reads them). errc::invalid_argument with validate()'s detail, or for a
/// job with a unique_key or a run_at (those go through the stage or enqueue_batch).
result<std::string> enqueue_copy_ready_rows(std::span<const new_job> jobs);

/// Where a COPY of jobs goes, as `<schema>.enqueue_copy_target(scheduled)` answered.
struct copy_into {
  std::string table;   ///< `<schema>.specs`, or the session's stage `pg_temp.tenure_enqueue_<oid>`
  std::string sql;     ///< `COPY <table> (<its columns>) FROM STDIN`
  /// Straight into the job table, made claimable by `enqueue_copied_ready(n)` (run rows of up to
  /// 200 ids since schema 30), else the stage (`enqueue_copied()`).
  bool ready = false;
};
/// The COPY for `answer`: `<schema>.specs` (its six job columns), never for a batch with a
/// `scheduled` job, or a stage (enqueue_copy_statement()); errc::protocol_error for any other text
/// (only those names are ever pasted into SQL), errc::invalid_argument for a bad schema name.
result<copy_into> enqueue_copy_into(std::string_view answer, std::string_view schema, bool scheduled);
/// The checks of enqueue_copy_rows() (`stage`) or enqueue_copy_ready_rows() (not `stage`) alone:
/// the batch's text can then be written and sent piece by piece with write_copy_rows().
result<void> check_copy_rows(std::span<const new_job> jobs, bool stage);
/// Writes the COPY text of `jobs` (for the stage or for `specs`, as above; the jobs passed
/// check_copy_rows()) in pieces of whole rows of about 64 KiB, each handed to `put` in chunks of
/// at most 1 MiB (`put` answers whether it sent it), so the batch's text is never held whole.
/// Answers false when `put` failed, errc::invalid_argument should a job's JSON still have no text
/// form (the pieces before it were sent).
result<bool> write_copy_rows(std::span<const new_job> jobs, bool stage, const std::function<bool(std::string_view)>& put);
/// Whether any of `jobs` is scheduled (has a run_at): such a batch goes through the stage.
bool any_scheduled(std::span<const new_job> jobs) noexcept;

}  // namespace tenure::postgres
