-- tenure migration 4: the retry backoff no longer overflows, and rescue no longer closes an
-- attempt whose callback is being resumed.
--
-- backoff() multiplied the base interval by 2^(attempt - 1) before capping it. interval
-- arithmetic overflows past ~292,000 years of microseconds, so with a base of one hour the
-- product raised 22008 ("interval out of range") from the 33rd attempt on (the 39th for one
-- minute), and every failure of such a job was refused instead of recorded. The delay is now
-- computed in seconds (double precision) and capped before it becomes an interval again. Same
-- results otherwise: d = min(cap, base x 2^(attempt-1)), then a random delay in [d/2, d].

CREATE OR REPLACE FUNCTION @schema@.backoff(queue text, attempt int) RETURNS interval
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  base interval := '1 second';
  cap  interval := '1 hour';
  d    double precision;
BEGIN
  SELECT q.backoff_base, q.backoff_cap INTO base, cap FROM @schema@.queues q WHERE q.name = backoff.queue;
  IF NOT FOUND THEN base := '1 second'; cap := '1 hour'; END IF;
  d := least(extract(epoch FROM cap)::double precision,
             extract(epoch FROM base)::double precision * power(2::double precision,
                                                                 least(greatest(attempt, 1) - 1, 200)));
  RETURN make_interval(secs => d / 2 + d / 2 * random());
END $$;

REVOKE ALL ON FUNCTION @schema@.backoff(text, int) FROM PUBLIC;

-- rescue_attempts: a waiting attempt whose callback timed out was picked by a statement whose
-- snapshot could predate a resume_callback (or extend_callback) that committed while the scan ran.
-- Rescue locked only the receipt, which a resume locks but does not change, so nothing made it
-- look again: the attempt was rescued although the resume had returned true, and the payload was
-- lost with it. Those attempts are now locked in their own statement first (their attempt_state
-- rows, which every resume and extend changes), skipping any a resume or extend holds; the
-- rescue statement that follows sees everything committed before it, and rescues a waiting
-- attempt only if it is one of those locked. Same rules as migration 2 otherwise.
CREATE OR REPLACE FUNCTION @schema@.rescue_attempts(stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  rec record;
  parked bigint[];
BEGIN
  IF stale_after IS NULL OR stale_after < '0'::interval THEN
    RAISE EXCEPTION 'tenure.rescue_stale: stale_after must be a non-negative interval'
      USING ERRCODE = '22023';
  END IF;
  parked := ARRAY(SELECT s.job_id FROM @schema@.attempt_state s
                   WHERE s.waiting AND s.callback_deadline <= now()
                   ORDER BY s.job_id
                     FOR UPDATE SKIP LOCKED);
  FOR rec IN
    WITH stale AS (
      SELECT r.job_id, r.run_lease,
             CASE WHEN s.waiting THEN 'rescued: callback timed out'
                  WHEN r.deadline_at <= now() THEN 'rescued: hard deadline passed'
                  ELSE format('rescued: no heartbeat for %s', rescue_attempts.stale_after) END AS why,
             s.progress
        FROM @schema@.receipts r
        LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
       WHERE (NOT coalesce(s.waiting, false)
              AND (coalesce(s.heartbeat_at, r.claimed_at) + rescue_attempts.stale_after <= now()
                   OR r.deadline_at <= now()))
          OR (s.waiting AND s.callback_deadline <= now() AND s.job_id = ANY (parked))
       ORDER BY r.job_id
         FOR UPDATE OF r SKIP LOCKED
    ), closed AS (
      DELETE FROM @schema@.receipts r USING stale s
       WHERE r.job_id = s.job_id AND r.run_lease = s.run_lease
      RETURNING r.*, s.why, s.progress AS live_progress
    )
    SELECT c.*, coalesce(q.dead_letter, false) AS dlq FROM closed c
      LEFT JOIN @schema@.queues q ON q.name = c.queue
  LOOP
    IF rec.attempt < rec.max_attempts THEN
      INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                  run_at, created_at, last_error, progress)
      VALUES (rec.job_id, rec.queue, rec.kind, rec.args, rec.priority, rec.attempt, rec.max_attempts,
              rec.run_lease, now(), rec.created_at, rec.why, coalesce(rec.live_progress, rec.progress));
      new_state := 'available';
    ELSIF rec.dlq THEN
      INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts,
                                        run_lease, run_at, created_at, finalized_at, last_error, progress)
      VALUES (rec.job_id, rec.queue, rec.kind, rec.args, rec.priority, rec.attempt, rec.max_attempts,
              rec.run_lease, rec.run_at, rec.created_at, now(), rec.why,
              coalesce(rec.live_progress, rec.progress));
      new_state := 'failed';
    ELSE
      INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                                 run_lease, run_at, created_at, finalized_at, last_error, progress)
      VALUES (rec.job_id, rec.queue, rec.kind, rec.args, 'failed', rec.priority, rec.attempt,
              rec.max_attempts, rec.run_lease, rec.run_at, rec.created_at, now(), rec.why,
              coalesce(rec.live_progress, rec.progress));
      new_state := 'failed';
    END IF;
    PERFORM pg_notify(@cancel_channel@, rec.job_id || ':' || rec.run_lease);
    job_id := rec.job_id;
    run_lease := rec.run_lease;
    queue := rec.queue;
    RETURN NEXT;
  END LOOP;
END $$;
