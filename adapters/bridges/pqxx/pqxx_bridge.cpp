#include "tenure/pqxx.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "common/complete_sql.hpp"
#include "common/copy_enqueue.hpp"
#include "common/enqueue_sql.hpp"
#include "tenure/postgres/sql_text.hpp"

namespace tenure {
namespace {

/// Runs `sql` in `tx` with its $1..$n placeholders bound to `params` (nullopt: NULL), as quoted
/// literals through tx.exec. Not exec_params: pqxx (6) rolls a transaction back when a statement
/// in it fails and exec then refuses it (pqxx::usage_error), but exec_params goes straight to
/// the connection, where it would run outside any transaction and commit on its own.
pqxx::result exec_bound(pqxx::transaction_base& tx, const std::string& sql,
                        const std::vector<std::optional<std::string>>& params) {
  std::string text;
  text.reserve(sql.size());
  for (std::size_t i = 0; i < sql.size(); ++i) {
    if (sql[i] != '$' || i + 1 >= sql.size() || sql[i + 1] < '1' || sql[i + 1] > '9') {
      text += sql[i];
      continue;
    }
    std::size_t n = 0;
    while (i + 1 < sql.size() && sql[i + 1] >= '0' && sql[i + 1] <= '9') n = n * 10 + (sql[++i] - '0');
    const auto& p = params.at(n - 1);
    text += p ? tx.quote(*p) : std::string{"NULL"};
  }
  return tx.exec(text);
}

/// Runs an enqueue statement in the caller's transaction.
bridges::answer run(pqxx::transaction_base& tx, const bridges::enqueue_statement& st) {
  // pqxx sends BEGIN when a transaction object is made; a nontransaction autocommits.
  const auto before = dynamic_cast<pqxx::nontransaction*>(&tx) != nullptr ? bridges::tx_state::idle
                                                                          : bridges::tx_state::in_transaction;
  try {
    const pqxx::result r = exec_bound(tx, st.sql, st.params);
    if (r.size() != 1 || r.columns() != 1) return errc::protocol_error;
    if (r[0][0].is_null()) return std::optional<std::string>{};
    return std::optional<std::string>{r[0][0].c_str()};
  } catch (const pqxx::broken_connection& e) {
    return bridges::failure(st, before, true, "", e.what());
  } catch (const pqxx::sql_error& e) {
    return bridges::failure(st, before, false, e.sqlstate(), e.what());
  } catch (const pqxx::usage_error& e) {
    // The transaction is closed (committed, aborted, or rolled back by pqxx after a failed
    // statement), or a stream is open on it.
    tenure::logger()->error("tenure: {}: {}", st.name, e.what());
    return error{errc::protocol_error, std::string{st.name} + ": " + e.what()};
  } catch (const std::exception& e) {
    tenure::logger()->error("tenure: {} failed: {}", st.name, e.what());
    return error{errc::database_error, e.what()};
  }
}

/// COPY of `jobs` into `into.table` (`specs`, or the session's stage) in the caller's transaction,
/// through pqxx::stream_to (which escapes each field), in the columns
/// postgres::enqueue_copy_into() lists.
result<void> copy(pqxx::transaction_base& tx, const postgres::copy_into& into, std::span<const new_job> jobs,
                  const bridges::enqueue_statement& st) {
  static const std::vector<std::string> stage_columns{"ord",      "kind",   "args",         "queue",
                                                      "priority", "run_at", "max_attempts", "metadata"};
  static const std::vector<std::string> ready_columns{"kind",     "args",         "queue",
                                                      "priority", "max_attempts", "metadata"};
  // The jobs passed check_copy_rows(), so their JSON has a text form.
  const auto json = [](const nlohmann::json& v) { return postgres::json_text(v).value(); };
  try {
    pqxx::stream_to out{tx, into.table, into.ready ? ready_columns : stage_columns};
    long ord = 0;
    for (const auto& j : jobs) {
      ++ord;
      if (into.ready) {
        out << std::make_tuple(j.kind, json(j.args), j.queue, j.priority, j.max_attempts, json(j.metadata));
      } else if (j.run_at) {
        out << std::make_tuple(ord, j.kind, json(j.args), j.queue, j.priority, postgres::timestamp_text(*j.run_at),
                               j.max_attempts, json(j.metadata));
      } else {
        out << std::make_tuple(ord, j.kind, json(j.args), j.queue, j.priority, nullptr, j.max_attempts,
                               json(j.metadata));
      }
    }
    out.complete();
    return success();
  } catch (const pqxx::broken_connection& e) {
    return bridges::failure(st, bridges::tx_state::in_transaction, true, "", e.what());
  } catch (const pqxx::sql_error& e) {
    return bridges::failure(st, bridges::tx_state::in_transaction, false, e.sqlstate(), e.what());
  } catch (const std::exception& e) {
    tenure::logger()->error("tenure: {} failed: {}", st.name, e.what());
    return error{errc::database_error, e.what()};
  }
}

/// The state the COPY path needs: inside a real transaction (not a nontransaction) on a UTF-8
/// session (COPY's text is escaped byte by byte).
bridges::tx_state copy_state(pqxx::transaction_base& tx) {
  if (dynamic_cast<pqxx::nontransaction*>(&tx) != nullptr) return bridges::tx_state::idle;
  try {
    if (tx.conn().get_client_encoding() != "UTF8") return bridges::tx_state::unknown;
  } catch (const std::exception&) {
    return bridges::tx_state::unknown;
  }
  return bridges::tx_state::in_transaction;
}

}  // namespace

result<std::int64_t> enqueue(pqxx::transaction_base& tx, const new_job& job, const sql_options& options) {
  return bridges::enqueue(job, options, [&tx](const bridges::enqueue_statement& st) { return run(tx, st); });
}

result<std::vector<std::int64_t>> enqueue_batch(pqxx::transaction_base& tx, std::span<const new_job> jobs,
                                                const sql_options& options) {
  return bridges::enqueue_batch(
      jobs, options, copy_state(tx), [&tx](const bridges::enqueue_statement& st) { return run(tx, st); },
      [&tx](const postgres::copy_into& into, std::span<const new_job> batch, const bridges::enqueue_statement& st) {
        return copy(tx, into, batch, st);
      });
}

result<enqueue_result> try_enqueue(pqxx::transaction_base& tx, const new_job& job, const sql_options& options) {
  return bridges::try_enqueue(job, options, [&tx](const bridges::enqueue_statement& st) { return run(tx, st); });
}

result<std::vector<enqueue_result>> try_enqueue_batch(pqxx::transaction_base& tx, std::span<const new_job> jobs,
                                                      const sql_options& options) {
  return bridges::try_enqueue_batch(
      jobs, options, copy_state(tx), [&tx](const bridges::enqueue_statement& st) { return run(tx, st); },
      [&tx](const postgres::copy_into& into, std::span<const new_job> batch, const bridges::enqueue_statement& st) {
        return copy(tx, into, batch, st);
      });
}

result<finalization_receipt> complete_in_tx(pqxx::transaction_base& tx, const finalization_token& token,
                                            const finalize_options& options) {
  TENURE_TRY(auto progress, bridges::prepare(token, options));
  if (dynamic_cast<pqxx::nontransaction*>(&tx) != nullptr) {
    // Autocommit: the completion would commit apart from the business writes.
    tenure::logger()->error("tenure: complete_in_tx for job {} lease {} on a pqxx::nontransaction: use pqxx::work",
                  token.job_id(), token.run_lease());
    return errc::protocol_error;
  }
  const std::string sql = bridges::complete_sql(options.schema, progress.has_value());
  try {
    const pqxx::result r = exec_bound(tx, sql, {token.to_string(), progress});
    if (r.size() != 1 || r[0][2].is_null()) return errc::protocol_error;
    return bridges::receipt_from(token, r[0][0].as<std::int64_t>(), r[0][1].as<std::int64_t>(),
                                 r[0][2].as<std::int64_t>());
  } catch (const pqxx::broken_connection& e) {
    tenure::logger()->warn("tenure: complete_in_tx for job {} lease {}: connection lost ({}); the transaction is gone",
                 token.job_id(), token.run_lease(), e.what());
    return errc::database_unavailable;
  } catch (const pqxx::sql_error& e) {
    return bridges::report_failure(token, postgres::errc_from_sqlstate(e.sqlstate()), e.what());
  } catch (const pqxx::usage_error& e) {
    tenure::logger()->error("tenure: complete_in_tx for job {} lease {}: {}", token.job_id(), token.run_lease(), e.what());
    return errc::protocol_error;
  } catch (const std::exception& e) {
    tenure::logger()->error("tenure: complete_in_tx for job {} lease {} failed: {}", token.job_id(), token.run_lease(),
                  e.what());
    return errc::database_error;
  }
}

}  // namespace tenure
