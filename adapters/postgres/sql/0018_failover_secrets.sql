-- tenure migration 18: the runtime's completion names its attempt by its secret too.
--
-- (job_id, run_lease) names one attempt as long as run leases are never issued twice. After a
-- failover to an asynchronous standby they can be: a claim the standby never received is lost
-- with the old primary's timeline, and the new primary advances the job's run lease to the same
-- value again, for another attempt (with another secret). The token-taking functions compare the
-- secret and refuse the lost attempt's holder (TN001); complete_batch matched the pair alone, so a
-- runtime that finished an attempt of the lost timeline and flushed its completion to the new
-- primary completed the other worker's attempt.
--
-- complete_batch now takes the attempts' secrets (as the claim returned them) in a fourth array;
-- an item whose secret is given completes the attempt only when it is the open attempt's secret,
-- and is stale otherwise. An item with a NULL secret (or no array at all, as callers of version
-- 16 send) is matched by (job_id, run_lease) as before.

-- DROP takes a function's grants with it: remember the roles that may run it and give it back to
-- them once it is created again (as migrations 9 and 14 do).
SELECT pg_catalog.set_config('tenure.migrate_grantees_complete_batch',
                             coalesce((SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', ')
                                         FROM pg_catalog.pg_proc p
                                        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
                                         JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
                                        WHERE p.oid = '@schema@.complete_batch(bigint[], bigint[], jsonb[])'::regprocedure
                                          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner), ''),
                             true);

DROP FUNCTION @schema@.complete_batch(bigint[], bigint[], jsonb[]);

-- As in migration 9, plus the secrets.
CREATE FUNCTION @schema@.complete_batch(job_ids bigint[], run_leases bigint[],
                                        progress jsonb[] DEFAULT NULL, secrets uuid[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(job_ids) IS DISTINCT FROM cardinality(run_leases)
     OR (complete_batch.progress IS NOT NULL
         AND cardinality(complete_batch.progress) IS DISTINCT FROM cardinality(job_ids))
     OR (complete_batch.secrets IS NOT NULL
         AND cardinality(complete_batch.secrets) IS DISTINCT FROM cardinality(job_ids)) THEN
    RAISE EXCEPTION 'tenure.complete_batch: arrays must have the same length' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  WITH input AS (
    SELECT DISTINCT ON (u.job_id, u.run_lease) u.job_id, u.run_lease, u.progress, u.secret
      FROM unnest(job_ids, run_leases, complete_batch.progress, complete_batch.secrets)
           AS u(job_id, run_lease, progress, secret)
     ORDER BY u.job_id, u.run_lease, u.progress IS NULL
  ), closed AS (
    DELETE FROM @schema@.receipts r
     USING input i LEFT JOIN @schema@.attempt_state s
             ON s.job_id = i.job_id AND s.run_lease = i.run_lease
     WHERE r.job_id = i.job_id AND r.run_lease = i.run_lease AND s.waiting IS NOT TRUE
       AND (i.secret IS NULL OR r.secret = i.secret)
    RETURNING r.*, coalesce(i.progress, s.progress) AS final_progress
  )
  INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                             run_lease, run_at, created_at, finalized_at, last_error, progress, metadata)
  SELECT c.job_id, c.queue, c.kind, c.args, 'completed', c.priority, c.attempt, c.max_attempts,
         c.run_lease, c.run_at, c.created_at, now(), c.last_error,
         coalesce(c.final_progress, c.progress), c.metadata
    FROM closed c
  RETURNING id, run_lease, finalized_at;
END $$;

DO $$
BEGIN
  IF pg_catalog.current_setting('tenure.migrate_grantees_complete_batch') <> '' THEN
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.complete_batch(bigint[], bigint[], jsonb[], uuid[]) TO '
            || pg_catalog.current_setting('tenure.migrate_grantees_complete_batch');
  END IF;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
