-- tenure migration 26: the maintenance sweep of attempt_state passes by rows a heartbeat holds.
--
-- The maintenance pass deletes the attempt_state rows of attempts that are no longer open. A
-- heartbeat statement whose snapshot was taken before a completion committed still sees those
-- attempts open and writes their rows (in job order), so the two could each hold a row the other
-- wanted: the sweep waited for the heartbeat's transaction while the heartbeat waited for the
-- sweep's, and PostgreSQL broke the cycle after deadlock_timeout by failing one of them (the whole
-- maintenance pass, or a heartbeat of every attempt in its batch). The sweep now locks the rows
-- it deletes with SKIP LOCKED: a row a transaction holds is left for a later pass, so the sweep
-- never waits on attempt_state and cannot be part of such a cycle. Nothing reads a stale row as
-- evidence of an open attempt (every reader checks the claim item and its closures), so leaving
-- one for a second longer changes no answer.
--
-- The sweep is one function, sweep_attempt_state(), called by promote_due's maintenance form
-- and at the end of maintain (after rescue and retention, so it also takes the rows of attempts
-- this pass closed, and holds the row locks of what it deleted for the shortest time).

CREATE FUNCTION @schema@.sweep_attempt_state() RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH gone AS (
    DELETE FROM @schema@.attempt_state s
     WHERE s.ctid = ANY (ARRAY(
             SELECT t.ctid FROM @schema@.attempt_state t
              WHERE NOT (
                 (t.run_lease >= 65536
                  AND EXISTS (SELECT FROM @schema@.claims c
                               WHERE c.claim_id = t.run_lease >> 16
                                 AND c.job_ids[(t.run_lease & 65535)::int] = t.job_id
                                 AND c.run_leases IS NULL
                                 AND NOT EXISTS (SELECT FROM @schema@.closures x
                                                  WHERE x.claim_id = c.claim_id AND x.pos = (t.run_lease & 65535)::int)))
                 OR (t.run_lease < 65536
                     AND EXISTS (SELECT FROM @schema@.legacy_attempts l
                                  WHERE l.job_id = t.job_id AND l.run_lease = t.run_lease
                                    AND NOT EXISTS (SELECT FROM @schema@.closures x
                                                     WHERE x.claim_id = l.claim_id AND x.pos = l.pos))))
                FOR UPDATE SKIP LOCKED))
    RETURNING 1
  )
  SELECT count(*) FROM gone
$$;

-- As in migration 24, the maintenance form's sweep through sweep_attempt_state().
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
  INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress)
  SELECT id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress
    FROM moved;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF promote_due.queue IS NULL THEN
    -- Maintenance pass: forget idle registrations nobody refreshed (their worker is gone), and
    -- sweep the materialized state of attempts that are closed.
    DELETE FROM @schema@.waiters w WHERE w.since < now() - interval '5 minutes';
    PERFORM @schema@.sweep_attempt_state();
  END IF;
  RETURN n;
END $$;

-- As in migration 24; its sweep of attempt_state is the pass's last step (sweep_attempt_state).
CREATE OR REPLACE FUNCTION @schema@.maintain(holder text, term bigint, stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
BEGIN
  PERFORM 1 FROM @schema@.leadership l
   WHERE l.name = 'maintenance' AND l.holder = maintain.holder AND l.term = maintain.term
     AND l.expires_at > clock_timestamp()
     FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tenure.maintain: % does not hold maintenance leadership term %', maintain.holder, maintain.term
      USING ERRCODE = 'TN004';
  END IF;
  PERFORM @schema@.promote_due(NULL, 10000);
  PERFORM @schema@.enqueue_due_schedules(NULL);
  RETURN QUERY SELECT r.job_id, r.run_lease, r.queue, r.new_state FROM @schema@.rescue_attempts(stale_after) r;
  WITH settled AS MATERIALIZED (
    SELECT w.claim_id, w.queue, greatest(z.last_closed + '5 minutes'::interval, z.kept_until) AS ripe_at
      FROM @schema@.open_claims w
      -- (one claims_pkey probe per open claim, as in open_attempts)
     CROSS JOIN LATERAL (SELECT c.job_ids FROM @schema@.claims c WHERE c.claim_id = w.claim_id OFFSET 0) c
      LEFT JOIN @schema@.queues q ON q.name = w.queue
     CROSS JOIN LATERAL (
           SELECT count(*) AS n, max(x.closed_at) AS last_closed,
                  max(x.closed_at + CASE x.outcome WHEN 'c' THEN coalesce(q.retain_completed, '24 hours'::interval)
                                                   WHEN 'x' THEN coalesce(q.retain_cancelled, '24 hours'::interval)
                                                   WHEN 'f' THEN coalesce(q.retain_failed, '7 days'::interval)
                                                   ELSE '0'::interval END) AS kept_until
             FROM @schema@.closures x WHERE x.claim_id = w.claim_id) z
     WHERE z.n = cardinality(c.job_ids)
     ORDER BY w.claim_id
     LIMIT 10000
  ), unlisted AS (
    DELETE FROM @schema@.open_claims o USING settled s WHERE o.claim_id = s.claim_id RETURNING o.claim_id
  )
  INSERT INTO @schema@.settled_claims (claim_id, queue, ripe_at)
  SELECT s.claim_id, s.queue, s.ripe_at FROM settled s JOIN unlisted u ON u.claim_id = s.claim_id;
  PERFORM @schema@.prune_expired(stale_after);
  PERFORM @schema@.sweep_attempt_state();
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
