-- tenure migration 14: parked callbacks.
--
-- A handler waiting for an external callback no longer has to keep its thread: it registers the
-- callback and parks the attempt (park_callback), then returns. The attempt stays open as
-- waiting_external with its run lease, exactly as a blocking wait leaves it (attempt_state.waiting,
-- the heartbeat and hard deadline suspended, the callback deadline armed), plus
-- attempt_state.no_handler: no handler is polling it (not named `parked`: rescue_attempts has a
-- variable of that name, and its columns win).
--   - resume_callback of a parked attempt makes it runnable again: its receipt and lease row move
--     back to `ready` with the SAME run lease and attempt count, and the payload in the new
--     column ready.resume_payload (never NULL for a continuation: a resume stores at least '{}').
--     The queue's sleeping workers get the same wake-up hint enqueue sends. A blocking waiter is
--     resumed as before.
--   - claim_attempts opens such a row as the continuation of its attempt: run lease and attempt
--     count are kept instead of advanced, and the payload comes back in the new last column
--     resume_payload (NULL on an ordinary claim). The continuation gets a fresh attempt secret
--     and a fresh hard deadline, like any claim: a token of the attempt before it parked is
--     refused from then on (TN001), even though the run lease is the same.
--   - complete_callback, fail_callback, extend_callback, rescue by callback timeout and cancel
--     treat a parked attempt as they treat a blocking waiter: they match its live receipt
--     (job_id, run_lease) and lock it, so exactly one of them, or one resume, wins.

ALTER TABLE @schema@.attempt_state ADD COLUMN no_handler boolean NOT NULL DEFAULT false;
ALTER TABLE @schema@.ready ADD COLUMN resume_payload jsonb;

-- ---- parking ----------------------------------------------------------------------------------

-- Moves the parked attempt (job_id, run_lease) back to `ready`, keeping its run lease and attempt
-- count, with `payload` as its resume payload and its latest progress; wakes the queue's sleeping
-- workers. The caller holds the receipt's lock. Internal.
CREATE FUNCTION @schema@.continue_parked(job_id bigint, run_lease bigint, payload jsonb)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  q text;
BEGIN
  WITH closed AS (
    DELETE FROM @schema@.receipts x
     WHERE x.job_id = continue_parked.job_id AND x.run_lease = continue_parked.run_lease
    RETURNING x.*
  )
  INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                              run_at, created_at, last_error, progress, metadata, resume_payload)
  SELECT c.job_id, c.queue, c.kind, c.args, c.priority, c.attempt, c.max_attempts, c.run_lease,
         now(), c.created_at, c.last_error, coalesce(s.progress, c.progress), c.metadata,
         coalesce(continue_parked.payload, '{}')
    FROM closed c
    LEFT JOIN @schema@.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
  RETURNING queue INTO q;
  -- The continuation opens with the same (job_id, run_lease): a lease row left here would hand it
  -- this attempt's old heartbeat and resolved callback.
  DELETE FROM @schema@.attempt_state s
   WHERE s.job_id = continue_parked.job_id AND s.run_lease = continue_parked.run_lease;
  IF q IS NOT NULL AND EXISTS (SELECT 1 FROM @schema@.waiters w WHERE w.queue = q) THEN
    PERFORM pg_notify(@wake_channel@, q);
  END IF;
END $$;

