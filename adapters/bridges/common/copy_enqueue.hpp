#pragma once
/// \file
/// Private to the bridges: bulk enqueue over COPY on the caller's connection (schema migrations
/// 22 and 23). Three steps inside the caller's transaction: `<schema>.enqueue_copy_target()`
/// names where the rows go, the jobs go there with one COPY, and a last call answers their ids in
/// input order. A batch of jobs to run now goes straight into `specs` (INSERT granted on six of its
/// columns, enqueue_batch's checks as its constraints; `<schema>.enqueue_copied_ready(n)` reads the
/// ids back and makes the jobs claimable, as run rows of up to 200 ids); a batch with a scheduled
/// job goes into the session's stage (a temporary table tenure owns) and
/// `<schema>.enqueue_copied()` moves it into the job tables. A bridge supplies what
/// enqueue_sql.hpp asks of it (running one statement) and one more function that runs a COPY of the
/// jobs (postgres::write_copy_rows() writes their text piece by piece).
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

/// The first step: `SELECT <schema>.enqueue_copy_target(<scheduled>)`, whose answer names where the
/// rows go (NULL: nowhere, send enqueue_batch).
inline enqueue_statement copy_target_statement(const sql_options& options, bool scheduled) {
  return {.name = "enqueue_copy_target",
          .sql = "SELECT " + options.schema + ".enqueue_copy_target(" + (scheduled ? "true" : "false") + ")",
          .jobs = 0};
}

/// The last step: the ids in input order, from the read-back of `specs` (`enqueue_copied_ready(n)`)
/// or from the stage's move (`enqueue_copied()`).
inline enqueue_statement copied_statement(const sql_options& options, const postgres::copy_into& into,
                                          std::size_t jobs) {
  if (into.ready) {
    return {.name = "enqueue_copied_ready",
            .sql = "SELECT " + options.schema + ".enqueue_copied_ready(" + std::to_string(jobs) + ")",
            .jobs = jobs};
  }
  return {.name = "enqueue_copied", .sql = "SELECT " + options.schema + ".enqueue_copied()", .jobs = jobs};
}

/// try_enqueue_batch for a bridge that can COPY: through COPY when use_copy() says so, else one
/// enqueue_batch statement. A batch with no scheduled job goes straight into `specs` when the
/// server offers it, any other into the stage. `run(const enqueue_statement&) -> answer` as in
/// enqueue_sql.hpp; `copy(const postgres::copy_into& into, std::span<const new_job> jobs, const
/// enqueue_statement& step) -> result<void>` runs into.sql with the jobs' rows (write_copy_rows(), or the
/// driver's own COPY into into.table), its failures made by failure() for `step`. Every job is
/// checked before anything is sent.
template <class Run, class Copy>
result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs, const sql_options& options,
                                                      tx_state state, Run&& run, Copy&& copy) {
  if (!use_copy(jobs, options, state)) return try_enqueue_batch(jobs, options, std::forward<Run>(run));
  TENURE_TRYV(detail::check_schema(options));
  const bool scheduled = postgres::any_scheduled(jobs);
  // The checks of the stricter of the two targets this batch can get (a batch without a scheduled
  // job passes the stage's too).
  TENURE_TRYV(postgres::check_copy_rows(jobs, scheduled));
  TENURE_TRY(auto target, run(copy_target_statement(options, scheduled)));
  // Nowhere to COPY (no stage: the schema's owner may not create temporary tables here): arrays.
  if (!target) return try_enqueue_batch(jobs, options, std::forward<Run>(run));
  TENURE_TRY(auto into, postgres::enqueue_copy_into(*target, options.schema, scheduled));
  const enqueue_statement copy_step{.name = "enqueue COPY", .sql = into.sql, .jobs = jobs.size()};
  TENURE_TRYV(copy(into, jobs, copy_step));
  const auto copied = copied_statement(options, into, jobs.size());
  TENURE_TRY(auto ids, run(copied));
  return results_from(copied, ids);
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
