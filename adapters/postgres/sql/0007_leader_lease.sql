-- tenure migration 7: maintenance leadership is a lease row with an expiry, not a session lock.
--
-- The leader used to be whoever held a session advisory lock. A session lock lasts as long as the
-- session, not as long as the process acts: a leader that was paused (SIGSTOP, a debugger, a VM
-- freeze, heavy swapping) kept its TCP session and so its lock, and no other worker rescued
-- anything while it stayed paused; a lock taken through a pooled server connection outlived the
-- worker that took it. Leadership is now the row below: the leader renews it before it expires;
-- any worker takes it over once it has expired; and the term grows on every takeover. The server's
-- clock decides expiry. The maintenance the runtime runs as leader goes through maintain(), which
-- checks the caller's term in the same transaction: a leader that wakes after losing its lease
-- changes nothing.

CREATE TABLE @schema@.leadership (
  name        text PRIMARY KEY,
  holder      text NOT NULL,
  term        bigint NOT NULL,
  acquired_at timestamptz NOT NULL,
  expires_at  timestamptz NOT NULL
);
-- One row, expired from the start: the first worker to ask takes it with term 1.
INSERT INTO @schema@.leadership (name, holder, term, acquired_at, expires_at)
VALUES ('maintenance', '', 0, '-infinity', '-infinity');
REVOKE ALL ON @schema@.leadership FROM PUBLIC;

-- Acquires or renews the maintenance lease for `holder` (a name unique to one runtime instance)
-- for `ttl` (up to one hour). Returns the holder's term, or NULL when another holder's lease has
-- not expired. A holder whose lease has not expired renews it (same term); a lease that has
-- expired is taken by whoever asks first (term + 1, even when the same holder takes it back).
-- Waits for a maintain() of the current term that is in progress (it holds the row FOR SHARE).
CREATE FUNCTION @schema@.acquire_leadership(holder text, ttl interval) RETURNS bigint
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
  -- One statement decides, under the row lock (a concurrent takeover re-evaluates it against the
  -- row it committed), so two workers never both get the lease.
  UPDATE @schema@.leadership l
     SET term = CASE WHEN l.holder = acquire_leadership.holder AND l.expires_at > clock_timestamp()
                     THEN l.term ELSE l.term + 1 END,
         acquired_at = CASE WHEN l.holder = acquire_leadership.holder AND l.expires_at > clock_timestamp()
                            THEN l.acquired_at ELSE clock_timestamp() END,
         holder = acquire_leadership.holder,
         expires_at = clock_timestamp() + ttl
   WHERE l.name = 'maintenance'
     AND (l.holder = acquire_leadership.holder OR l.expires_at <= clock_timestamp())
  RETURNING l.term INTO t;
  RETURN t;
END $$;

-- Ends `holder`'s lease of `term` now (a worker that stops), so the next worker need not wait for
-- it to expire. true when it did; false when that lease was no longer held.
CREATE FUNCTION @schema@.release_leadership(holder text, term bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE @schema@.leadership l SET expires_at = clock_timestamp()
   WHERE l.name = 'maintenance' AND l.holder = release_leadership.holder AND l.term = release_leadership.term
     AND l.expires_at > clock_timestamp();
  RETURN FOUND;
END $$;

-- The maintenance pass of the leader of `term`: promotes due deferred jobs (up to 10,000) and
-- rescues stale attempts (rescue_attempts), in one transaction. It first locks the lease row FOR
-- SHARE and checks that `holder` still holds `term` and that it has not expired; otherwise it
-- raises TN004 and changes nothing. The lock keeps a takeover waiting until this pass commits, so
-- no pass of an old term runs beside a newer leader. promote_due(), rescue_attempts() and
-- rescue_stale() stay callable on their own (by an operator from psql, say): both are guarded
-- and safe beside a leader.
CREATE FUNCTION @schema@.maintain(holder text, term bigint, stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
  RETURN QUERY SELECT r.job_id, r.run_lease, r.queue, r.new_state FROM @schema@.rescue_attempts(stale_after) r;
END $$;

REVOKE ALL ON FUNCTION @schema@.acquire_leadership(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @schema@.release_leadership(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @schema@.maintain(text, bigint, interval) FROM PUBLIC;
