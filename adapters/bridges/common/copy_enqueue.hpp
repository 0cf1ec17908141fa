#pragma once
/// \file
/// Private to the bridges: bulk enqueue over COPY on the caller's connection (schema migration
/// 22). Three steps inside the caller's transaction: `<schema>.enqueue_copy_stage()` names the
/// session's stage (a temporary table tenure owns, with enqueue_batch's checks as constraints),
/// the jobs go into it with one COPY, and `<schema>.enqueue_copied()` moves them into the job
/// tables and answers their ids in input order. A bridge supplies what enqueue_sql.hpp asks of it
/// (running one statement) and one more function that runs a COPY with the rows
/// postgres::enqueue_copy_rows() writes.
#include <cstddef>
#include <span>
#include <string>

#include "common/enqueue_sql.hpp"

namespace tenure::bridges {

/// Whether a batch goes through COPY: keyless jobs (keys need enqueue_batch's per-key locking), at
/// least options.copy_threshold of them (0: never), inside the caller's transaction (outside one,
/// the COPY's own commit would empty the stage before the move).
inline bool use_copy(std::span<const new_job> jobs, const sql_options& options, tx_state state) {
  if (options.copy_threshold == 0 || jobs.size() < options.copy_threshold || state != tx_state::in_transaction) {
    return false;
  }
  for (const auto& j : jobs) {
    if (j.unique_key) return false;
  }
  return true;
}

/// The statements around the COPY.
struct copy_enqueue {
  enqueue_statement stage;  ///< answers the stage's name
  std::string rows;         ///< the jobs in COPY text format (postgres::enqueue_copy_rows)
  enqueue_statement move;   ///< answers the ids in input order
};

/// The steps for `jobs`; errc::invalid_argument (validate()'s detail, or the schema name) before
/// anything is sent, as enqueue_batch_statement_for.
inline result<copy_enqueue> copy_enqueue_for(std::span<const new_job> jobs, const sql_options& options) {
  TENURE_TRYV(detail::check_schema(options));
  TENURE_TRY(auto rows, postgres::enqueue_copy_rows(jobs));
  return copy_enqueue{
      .stage = {.name = "enqueue_copy_stage", .sql = "SELECT " + options.schema + ".enqueue_copy_stage()", .jobs = 0},
      .rows = std::move(rows),
      .move = {.name = "enqueue_copied", .sql = "SELECT " + options.schema + ".enqueue_copied()", .jobs = jobs.size()}};
}

/// try_enqueue_batch for a bridge that can COPY: through COPY when use_copy() says so, else one
/// enqueue_batch statement. `run(const enqueue_statement&) -> answer` as in enqueue_sql.hpp;
/// `copy(const std::string& stage, const std::string& sql, const std::string& rows,
/// const enqueue_statement& step) -> result<void>` runs the COPY into `stage` (`sql` with `rows`, or
/// the driver's own COPY of the jobs), its failures made by failure() for `step`.
template <class Run, class Copy>
result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs, const sql_options& options,
                                                      tx_state state, Run&& run, Copy&& copy) {
  if (!use_copy(jobs, options, state)) return try_enqueue_batch(jobs, options, std::forward<Run>(run));
  TENURE_TRY(auto steps, copy_enqueue_for(jobs, options));
  TENURE_TRY(auto stage, run(steps.stage));
  // No stage (the schema's owner may not create temporary tables here): arrays after all.
  if (!stage) return try_enqueue_batch(jobs, options, std::forward<Run>(run));
  TENURE_TRY(auto sql, postgres::enqueue_copy_statement(*stage));
  const enqueue_statement copy_step{.name = "enqueue COPY", .sql = sql, .jobs = jobs.size()};
  TENURE_TRYV(copy(*stage, copy_step.sql, steps.rows, copy_step));
  TENURE_TRY(auto ids, run(steps.move));
  return results_from(steps.move, ids);
}

/// enqueue_batch for a bridge that can COPY.
template <class Run, class Copy>
result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs, const sql_options& options,
                                                tx_state state, Run&& run, Copy&& copy) {
  TENURE_TRY(auto out, try_enqueue_batch(jobs, options, state, std::forward<Run>(run), std::forward<Copy>(copy)));
  std::vector<std::int64_t> ids;
  ids.reserve(out.size());
  for (const auto& r : out) ids.push_back(r.id);
  return ids;
}

}  // namespace tenure::bridges