-- Parks the live attempt (job_id, run_lease) on its current callback `callback_id`: its handler
-- returns and no longer polls. Guarded by (job_id, run_lease, callback_id); locks the receipt, so
-- it serializes with resume, completion, rescue and cancel. Returns
--   'parked'  : waiting_external (the callback deadline armed now, or kept when the attempt was
--               already waiting);
--   'resumed' : the callback was resumed before the attempt parked: the attempt went straight
--               back to `ready` with that payload (as a resume of a parked attempt does);
--   NULL      : the attempt is stale, or callback_id is not its current callback.
CREATE FUNCTION @schema@.park_callback(job_id bigint, run_lease bigint, callback_id uuid)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  st @schema@.attempt_state%ROWTYPE;
BEGIN
  PERFORM 1 FROM @schema@.receipts r
    WHERE r.job_id = park_callback.job_id AND r.run_lease = park_callback.run_lease
    FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  SELECT s.* INTO st FROM @schema@.attempt_state s
   WHERE s.job_id = park_callback.job_id AND s.run_lease = park_callback.run_lease
     AND s.callback_id = park_callback.callback_id
     FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF st.resumed THEN
    PERFORM @schema@.continue_parked(park_callback.job_id, park_callback.run_lease, st.resume_payload);
    RETURN 'resumed';
  END IF;
  UPDATE @schema@.attempt_state s
     SET no_handler = true, waiting = true,
         callback_deadline = CASE WHEN s.waiting THEN s.callback_deadline ELSE now() + s.callback_timeout END,
         waiting_since = CASE WHEN s.waiting THEN s.waiting_since ELSE now() END
   WHERE s.job_id = park_callback.job_id AND s.run_lease = park_callback.run_lease;
  RETURN 'parked';
END $$;

-- As in migration 2, plus parked attempts: a parked attempt goes back to `ready` to be continued
-- by any worker (continue_parked); a blocking waiter is resumed in place, as before.
CREATE OR REPLACE FUNCTION @schema@.resume_callback(callback_id uuid, payload jsonb DEFAULT '{}')
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM @schema@.lock_callback(resume_callback.callback_id);
  IF a.job_id IS NULL THEN
    RETURN false;
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.attempt_state s
              WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease AND s.no_handler) THEN
    PERFORM @schema@.continue_parked(a.job_id, a.run_lease, coalesce(resume_callback.payload, '{}'));
    RETURN true;
  END IF;
  -- The hard deadline was suspended while the attempt waited: push it back by the time spent
  -- parked, so a long wait does not make the resumed attempt overdue at once.
  UPDATE @schema@.receipts r
     SET deadline_at = r.deadline_at + (now() - s.waiting_since)
    FROM @schema@.attempt_state s
   WHERE r.job_id = a.job_id AND r.run_lease = a.run_lease AND r.deadline_at IS NOT NULL
     AND s.job_id = r.job_id AND s.run_lease = r.run_lease AND s.waiting AND s.waiting_since IS NOT NULL;
  UPDATE @schema@.attempt_state s
     SET resumed = true, resume_payload = coalesce(resume_callback.payload, '{}'), waiting = false,
         callback_deadline = NULL, waiting_since = NULL, heartbeat_at = now()
   WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease;
  PERFORM pg_notify(@callback_channel@, a.job_id || ':' || a.run_lease);
  RETURN true;
END $$;

-- ---- the claim: a continuation keeps its run lease and attempt --------------------------------

-- DROP takes a function's grants with it: remember the roles that may run each replaced function
-- and give it back to them once it is created again (as migration 9 does).
SELECT pg_catalog.set_config('tenure.migrate_grantees_' || f.name,
                             coalesce((SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', ')
                                         FROM pg_catalog.pg_proc p
                                        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
                                         JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
                                        WHERE p.oid = f.sig::regprocedure
                                          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner), ''),
                             true)
  FROM (VALUES ('claim_attempts', '@schema@.claim_attempts(text, int, text, text)'),
               ('claim', '@schema@.claim(text, int, text)')) AS f(name, sig);

DROP FUNCTION @schema@.claim(text, int, text);
DROP FUNCTION @schema@.claim_attempts(text, int, text, text);

-- As in migration 13 (limits and aging), plus parked continuations (the three lines marked
-- "continuation"): a ready row with a resume_payload keeps its run_lease and attempt, and returns
-- the payload as the new last column.
CREATE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
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
  lim_take int := claim_attempts.max_jobs;  -- the most this claim may take
  lim_tokens double precision;              -- the refilled bucket, when rate_per_second is set
  lim_at timestamptz;
  lim_aged bigint[];                        -- priority_aging: the candidates, locked
