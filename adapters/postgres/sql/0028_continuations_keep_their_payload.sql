-- tenure migration 28: a continuation that goes back to its queue stays a continuation.
--
-- A parked attempt resumed by its callback is continued by a new claim: the ready row carries the
-- callback's payload, and the claim hands it to the handler (job_context::resumed_with) with the
-- parked attempt's number. Until now the claim dropped the payload with the ready row, so a
-- continuation that went back to its queue came back as a fresh attempt: rescued after its worker
-- died (or after a claim whose session outlived its client committed with nobody to run it),
-- given back by a stopping runtime, or failed and retried. Its handler then started over and
-- parked on a new callback that the outside system, having answered once, never resumes: the
-- answer was lost and the job waited out its callback timeout.
--
-- The claim now keeps each continuation's payload in its claim row (claims.resume_payloads, NULL
-- on a claim without one, as last_errors and progress are), and every path that puts an attempt
-- back carries it: rescue and a retrying failure as the next attempt (an attempt that died or
-- failed counts, so max_attempts still bounds a continuation that keeps failing), a snooze as the
-- same attempt (a give-back spends none). deferred gains the column so that a retry or a delayed
-- snooze keeps it until promotion. A terminal closure (completion, cancel, final failure) ends
-- the payload with the job, and retry_job of a finished job starts it over, as before.

ALTER TABLE @schema@.claims ADD COLUMN resume_payloads jsonb[];  -- the continuations' payloads; NULL when none
ALTER TABLE @schema@.deferred ADD COLUMN resume_payload jsonb;  -- a continuation waiting to go back

-- As in migration 24, each continuation's payload kept in its claim row.
CREATE OR REPLACE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
                                                   idle_mode text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, max_attempts int,
              deadline_at timestamptz, secret uuid, metadata jsonb, available_at timestamptz,
              resume_payload jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  n int;
  -- Limits and aging (migration 13): read in the pause probe; NULL when not set.
  lim_paused boolean;
  lim_running int;
  lim_rate double precision;
  lim_aging interval;
  lim_deadline interval;                    -- the queue's hard_deadline
  lim_take int := claim_attempts.max_jobs;  -- the most this claim may take
  lim_tokens double precision;              -- the refilled bucket, when rate_per_second is set
  lim_at timestamptz;
  lim_aged tid[];                           -- priority_aging: the candidates' row addresses, locked
