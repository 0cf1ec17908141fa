-- tenure migration 21: promotion of due jobs reads only the rows it moves, whatever the statistics.
--
-- promote_due picks the due jobs of `deferred` (`ORDER BY run_at LIMIT max_jobs FOR UPDATE SKIP
-- LOCKED`) and moves them into `ready`. On the statistics a VACUUM leaves after `deferred` emptied
-- (no pages or no live rows), a burst of scheduled jobs that fall due together planned badly in
-- both halves of the statement: the pick as a bitmap scan of every due row and a sort of them all
-- to keep the first max_jobs, and the delete of the picked rows (a join on id) as a hash join over
-- a full scan of `deferred_pkey`. Each promotion then read every due job: ~72 ms instead of ~7 for
-- 1,000 of 300,000 due, in every pass of the leader (which promotes up to 10,000 at a time) until
-- autoanalyze caught up. The pick now may only walk a due index in run_at order (no bitmap scan,
-- no sort), and the delete names the locked rows by ctid (a TID scan). Rows of `deferred` are only
-- ever inserted and deleted, so a locked row's address is its own until the transaction ends
-- (migration 20 does the same for the claim). Signature, result and grants unchanged.

CREATE OR REPLACE FUNCTION @schema@.promote_due(queue text DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_bitmapscan = off SET enable_sort = off AS $$
#variable_conflict use_column
DECLARE
  n bigint;
BEGIN
  WITH moved AS (
    DELETE FROM @schema@.deferred d
     WHERE d.ctid = ANY (ARRAY(SELECT p.ctid FROM @schema@.deferred p
                                WHERE (promote_due.queue IS NULL OR p.queue = promote_due.queue)
                                  AND p.run_at <= now()
                                ORDER BY p.run_at
                                LIMIT promote_due.max_jobs
                                FOR UPDATE SKIP LOCKED))
    RETURNING d.*
  )
  INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                              run_at, created_at, last_error, progress, metadata)
  SELECT id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at,
         last_error, progress, metadata
    FROM moved;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF promote_due.queue IS NULL THEN
    -- Maintenance pass: forget idle registrations nobody refreshed (their worker is gone), and
    -- sweep the materialized state of attempts that are closed.
    DELETE FROM @schema@.waiters w WHERE w.since < now() - interval '5 minutes';
    DELETE FROM @schema@.attempt_state s
     WHERE NOT EXISTS (SELECT 1 FROM @schema@.receipts r
                        WHERE r.job_id = s.job_id AND r.run_lease = s.run_lease);
  END IF;
  RETURN n;
END $$;
