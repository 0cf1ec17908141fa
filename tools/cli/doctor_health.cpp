// tenure doctor: whether the background work runs (rescue, pruning, claims), whether the tables
// get vacuumed, and whether the connection suits a runtime.
#include <string>

#include "cli/context.hpp"
#include "cli/doctor_checks.hpp"
#include "tenure/postgres/session_probe.hpp"

namespace tenure::cli::doctor {
namespace {

/// Who holds the maintenance lease, as a clause for a finding, and whether it is live.
struct lease {
  bool live = false;
  std::string said;
};

lease maintenance_lease(pg_session& db, const std::string& s) {
  const auto rows = db.query(
      "SELECT holder, expires_at > clock_timestamp(), "
      "       CASE WHEN isfinite(expires_at) THEN extract(epoch FROM clock_timestamp() - expires_at) END, term "
      "  FROM " + s + ".leadership WHERE name = 'maintenance'",
      {}, "cannot read the maintenance lease");
  lease out;
  if (rows.empty() || text_of(rows[0][0]).empty()) {
    out.said = "no process has ever held the maintenance lease";
    return out;
  }
  const auto& r = rows[0];
  out.live = text_of(r[1]) == "t";
  out.said = out.live ? "the maintenance lease is held by " + text_of(r[0]) + " (term " + text_of(r[3]) + ")"
                      : "no process holds the maintenance lease (last held by " + text_of(r[0]) +
                            (r[2] ? ", expired " + age_text(seconds_of(r[2])) + " ago)" : ")");
  return out;
}

const char* k_start_maintenance =
    "run a tenure runtime (its maintenance leader rescues, promotes and prunes), or `tenure maintain --interval 10s` "
    "as a service";

}  // namespace

findings check_stale_attempts(pg_session& db, const settings& st) {
  const std::string s = db.quote_ident(st.schema);
  // The attempts rescue_attempts(stale_after) would close, oldest silence first.
  const auto rows = db.query(
      "WITH stale AS ("
      "  SELECT r.job_id, r.run_lease, r.queue, r.worker, "
      "         extract(epoch FROM now() - coalesce(a.heartbeat_at, r.claimed_at)) AS silent, "
      "         CASE WHEN coalesce(a.waiting, false) THEN 'callback timed out' "
      "              WHEN r.deadline_at <= now() THEN 'hard deadline passed' ELSE 'no heartbeat' END AS why "
      "    FROM " + s + ".receipts r "
      "    LEFT JOIN " + s + ".attempt_state a ON a.job_id = r.job_id AND a.run_lease = r.run_lease "
      "   WHERE (NOT coalesce(a.waiting, false) "
      "          AND (coalesce(a.heartbeat_at, r.claimed_at) + $1::interval <= now() OR r.deadline_at <= now())) "
      "      OR (a.waiting AND a.callback_deadline <= now())) "
      "SELECT (SELECT count(*) FROM stale), (SELECT count(*) FROM " + s + ".receipts), "
      "       job_id, run_lease, queue, worker, silent, why "
      "  FROM (SELECT 1) one LEFT JOIN (SELECT * FROM stale ORDER BY silent DESC, job_id LIMIT 5) x ON true",
      {interval_literal(st.stale_after)}, "cannot read the open attempts");
  const long long stale = rows.empty() ? 0 : integer_of(rows[0][0]);
  const long long open = rows.empty() ? 0 : integer_of(rows[0][1]);
  if (stale == 0) {
    return {finding{"stale_attempts", severity::ok,
                    std::to_string(open) + " open attempt(s), none past its staleness (" +
                        age_text(std::chrono::duration<double>(st.stale_after).count()) + " without heartbeat)"}};
  }
  const auto l = maintenance_lease(db, s);
  finding f{"stale_attempts", l.live ? severity::warning : severity::error};
  auto examples = nlohmann::ordered_json::array();
  std::string listed;
  for (const auto& r : rows) {
    examples.push_back({{"job_id", integer_of(r[2])}, {"run_lease", integer_of(r[3])}, {"queue", text_of(r[4])},
                        {"worker", r[5] ? nlohmann::ordered_json(*r[5]) : nlohmann::ordered_json()},
                        {"silent_seconds", seconds_of(r[6])}, {"why", text_of(r[7])}});
    listed += (listed.empty() ? "" : "; ") + std::string{"job "} + text_of(r[2]) + " (queue " + text_of(r[4]) +
              ", worker " + (r[5] ? *r[5] : "unnamed") + ", " + text_of(r[7]) + ", silent " +
              age_text(seconds_of(r[6])) + ")";
  }
  f.details = {{"stale", stale}, {"open", open}, {"maintenance_lease_live", l.live}, {"oldest", examples}};
  f.found = std::to_string(stale) + " open attempt(s) past their staleness (no heartbeat for " +
            age_text(std::chrono::duration<double>(st.stale_after).count()) + ", or a deadline passed)" +
            (stale > 5 ? ", the 5 oldest: " : ": ") + listed +
            ". Their workers are gone and rescue has not closed them: " + l.said;
  f.fix = l.live ? "the lease holder's passes are not rescuing them (frozen, or its staleness is longer than "
                   "--stale-after): check that process; once its lease has expired, `tenure maintain --once` "
                   "rescues them"
                 : std::string{k_start_maintenance} + "; `tenure maintain --once` rescues them now";
  return {f};
}

findings check_queue_age(pg_session& db, const settings& st) {
  const std::string s = db.quote_ident(st.schema);
  const auto rows = db.query(
      // The available jobs: ready rows, and the untaken ids of bulk batches' run rows.
      "SELECT r.queue, sum(r.n), extract(epoch FROM clock_timestamp() - min(r.since)), "
      "       coalesce(bool_or(q.paused), false) "
      "  FROM (SELECT queue, 1 AS n, run_at AS since FROM " + s + ".ready "
      "        UNION ALL "
      "        SELECT queue, cardinality(job_ids) - taken, created_at FROM " + s + ".runs) r "
      "  LEFT JOIN " + s + ".queues q ON q.name = r.queue "
      " GROUP BY r.queue ORDER BY 3 DESC, 1",
      {}, "cannot read the available jobs");
  const double limit = std::chrono::duration<double>(st.max_queue_age).count();
  findings problems;
  for (const auto& r : rows) {
    const double age = seconds_of(r[2]);
    if (age <= limit) continue;
    const std::string queue = text_of(r[0]);
    const bool paused = text_of(r[3]) == "t";
    finding f{"queue_age", paused ? severity::ok : severity::warning};
    f.details = {{"queue", queue}, {"available", integer_of(r[1])}, {"oldest_available_seconds", age},
                 {"paused", paused}};
    f.found = "queue " + queue + (paused ? " is paused; its" : ":") + " oldest available job has waited " +
              age_text(age) + " (" + text_of(r[1]) + " available), longer than " + age_text(limit);
    f.fix = paused ? "resume it when its jobs should run: tenure queue resume QUEUE"
                   : "no worker claims this queue, or too few do: start workers for it (check their queue names "
                     "and that they can reach the database)";
    problems.push_back(std::move(f));
  }
  return capped("queue_age", std::move(problems),
                "no queue's oldest available job has waited longer than " + age_text(limit) + " (" +
                    std::to_string(rows.size()) + " queue(s) with available jobs)");
}

findings check_retention(pg_session& db, const settings& st) {
  const std::string s = db.quote_ident(st.schema);
  // As prune_expired(stale_after) decides it: the queue's retention, never below the prune floor
  // (5 minutes or stale_after); then the grace a pass that runs now and then needs.
  const std::string keep =
      "greatest(%s, greatest($1::interval, '5 minutes'::interval))";
  auto kept = [&](const std::string& setting) {
    std::string k = keep;
    k.replace(k.find("%s"), 2, setting);
    return k;
  };
  const auto rows = db.query(
      "WITH expired AS ("
      "  SELECT d.queue, d.state, count(*) AS n, extract(epoch FROM now() - min(d.finalized_at)) AS oldest, k.keep "
      "    FROM " + s + ".done d LEFT JOIN " + s + ".queues q ON q.name = d.queue "
      "    CROSS JOIN LATERAL (SELECT " +
          kept("CASE d.state WHEN 'completed' THEN coalesce(q.retain_completed, '24 hours') "
               "WHEN 'cancelled' THEN coalesce(q.retain_cancelled, '24 hours') "
               "ELSE coalesce(q.retain_failed, '7 days') END") + " AS keep) k "
      "   WHERE d.finalized_at < now() - k.keep - $2::interval GROUP BY d.queue, d.state, k.keep "
      "  UNION ALL "
      "  SELECT d.queue, 'dead-lettered', count(*), extract(epoch FROM now() - min(d.finalized_at)), k.keep "
      "    FROM " + s + ".dead_letter d LEFT JOIN " + s + ".queues q ON q.name = d.queue "
      "    CROSS JOIN LATERAL (SELECT " + kept("coalesce(q.retain_failed, '7 days')") + " AS keep) k "
      "   WHERE d.finalized_at < now() - k.keep - $2::interval GROUP BY d.queue, k.keep) "
      "SELECT queue, state, n, oldest, extract(epoch FROM keep) FROM expired ORDER BY n DESC, queue, state",
      {interval_literal(st.stale_after), interval_literal(st.retention_grace)}, "cannot read the finished jobs");
  findings problems;
  std::optional<lease> l;
  for (const auto& r : rows) {
    if (!l) l = maintenance_lease(db, s);
    const std::string queue = text_of(r[0]), state = text_of(r[1]);
    finding f{"retention", severity::warning};
    f.details = {{"queue", queue}, {"state", state}, {"expired", integer_of(r[2])},
                 {"oldest_finished_seconds", seconds_of(r[3])}, {"retention_seconds", seconds_of(r[4])},
                 {"maintenance_lease_live", l->live}};
    f.found = "queue " + queue + ": " + text_of(r[2]) + " " + state + " job(s) kept past their retention of " +
              age_text(seconds_of(r[4])) + " (plus " +
              age_text(std::chrono::duration<double>(st.retention_grace).count()) + " grace), the oldest finished " +
              age_text(seconds_of(r[3])) + " ago: pruning is not running or not keeping up; " + l->said;
    f.fix = l->live ? "the lease holder's passes prune at most 50,000 jobs each: check that its passes run "
                      "(`tenure maintain --once` when no runtime leads)"
                    : std::string{k_start_maintenance} + " (`tenure maintain --once` prunes up to 50,000 now)";
    problems.push_back(std::move(f));
  }
  return capped("retention", std::move(problems),
                "no finished job is kept past its queue's retention (plus " +
                    age_text(std::chrono::duration<double>(st.retention_grace).count()) + " grace)");
}

findings check_vacuum(pg_session& db, const settings& st) {
  findings problems;
  const auto global = db.query("SELECT current_setting('autovacuum'), current_setting('track_counts')", {},
                               "cannot read the autovacuum settings");
  for (const auto& [name, value] : {std::pair{"autovacuum", text_of(global.at(0)[0])},
                                    std::pair{"track_counts", text_of(global.at(0)[1])}}) {
    if (value == "on") continue;
    problems.push_back({"vacuum", severity::error,
                        std::string{name} + " is off for the whole server: no table is vacuumed automatically, "
                                            "and tenure's queue tables fill with dead rows",
                        std::string{"set "} + name + " = on in postgresql.conf and reload",
                        {{"setting", name}, {"value", value}}});
  }
  const char* off = "~* '^(toast\\.)?autovacuum_enabled=(f|fa|fal|fals|false|n|no|of|off|0)$'";
  const auto rows = db.query(
      "SELECT c.oid::pg_catalog.regclass::text, coalesce(t.n_live_tup, 0), coalesce(t.n_dead_tup, 0), "
      "       extract(epoch FROM now() - greatest(t.last_autovacuum, t.last_vacuum)), "
      "       EXISTS (SELECT 1 FROM unnest(c.reloptions) o WHERE o " + std::string{off} + "), "
      "       EXISTS (SELECT 1 FROM unnest(x.reloptions) o WHERE o " + off + ") "
      "  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
      "  LEFT JOIN pg_catalog.pg_class x ON x.oid = c.reltoastrelid "
      "  LEFT JOIN pg_catalog.pg_stat_user_tables t ON t.relid = c.oid "
      " WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY 1",
      {st.schema}, "cannot read the table statistics");
  for (const auto& r : rows) {
    const std::string table = text_of(r[0]);
    const long long live = integer_of(r[1]), dead = integer_of(r[2]);
    const std::string vacuumed =
        r[3] ? "last vacuumed " + age_text(seconds_of(r[3])) + " ago" : "not vacuumed since statistics were reset";
    nlohmann::ordered_json details = {{"table", table}, {"live_rows", live}, {"dead_rows", dead},
                                      {"last_vacuum_seconds", r[3] ? nlohmann::ordered_json(seconds_of(r[3]))
                                                                   : nlohmann::ordered_json()}};
    if (text_of(r[4]) == "t" || text_of(r[5]) == "t") {
      const bool toast = text_of(r[4]) != "t";
      problems.push_back({"vacuum", severity::warning,
                          std::string{"autovacuum is disabled on "} + (toast ? "the TOAST table of " : "") + "table " +
                              table + ": its dead rows are never cleaned up automatically (" + vacuumed + ")",
                          "ALTER TABLE " + table + " RESET (" + (toast ? "toast." : "") + "autovacuum_enabled)",
                          details});
    }
    if (dead >= 10'000 && dead > live) {
      problems.push_back({"vacuum", severity::warning,
                          "table " + table + " holds " + std::to_string(dead) + " dead rows against " +
                              std::to_string(live) + " live ones (" + vacuumed +
                              "): vacuum is not keeping up, so claims and scans wade through dead rows",
                          "look for a long-open transaction (pg_stat_activity.xact_start) that keeps dead rows "
                          "from being removed; let autovacuum visit the table sooner (ALTER TABLE " + table +
                              " SET (autovacuum_vacuum_scale_factor = 0.01)); VACUUM " + table + " now",
                          details});
    }
  }
  return capped("vacuum", std::move(problems),
                "autovacuum is on and keeps up on the " + std::to_string(rows.size()) + " tables of schema " +
                    st.schema);
}

findings check_pooler(const settings& st) {
  auto kind = postgres::probe_session(st.dsn, st.session_wait);
  if (!kind) throw adapter_error("cannot probe the connection", kind.error());
  switch (kind.value()) {
    case postgres::session_kind::direct:
      return {finding{"pooler", severity::ok,
                      "the connection is a PostgreSQL session of its own (no pooler): a runtime can use it",
                      "", {{"session", "direct"}}}};
    case postgres::session_kind::pooled_session:
      return {finding{"pooler", severity::ok,
                      "the connection goes through a pooler that keeps one server session per client (session "
                      "mode): a runtime can use it",
                      "", {{"session", "pooled_session"}}}};
    case postgres::session_kind::pooled_without_session:
      break;
  }
  return {finding{"pooler", severity::warning,
                  "the connection goes through a pooler that does not keep a server session per client: a "
                  "notification sent to it did not arrive within " +
                      std::to_string(st.session_wait.count()) +
                      " ms, as behind pgbouncer pool_mode=transaction. A runtime given this DSN refuses to start "
                      "(it needs LISTEN/NOTIFY and its own session); producers, finalizers and the tenure command "
                      "work through it",
                  "give runtimes a direct DSN or one of a session-mode pool; keep this DSN for producers and "
                  "finalizers",
                  {{"session", "pooled_without_session"}}}};
}

}  // namespace tenure::cli::doctor