BEGIN
  IF claim_attempts.queue IS NULL THEN
    RAISE EXCEPTION 'tenure.claim: queue must not be NULL' USING ERRCODE = '22023';
  END IF;
  IF claim_attempts.max_jobs IS NULL OR claim_attempts.max_jobs < 1 OR claim_attempts.max_jobs > 10000 THEN
    RAISE EXCEPTION 'tenure.claim: max_jobs must be between 1 and 10000 (got %)', claim_attempts.max_jobs
      USING ERRCODE = '22023';
  END IF;
  PERFORM pg_advisory_xact_lock_shared(hashtext('@schema@.queue_claims'), hashtext(claim_attempts.queue));
  SELECT q.paused, q.max_running, q.rate_per_second, q.priority_aging, q.hard_deadline
    INTO lim_paused, lim_running, lim_rate, lim_aging, lim_deadline
    FROM @schema@.queues q WHERE q.name = claim_attempts.queue;
  IF lim_paused THEN
    RETURN;
  END IF;
  -- A limited queue: lock its row, take at most what max_running and the bucket allow.
  IF lim_running IS NOT NULL OR lim_rate IS NOT NULL THEN
    SELECT a.allowed, a.tokens, a.at INTO lim_take, lim_tokens, lim_at
      FROM @schema@.claim_allowance(claim_attempts.queue, claim_attempts.max_jobs) a;
  END IF;
  -- Promotion is a write statement; a probe of the due index is enough when nothing is due.
  IF EXISTS (SELECT 1 FROM @schema@.deferred d
              WHERE d.queue = claim_attempts.queue AND d.run_at <= now()) THEN
    PERFORM @schema@.promote_due(claim_attempts.queue, 1000);
  END IF;
  -- priority_aging: the first lim_take of each priority (locked), the lim_take of best effective
  -- priority among them. A statement of its own, so the claim below plans nothing more without it.
  IF lim_aging IS NOT NULL THEN
    lim_aged := ARRAY(SELECT c.ctid
                        FROM generate_series(1, 4) AS l(priority)
                       CROSS JOIN LATERAL (
                             SELECT p.ctid, p.id, p.priority, greatest(p.run_at, p.created_at) AS since
                               FROM @schema@.ready p
                              WHERE p.queue = claim_attempts.queue AND p.priority = l.priority
                              ORDER BY p.id
                              LIMIT lim_take
                              FOR UPDATE SKIP LOCKED) c
                       ORDER BY greatest(1, c.priority - floor(greatest(0, extract(epoch FROM now() - c.since))
                                                               / extract(epoch FROM lim_aging))),
                                c.id
                       LIMIT lim_take);
  END IF;
  RETURN QUERY
  WITH moved AS (
    DELETE FROM @schema@.ready r
     WHERE r.ctid = ANY (CASE WHEN lim_aging IS NULL
                              THEN ARRAY(SELECT p.ctid FROM @schema@.ready p
                                          WHERE p.queue = claim_attempts.queue
                                          ORDER BY p.priority, p.id
                                          LIMIT lim_take
                                          FOR UPDATE SKIP LOCKED)
                              ELSE lim_aged END)
    RETURNING r.id, r.priority, r.run_at, r.created_at, r.attempt, r.last_error, r.progress, r.resume_payload
  ), batch AS (
    -- One pass over the deleted rows, sorted once: every array is built from the same sequence,
    -- so element pos of each is the same job. last_errors, progress and the resume payloads are
    -- NULL arrays when no job carries one.
    SELECT array_agg(m.id) AS ids, min(m.id) AS lo, max(m.id) AS hi,
           -- continuation: a resumed parked attempt keeps its attempt number.
           array_agg(m.attempt + (m.resume_payload IS NULL)::int) AS attempts,
           array_agg(gen_random_uuid()) AS secrets,
           array_agg(m.run_at) AS run_ats,
           array_agg(greatest(m.run_at, m.created_at)) AS available,
           CASE WHEN count(m.last_error) > 0 THEN array_agg(m.last_error) END AS last_errors,
           CASE WHEN count(m.progress) > 0 THEN array_agg(m.progress) END AS progress,
           CASE WHEN count(m.resume_payload) > 0 THEN array_agg(m.resume_payload) END AS resumes
      FROM (SELECT * FROM moved ORDER BY moved.priority, moved.id) m
  ), opened AS (
    INSERT INTO @schema@.claims (claim_id, queue, worker, claimed_at, deadline_at, lo, hi, job_ids, attempts,
                                 secrets, run_ats, last_errors, progress, resume_payloads)
    SELECT nextval('@schema@.claim_id_seq'), claim_attempts.queue, claim_attempts.worker, now(),
           now() + lim_deadline, b.lo, b.hi, b.ids, b.attempts, b.secrets, b.run_ats, b.last_errors, b.progress,
           b.resumes
      FROM batch b
     WHERE b.ids IS NOT NULL
    RETURNING claim_id, deadline_at
  ), listed AS (
    INSERT INTO @schema@.open_claims (claim_id, queue)
    SELECT o.claim_id, claim_attempts.queue FROM opened o
  )
  SELECT u.job_id, o.claim_id * 65536 + u.pos, s.kind, s.args, u.attempt, s.max_attempts, o.deadline_at,
         u.secret, s.metadata, u.available_at,
         u.resume_payload  -- continuation: the payload of the resume, NULL on an ordinary claim
    FROM opened o
   CROSS JOIN batch b
   CROSS JOIN LATERAL unnest(b.ids, b.attempts, b.secrets, b.available, b.resumes)
                      WITH ORDINALITY AS u(job_id, attempt, secret, available_at, resume_payload, pos)
    JOIN @schema@.specs s ON s.id = u.job_id
   ORDER BY u.pos;
  GET DIAGNOSTICS n = ROW_COUNT;
  -- rate_per_second: the claimed jobs spend their tokens, in the claim's transaction.
  IF lim_tokens IS NOT NULL THEN
    UPDATE @schema@.queues q SET rate_tokens = lim_tokens - n, rate_refilled_at = lim_at
     WHERE q.name = claim_attempts.queue;
  END IF;
  IF claim_attempts.idle_mode IS NOT NULL AND claim_attempts.worker IS NOT NULL THEN
    -- A claim a limit held back to nothing does not join the waiters: no enqueue could wake it
    -- usefully, so producers send no NOTIFY for it (it polls).
    IF n = 0 AND claim_attempts.idle_mode = 'sleep' AND lim_take > 0 THEN
      INSERT INTO @schema@.waiters AS w (queue, worker) VALUES (claim_attempts.queue, claim_attempts.worker)
      ON CONFLICT (queue, worker) DO UPDATE SET since = now() WHERE w.since < now() - interval '1 minute';
    ELSIF n > 0 AND EXISTS (SELECT 1 FROM @schema@.waiters w
                             WHERE w.queue = claim_attempts.queue AND w.worker = claim_attempts.worker) THEN
      DELETE FROM @schema@.waiters w WHERE w.queue = claim_attempts.queue AND w.worker = claim_attempts.worker;
    END IF;
  END IF;
