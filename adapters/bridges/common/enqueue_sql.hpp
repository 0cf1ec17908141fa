#pragma once
/// \file
/// Private to the bridges: transactional enqueue on the caller's connection, whatever its driver.
/// Everything but running the statement is here: checking the job and the schema before anything
/// is sent, the statement (`<schema>.enqueue(...)`, or one `<schema>.enqueue_batch(...)` over
/// arrays for a whole batch or a keyed job), its text parameters, reading the ids (and whether
/// each job was inserted) back, and what a failure
/// means. A bridge supplies one function that runs an enqueue_statement through its driver and
/// returns the answer's one text cell, or the error failure() made of what went wrong.
#include <cctype>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tenure/job.hpp"
#include "tenure/log.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/sql_text.hpp"
#include "tenure/result.hpp"
#include "tenure/sql_options.hpp"

namespace tenure::bridges {

/// The caller's connection just before the statement is sent.
enum class tx_state {
  in_transaction,  ///< inside BEGIN: the job commits or rolls back with the caller's writes
  idle,            ///< no transaction block (autocommit): the statement commits on its own
  aborted,         ///< a statement failed in the open transaction: only ROLLBACK is accepted
  busy,            ///< another command is still running on the connection
  unknown,         ///< the connection is bad
};

/// One statement for one job or a whole batch: one row with one text column comes back.
struct enqueue_statement {
  const char* name = "enqueue";  ///< "enqueue" or "enqueue_batch", for logs
  std::string sql;               ///< $1..$7 placeholders
  std::vector<std::optional<std::string>> params;  ///< text values; nullopt is NULL
  std::size_t jobs = 0;          ///< how many ids the answer holds
  /// The answer marks a job that was not inserted (its unique key's holder) by a negative id:
  /// job ids are positive.
  bool signed_ids = false;
};

/// What a bridge's driver answered: the one text cell (nullopt for SQL NULL) or a failure.
using answer = result<std::optional<std::string>>;

namespace detail {

inline result<void> check_schema(const sql_options& options) {
  if (postgres::valid_schema_name(options.schema)) return success();
  return error{errc::invalid_argument, "invalid schema name '" + options.schema +
                                           "' (use [a-z_][a-z0-9_]*, at most 54 characters)"};
}

/// A driver's error text on one line without its severity ("ERROR:  "): libpq's whole message
/// spans lines (CONTEXT, ...), of which the first is the server's primary message.
inline std::string primary_message(std::string_view text) {
  text = text.substr(0, text.find('\n'));
  if (const auto colon = text.find(":  "); colon != std::string_view::npos && colon > 0) {
    bool severity = true;
    for (char c : text.substr(0, colon)) severity = severity && std::isupper(static_cast<unsigned char>(c));
    if (severity) text.remove_prefix(colon + 3);
  }
  return postgres::one_line(text);
}

}  // namespace detail

inline result<enqueue_statement> enqueue_batch_statement_for(std::span<const new_job> jobs,
                                                             const sql_options& options);

/// `SELECT <schema>.enqueue($1..$7)` for one keyless job; a keyed one is a batch of one, whose
/// answer says whether it was inserted. errc::invalid_argument (validate()'s detail, or the
/// schema name) before anything is sent.
inline result<enqueue_statement> enqueue_statement_for(const new_job& job, const sql_options& options) {
  if (job.unique_key) return enqueue_batch_statement_for(std::span<const new_job>(&job, 1), options);
  TENURE_TRYV(validate(job));
  TENURE_TRYV(detail::check_schema(options));
  auto args = postgres::json_text(job.args);
  auto metadata = postgres::json_text(job.metadata);
  if (!args || !metadata) return error{errc::invalid_argument, "args or metadata cannot be written as JSON text"};
  return enqueue_statement{
      .name = "enqueue",
      .sql = "SELECT " + options.schema +
             ".enqueue($1, $2::jsonb, $3, $4::int, $5::timestamptz, $6::int, $7::jsonb)",
      .params = {job.kind, std::move(args), job.queue, std::to_string(job.priority),
                 job.run_at ? std::optional{postgres::timestamp_text(*job.run_at)} : std::nullopt,
                 std::to_string(job.max_attempts), std::move(metadata)},
      .jobs = 1};
}

/// One `<schema>.enqueue_batch(...)` over arrays for all `jobs`, never a statement per job; the
/// ids come back as one array in input order (with a job's unique key: negative for a holder's
/// id, not inserted). All or nothing: one invalid job refuses the batch (errc::invalid_argument
/// with its detail) before anything is sent.
inline result<enqueue_statement> enqueue_batch_statement_for(std::span<const new_job> jobs,
                                                             const sql_options& options) {
  TENURE_TRYV(detail::check_schema(options));
  std::vector<std::optional<std::string>> kinds, args, queues, run_ats, metadatas, keys;
  std::vector<std::int64_t> priorities, max_attempts;
  bool keyed = false;
  for (const auto& j : jobs) {
    TENURE_TRYV(validate(j));
    keys.push_back(j.unique_key);
    keyed = keyed || j.unique_key.has_value();
    kinds.emplace_back(j.kind);
    args.emplace_back(postgres::json_text(j.args));
    metadatas.emplace_back(postgres::json_text(j.metadata));
    if (!args.back() || !metadatas.back()) {
      return error{errc::invalid_argument, "args or metadata cannot be written as JSON text"};
    }
    queues.emplace_back(j.queue);
    run_ats.push_back(j.run_at ? std::optional{postgres::timestamp_text(*j.run_at)} : std::nullopt);
    priorities.push_back(j.priority);
    max_attempts.push_back(j.max_attempts);
  }
  using postgres::int_array;
  using postgres::text_array;
  if (keyed) {
    return enqueue_statement{
        .name = "enqueue_batch",
        .sql = "SELECT array_agg(CASE WHEN inserted THEN job_id ELSE -job_id END ORDER BY ord)::text FROM " +
               options.schema +
               ".enqueue_batch($1::text[], $2::jsonb[], $3::text[], $4::int[], $5::timestamptz[], $6::int[], "
               "$7::jsonb[], $8::text[])",
        .params = {text_array(kinds), text_array(args), text_array(queues), int_array(priorities),
                   text_array(run_ats), int_array(max_attempts), text_array(metadatas), text_array(keys)},
        .jobs = jobs.size(),
        .signed_ids = true};
  }
  return enqueue_statement{
      .name = "enqueue_batch",
      .sql = "SELECT array_agg(job_id ORDER BY ord)::text FROM " + options.schema +
             ".enqueue_batch($1::text[], $2::jsonb[], $3::text[], $4::int[], $5::timestamptz[], $6::int[], "
             "$7::jsonb[])",
      .params = {text_array(kinds), text_array(args), text_array(queues), int_array(priorities), text_array(run_ats),
                 int_array(max_attempts), text_array(metadatas)},
      .jobs = jobs.size()};
}

/// Refuses, before anything is sent, a connection that cannot take the statement: an aborted
/// transaction or a busy connection (errc::protocol_error: the caller's code must roll back or
/// wait), a bad connection (errc::database_unavailable). In a transaction the job joins it; on
/// an idle connection (autocommit) the statement is its own transaction.
inline result<void> check_state(const enqueue_statement& st, tx_state state) {
  switch (state) {
    case tx_state::in_transaction:
    case tx_state::idle: return success();
    case tx_state::aborted:
      return error{errc::protocol_error,
                   std::string{st.name} + " in an aborted transaction: roll it back first", "25P02"};
    case tx_state::busy:
      return error{errc::protocol_error, std::string{st.name} + " while a command is still running on the connection"};
    case tx_state::unknown: break;
  }
  return error{errc::database_unavailable, std::string{st.name} + ": the connection is not open"};
}

/// What a failed statement means, logged. `connection_lost`: the driver says the connection is
/// gone. `sqlstate` and `message` (the server's or the driver's text) as the driver gave them.
/// A connection lost inside the caller's transaction took the transaction with it:
/// errc::database_unavailable, nothing was written. Lost in autocommit (`before` idle), the
/// statement may have committed: errc::commit_in_doubt. A server error maps by its SQLSTATE
/// (22023, a job the server refuses: errc::invalid_argument; 25P02: errc::protocol_error, as
/// check_state) with the server's message as the detail, which then says that the caller's
/// transaction is aborted (PostgreSQL aborts it on any error).
inline error failure(const enqueue_statement& st, tx_state before, bool connection_lost, std::string_view sqlstate,
                     std::string_view message) {
  std::string msg = detail::primary_message(message);
  if (connection_lost || sqlstate.empty() || sqlstate.starts_with("08")) {
    const bool in_doubt = before == tx_state::idle;
    tenure::logger()->warn("tenure: {} lost its connection ({}): {}", st.name, msg,
                           in_doubt ? "it ran in autocommit, so it may have committed"
                                    : "the caller's transaction is gone with it");
    return error{in_doubt ? errc::commit_in_doubt : errc::database_unavailable, std::move(msg), std::string{sqlstate}};
  }
  if (sqlstate == "25P02") return check_state(st, tx_state::aborted).error();
  const errc code = postgres::errc_from_sqlstate(sqlstate);
  if (code == errc::database_error) {
    tenure::logger()->error("tenure: {} failed with SQLSTATE {}: {}", st.name, sqlstate, msg);
  }
  if (before == tx_state::in_transaction) msg += " (the caller's transaction is aborted: roll it back)";
  return error{code, std::move(msg), std::string{sqlstate}};
}

/// What the statement answered ("42", "{42,43}", or with signed_ids "{42,-7}"), in input order;
/// errc::protocol_error unless there are exactly st.jobs ids.
inline result<std::vector<enqueue_result>> results_from(const enqueue_statement& st,
                                                        const std::optional<std::string>& text) {
  const auto ids = postgres::int_array_values(text.value_or(""));
  if (ids.size() != st.jobs) {
    tenure::logger()->error("tenure: {} answered {} ids for {} jobs", st.name, ids.size(), st.jobs);
    return errc::protocol_error;
  }
  std::vector<enqueue_result> out;
  out.reserve(ids.size());
  for (const auto id : ids) {
    const bool held = st.signed_ids && id < 0;
    out.push_back({.id = held ? -id : id, .inserted = !held});
  }
  return out;
}

/// try_enqueue for any bridge: `run(const enqueue_statement&) -> answer` runs it through the driver.
template <class Run>
result<enqueue_result> try_enqueue(const new_job& job, const sql_options& options, Run&& run) {
  TENURE_TRY(auto st, enqueue_statement_for(job, options));
  TENURE_TRY(auto text, run(st));
  TENURE_TRY(auto out, results_from(st, text));
  return out.front();
}

/// try_enqueue_batch for any bridge; an empty batch sends nothing.
template <class Run>
result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs, const sql_options& options,
                                                      Run&& run) {
  if (jobs.empty()) return std::vector<enqueue_result>{};
  TENURE_TRY(auto st, enqueue_batch_statement_for(jobs, options));
  TENURE_TRY(auto text, run(st));
  return results_from(st, text);
}

/// enqueue for any bridge: the new job's id, or the id of the live job holding its unique key.
template <class Run>
result<std::int64_t> enqueue(const new_job& job, const sql_options& options, Run&& run) {
  TENURE_TRY(auto r, try_enqueue(job, options, std::forward<Run>(run)));
  return r.id;
}

/// enqueue_batch for any bridge; an empty batch sends nothing.
template <class Run>
result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs, const sql_options& options, Run&& run) {
  TENURE_TRY(auto out, try_enqueue_batch(jobs, options, std::forward<Run>(run)));
  std::vector<std::int64_t> ids;
  ids.reserve(out.size());
  for (const auto& r : out) ids.push_back(r.id);
  return ids;
}

}  // namespace tenure::bridges
