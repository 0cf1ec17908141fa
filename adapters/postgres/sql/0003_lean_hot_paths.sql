-- tenure migration 3: claim, completion and heartbeats do less work per job. Same contract, same
-- results, same locks; only the statements' shapes and plans change. Instructions per job
-- before and after are measured by bench/sql_cost (README, "Server work per job").
--
-- claim_attempts: the picked ids go to the DELETE as one array (an index probe per id), and the
--   queue's hard deadline is read once per claim instead of joined to every row. That shape
--   plans the same for any batch size, so the function keeps one generic plan instead of
--   planning the statement (and copying the plan) on every call, as custom plans did.
-- complete_batch, heartbeat_batch: receipts are found through their primary key
--   (job_id = ANY(job_ids)).
-- None of them reads a table sequentially (enable_seqscan = off, set on the functions, so it
-- applies to their own statements only): between two vacuums ready and receipts still hold every
-- row moved out since the last one, and a sequential scan's cost grows with them, while a plan
-- cached when the table was small would keep choosing one.

CREATE OR REPLACE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
                                                   idle_mode text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, max_attempts int,
              deadline_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  n int;
BEGIN
  IF claim_attempts.queue IS NULL THEN
    RAISE EXCEPTION 'tenure.claim: queue must not be NULL' USING ERRCODE = '22023';
  END IF;
  IF claim_attempts.max_jobs IS NULL OR claim_attempts.max_jobs < 1 OR claim_attempts.max_jobs > 10000 THEN
    RAISE EXCEPTION 'tenure.claim: max_jobs must be between 1 and 10000 (got %)', claim_attempts.max_jobs
      USING ERRCODE = '22023';
  END IF;
  -- Promotion is a write statement; a probe of the due index is enough when nothing is due.
  IF EXISTS (SELECT 1 FROM @schema@.deferred d
              WHERE d.queue = claim_attempts.queue AND d.run_at <= now()) THEN
    PERFORM @schema@.promote_due(claim_attempts.queue, 1000);
  END IF;
  RETURN QUERY
  WITH moved AS (
    DELETE FROM @schema@.ready r
     WHERE r.id = ANY (ARRAY(SELECT p.id FROM @schema@.ready p
                              WHERE p.queue = claim_attempts.queue
                              ORDER BY p.priority, p.id
                              LIMIT claim_attempts.max_jobs
                              FOR UPDATE SKIP LOCKED))
    RETURNING r.*
  ), opened AS (
    INSERT INTO @schema@.receipts (job_id, run_lease, queue, kind, args, priority, attempt,
                                   max_attempts, run_at, created_at, claimed_at, deadline_at,
                                   worker, last_error, progress)
    SELECT m.id, m.run_lease + 1, m.queue, m.kind, m.args, m.priority, m.attempt + 1,
           m.max_attempts, m.run_at, m.created_at, now(),
           now() + (SELECT q.hard_deadline FROM @schema@.queues q WHERE q.name = claim_attempts.queue),
           claim_attempts.worker, m.last_error, m.progress
      FROM moved m
    RETURNING job_id, run_lease, kind, args, attempt, max_attempts, deadline_at, priority
  )
  SELECT o.job_id, o.run_lease, o.kind, o.args, o.attempt, o.max_attempts, o.deadline_at
    FROM opened o ORDER BY o.priority, o.job_id;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF claim_attempts.idle_mode IS NOT NULL AND claim_attempts.worker IS NOT NULL THEN
    IF n = 0 AND claim_attempts.idle_mode = 'sleep' THEN
      INSERT INTO @schema@.waiters AS w (queue, worker) VALUES (claim_attempts.queue, claim_attempts.worker)
      ON CONFLICT (queue, worker) DO UPDATE SET since = now() WHERE w.since < now() - interval '1 minute';
    ELSIF n > 0 AND EXISTS (SELECT 1 FROM @schema@.waiters w
                             WHERE w.queue = claim_attempts.queue AND w.worker = claim_attempts.worker) THEN
      DELETE FROM @schema@.waiters w WHERE w.queue = claim_attempts.queue AND w.worker = claim_attempts.worker;
    END IF;
  END IF;
END $$;

-- As in migration 2 (a waiting attempt is not completed by its token), with the receipts found
-- through their key.
CREATE OR REPLACE FUNCTION @schema@.complete_batch(job_ids bigint[], run_leases bigint[],
                                                   progress jsonb[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(job_ids) IS DISTINCT FROM cardinality(run_leases)
     OR (complete_batch.progress IS NOT NULL
         AND cardinality(complete_batch.progress) IS DISTINCT FROM cardinality(job_ids)) THEN
    RAISE EXCEPTION 'tenure.complete_batch: arrays must have the same length' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  WITH input AS (
    SELECT DISTINCT ON (u.job_id, u.run_lease) u.job_id, u.run_lease, u.progress
      FROM unnest(job_ids, run_leases, complete_batch.progress) AS u(job_id, run_lease, progress)
     ORDER BY u.job_id, u.run_lease, u.progress IS NULL
  ), closed AS (
    DELETE FROM @schema@.receipts r
     USING input i LEFT JOIN @schema@.attempt_state s
             ON s.job_id = i.job_id AND s.run_lease = i.run_lease
     WHERE r.job_id = ANY (complete_batch.job_ids)
       AND r.job_id = i.job_id AND r.run_lease = i.run_lease AND s.waiting IS NOT TRUE
    RETURNING r.*, coalesce(i.progress, s.progress) AS final_progress
  )
  INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                             run_lease, run_at, created_at, finalized_at, last_error, progress)
  SELECT c.job_id, c.queue, c.kind, c.args, 'completed', c.priority, c.attempt, c.max_attempts,
         c.run_lease, c.run_at, c.created_at, now(), c.last_error,
         coalesce(c.final_progress, c.progress)
    FROM closed c
  RETURNING id, run_lease, finalized_at;
END $$;

-- Heartbeats for every in-flight attempt, once per interval: the same key probe as completion.
CREATE OR REPLACE FUNCTION @schema@.heartbeat_batch(job_ids bigint[], run_leases bigint[],
                                                    progress jsonb[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(job_ids) IS DISTINCT FROM cardinality(run_leases)
     OR (heartbeat_batch.progress IS NOT NULL
         AND cardinality(heartbeat_batch.progress) IS DISTINCT FROM cardinality(job_ids)) THEN
    RAISE EXCEPTION 'tenure.heartbeat_batch: arrays must have the same length' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  WITH input AS (
    SELECT DISTINCT ON (u.job_id, u.run_lease) u.job_id, u.run_lease, u.progress
      FROM unnest(job_ids, run_leases, heartbeat_batch.progress) AS u(job_id, run_lease, progress)
     ORDER BY u.job_id, u.run_lease, u.progress IS NULL
  )
  INSERT INTO @schema@.attempt_state AS s (job_id, run_lease, heartbeat_at, progress)
  SELECT r.job_id, r.run_lease, now(), i.progress
    FROM @schema@.receipts r JOIN input i ON i.job_id = r.job_id AND i.run_lease = r.run_lease
   WHERE r.job_id = ANY (heartbeat_batch.job_ids)
   ORDER BY r.job_id
  ON CONFLICT (job_id, run_lease) DO UPDATE
    SET heartbeat_at = excluded.heartbeat_at, progress = coalesce(excluded.progress, s.progress)
  RETURNING s.job_id, s.run_lease;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
