// `tenure bench --mode prune`: retention under load.
#include "bench/common.hpp"
#include "bench/modes.hpp"

#include <cmath>
#include <stdexcept>
#include <thread>

#include "bench/statement_wal.hpp"

namespace tenure::bench {

using namespace std::chrono_literals;

namespace {

/// Expired finished jobs for the prune scenario: `n` completed jobs of the bench queue, finished
/// two days ago (past the default 24 h retention), as the drain and the leader's sweep leave them:
/// their specs, claims of 100, a completion of each and the claims' settled rows; one statement per
/// 100,000.
void insert_expired(const std::string& dsn, const std::string& schema, long n) {
  pg_session s(dsn);
  for (long done = 0; done < n;) {
    const long k = std::min<long>(100'000, n - done);
    s.query("WITH spec AS (INSERT INTO " + schema + ".specs (id, queue, kind, args, priority, max_attempts, "
            "metadata, created_at) SELECT nextval('" + schema + ".job_id_seq'), '" + k_queue + "', 'noop', '{}', "
            "2, 25, '{}', now() - interval '2 days' FROM generate_series(1, " + std::to_string(k) + ") RETURNING id), "
            "batch AS (SELECT nextval('" + schema + ".claim_id_seq') AS claim_id, array_agg(id ORDER BY id) AS ids "
            "FROM (SELECT id, (row_number() OVER (ORDER BY id) - 1) / 100 AS b FROM spec) x GROUP BY b), "
            "claim AS (INSERT INTO " + schema + ".claims (claim_id, queue, worker, claimed_at, lo, hi, job_ids, "
            "attempts, secrets, run_ats) SELECT claim_id, '" + k_queue + "', 'bench', now() - interval '2 days', "
            "ids[1], ids[cardinality(ids)], ids, array_fill(1, ARRAY[cardinality(ids)]), "
            "ARRAY(SELECT gen_random_uuid() FROM generate_series(1, cardinality(ids))), "
            "array_fill(now() - interval '2 days', ARRAY[cardinality(ids)]) FROM batch "
            "RETURNING claim_id, cardinality(job_ids) AS n), "
            "closure AS (INSERT INTO " + schema + ".closures (claim_id, pos, outcome, closed_at) "
            "SELECT claim_id, p, 'c', now() - interval '2 days' FROM claim, generate_series(1, n) p) "
            // settled as the leader's sweep leaves them: ripe a day after they finished
            "INSERT INTO " + schema + ".settled_claims (claim_id, queue, ripe_at) "
            "SELECT claim_id, '" + k_queue + "', now() - interval '1 day' FROM claim",
            {}, "bench: insert expired rows");
    done += k;
  }
  s.query("ANALYZE " + schema + ".specs, " + schema + ".claims, " + schema + ".closures, " + schema + ".settled_claims", {},
          "bench: analyze");
}

/// One phase of the prune scenario: a runtime (maintenance off: the pruner is the only leader)
/// drains `jobs`, then `samples` low-load pickups are timed.
struct drain_phase {
  double drain_jobs_per_s = 0;
  std::vector<double> pickup_ms;
};

drain_phase measure_drain(const options& o, const std::string& schema) {
  enqueue_batches(o.dsn, schema, o.jobs);
  auto cfg = drain_config(o);
  cfg.maintenance = false;
  auto rt = make_runtime(o.dsn, schema, cfg);
  std::atomic<std::int64_t> last_start_ns{0}, last_job{0};
  rt->handle("noop", [&](job_context& ctx) {
    last_start_ns = clock::now().time_since_epoch().count();
    last_job = ctx.job_id();
    return job_outcome::completed();
  });
  const auto t0 = clock::now();
  if (!rt->start()) throw std::runtime_error("bench: runtime did not start");
  wait_for([&] { return rt->metrics().completed >= static_cast<std::uint64_t>(o.jobs); }, 600s, "the drain");
  drain_phase out;
  out.drain_jobs_per_s = std::round(o.jobs / seconds_since(t0));
  out.pickup_ms = pickup_latencies(o.dsn, schema, last_start_ns, last_job, o.pickup_samples);
  rt->stop();
  return out;
}

}  // namespace

/// Retention under load: `prune_rows` expired finished jobs are deleted by back-to-back fenced
/// leader passes (maintain(), at most 50,000 per pass) while a runtime drains `jobs` and then
/// takes `pickup_samples` low-load pickups; the same drain and pickups without pruning first, for
/// comparison.
nlohmann::json run_prune(const options& o, const std::string& schema) {
  insert_expired(o.dsn, schema, o.prune_rows);
  const auto baseline = measure_drain(o, schema);
  // What the pruner's passes write (the drain beside them runs no leader of its own).
  auto by_statement = statement_wal::open(o.dsn, schema);
  const auto statements_before = by_statement ? by_statement->read({"maintain"}) : statement_wal::reading{};

  std::atomic<bool> stop{false};
  std::atomic<long> pruned{0};
  std::vector<double> pass_ms;
  double prune_s = 0;
  std::string error;
  std::thread pruner([&] {
    try {
      pg_session s(o.dsn);
      const auto t0 = clock::now();
      while (!stop.load()) {
        auto term = s.query("SELECT " + schema + ".acquire_leadership('bench-pruner', '1 minute')", {}, "bench: lease");
        if (!term.at(0).at(0)) throw std::runtime_error("bench: another leader holds the lease");
        const auto sent = clock::now();
        s.query("SELECT count(*) FROM " + schema + ".maintain('bench-pruner', " + *term.at(0).at(0) + ")", {},
                "bench: maintain");
        pass_ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - sent).count());
        const long left = std::stol(*s.query("SELECT coalesce(sum(cardinality(c.job_ids)), 0) FROM " + schema +
                                                 ".settled_claims r JOIN " + schema + ".claims c USING (claim_id) "
                                                 "WHERE r.retired_at IS NULL AND r.ripe_at <= now()",
                                             {}, "bench: left")
                                         .at(0)
                                         .at(0));
        pruned = o.prune_rows - left;
        if (left == 0) break;
      }
      prune_s = seconds_since(t0);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  drain_phase during;
  try {
    during = measure_drain(o, schema);
  } catch (...) {
    stop = true;
    pruner.join();
    throw;
  }
  const long pruned_during_drain = pruned.load();
  pruner.join();  // runs until every expired row is gone
  if (!error.empty()) throw std::runtime_error(error);
  nlohmann::json prune_wal = nullptr;
  if (by_statement) {
    prune_wal = std::round(wal_per_job(statements_before, by_statement->read({"maintain"}), "maintain",
                                       static_cast<double>(o.prune_rows)));
  }
  return {{"scenario", "prune"},
          {"jobs", o.jobs},
          {"prune_rows", o.prune_rows},
          {"pruned_while_measuring", pruned_during_drain},
          {"prune_seconds", rounded(prune_s, 2)},
          {"prune_rows_per_s", prune_s > 0 ? std::round(o.prune_rows / prune_s) : 0.0},
          {"prune_passes", pass_ms.size()},
          {"prune_pass_p50_ms", rounded(percentile(pass_ms, 0.50), 1)},
          {"prune_pass_max_ms", rounded(percentile(pass_ms, 1.0), 1)},
          // WAL of the pruner's passes per expired row (null without pg_stat_statements).
          {"prune_wal_bytes_per_row", prune_wal},
          {"baseline_drain_jobs_per_s", baseline.drain_jobs_per_s},
          {"baseline_pickup_p50_ms", percentile(baseline.pickup_ms, 0.50)},
          {"baseline_pickup_p99_ms", percentile(baseline.pickup_ms, 0.99)},
          {"pruning_drain_jobs_per_s", during.drain_jobs_per_s},
          {"pruning_pickup_p50_ms", percentile(during.pickup_ms, 0.50)},
          {"pruning_pickup_p99_ms", percentile(during.pickup_ms, 0.99)},
          {"peak_rss_mb", rounded(peak_rss_mb(), 1)}};
}

}  // namespace tenure::bench