END $$;

-- As in migration 26, the payload carried from deferred to ready.
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
  INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress,
                              resume_payload)
  SELECT id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress, resume_payload
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

-- As in migration 24, a rescued continuation goes back with its payload, as the next attempt.
CREATE OR REPLACE FUNCTION @schema@.rescue_attempts(stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
#variable_conflict use_column
DECLARE
  rec      record;
  v_claims bigint[];
  v_poss   int[];
BEGIN
  IF stale_after IS NULL OR stale_after < '0'::interval THEN
    RAISE EXCEPTION 'tenure.rescue_stale: stale_after must be a non-negative interval'
      USING ERRCODE = '22023';
  END IF;
  -- The candidates, each lock tried once: the try sits outside the fenced scan, so it runs only
  -- for stale attempts and no lock is taken on a live one.
  SELECT array_agg(t.claim_id ORDER BY t.claim_id, t.pos), array_agg(t.pos ORDER BY t.claim_id, t.pos)
    INTO v_claims, v_poss
    FROM (SELECT a.claim_id, a.pos, a.job_id, a.run_lease
            FROM @schema@.open_attempts a
            LEFT JOIN @schema@.attempt_state s ON s.job_id = a.job_id AND s.run_lease = a.run_lease
           WHERE (NOT coalesce(s.waiting, false)
                  AND (coalesce(s.heartbeat_at, a.claimed_at) + rescue_attempts.stale_after <= now()
                       OR coalesce(s.deadline_at, a.deadline_at) <= now()))
              OR (s.waiting AND s.callback_deadline <= now())
          OFFSET 0) t
   WHERE pg_try_advisory_xact_lock(hashtext('@schema@.attempt'), @schema@.attempt_lock_key(t.job_id, t.run_lease));
  IF v_claims IS NULL THEN
    RETURN;
  END IF;
  FOR rec IN
    WITH stale AS MATERIALIZED (
      -- Under the locks, from a fresh snapshot: still open and still stale.
      SELECT c.claim_id, t.pos, c.job_ids[t.pos] AS job_id,
             coalesce(c.run_leases[t.pos], c.claim_id * 65536 + t.pos) AS run_lease, c.queue,
             c.attempts[t.pos] AS attempt, c.run_ats[t.pos] AS run_at,
             coalesce(s.progress, c.progress[t.pos]) AS carried, s.progress AS live_progress,
             c.resume_payloads[t.pos] AS resume_payload,
             CASE WHEN s.waiting THEN 'rescued: callback timed out'
                  WHEN coalesce(s.deadline_at, c.deadline_at) <= now() THEN 'rescued: hard deadline passed'
                  ELSE format('rescued: no heartbeat for %s', rescue_attempts.stale_after) END AS why
        FROM unnest(v_claims, v_poss) AS t(claim_id, pos)
        JOIN @schema@.claims c ON c.claim_id = t.claim_id
        LEFT JOIN @schema@.attempt_state s
               ON s.job_id = c.job_ids[t.pos] AND s.run_lease = coalesce(c.run_leases[t.pos], c.claim_id * 65536 + t.pos)
       WHERE NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = c.claim_id AND x.pos = t.pos)
         AND ((NOT coalesce(s.waiting, false)
               AND (coalesce(s.heartbeat_at, c.claimed_at) + rescue_attempts.stale_after <= now()
                    OR coalesce(s.deadline_at, c.deadline_at) <= now()))
              OR (s.waiting AND s.callback_deadline <= now()))
    ), decided AS MATERIALIZED (
      SELECT t.*, sp.kind, sp.args, sp.priority, sp.max_attempts, sp.created_at, sp.metadata,
             CASE WHEN t.attempt < sp.max_attempts THEN 'a'
                  WHEN coalesce(q.dead_letter, false) THEN 'd'
                  ELSE 'f' END::"char" AS outcome
        FROM stale t
        JOIN @schema@.specs sp ON sp.id = t.job_id
        LEFT JOIN @schema@.queues q ON q.name = t.queue
    ), won AS (
      INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, last_error, progress)
      SELECT d.claim_id, d.pos, d.outcome, now(),
             CASE WHEN d.outcome = 'f' THEN d.why END, CASE WHEN d.outcome = 'f' THEN d.live_progress END
        FROM decided d
       ORDER BY d.claim_id, d.pos
      ON CONFLICT (claim_id, pos) DO NOTHING
      RETURNING x.claim_id, x.pos
    ), closed AS (
      SELECT d.* FROM decided d JOIN won w ON w.claim_id = d.claim_id AND w.pos = d.pos
    ), back AS (
      -- available at once, no backoff; the attempt counts (the next claim opens attempt + 1). A
      -- continuation stays one: its resume payload goes back with it, as the attempt it opens.
      INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error,
                                  progress, resume_payload)
      SELECT c.job_id, c.queue, c.priority, now(), c.created_at, c.run_lease,
             c.attempt + (c.resume_payload IS NOT NULL)::int, c.why, c.carried, c.resume_payload
        FROM closed c WHERE c.outcome = 'a'
    ), buried AS (
      INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                        run_at, created_at, finalized_at, last_error, progress, metadata)
      SELECT c.job_id, c.queue, c.kind, c.args, c.priority, c.attempt, c.max_attempts, c.run_lease,
             c.run_at, c.created_at, now(), c.why, c.carried, c.metadata
        FROM closed c WHERE c.outcome = 'd'
    )
    SELECT c.job_id, c.run_lease, c.queue, c.outcome FROM closed c ORDER BY c.job_id
  LOOP
    PERFORM pg_notify(@cancel_channel@, rec.job_id || ':' || rec.run_lease);
    job_id := rec.job_id;
    run_lease := rec.run_lease;
    queue := rec.queue;
    new_state := CASE WHEN rec.outcome = 'a' THEN 'available' ELSE 'failed' END;
    RETURN NEXT;
  END LOOP;
