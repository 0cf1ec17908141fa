#include "tenure/pqxx.hpp"

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "common/complete_sql.hpp"
#include "tenure/postgres/sql_text.hpp"

namespace tenure {

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
    const pqxx::result r =
        progress ? tx.exec_params(sql, token.to_string(), *progress) : tx.exec_params(sql, token.to_string());
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
