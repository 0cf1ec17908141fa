#include "tenure/libpq.hpp"

#include <cstdlib>
#include <memory>

#include <spdlog/spdlog.h>

#include "common/complete_sql.hpp"
#include "connection.hpp"  // adapters/postgres: SQLSTATE mapping

namespace tenure {

result<finalization_receipt> complete_in_tx(PGconn* conn, const finalization_token& token,
                                            const finalize_options& options) {
  TENURE_TRY(auto progress, bridges::prepare(token, options));
  if (conn == nullptr) return errc::protocol_error;
  switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS: break;
    // Misuse of the caller's transaction is a protocol error (retryable), not bad job input: a
    // handler with this slip must not fail every job for good.
    case PQTRANS_IDLE:
      spdlog::error("tenure: complete_in_tx for job {} lease {} outside a transaction: BEGIN first",
                    token.job_id(), token.run_lease());
      return errc::protocol_error;
    case PQTRANS_INERROR:
      spdlog::error("tenure: complete_in_tx for job {} lease {} in an aborted transaction: roll it back",
                    token.job_id(), token.run_lease());
      return errc::protocol_error;
    case PQTRANS_ACTIVE:
      spdlog::error("tenure: complete_in_tx for job {} lease {} while a command is still running on the connection",
                    token.job_id(), token.run_lease());
      return errc::protocol_error;
    case PQTRANS_UNKNOWN:
    default: return errc::database_unavailable;
  }
  const std::string token_text = token.to_string();
  const std::string sql = bridges::complete_sql(options.schema, progress.has_value());
  const char* params[2] = {token_text.c_str(), progress ? progress->c_str() : nullptr};
  std::unique_ptr<PGresult, decltype(&PQclear)> res{
      PQexecParams(conn, sql.c_str(), progress ? 2 : 1, nullptr, params, nullptr, nullptr, 0), &PQclear};
  if (!res || PQresultStatus(res.get()) != PGRES_TUPLES_OK) {
    if (PQstatus(conn) != CONNECTION_OK) {
      spdlog::warn("tenure: complete_in_tx for job {} lease {}: connection lost ({}); the transaction is gone",
                   token.job_id(), token.run_lease(), PQerrorMessage(conn));
      return errc::database_unavailable;
    }
    const char* state = res ? PQresultErrorField(res.get(), PG_DIAG_SQLSTATE) : nullptr;
    const auto code = postgres::detail::errc_from_sqlstate(state ? state : "");
    if (code == errc::stale_attempt) {
      spdlog::info("tenure: complete_in_tx: job {} lease {} is stale (TN001); the caller's transaction is aborted",
                   token.job_id(), token.run_lease());
    } else {
      spdlog::error("tenure: complete_in_tx for job {} lease {} failed: {}", token.job_id(), token.run_lease(),
                    res ? PQresultErrorMessage(res.get()) : PQerrorMessage(conn));
    }
    return code;
  }
  if (PQntuples(res.get()) != 1 || PQgetisnull(res.get(), 0, 2)) return errc::protocol_error;
  auto num = [&](int col) { return std::strtoll(PQgetvalue(res.get(), 0, col), nullptr, 10); };
  return bridges::receipt_from(token, num(0), num(1), num(2));
}

}  // namespace tenure
