-- tenure migration 29: a heartbeat leaves a parked attempt's heartbeat_at alone.
--
-- A runtime collects a heartbeat from the attempts in flight and sends it from its database pool.
-- A handler that parks is in flight until the park has answered, so a heartbeat collected just
-- before could reach the server after the park committed and move the parked attempt's
-- heartbeat_at, and answer it live, though no handler holds it any more. Nothing decides on a
-- parked attempt's heartbeat_at (rescue waits for its callback deadline), but the row said a
-- handler had beaten after it parked.
--
-- heartbeat_batch now keeps heartbeat_at of an attempt whose attempt_state says no_handler and
-- leaves it out of its answer (heartbeat(token) answers false for it). Progress it carries is
-- still kept: a handler's last progress before it parked reaches the continuation whichever of
-- the two statements ran first.
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
  ), beaten AS (
    INSERT INTO @schema@.attempt_state AS s (job_id, run_lease, heartbeat_at, progress)
    SELECT i.job_id, i.run_lease, now(), i.progress
      FROM input i
     CROSS JOIN LATERAL (
           SELECT c.claim_id, (i.run_lease & 65535)::int AS pos
             FROM @schema@.claims c
            WHERE i.run_lease >= 65536 AND c.claim_id = i.run_lease >> 16
              AND c.job_ids[(i.run_lease & 65535)::int] = i.job_id AND c.run_leases IS NULL
           UNION ALL
           SELECT l.claim_id, l.pos
             FROM @schema@.legacy_attempts l
            WHERE i.run_lease < 65536 AND l.job_id = i.job_id AND l.run_lease = i.run_lease) a
     WHERE NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos)
     ORDER BY i.job_id
    ON CONFLICT (job_id, run_lease) DO UPDATE
      SET heartbeat_at = CASE WHEN s.no_handler THEN s.heartbeat_at ELSE excluded.heartbeat_at END,
          progress = coalesce(excluded.progress, s.progress)
    RETURNING s.job_id, s.run_lease, s.no_handler
  )
  SELECT b.job_id, b.run_lease FROM beaten b WHERE NOT b.no_handler;
END $$;