BEGIN
  IF claim_attempts.queue IS NULL THEN
    RAISE EXCEPTION 'tenure.claim: queue must not be NULL' USING ERRCODE = '22023';
  END IF;
  IF claim_attempts.max_jobs IS NULL OR claim_attempts.max_jobs < 1 OR claim_attempts.max_jobs > 10000 THEN
    RAISE EXCEPTION 'tenure.claim: max_jobs must be between 1 and 10000 (got %)', claim_attempts.max_jobs
      USING ERRCODE = '22023';
  END IF;
  PERFORM pg_advisory_xact_lock_shared(hashtext('@schema@.queue_claims'), hashtext(claim_attempts.queue));
  SELECT q.paused, q.max_running, q.rate_per_second, q.priority_aging
    INTO lim_paused, lim_running, lim_rate, lim_aging
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
    lim_aged := ARRAY(SELECT c.id
                        FROM generate_series(1, 4) AS l(priority)
                       CROSS JOIN LATERAL (
                             SELECT p.id, p.priority, greatest(p.run_at, p.created_at) AS since
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
     WHERE r.id = ANY (CASE WHEN lim_aging IS NULL
                            THEN ARRAY(SELECT p.id FROM @schema@.ready p
                                        WHERE p.queue = claim_attempts.queue
                                        ORDER BY p.priority, p.id
                                        LIMIT lim_take
                                        FOR UPDATE SKIP LOCKED)
                            ELSE lim_aged END)
    RETURNING r.*
  ), opened AS (
    INSERT INTO @schema@.receipts (job_id, run_lease, queue, kind, args, priority, attempt,
                                   max_attempts, run_at, created_at, claimed_at, deadline_at,
                                   worker, last_error, progress, secret, metadata)
    -- continuation: a resumed parked attempt (resume_payload set) keeps its run lease and attempt.
    SELECT m.id, m.run_lease + (m.resume_payload IS NULL)::int, m.queue, m.kind, m.args, m.priority,
           m.attempt + (m.resume_payload IS NULL)::int,
           m.max_attempts, m.run_at, m.created_at, now(),
           now() + (SELECT q.hard_deadline FROM @schema@.queues q WHERE q.name = claim_attempts.queue),
           claim_attempts.worker, m.last_error, m.progress, gen_random_uuid(), m.metadata
      FROM moved m
    RETURNING job_id, run_lease, kind, args, attempt, max_attempts, deadline_at, secret, metadata, priority, run_at,
              created_at
  )
  SELECT o.job_id, o.run_lease, o.kind, o.args, o.attempt, o.max_attempts, o.deadline_at, o.secret,
         o.metadata, greatest(o.run_at, o.created_at),
         m.resume_payload  -- continuation: the payload of the resume, NULL on an ordinary claim
    FROM opened o JOIN moved m ON m.id = o.job_id ORDER BY o.priority, o.job_id;
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

-- As in migration 9, plus resume_payload as the last column: a plain-SQL worker sees that it
-- claimed the continuation of a parked attempt, and the payload it was resumed with.
CREATE FUNCTION @schema@.claim(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, token text, metadata jsonb,
              resume_payload jsonb)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT c.job_id, c.run_lease, c.kind, c.args, c.attempt, @schema@.make_token(c.job_id, c.run_lease, c.secret),
         c.metadata, c.resume_payload
    FROM @schema@.claim_attempts($1, $2, $3, NULL) c
$$;

DO $$
DECLARE
  f text;
  sig text;
BEGIN
  FOR f, sig IN VALUES ('claim_attempts', 'claim_attempts(text, int, text, text)'),
                       ('claim', 'claim(text, int, text)') LOOP
    IF pg_catalog.current_setting('tenure.migrate_grantees_' || f) <> '' THEN
      EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.' || sig || ' TO '
              || pg_catalog.current_setting('tenure.migrate_grantees_' || f);
    END IF;
  END LOOP;
  -- The new worker function goes to the roles `tenure grant-worker` gave the claim to.
  IF pg_catalog.current_setting('tenure.migrate_grantees_claim_attempts') <> '' THEN
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.park_callback(bigint, bigint, uuid) TO '
            || pg_catalog.current_setting('tenure.migrate_grantees_claim_attempts');
  END IF;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
