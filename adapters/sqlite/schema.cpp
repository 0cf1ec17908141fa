// The SQLite fake's schema: the PostgreSQL store's tables and its jobs view, in SQLite's dialect.
#include "rows.hpp"

namespace tenure::sqlite::detail {

const std::vector<std::string>& schema_statements() {
  static const std::vector<std::string> statements = {
      // Durations and timestamps are int64 microseconds (timestamps from the injected clock).
      "CREATE TABLE queues ("
      " name TEXT PRIMARY KEY, dead_letter INTEGER NOT NULL DEFAULT 0, hard_deadline INTEGER,"
      " backoff_base INTEGER NOT NULL DEFAULT 1000000,"
      " backoff_cap INTEGER NOT NULL DEFAULT 3600000000,"
      " CHECK (hard_deadline IS NULL OR hard_deadline > 0),"
      " CHECK (backoff_base >= 0 AND backoff_cap >= backoff_base))",
      // PostgreSQL's job_id_seq. Unlike a sequence it rolls back with its transaction; ids are
      // still never handed out twice.
      "CREATE TABLE job_id_seq (last_value INTEGER NOT NULL)",
      "INSERT INTO job_id_seq (last_value) VALUES (0)",
      "CREATE TABLE ready ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " last_error TEXT, progress TEXT, metadata TEXT NOT NULL DEFAULT '{}',"
      " resume_payload TEXT)",  // set: the continuation of a parked attempt (same attempt)
      "CREATE INDEX ready_claim_idx ON ready (queue, priority, id)",
      "CREATE TABLE deferred ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " last_error TEXT, progress TEXT, metadata TEXT NOT NULL DEFAULT '{}',"
      " state TEXT NOT NULL CHECK (state IN ('scheduled', 'retryable')),"
      " resume_payload TEXT)",  // a continuation retried or snoozed (as in ready)
      "CREATE INDEX deferred_queue_due_idx ON deferred (queue, run_at)",
      "CREATE INDEX deferred_due_idx ON deferred (run_at)",
      "CREATE TABLE receipts ("
      " job_id INTEGER NOT NULL, run_lease INTEGER NOT NULL, queue TEXT NOT NULL,"
      " kind TEXT NOT NULL, args TEXT NOT NULL, priority INTEGER NOT NULL,"
      " attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL, run_at INTEGER NOT NULL,"
      " created_at INTEGER NOT NULL, claimed_at INTEGER NOT NULL, deadline_at INTEGER,"
      " worker TEXT, last_error TEXT, progress TEXT,"
      " secret TEXT NOT NULL,"  // the attempt's secret, 32 hex digits
      " metadata TEXT NOT NULL DEFAULT '{}',"
      " resume_payload TEXT,"  // a continuation's payload (PostgreSQL: claims.resume_payloads)
      " PRIMARY KEY (job_id, run_lease))",
      // No foreign key, as in the SQL; this fake deletes an attempt's row when it closes.
      "CREATE TABLE attempt_state ("
      " job_id INTEGER NOT NULL, run_lease INTEGER NOT NULL, heartbeat_at INTEGER NOT NULL,"
      " progress TEXT, PRIMARY KEY (job_id, run_lease))",
      // An open attempt's callback (PostgreSQL keeps it in attempt_state); times in microseconds.
      "CREATE TABLE callbacks ("
      " callback_id TEXT PRIMARY KEY, job_id INTEGER NOT NULL, run_lease INTEGER NOT NULL,"
      " timeout INTEGER NOT NULL, deadline INTEGER, waiting INTEGER NOT NULL DEFAULT 0,"
      " parked INTEGER NOT NULL DEFAULT 0, resumed INTEGER NOT NULL DEFAULT 0, payload TEXT,"
      " UNIQUE (job_id, run_lease))",
      "CREATE TABLE done ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " state TEXT NOT NULL CHECK (state IN ('completed', 'failed', 'cancelled')),"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " finalized_at INTEGER NOT NULL, last_error TEXT, progress TEXT,"
      " metadata TEXT NOT NULL DEFAULT '{}')",
      "CREATE TABLE dead_letter ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " finalized_at INTEGER NOT NULL, last_error TEXT, progress TEXT,"
      " metadata TEXT NOT NULL DEFAULT '{}')",
      // Each keyed job's unique key. The job of (queue, unique_key) that is live holds it: this
      // fake serializes its writers, so no lock table is needed.
      "CREATE TABLE job_keys ("
      " job_id INTEGER PRIMARY KEY, queue TEXT NOT NULL, unique_key TEXT NOT NULL)",
      "CREATE INDEX job_keys_key_idx ON job_keys (queue, unique_key)",
      "CREATE VIEW jobs AS"
      " SELECT id, queue, kind, args, 'available' AS state, priority, attempt, max_attempts,"
      "        run_lease, run_at, created_at, NULL AS finalized_at, last_error, progress,"
      "        0 AS dead_lettered, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = ready.id) AS unique_key FROM ready"
      " UNION ALL"
      " SELECT id, queue, kind, args, state, priority, attempt, max_attempts, run_lease, run_at,"
      "        created_at, NULL, last_error, progress, 0, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = deferred.id) FROM deferred"
      " UNION ALL"
      " SELECT r.job_id, r.queue, r.kind, r.args,"
      "        CASE WHEN EXISTS (SELECT 1 FROM callbacks c WHERE c.job_id = r.job_id"
      "                            AND c.run_lease = r.run_lease AND c.waiting)"
      "             THEN 'waiting_external' ELSE 'running' END, r.priority, r.attempt,"
      "        r.max_attempts, r.run_lease, r.run_at, r.created_at, NULL, r.last_error,"
      "        coalesce(s.progress, r.progress), 0, r.metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = r.job_id)"
      "   FROM receipts r LEFT JOIN attempt_state s"
      "     ON s.job_id = r.job_id AND s.run_lease = r.run_lease"
      " UNION ALL"
      " SELECT id, queue, kind, args, state, priority, attempt, max_attempts, run_lease, run_at,"
      "        created_at, finalized_at, last_error, progress, 0, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = done.id) FROM done"
      " UNION ALL"
      " SELECT id, queue, kind, args, 'failed', priority, attempt, max_attempts, run_lease,"
      "        run_at, created_at, finalized_at, last_error, progress, 1, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = dead_letter.id) FROM dead_letter",
      "PRAGMA user_version = " + std::to_string(k_schema_version),
  };
  return statements;
}

}  // namespace tenure::sqlite::detail
