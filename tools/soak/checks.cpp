// The soak's records and its end-of-run checks (see soak.hpp). Every figure the run is judged by
// is computed here, from the side tables and tenure's own tables, so a new check (e.g. a
// transition trace) is one more entry in check() and must_be_zero().
#include <string>

#include "cli/pg_session.hpp"
#include "soak/soak.hpp"

namespace tenure::soak {
namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (auto pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size())) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

/// `@t@` is tenure's schema, `@r@` the records' schema.
std::string sql(const names& n, const std::string& text) {
  return replace_all(replace_all(text, "@t@", n.tenure), "@r@", n.rec);
}

long count(cli::pg_session& db, const names& n, const std::string& text, const std::vector<std::string>& params = {}) {
  auto rows = db.query(sql(n, text), params, "soak: check");
  return rows.empty() || !rows[0][0] ? 0 : std::stol(*rows[0][0]);
}

}  // namespace

names names_for(const std::string& tenure_schema) { return {tenure_schema, tenure_schema + "_rec"}; }

void create_records(cli::pg_session& db, const names& n) {
  const char* statements[] = {
      "CREATE SCHEMA @r@",
      // The business row of every committed enqueue, written in the producer's transaction.
      "CREATE TABLE @r@.orders (job_id bigint PRIMARY KEY, kind text NOT NULL, caller_owned boolean NOT NULL, "
      "created_at timestamptz NOT NULL DEFAULT clock_timestamp())",
      // Jobs enqueued in transactions the producers rolled back on purpose (written at the end).
      "CREATE TABLE @r@.rolled_back (job_id bigint PRIMARY KEY)",
      // Every execution of a handler, committed by the handler before it returns.
      "CREATE TABLE @r@.executions (id bigserial PRIMARY KEY, job_id bigint NOT NULL, run_lease bigint NOT NULL, "
      "worker text NOT NULL, outcome text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
      "CREATE INDEX ON @r@.executions (job_id)",
      // The business row of a caller-owned completion, in the transaction of complete_in_tx.
      "CREATE TABLE @r@.business (id bigserial PRIMARY KEY, job_id bigint NOT NULL, run_lease bigint NOT NULL, "
      "worker text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
      "CREATE INDEX ON @r@.business (job_id)",
      // Callbacks registered by parking handlers; `resolve` says what the soak does with them.
      "CREATE TABLE @r@.callbacks (callback_id uuid PRIMARY KEY, job_id bigint NOT NULL, run_lease bigint NOT NULL, "
      "resolve text NOT NULL CHECK (resolve IN ('resume', 'timeout', 'cancel')), "
      "created_at timestamptz NOT NULL DEFAULT clock_timestamp(), resolved_at timestamptz)",
      // Every terminal transition tenure writes (a terminal closure of an attempt: completed,
      // failed or cancelled), with the job and run lease of its claim item.
      "CREATE TABLE @r@.finals (id bigserial PRIMARY KEY, job_id bigint NOT NULL, run_lease bigint NOT NULL, "
      "state text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
      "CREATE INDEX ON @r@.finals (job_id)",
      "CREATE FUNCTION @r@.record_final() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
      "INSERT INTO @r@.finals (job_id, run_lease, state) "
      "SELECT c.job_ids[NEW.pos], coalesce(c.run_leases[NEW.pos], c.claim_id * 65536 + NEW.pos), "
      "CASE NEW.outcome WHEN 'c' THEN 'completed' WHEN 'f' THEN 'failed' ELSE 'cancelled' END "
      "FROM @t@.claims c WHERE c.claim_id = NEW.claim_id; "
      "RETURN NULL; END $$",
      "CREATE TRIGGER soak_record_final AFTER INSERT ON @t@.closures "
      "FOR EACH ROW WHEN (NEW.outcome IN ('c', 'f', 'x')) EXECUTE FUNCTION @r@.record_final()",
  };
  for (const char* statement : statements) db.query(sql(n, statement), {}, "soak: cannot create the records");
}

const std::vector<std::string>& must_be_zero() {
  static const std::vector<std::string> keys{"lost",
                                             "finalized_twice",
                                             "business_without_completion",
                                             "completion_without_business",
                                             "rolled_back_ran",
                                             "stuck_attempts"};
  return keys;
}

bool passed(const nlohmann::json& figures) {
  for (const auto& key : must_be_zero()) {
    if (!figures.contains(key) || figures.at(key).get<long>() != 0) return false;
  }
  return true;
}

