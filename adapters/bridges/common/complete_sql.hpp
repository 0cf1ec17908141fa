#pragma once
/// \file
/// Private to the bridges: the one statement every bridge runs for complete_in_tx, and how its
/// answer becomes a receipt. The SQL contract (`<schema>.complete_job(token, progress)`) does
/// the guarded completion; a stale attempt raises TN001, which aborts the caller's transaction.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "common/receipt_access.hpp"
#include "tenure/postgres/sql_text.hpp"
#include "tenure/finalization.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::bridges {

/// `SELECT job_id, run_lease, completed_at (µs since epoch) FROM <schema>.complete_job($1[, $2])`.
inline std::string complete_sql(const std::string& schema, bool with_progress) {
  return "SELECT job_id, run_lease, (extract(epoch FROM completed_at) * 1000000)::bigint FROM " + schema +
         (with_progress ? ".complete_job($1, $2::jsonb)" : ".complete_job($1)");
}

/// Checks what can be checked before anything is sent: the schema name and the progress JSON.
/// Returns the progress text (when given) or errc::invalid_argument.
inline result<std::optional<std::string>> prepare(const finalization_token& token, const finalize_options& opt) {
  if (!postgres::valid_schema_name(opt.schema)) {
    tenure::logger()->error("tenure: complete_in_tx: invalid schema name '{}'", opt.schema);
    return errc::invalid_argument;
  }
  if (token.job_id() <= 0 || token.run_lease() <= 0) return errc::malformed_token;
  if (!opt.progress) return std::optional<std::string>{};
  try {
    return std::optional<std::string>{opt.progress->dump()};
  } catch (const nlohmann::json::exception&) {
    return errc::invalid_argument;  // e.g. invalid UTF-8: never sent half-encoded
  }
}

/// The receipt for the row complete_job returned; protocol_error if it names another attempt.
inline result<finalization_receipt> receipt_from(const finalization_token& token, std::int64_t job_id,
                                                 std::int64_t run_lease, std::int64_t completed_us) {
  if (job_id != token.job_id() || run_lease != token.run_lease()) return errc::protocol_error;
  const time_point at{std::chrono::duration_cast<clock_type::duration>(std::chrono::microseconds{completed_us})};
  return detail::receipt_access::make(token, at);
}

/// Logs why complete_job failed and returns the error: a stale attempt at info (expected), the
/// rest at error.
inline errc report_failure(const finalization_token& token, errc code, std::string_view detail) {
  if (code == errc::stale_attempt) {
    tenure::logger()->info("tenure: complete_in_tx: job {} lease {} is stale (TN001); the caller's transaction is aborted",
                 token.job_id(), token.run_lease());
  } else {
    tenure::logger()->error("tenure: complete_in_tx for job {} lease {} failed: {}", token.job_id(), token.run_lease(),
                  postgres::one_line(detail));
  }
  return code;
}

}  // namespace tenure::bridges
