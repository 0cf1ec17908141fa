-- tenure migration 27: renewing the maintenance lease does not wait for the holder's own pass.
--
-- maintain() fences its pass by locking the lease row until it commits, so that no pass of an old
-- term runs beside a newer leader. It took the row FOR SHARE, which every UPDATE of the row waits
-- for: the holder's own renewal too. A runtime renews from the session that also receives its
-- wake-up notifications, so while its pass ran (tens of milliseconds after a large drain, every
-- maintenance_interval) the renewal waited and no wake-up was read.
--
-- The pass now takes the row FOR KEY SHARE. A renewal (the holder's own lease, not expired) and a
-- release change only expires_at, a FOR NO KEY UPDATE that does not wait for it, and another
-- holder's unexpired lease is answered NULL without a lock, as before. A takeover (an expired
-- lease, or the first) still waits for the pass: it locks the row FOR UPDATE, which conflicts
-- with KEY SHARE, before it decides. A renewal changes neither holder nor term, so a
-- pass that ran beside one still commits under its caller's (holder, term)
-- (models/leadership.pml).

-- The holder's own unexpired lease is renewed by one UPDATE of expires_at (same term); under
-- READ COMMITTED a takeover that committed first makes it match nothing. Otherwise, under the
-- row's FOR UPDATE lock (after any pass of the current term has committed), an expired lease is
-- taken (term + 1, even by the same holder). Another holder's unexpired lease answers NULL, at
-- once when it is unexpired before the lock.
CREATE OR REPLACE FUNCTION @schema@.acquire_leadership(holder text, ttl interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t bigint;
BEGIN
  IF holder IS NULL OR length(holder) NOT BETWEEN 1 AND 200 THEN
    RAISE EXCEPTION 'tenure.acquire_leadership: holder must be 1..200 characters' USING ERRCODE = '22023';
  END IF;
  IF ttl IS NULL OR ttl <= '0'::interval OR ttl > '1 hour'::interval THEN
    RAISE EXCEPTION 'tenure.acquire_leadership: ttl must be positive and at most one hour' USING ERRCODE = '22023';
  END IF;
  UPDATE @schema@.leadership l
     SET expires_at = clock_timestamp() + ttl
   WHERE l.name = 'maintenance' AND l.holder = acquire_leadership.holder AND l.expires_at > clock_timestamp()
  RETURNING l.term INTO t;
  IF FOUND THEN
    RETURN t;
  END IF;
  IF NOT EXISTS (SELECT FROM @schema@.leadership l
                  WHERE l.name = 'maintenance' AND l.expires_at <= clock_timestamp()) THEN
    RETURN NULL;  -- another holder's lease, not expired: answered without waiting
  END IF;
  PERFORM 1 FROM @schema@.leadership l WHERE l.name = 'maintenance' FOR UPDATE;
  UPDATE @schema@.leadership l
     SET term = l.term + 1,
         acquired_at = clock_timestamp(),
         holder = acquire_leadership.holder,
         expires_at = clock_timestamp() + ttl
   WHERE l.name = 'maintenance' AND l.expires_at <= clock_timestamp()
  RETURNING l.term INTO t;
  RETURN t;
END $$;

-- As in migration 26, with the lease row locked FOR KEY SHARE.
CREATE OR REPLACE FUNCTION @schema@.maintain(holder text, term bigint, stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
BEGIN
  PERFORM 1 FROM @schema@.leadership l
   WHERE l.name = 'maintenance' AND l.holder = maintain.holder AND l.term = maintain.term
     AND l.expires_at > clock_timestamp()
     FOR KEY SHARE;
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