END $$;

-- As in migration 24, a retried continuation waits in deferred with its payload, as the next attempt.
CREATE OR REPLACE FUNCTION @schema@.fail_attempt(job_id bigint, run_lease bigint, error text,
                                                 permanent boolean DEFAULT false,
                                                 retry_after interval DEFAULT NULL)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  err text := @schema@.bound_error(fail_attempt.error);
  o   "char";
BEGIN
  WITH a AS (
    SELECT l.claim_id, l.pos, sp.queue, sp.kind, sp.args, sp.priority, c.attempts[l.pos] AS attempt,
           sp.max_attempts, c.run_ats[l.pos] AS run_at, sp.created_at, sp.metadata,
           s.progress AS live_progress, coalesce(s.progress, c.progress[l.pos]) AS carried_progress,
           c.resume_payloads[l.pos] AS resume_payload,
           CASE WHEN NOT coalesce(fail_attempt.permanent, false) AND c.attempts[l.pos] < sp.max_attempts
                  THEN 'r'
                WHEN coalesce((SELECT q.dead_letter FROM @schema@.queues q WHERE q.name = sp.queue), false)
                  THEN 'd'
                ELSE 'f' END::"char" AS outcome
      FROM @schema@.attempt_at(fail_attempt.job_id, fail_attempt.run_lease) l
      JOIN @schema@.claims c ON c.claim_id = l.claim_id
      JOIN @schema@.specs sp ON sp.id = fail_attempt.job_id
      LEFT JOIN @schema@.attempt_state s
             ON s.job_id = fail_attempt.job_id AND s.run_lease = fail_attempt.run_lease
  ), won AS (
    INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, last_error, progress)
    SELECT a.claim_id, a.pos, a.outcome, now(),
           CASE WHEN a.outcome = 'f' THEN err END, CASE WHEN a.outcome = 'f' THEN a.live_progress END
      FROM a
    ON CONFLICT (claim_id, pos) DO NOTHING
    RETURNING x.outcome
  ), retried AS (
    -- A failed continuation is retried as the same continuation: its resume payload goes back
    -- with it, as the attempt it opens.
    INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt,
                                   last_error, progress, resume_payload)
    SELECT fail_attempt.job_id, a.queue, a.priority,
           now() + CASE WHEN fail_attempt.retry_after IS NULL
                        THEN @schema@.backoff(a.queue, a.attempt)
                        ELSE greatest(fail_attempt.retry_after, '0'::interval) END,
           a.created_at, 'retryable', fail_attempt.run_lease, a.attempt + (a.resume_payload IS NOT NULL)::int,
           err, a.carried_progress, a.resume_payload
      FROM a JOIN won w ON w.outcome = 'r'
  ), buried AS (
    INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                      run_at, created_at, finalized_at, last_error, progress, metadata)
    SELECT fail_attempt.job_id, a.queue, a.kind, a.args, a.priority, a.attempt, a.max_attempts,
           fail_attempt.run_lease, a.run_at, a.created_at, now(), err, a.carried_progress, a.metadata
      FROM a JOIN won w ON w.outcome = 'd'
  )
  SELECT w.outcome INTO o FROM won w;
  RETURN CASE o WHEN 'r' THEN 'retryable' WHEN 'd' THEN 'failed' WHEN 'f' THEN 'failed' END;
