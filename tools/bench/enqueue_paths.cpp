// The two bulk enqueue paths of the caller's connection, timed side by side: enqueue_batch over
// arrays and COPY (straight into ready: the jobs are to run now; tenure/libpq.hpp), batch by batch
// in turn on one connection, each batch in a transaction of its own.
#include "bench/common.hpp"

#include <memory>
#include <stdexcept>

#include <libpq-fe.h>

#include "tenure/libpq.hpp"

namespace tenure::bench {

enqueue_path_rates enqueue_paths(const std::string& dsn, const std::string& schema, int n, int batch,
                                 const std::string& queue) {
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn{PQconnectdb(dsn.c_str()), &PQfinish};
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    throw std::runtime_error(std::string{"bench: cannot connect: "} + PQerrorMessage(conn.get()));
  }
  const auto exec = [&](const char* sql) {
    std::unique_ptr<PGresult, decltype(&PQclear)> r{PQexec(conn.get(), sql), &PQclear};
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      throw std::runtime_error(std::string{"bench: "} + sql + ": " + PQerrorMessage(conn.get()));
    }
  };
  const sql_options arrays{.schema = schema, .copy_threshold = 0};
  const sql_options copy{.schema = schema, .copy_threshold = 1};
  const std::vector<new_job> jobs(static_cast<std::size_t>(batch), new_job{.kind = "noop", .queue = queue});
  double array_s = 0, copy_s = 0;
  int array_jobs = 0, copy_jobs = 0;
  // A first batch of each warms the session (plans, the stage), uncounted.
  for (int round = -1; array_jobs < n; ++round) {
    for (const auto* opts : {&arrays, &copy}) {
      const auto t0 = clock::now();
      exec("BEGIN");
      auto ids = enqueue_batch(conn.get(), jobs, *opts);
      if (!ids) throw std::runtime_error("bench: enqueue failed: " + ids.error().message());
      exec("COMMIT");
      if (round < 0) continue;
      (opts == &copy ? copy_s : array_s) += seconds_since(t0);
      (opts == &copy ? copy_jobs : array_jobs) += batch;
    }
  }
  return {.array_jobs_per_s = array_jobs / array_s, .copy_jobs_per_s = copy_jobs / copy_s};
}

}  // namespace tenure::bench