nlohmann::json check(cli::pg_session& db, const names& n, const check_limits& limits) {
  const std::string slack = std::to_string(limits.slack.count()) + " seconds";
  const std::string attempt_limit = std::to_string((limits.attempt_limit + limits.slack).count()) + " seconds";
  nlohmann::json out;
  out["jobs_enqueued"] = count(db, n, "SELECT count(*) FROM @r@.orders");
  out["jobs_rolled_back"] = count(db, n, "SELECT count(*) FROM @r@.rolled_back");
  out["completed"] = count(db, n, "SELECT count(*) FROM @r@.orders o JOIN @t@.jobs j ON j.id = o.job_id "
                                  "WHERE j.state = 'completed'");
  out["failed_as_designed"] = count(db, n, "SELECT count(*) FROM @r@.orders o JOIN @t@.jobs j ON j.id = o.job_id "
                                           "WHERE j.state = 'failed' AND o.kind = 'fail'");
  out["failed_otherwise"] = count(db, n, "SELECT count(*) FROM @r@.orders o JOIN @t@.jobs j ON j.id = o.job_id "
                                         "WHERE j.state = 'failed' AND o.kind <> 'fail'");
  out["cancelled"] = count(db, n, "SELECT count(*) FROM @r@.orders o JOIN @t@.jobs j ON j.id = o.job_id "
                                  "WHERE j.state = 'cancelled'");
  out["pending_at_end"] = count(db, n, "SELECT count(*) FROM @r@.orders o JOIN @t@.jobs j ON j.id = o.job_id "
                                       "WHERE j.state NOT IN ('completed', 'failed', 'cancelled')");
  out["executions"] = count(db, n, "SELECT count(*) FROM @r@.executions");
  out["jobs_run_more_than_once"] =
      count(db, n, "SELECT count(*) FROM (SELECT job_id FROM @r@.executions GROUP BY job_id "
                   "HAVING count(DISTINCT run_lease) > 1) x");
  out["caller_owned_completions"] = count(db, n, "SELECT count(*) FROM @r@.business");

  // A committed job that tenure no longer knows, or that waits to be claimed far longer than a
  // live worker would leave it.
  out["lost"] = count(db, n,
                      "SELECT count(*) FROM @r@.orders o LEFT JOIN @t@.jobs j ON j.id = o.job_id "
                      "WHERE j.id IS NULL OR (j.state IN ('available', 'scheduled', 'retryable') "
                      "AND j.run_at < now() - $1::interval)",
                      {slack});
  // More than one terminal transition of a job, or more than one committed caller-owned
  // completion (the soak never retries a finished job, so each is a second finalization).
  out["finalized_twice"] = count(db, n,
                                 "SELECT count(*) FROM (SELECT job_id FROM @r@.finals GROUP BY job_id "
                                 "HAVING count(*) > 1 UNION SELECT job_id FROM @r@.business GROUP BY job_id "
                                 "HAVING count(*) > 1) x");
  // A business row committed by an attempt that is not the one that completed its job.
  out["business_without_completion"] = count(db, n,
                                             "SELECT count(*) FROM @r@.business b LEFT JOIN @t@.jobs j ON j.id = b.job_id "
                                             "WHERE j.state IS DISTINCT FROM 'completed' OR j.run_lease <> b.run_lease");
  // A caller-owned job completed without the business row of its completing attempt.
  out["completion_without_business"] =
      count(db, n,
            "SELECT count(*) FROM @r@.orders o JOIN @t@.jobs j ON j.id = o.job_id "
            "WHERE o.caller_owned AND j.state = 'completed' AND NOT EXISTS "
            "(SELECT 1 FROM @r@.business b WHERE b.job_id = j.id AND b.run_lease = j.run_lease)");
  // A job of a rolled-back transaction that exists, ran or was finalized.
  out["rolled_back_ran"] = count(db, n,
                                 "SELECT count(*) FROM @r@.rolled_back r WHERE "
                                 "EXISTS (SELECT 1 FROM @t@.jobs j WHERE j.id = r.job_id) OR "
                                 "EXISTS (SELECT 1 FROM @r@.executions e WHERE e.job_id = r.job_id) OR "
                                 "EXISTS (SELECT 1 FROM @r@.finals f WHERE f.job_id = r.job_id)");
  // An attempt still open long after anything in the workload may hold one (handler waits,
  // hard deadline, callback timeouts, plus the rescue bound and slack).
  out["stuck_attempts"] = count(db, n,
                                "SELECT count(*) FROM @t@.jobs j WHERE j.state IN ('running', 'waiting_external') "
                                "AND j.claimed_at < now() - $1::interval",
                                {attempt_limit});

  nlohmann::json by_kind = nlohmann::json::object();
  for (const auto& row : db.query(sql(n,
                                      "SELECT o.kind, count(*), count(*) FILTER (WHERE j.state = 'completed'), "
                                      "count(*) FILTER (WHERE j.state = 'failed'), "
                                      "count(*) FILTER (WHERE j.state = 'cancelled') "
                                      "FROM @r@.orders o LEFT JOIN @t@.jobs j ON j.id = o.job_id "
                                      "GROUP BY o.kind ORDER BY o.kind"),
                                  {}, "soak: check")) {
    by_kind[*row[0]] = {{"enqueued", std::stol(*row[1])},
                        {"completed", std::stol(*row[2])},
                        {"failed", std::stol(*row[3])},
                        {"cancelled", std::stol(*row[4])}};
  }
  out["by_kind"] = by_kind;
  return out;
}

}  // namespace tenure::soak
