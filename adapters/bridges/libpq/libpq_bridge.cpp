#include "tenure/libpq.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "common/complete_sql.hpp"
#include "common/copy_enqueue.hpp"
#include "common/enqueue_sql.hpp"
#include "tenure/postgres/sql_text.hpp"

namespace tenure {
namespace {

bridges::tx_state state_of(PGconn* conn) {
  if (PQstatus(conn) != CONNECTION_OK) return bridges::tx_state::unknown;
  switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS: return bridges::tx_state::in_transaction;
    case PQTRANS_IDLE: return bridges::tx_state::idle;
    case PQTRANS_INERROR: return bridges::tx_state::aborted;
    case PQTRANS_ACTIVE: return bridges::tx_state::busy;
    case PQTRANS_UNKNOWN:
    default: return bridges::tx_state::unknown;
  }
}

/// Runs an enqueue statement on the caller's connection, in whatever transaction is open on it.
bridges::answer run(PGconn* conn, const bridges::enqueue_statement& st) {
  if (conn == nullptr) return error{errc::invalid_argument, std::string{st.name} + " needs a PostgreSQL connection"};
  const auto before = state_of(conn);
  TENURE_TRYV(bridges::check_state(st, before));
  std::vector<const char*> values;
  for (const auto& p : st.params) values.push_back(p ? p->c_str() : nullptr);
  std::unique_ptr<PGresult, decltype(&PQclear)> res{
      PQexecParams(conn, st.sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0),
      &PQclear};
  if (res && PQresultStatus(res.get()) == PGRES_TUPLES_OK) {
    if (PQntuples(res.get()) != 1 || PQnfields(res.get()) != 1) return errc::protocol_error;
    if (PQgetisnull(res.get(), 0, 0)) return std::optional<std::string>{};
    return std::optional<std::string>{PQgetvalue(res.get(), 0, 0)};
  }
  const char* state = res ? PQresultErrorField(res.get(), PG_DIAG_SQLSTATE) : nullptr;
  const char* primary = res ? PQresultErrorField(res.get(), PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  return bridges::failure(st, before, PQstatus(conn) != CONNECTION_OK, state ? state : "",
                          primary ? primary : PQerrorMessage(conn));
}

/// Runs into.sql (a COPY ... FROM STDIN) on the caller's connection with the rows of `jobs`, written
/// and sent piece by piece.
result<void> copy(PGconn* conn, const postgres::copy_into& into, std::span<const new_job> jobs,
                  const bridges::enqueue_statement& st) {
  const auto before = state_of(conn);
  TENURE_TRYV(bridges::check_state(st, before));
  using result_ptr = std::unique_ptr<PGresult, decltype(&PQclear)>;
  auto fail = [&](PGresult* res) {
    const char* state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    const char* primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    return bridges::failure(st, before, PQstatus(conn) != CONNECTION_OK, state ? state : "",
                            primary ? primary : PQerrorMessage(conn));
  };
  {
    result_ptr res{PQexec(conn, into.sql.c_str()), &PQclear};
    if (!res || PQresultStatus(res.get()) != PGRES_COPY_IN) return fail(res.get());
  }
  // A blocking connection sends each piece before the next is written: the server reads the first
  // rows while the last are written, and the batch's text is never held whole.
  const auto sent = postgres::write_copy_rows(jobs, !into.ready, [conn](std::string_view chunk) {
    return PQputCopyData(conn, chunk.data(), static_cast<int>(chunk.size())) == 1;
  });
  const bool all_sent = sent && sent.value();
  const bool ended = PQputCopyEnd(conn, all_sent ? nullptr : "tenure: the rows could not be sent") == 1;
  // The COPY's own result, then the end of its command (a null result).
  result_ptr res{PQgetResult(conn), &PQclear};
  while (PGresult* extra = PQgetResult(conn)) PQclear(extra);
  if (!sent) return sent.error();  // a job's text could not be written; the COPY ended with an error
  if (res && PQresultStatus(res.get()) == PGRES_COMMAND_OK && all_sent && ended) return success();
  return fail(res.get());
}

/// The bridges' options for `conn`: COPY only on a connection whose client encoding is UTF-8 (COPY's
/// text format is escaped byte by byte, which a client-only multibyte encoding such as SJIS breaks).
sql_options for_connection(PGconn* conn, const sql_options& options) {
  if (conn == nullptr || options.copy_threshold == 0 ||
      std::string_view{pg_encoding_to_char(PQclientEncoding(conn))} == "UTF8") {
    return options;
  }
  sql_options arrays = options;
  arrays.copy_threshold = 0;
  return arrays;
}

}  // namespace

result<std::int64_t> enqueue(PGconn* conn, const new_job& job, const sql_options& options) {
  return bridges::enqueue(job, options, [conn](const bridges::enqueue_statement& st) { return run(conn, st); });
}

result<std::vector<std::int64_t>> enqueue_batch(PGconn* conn, std::span<const new_job> jobs,
                                                const sql_options& options) {
  return bridges::enqueue_batch(
      jobs, for_connection(conn, options), conn ? state_of(conn) : bridges::tx_state::unknown,
      [conn](const bridges::enqueue_statement& st) { return run(conn, st); },
      [conn](const postgres::copy_into& into, std::span<const new_job> batch, const bridges::enqueue_statement& st) {
        return copy(conn, into, batch, st);
      });
}

result<enqueue_result> try_enqueue(PGconn* conn, const new_job& job, const sql_options& options) {
  return bridges::try_enqueue(job, options, [conn](const bridges::enqueue_statement& st) { return run(conn, st); });
}

result<std::vector<enqueue_result>> try_enqueue_batch(PGconn* conn, std::span<const new_job> jobs,
                                                      const sql_options& options) {
  return bridges::try_enqueue_batch(
      jobs, for_connection(conn, options), conn ? state_of(conn) : bridges::tx_state::unknown,
      [conn](const bridges::enqueue_statement& st) { return run(conn, st); },
      [conn](const postgres::copy_into& into, std::span<const new_job> batch, const bridges::enqueue_statement& st) {
        return copy(conn, into, batch, st);
      });
}

namespace {

using result_ptr = std::unique_ptr<PGresult, decltype(&PQclear)>;

/// Whether `conn` may take a completion: inside a transaction block the caller opened, idle.
/// Misuse of the caller's transaction is a protocol error (retryable), not bad job input: a
/// handler with this slip must not fail every job for good.
result<void> check_open_transaction(PGconn* conn, const finalization_token& token, const char* what) {
  if (conn == nullptr) return errc::protocol_error;
  auto misuse = [&](const char* why) {
    tenure::logger()->error("tenure: {} for job {} lease {} {}", what, token.job_id(), token.run_lease(), why);
    return errc::protocol_error;
  };
  if (PQstatus(conn) != CONNECTION_OK) return errc::database_unavailable;
  if (PQpipelineStatus(conn) != PQ_PIPELINE_OFF) return misuse("on a connection in pipeline mode");
  switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS: return success();
    case PQTRANS_IDLE: return misuse("outside a transaction: BEGIN first");
    case PQTRANS_INERROR: return misuse("in an aborted transaction: roll it back");
    case PQTRANS_ACTIVE: return misuse("while a command is still running on the connection");
    case PQTRANS_UNKNOWN:
    default: return errc::database_unavailable;
  }
}

/// complete_job's answer (one row) as a receipt, or why it failed.
result<finalization_receipt> receipt_of(PGconn* conn, const finalization_token& token, PGresult* res) {
  if (!res || PQresultStatus(res) != PGRES_TUPLES_OK) {
    if (PQstatus(conn) != CONNECTION_OK) {
      tenure::logger()->warn("tenure: complete_in_tx for job {} lease {}: connection lost ({}); the transaction is gone",
                             token.job_id(), token.run_lease(), postgres::one_line(PQerrorMessage(conn)));
      return errc::database_unavailable;
    }
    const char* state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    return bridges::report_failure(token, postgres::errc_from_sqlstate(state ? state : ""),
                                   res ? PQresultErrorMessage(res) : PQerrorMessage(conn));
  }
  if (PQntuples(res) != 1 || PQgetisnull(res, 0, 2)) return errc::protocol_error;
  auto num = [&](int col) { return std::strtoll(PQgetvalue(res, 0, col), nullptr, 10); };
  return bridges::receipt_from(token, num(0), num(1), num(2));
}

/// complete_job's statement and parameters for one token.
struct completion_statement {
  std::string token_text;
  std::string sql;
  std::optional<std::string> progress;
  int count() const { return progress ? 2 : 1; }
  std::array<const char*, 2> values() const { return {token_text.c_str(), progress ? progress->c_str() : nullptr}; }
};

/// What both completions check before anything is sent, and the statement they send.
result<completion_statement> completion_for(PGconn* conn, const finalization_token& token,
                                            const finalize_options& options, const char* what) {
  TENURE_TRY(auto progress, bridges::prepare(token, options));
  TENURE_TRYV(check_open_transaction(conn, token, what));
  return completion_statement{token.to_string(), bridges::complete_sql(options.schema, progress.has_value()),
                              std::move(progress)};
}

/// The next result of the pipeline and the null that ends its command (none for a sync).
result_ptr next_result(PGconn* conn) {
  result_ptr res{PQgetResult(conn), &PQclear};
  if (res && PQresultStatus(res.get()) != PGRES_PIPELINE_SYNC) {
    while (PGresult* extra = PQgetResult(conn)) PQclear(extra);
  }
  return res;
}

}  // namespace