END $$;

-- As in migration 24, a snoozed continuation goes back with its payload, as the same attempt.
CREATE OR REPLACE FUNCTION @schema@.snooze_attempt(job_id bigint, run_lease bigint, delay interval)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  closed bigint;
BEGIN
  WITH a AS (
    SELECT l.claim_id, l.pos, sp.queue, sp.priority, sp.created_at, c.attempts[l.pos] AS attempt,
           c.last_errors[l.pos] AS last_error, coalesce(s.progress, c.progress[l.pos]) AS progress,
           c.resume_payloads[l.pos] AS resume_payload
      FROM @schema@.attempt_at(snooze_attempt.job_id, snooze_attempt.run_lease) l
      JOIN @schema@.claims c ON c.claim_id = l.claim_id
      JOIN @schema@.specs sp ON sp.id = snooze_attempt.job_id
      LEFT JOIN @schema@.attempt_state s
             ON s.job_id = snooze_attempt.job_id AND s.run_lease = snooze_attempt.run_lease
  ), won AS (
    INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at)
    SELECT a.claim_id, a.pos, 's', now() FROM a
    ON CONFLICT (claim_id, pos) DO NOTHING
    RETURNING x.claim_id
  ), now_ready AS (
    INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error,
                                progress, resume_payload)
    SELECT snooze_attempt.job_id, a.queue, a.priority, now(), a.created_at, snooze_attempt.run_lease,
           a.attempt - (a.resume_payload IS NULL)::int, a.last_error, a.progress, a.resume_payload
      FROM a JOIN won w ON true
     WHERE snooze_attempt.delay IS NULL OR snooze_attempt.delay <= '0'::interval
  ), later AS (
    INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt,
                                   last_error, progress, resume_payload)
    SELECT snooze_attempt.job_id, a.queue, a.priority, now() + snooze_attempt.delay, a.created_at,
           'scheduled', snooze_attempt.run_lease, a.attempt - (a.resume_payload IS NULL)::int, a.last_error,
           a.progress, a.resume_payload
      FROM a JOIN won w ON true
     WHERE snooze_attempt.delay > '0'::interval
  )
  SELECT w.claim_id INTO closed FROM won w;
  RETURN FOUND;
END $$;
