#include "bench/bench.hpp"

#include <stdexcept>

#include "bench/common.hpp"
#include "bench/modes.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::bench {

nlohmann::json run(const options& o) {
  if (o.jobs < 1) throw std::runtime_error("bench: --jobs must be at least 1");
  if (o.producers < 1) throw std::runtime_error("bench: --producers must be at least 1");
  const std::string schema = "bench_" + random_hex();
  auto migrated = postgres::migrate(o.dsn, schema);
  if (!migrated) throw std::runtime_error("bench: migrate failed: " + migrated.error().message());
  nlohmann::json result;
  try {
    if (o.mode == "runtime") {
      result = run_runtime(o, schema);
    } else if (o.mode == "sql-limit") {
      result = run_sql_limit(o, schema);
    } else if (o.mode == "enqueue-single") {
      result = run_enqueue_single(o, schema);
    } else if (o.mode == "caller-owned") {
      result = run_caller_owned(o, schema);
    } else if (o.mode == "prune") {
      result = run_prune(o, schema);
    } else {
      throw std::runtime_error("bench: unknown mode '" + o.mode +
                               "' (runtime, sql-limit, enqueue-single, caller-owned, prune)");
    }
  } catch (...) {
    if (!o.keep_schema) {
      try {
        pg_session(o.dsn).query("DROP SCHEMA " + schema + " CASCADE", {}, "bench: cleanup");
      } catch (...) {
      }
    }
    throw;
  }
  if (!o.keep_schema) pg_session(o.dsn).query("DROP SCHEMA " + schema + " CASCADE", {}, "bench: cleanup");
  // Which schema the run used: the one to inspect with --keep-schema (dropped otherwise).
  result["schema"] = schema;
  result["schema_kept"] = o.keep_schema;
  return result;
}

}  // namespace tenure::bench