result<finalization_receipt> complete_in_tx(PGconn* conn, const finalization_token& token,
                                            const finalize_options& options) {
  TENURE_TRY(const auto st, completion_for(conn, token, options, "complete_in_tx"));
  const auto params = st.values();
  result_ptr res{PQexecParams(conn, st.sql.c_str(), st.count(), nullptr, params.data(), nullptr, nullptr, 0), &PQclear};
  return receipt_of(conn, token, res.get());
}

result<finalization_receipt> complete_and_commit(PGconn* conn, const finalization_token& token,
                                                 const finalize_options& options) {
  TENURE_TRY(const auto st, completion_for(conn, token, options, "complete_and_commit"));
  const auto params = st.values();
  // complete_job, COMMIT and a sync in one send. A refused complete_job makes the server skip the
  // COMMIT (the pipeline is aborted up to the sync), so the transaction cannot commit without it.
  if (PQenterPipelineMode(conn) != 1) return errc::protocol_error;
  const bool sent = PQsendQueryParams(conn, st.sql.c_str(), st.count(), nullptr, params.data(), nullptr, nullptr, 0) == 1 &&
                    PQsendQueryParams(conn, "COMMIT", 0, nullptr, nullptr, nullptr, nullptr, 0) == 1 &&
                    PQpipelineSync(conn) == 1;
  result_ptr completed = sent ? next_result(conn) : result_ptr{nullptr, &PQclear};
  result_ptr committed = sent ? next_result(conn) : result_ptr{nullptr, &PQclear};
  result_ptr synced = sent ? next_result(conn) : result_ptr{nullptr, &PQclear};
  const bool in_sync = synced && PQresultStatus(synced.get()) == PGRES_PIPELINE_SYNC;
  if (!in_sync) {
    // A broken connection answers nothing more; drain whatever is left before leaving the mode.
    while (PGresult* extra = PQgetResult(conn)) PQclear(extra);
  }
  PQexitPipelineMode(conn);
  const bool lost = PQstatus(conn) != CONNECTION_OK;
  auto end_aborted = [&] {
    if (!lost && PQtransactionStatus(conn) == PQTRANS_INERROR) result_ptr{PQexec(conn, "ROLLBACK"), &PQclear};
  };
  auto in_doubt = [&] {
    tenure::logger()->warn("tenure: complete_and_commit for job {} lease {}: connection lost after the COMMIT was sent "
                           "({}); whether it committed is unknown",
                           token.job_id(), token.run_lease(), postgres::one_line(PQerrorMessage(conn)));
    return errc::commit_in_doubt;
  };
  if (!sent) {
    tenure::logger()->error("tenure: complete_and_commit for job {} lease {}: could not send ({})", token.job_id(),
                            token.run_lease(), postgres::one_line(PQerrorMessage(conn)));
    if (lost) return in_doubt();
    end_aborted();
    return errc::protocol_error;
  }
  // complete_job refused by the server (a SQLSTATE: TN001, TN002, ...): the COMMIT was skipped and
  // nothing committed. End the aborted transaction so the connection is idle again.
  const bool refused = completed && PQresultStatus(completed.get()) == PGRES_FATAL_ERROR &&
                       PQresultErrorField(completed.get(), PG_DIAG_SQLSTATE) != nullptr;
  if (refused) {
    auto why = receipt_of(conn, token, completed.get());
    end_aborted();
    return why;
  }
  // No answer to complete_job: the connection broke after the COMMIT may have gone out.
  if (!completed || PQresultStatus(completed.get()) != PGRES_TUPLES_OK) {
    if (lost) return in_doubt();
    end_aborted();
    return errc::protocol_error;
  }
  auto receipt = receipt_of(conn, token, completed.get());
  if (committed && PQresultStatus(committed.get()) == PGRES_COMMAND_OK &&
      std::string_view{PQcmdStatus(committed.get())} == "COMMIT") {
    // The server answered the COMMIT: the receipt says so. A receipt_of error here is an answer
    // naming another attempt: committed anyway, and the runtime reads the evidence.
    if (!receipt) return receipt;
    return detail::receipt_access::committed(receipt.value());
  }
  if (lost || !committed || PQresultErrorField(committed.get(), PG_DIAG_SQLSTATE) == nullptr) return in_doubt();
  // The server refused the COMMIT (a serialization failure, a deferred constraint...): the
  // transaction is over and nothing of it committed.
  tenure::logger()->error("tenure: complete_and_commit for job {} lease {}: the COMMIT failed: {}", token.job_id(),
                          token.run_lease(), postgres::one_line(PQresultErrorMessage(committed.get())));
  const std::string state = PQresultErrorField(committed.get(), PG_DIAG_SQLSTATE);
  const char* primary = PQresultErrorField(committed.get(), PG_DIAG_MESSAGE_PRIMARY);
  std::string detail = "the COMMIT failed: " + std::string{primary ? primary : "(no message)"};
  end_aborted();
  return error{postgres::errc_from_sqlstate(state), std::move(detail), state};
}

}  // namespace tenure
