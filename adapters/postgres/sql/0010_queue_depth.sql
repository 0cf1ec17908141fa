-- tenure migration 10: what the runtime's metrics read from the database.
--
-- claim_attempts returns one more column, available_at: when the job became claimable (its
--   run_at, or its created_at when later), so the worker measures pickup latency from there. A
--   returned row type cannot change in place: the function is dropped and created again, and
--   the roles that could run it (those `tenure grant-worker` gave it to) get it back.
-- queue_depths() counts every queue's unfinished jobs per state (available, scheduled,
--   retryable, running, waiting_external) and the age of its oldest available job, in one
--   statement; the maintenance leader reads it once per pass for its gauges. The same roles may
--   run it (`tenure grant-worker` gives it too).

SELECT pg_catalog.set_config('tenure.migrate_claim_grantees',
                             coalesce(pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', '), ''),
                             true)
  FROM pg_catalog.pg_proc p
 CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
  JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
 WHERE p.oid = '@schema@.claim_attempts(text, int, text, text)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

-- As in migration 9, plus available_at.
DROP FUNCTION @schema@.claim_attempts(text, int, text, text);
CREATE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
                                        idle_mode text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, max_attempts int,
              deadline_at timestamptz, secret uuid, metadata jsonb, available_at timestamptz)
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
  PERFORM pg_advisory_xact_lock_shared(hashtext('@schema@.queue_claims'), hashtext(claim_attempts.queue));
  IF EXISTS (SELECT 1 FROM @schema@.queues q WHERE q.name = claim_attempts.queue AND q.paused) THEN
    RETURN;
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
                                   worker, last_error, progress, secret, metadata)
    SELECT m.id, m.run_lease + 1, m.queue, m.kind, m.args, m.priority, m.attempt + 1,
           m.max_attempts, m.run_at, m.created_at, now(),
           now() + (SELECT q.hard_deadline FROM @schema@.queues q WHERE q.name = claim_attempts.queue),
           claim_attempts.worker, m.last_error, m.progress, gen_random_uuid(), m.metadata
      FROM moved m
    RETURNING job_id, run_lease, kind, args, attempt, max_attempts, deadline_at, secret, metadata, priority, run_at,
              created_at
  )
  SELECT o.job_id, o.run_lease, o.kind, o.args, o.attempt, o.max_attempts, o.deadline_at, o.secret,
         o.metadata, greatest(o.run_at, o.created_at)
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

-- Every queue with an unfinished job or stored settings; a state with no job counts 0, and
-- oldest_available is 0 when nothing is available. Reads the unfinished tables once each.
CREATE FUNCTION @schema@.queue_depths()
RETURNS TABLE(queue text, available bigint, scheduled bigint, retryable bigint, running bigint,
              waiting_external bigint, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH c AS (
    SELECT r.queue, count(*) AS available, 0::bigint AS scheduled, 0::bigint AS retryable,
           0::bigint AS running, 0::bigint AS waiting, min(greatest(r.run_at, r.created_at)) AS since
      FROM @schema@.ready r GROUP BY r.queue
    UNION ALL
    SELECT d.queue, 0, count(*) FILTER (WHERE d.state = 'scheduled'), count(*) FILTER (WHERE d.state = 'retryable'),
           0, 0, NULL
      FROM @schema@.deferred d GROUP BY d.queue
    UNION ALL
    SELECT r.queue, 0, 0, 0, count(*) FILTER (WHERE s.waiting IS NOT TRUE), count(*) FILTER (WHERE s.waiting), NULL
      FROM @schema@.receipts r
      LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
     GROUP BY r.queue
    UNION ALL
    SELECT q.name, 0, 0, 0, 0, 0, NULL FROM @schema@.queues q
  )
  SELECT c.queue, sum(c.available)::bigint, sum(c.scheduled)::bigint, sum(c.retryable)::bigint,
         sum(c.running)::bigint, sum(c.waiting)::bigint,
         coalesce(greatest(clock_timestamp() - min(c.since), '0'::interval), '0'::interval)
    FROM c GROUP BY c.queue ORDER BY c.queue
$$;


DO $$
BEGIN
  IF pg_catalog.current_setting('tenure.migrate_claim_grantees') <> '' THEN
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.claim_attempts(text, int, text, text) TO '
            || pg_catalog.current_setting('tenure.migrate_claim_grantees');
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.queue_depths() TO '
            || pg_catalog.current_setting('tenure.migrate_claim_grantees');
  END IF;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
