-- tenure migration 1: the lifecycle tables, the read view and the public SQL contract v1.
--
-- Placeholders, replaced by the migration runner: @schema@ (a validated, unquoted identifier),
-- @wake_channel@ and @cancel_channel@ (string literals naming the NOTIFY channels).
-- Every function is SECURITY DEFINER with search_path = pg_catalog, pg_temp and schema-qualified
-- names, and EXECUTE is revoked from PUBLIC at the end: roles get access only through
-- `tenure grant-finalizer|grant-worker|grant-producer`.
--
-- Layout by lifecycle (a job's row moves; its id and run_lease travel with it):
--   ready       claimable now                       (enqueue inserts, claim deletes)
--   deferred    scheduled (future run_at) or retryable (backoff)
--   receipts    one row per open attempt, key (job_id, run_lease)
--   attempt_state  the materialized lease of an attempt that needed mutable state
--   done        terminal history: completed, failed, cancelled
--   dead_letter failed jobs of queues that ask for dead-lettering
--   jobs        the one read view over all of them

CREATE TABLE @schema@.queues (
  name          text PRIMARY KEY,
  dead_letter   boolean  NOT NULL DEFAULT false,
  hard_deadline interval,
  backoff_base  interval NOT NULL DEFAULT '1 second',
  backoff_cap   interval NOT NULL DEFAULT '1 hour',
  CHECK (hard_deadline IS NULL OR hard_deadline > '0'::interval),
  CHECK (backoff_base >= '0'::interval AND backoff_cap >= backoff_base)
);

CREATE SEQUENCE @schema@.job_id_seq AS bigint;

CREATE TABLE @schema@.ready (
  id           bigint      PRIMARY KEY,
  queue        text        NOT NULL,
  kind         text        NOT NULL,
  args         jsonb       NOT NULL,
  priority     smallint    NOT NULL,
  attempt      int         NOT NULL,
  max_attempts int         NOT NULL,
  run_lease    bigint      NOT NULL,
  run_at       timestamptz NOT NULL,
  created_at   timestamptz NOT NULL,
  last_error   text,
  progress     jsonb
);
CREATE INDEX ready_claim_idx ON @schema@.ready (queue, priority, id);

CREATE TABLE @schema@.deferred (
  id           bigint      PRIMARY KEY,
  queue        text        NOT NULL,
  kind         text        NOT NULL,
  args         jsonb       NOT NULL,
  priority     smallint    NOT NULL,
  attempt      int         NOT NULL,
  max_attempts int         NOT NULL,
  run_lease    bigint      NOT NULL,
  run_at       timestamptz NOT NULL,
  created_at   timestamptz NOT NULL,
  last_error   text,
  progress     jsonb,
  state        text        NOT NULL CHECK (state IN ('scheduled', 'retryable'))
);
CREATE INDEX deferred_queue_due_idx ON @schema@.deferred (queue, run_at);
CREATE INDEX deferred_due_idx ON @schema@.deferred (run_at);

CREATE TABLE @schema@.receipts (
  job_id       bigint      NOT NULL,
  run_lease    bigint      NOT NULL,
  queue        text        NOT NULL,
  kind         text        NOT NULL,
  args         jsonb       NOT NULL,
  priority     smallint    NOT NULL,
  attempt      int         NOT NULL,
  max_attempts int         NOT NULL,
  run_at       timestamptz NOT NULL,
  created_at   timestamptz NOT NULL,
  claimed_at   timestamptz NOT NULL,
  deadline_at  timestamptz,
  worker       text,
  last_error   text,
  progress     jsonb,      -- progress carried from earlier attempts (checkpoint)
  PRIMARY KEY (job_id, run_lease)
);

CREATE TABLE @schema@.attempt_state (
  job_id       bigint      NOT NULL,
  run_lease    bigint      NOT NULL,
  heartbeat_at timestamptz NOT NULL,
  progress     jsonb,
  PRIMARY KEY (job_id, run_lease)
);
-- No foreign key to receipts: a closed attempt's row is simply no longer reachable (every reader
-- joins through receipts, and a run lease is never reused), and the maintenance pass sweeps
-- such rows in one statement. This keeps completion free of per-row trigger work and of lock
-- ordering between heartbeat and completion batches.

CREATE TABLE @schema@.done (
  id           bigint      PRIMARY KEY,
  queue        text        NOT NULL,
  kind         text        NOT NULL,
  args         jsonb       NOT NULL,
  state        text        NOT NULL CHECK (state IN ('completed', 'failed', 'cancelled')),
  priority     smallint    NOT NULL,
  attempt      int         NOT NULL,
  max_attempts int         NOT NULL,
  run_lease    bigint      NOT NULL,
  run_at       timestamptz NOT NULL,
  created_at   timestamptz NOT NULL,
  finalized_at timestamptz NOT NULL,
  last_error   text,
  progress     jsonb
);

CREATE TABLE @schema@.dead_letter (
  id           bigint      PRIMARY KEY,
  queue        text        NOT NULL,
  kind         text        NOT NULL,
  args         jsonb       NOT NULL,
  priority     smallint    NOT NULL,
  attempt      int         NOT NULL,
  max_attempts int         NOT NULL,
  run_lease    bigint      NOT NULL,
  run_at       timestamptz NOT NULL,
  created_at   timestamptz NOT NULL,
  finalized_at timestamptz NOT NULL,
  last_error   text,
  progress     jsonb
);

-- Idle workers announce themselves here so enqueue pays for a NOTIFY only when one is waiting.
CREATE UNLOGGED TABLE @schema@.waiters (
  queue  text        NOT NULL,
  worker text        NOT NULL,
  since  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (queue, worker)
);

CREATE VIEW @schema@.jobs AS
  SELECT id, queue, kind, args, 'available'::text AS state, priority::int AS priority, attempt,
         max_attempts, run_lease, run_at, created_at, NULL::timestamptz AS finalized_at,
         last_error, progress, NULL::timestamptz AS claimed_at, NULL::timestamptz AS heartbeat_at,
         NULL::text AS worker, false AS dead_lettered
    FROM @schema@.ready
  UNION ALL
  SELECT id, queue, kind, args, state, priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, NULL, last_error, progress, NULL, NULL, NULL, false
    FROM @schema@.deferred
  UNION ALL
  SELECT r.job_id, r.queue, r.kind, r.args, 'running', r.priority::int, r.attempt, r.max_attempts,
         r.run_lease, r.run_at, r.created_at, NULL, r.last_error, coalesce(s.progress, r.progress),
         r.claimed_at, s.heartbeat_at, r.worker, false
    FROM @schema@.receipts r
    LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
  UNION ALL
  SELECT id, queue, kind, args, state, priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, finalized_at, last_error, progress, NULL, NULL, NULL, false
    FROM @schema@.done
  UNION ALL
  SELECT id, queue, kind, args, 'failed', priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, finalized_at, last_error, progress, NULL, NULL, NULL, true
    FROM @schema@.dead_letter;

-- ---- helpers ----------------------------------------------------------------------------------

-- Parses a version-1 finalization token 'tn1:<job_id>:<run_lease>'. Raises TN002 for anything else.
CREATE FUNCTION @schema@.parse_token(token text, OUT job_id bigint, OUT run_lease bigint)
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  m text[];
BEGIN
  IF token IS NULL THEN
    RAISE EXCEPTION 'malformed finalization token: NULL' USING ERRCODE = 'TN002';
  END IF;
  IF octet_length(token) > 64 THEN
    RAISE EXCEPTION 'malformed finalization token: % bytes (at most 64)', octet_length(token)
      USING ERRCODE = 'TN002';
  END IF;
  m := regexp_match(token, '^tn1:([1-9][0-9]{0,18}):([1-9][0-9]{0,18})$');
  IF m IS NULL THEN
    IF token ~ '^tn[0-9]+:' AND token !~ '^tn1:' THEN
      RAISE EXCEPTION 'malformed finalization token: unknown version' USING ERRCODE = 'TN002',
        HINT = 'this server understands tokens of version tn1';
    END IF;
    RAISE EXCEPTION 'malformed finalization token' USING ERRCODE = 'TN002',
      HINT = 'expected tn1:<job_id>:<run_lease>';
  END IF;
  IF m[1]::numeric > 9223372036854775807 OR m[2]::numeric > 9223372036854775807 THEN
    RAISE EXCEPTION 'malformed finalization token: number out of range' USING ERRCODE = 'TN002';
  END IF;
  job_id := m[1]::bigint;
  run_lease := m[2]::bigint;
END $$;

CREATE FUNCTION @schema@.make_token(job_id bigint, run_lease bigint) RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT 'tn1:' || $1 || ':' || $2
$$;

-- Validates one job's fields; raises 22023 (invalid_parameter_value) naming the bad field.
CREATE FUNCTION @schema@.check_job(kind text, queue text, priority int, max_attempts int,
                                   what text DEFAULT 'job')
RETURNS void LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF kind IS NULL OR kind = '' OR length(kind) > 255 OR kind ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION '%: kind must be 1..255 printable characters', what USING ERRCODE = '22023';
  END IF;
  IF queue IS NULL OR queue = '' OR length(queue) > 128 OR queue ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION '%: queue must be 1..128 printable characters', what USING ERRCODE = '22023';
  END IF;
  IF priority IS NULL OR priority < 1 OR priority > 4 THEN
    RAISE EXCEPTION '%: priority must be between 1 (highest) and 4 (got %)', what, priority
      USING ERRCODE = '22023';
  END IF;
  IF max_attempts IS NULL OR max_attempts < 1 THEN
    RAISE EXCEPTION '%: max_attempts must be at least 1 (got %)', what, max_attempts
      USING ERRCODE = '22023';
  END IF;
END $$;

-- Bounds an error text without losing the fact that it was cut.
CREATE FUNCTION @schema@.bound_error(error text) RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN length($1) <= 65536 THEN $1
              ELSE left($1, 65536) || format(' ... [truncated %s characters]', length($1) - 65536)
         END
$$;

-- Exponential backoff with equal jitter, capped: the n-th failure waits between d/2 and d where
-- d = least(cap, base * 2^(n-1)).
CREATE FUNCTION @schema@.backoff(queue text, attempt int) RETURNS interval
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  base interval := '1 second';
  cap  interval := '1 hour';
  d    interval;
BEGIN
  SELECT q.backoff_base, q.backoff_cap INTO base, cap FROM @schema@.queues q WHERE q.name = backoff.queue;
  IF NOT FOUND THEN base := '1 second'; cap := '1 hour'; END IF;
  d := least(cap, base * power(2, least(greatest(attempt, 1) - 1, 40)));
  RETURN d / 2 + d / 2 * random();
END $$;

-- ---- producers --------------------------------------------------------------------------------

CREATE FUNCTION @schema@.enqueue(kind text, args jsonb DEFAULT '{}', queue text DEFAULT 'default',
                                 priority int DEFAULT 2, run_at timestamptz DEFAULT NULL,
                                 max_attempts int DEFAULT 25)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_id  bigint;
  v_now timestamptz := now();
BEGIN
  -- The common case is checked inline (a simple expression, no extra call); check_job words
  -- the error when something is off.
  IF enqueue.kind IS NULL OR enqueue.kind = '' OR length(enqueue.kind) > 255
     OR enqueue.queue IS NULL OR enqueue.queue = '' OR length(enqueue.queue) > 128
     OR enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 1 AND 4
     OR enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1
     OR enqueue.kind ~ '[[:cntrl:]]' OR enqueue.queue ~ '[[:cntrl:]]' THEN
    PERFORM @schema@.check_job(enqueue.kind, enqueue.queue, enqueue.priority, enqueue.max_attempts,
                               'tenure.enqueue');
  END IF;
  v_id := nextval('@schema@.job_id_seq');
  IF enqueue.run_at IS NULL OR enqueue.run_at <= v_now THEN
    INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                run_at, created_at)
    VALUES (v_id, enqueue.queue, enqueue.kind, coalesce(enqueue.args, '{}'), enqueue.priority, 0,
            enqueue.max_attempts, 0, v_now, v_now);
    -- Wake-up: only when a worker of this queue said it is idle (no NOTIFY lock otherwise).
    IF EXISTS (SELECT 1 FROM @schema@.waiters w WHERE w.queue = enqueue.queue) THEN
      PERFORM pg_notify(@wake_channel@, enqueue.queue);
    END IF;
  ELSE
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, state)
    VALUES (v_id, enqueue.queue, enqueue.kind, coalesce(enqueue.args, '{}'), enqueue.priority, 0,
            enqueue.max_attempts, 0, enqueue.run_at, v_now, 'scheduled');
  END IF;
  RETURN v_id;
END $$;

-- Many jobs in one statement; ids come back in input order. All arrays must have one length
-- (run_ats and max_attempts may be NULL for "now" / 25).
CREATE FUNCTION @schema@.enqueue_batch(kinds text[], args jsonb[], queues text[], priorities int[],
                                       run_ats timestamptz[] DEFAULT NULL,
                                       max_attempts int[] DEFAULT NULL)
RETURNS TABLE(ord bigint, job_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  n   int := coalesce(cardinality(kinds), 0);
  bad record;
BEGIN
  IF coalesce(cardinality(enqueue_batch.args), 0) <> n OR coalesce(cardinality(queues), 0) <> n
     OR coalesce(cardinality(priorities), 0) <> n
     OR (run_ats IS NOT NULL AND cardinality(run_ats) <> n)
     OR (enqueue_batch.max_attempts IS NOT NULL AND cardinality(enqueue_batch.max_attempts) <> n) THEN
    RAISE EXCEPTION 'tenure.enqueue_batch: all arrays must have the same length (%)', n
      USING ERRCODE = '22023';
  END IF;
  FOR bad IN
    SELECT u.i, u.k, u.q, u.p, u.m
      FROM unnest(kinds, queues, priorities,
                  coalesce(enqueue_batch.max_attempts, array_fill(25, ARRAY[n])))
           WITH ORDINALITY AS u(k, q, p, m, i)
     WHERE u.k IS NULL OR u.k = '' OR length(u.k) > 255 OR u.k ~ '[[:cntrl:]]'
        OR u.q IS NULL OR u.q = '' OR length(u.q) > 128 OR u.q ~ '[[:cntrl:]]'
        OR u.p IS NULL OR u.p NOT BETWEEN 1 AND 4 OR u.m IS NULL OR u.m < 1
     ORDER BY u.i LIMIT 1
  LOOP
    PERFORM @schema@.check_job(bad.k, bad.q, bad.p, bad.m,
                               format('tenure.enqueue_batch: job %s', bad.i));
  END LOOP;

  RETURN QUERY
  WITH input AS MATERIALIZED (
    SELECT nextval('@schema@.job_id_seq') AS id, u.*
      FROM unnest(kinds, enqueue_batch.args, queues, priorities,
                  coalesce(run_ats, array_fill(NULL::timestamptz, ARRAY[n])),
                  coalesce(enqueue_batch.max_attempts, array_fill(25, ARRAY[n])))
           WITH ORDINALITY AS u(kind, args, queue, priority, run_at, max_attempts, ord)
  ), to_ready AS (
    INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                run_at, created_at)
    SELECT i.id, i.queue, i.kind, coalesce(i.args, '{}'), i.priority, 0, i.max_attempts, 0, now(), now()
      FROM input i WHERE i.run_at IS NULL OR i.run_at <= now()
  ), to_deferred AS (
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, state)
    SELECT i.id, i.queue, i.kind, coalesce(i.args, '{}'), i.priority, 0, i.max_attempts, 0,
           i.run_at, now(), 'scheduled'
      FROM input i WHERE i.run_at > now()
  )
  SELECT i.ord, i.id FROM input i ORDER BY i.ord;

  -- Wake-up: one NOTIFY per queue of the batch that has an idle worker.
  PERFORM pg_notify(@wake_channel@, w.queue)
     FROM (SELECT DISTINCT u.q AS queue FROM unnest(queues) AS u(q)) w
    WHERE EXISTS (SELECT 1 FROM @schema@.waiters x WHERE x.queue = w.queue);
END $$;

-- ---- workers ----------------------------------------------------------------------------------

-- Moves due deferred jobs of one queue (or of every queue when queue is NULL) to ready.
CREATE FUNCTION @schema@.promote_due(queue text DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  n bigint;
BEGIN
  WITH due AS (
    SELECT d.id FROM @schema@.deferred d
     WHERE (promote_due.queue IS NULL OR d.queue = promote_due.queue) AND d.run_at <= now()
     ORDER BY d.run_at LIMIT promote_due.max_jobs FOR UPDATE SKIP LOCKED
  ), moved AS (
    DELETE FROM @schema@.deferred d USING due WHERE d.id = due.id RETURNING d.*
  )
  INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                              run_at, created_at, last_error, progress)
  SELECT id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at,
         last_error, progress
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

-- The claim with every column the runtime needs. `claim` below is the public projection.
-- idle_mode does the calling worker's wake-up bookkeeping in the same transaction (no extra
-- round trip): 'poll' removes the worker from `waiters` when the claim found jobs; 'sleep' does
-- that too and adds it (refreshed at most once a minute) when the claim found none. A worker
-- passes 'sleep' only before it stops polling eagerly, so producers NOTIFY only then.
CREATE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
                                        idle_mode text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, max_attempts int,
              deadline_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
  -- Promotion is a write statement; a probe of the due index is enough when nothing is due.
  IF EXISTS (SELECT 1 FROM @schema@.deferred d
              WHERE d.queue = claim_attempts.queue AND d.run_at <= now()) THEN
    PERFORM @schema@.promote_due(claim_attempts.queue, 1000);
  END IF;
  RETURN QUERY
  WITH picked AS (
    SELECT r.id FROM @schema@.ready r
     WHERE r.queue = claim_attempts.queue
     ORDER BY r.priority, r.id
     LIMIT claim_attempts.max_jobs
     FOR UPDATE SKIP LOCKED
  ), moved AS (
    DELETE FROM @schema@.ready r USING picked p WHERE r.id = p.id RETURNING r.*
  ), opened AS (
    INSERT INTO @schema@.receipts (job_id, run_lease, queue, kind, args, priority, attempt,
                                   max_attempts, run_at, created_at, claimed_at, deadline_at,
                                   worker, last_error, progress)
    SELECT m.id, m.run_lease + 1, m.queue, m.kind, m.args, m.priority, m.attempt + 1,
           m.max_attempts, m.run_at, m.created_at, now(), now() + q.hard_deadline,
           claim_attempts.worker, m.last_error, m.progress
      FROM moved m LEFT JOIN @schema@.queues q ON q.name = m.queue
    RETURNING job_id, run_lease, kind, args, attempt, max_attempts, deadline_at, priority
  )
  SELECT o.job_id, o.run_lease, o.kind, o.args, o.attempt, o.max_attempts, o.deadline_at
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

CREATE FUNCTION @schema@.claim(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, token text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT c.job_id, c.run_lease, c.kind, c.args, c.attempt, @schema@.make_token(c.job_id, c.run_lease)
    FROM @schema@.claim_attempts($1, $2, $3, NULL) c
$$;

-- Heartbeats (and optional progress) for many attempts in one statement. Returns the live ones;
-- an attempt missing from the result is stale. Takes no lock on receipts, so it never waits for
-- (or deadlocks with) a completion, rescue or caller transaction.
CREATE FUNCTION @schema@.heartbeat_batch(job_ids bigint[], run_leases bigint[],
                                         progress jsonb[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
  )
  INSERT INTO @schema@.attempt_state AS s (job_id, run_lease, heartbeat_at, progress)
  SELECT r.job_id, r.run_lease, now(), i.progress
    FROM @schema@.receipts r JOIN input i ON i.job_id = r.job_id AND i.run_lease = r.run_lease
   ORDER BY r.job_id
  ON CONFLICT (job_id, run_lease) DO UPDATE
    SET heartbeat_at = excluded.heartbeat_at, progress = coalesce(excluded.progress, s.progress)
  RETURNING s.job_id, s.run_lease;
END $$;

CREATE FUNCTION @schema@.heartbeat(token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
BEGIN
  SELECT * INTO t FROM @schema@.parse_token(token);
  RETURN EXISTS (SELECT 1 FROM @schema@.heartbeat_batch(ARRAY[t.job_id], ARRAY[t.run_lease]));
END $$;

-- Completes many attempts in one guarded statement. Returns the applied ones; an attempt missing
-- from the result was stale. The DELETE locks each receipt row: a completion and a rescue (or
-- cancel, or fail) of the same attempt serialize on it and exactly one of them wins; the loser
-- finds the row gone and matches nothing.
CREATE FUNCTION @schema@.complete_batch(job_ids bigint[], run_leases bigint[],
                                        progress jsonb[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(job_ids) IS DISTINCT FROM cardinality(run_leases)
     OR (complete_batch.progress IS NOT NULL
         AND cardinality(complete_batch.progress) IS DISTINCT FROM cardinality(job_ids)) THEN
    RAISE EXCEPTION 'tenure.complete_batch: arrays must have the same length' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  WITH input AS (
    SELECT DISTINCT ON (u.job_id, u.run_lease) u.job_id, u.run_lease, u.progress
      FROM unnest(job_ids, run_leases, complete_batch.progress) AS u(job_id, run_lease, progress)
     ORDER BY u.job_id, u.run_lease, u.progress IS NULL
  ), closed AS (
    DELETE FROM @schema@.receipts r USING input i
     WHERE r.job_id = i.job_id AND r.run_lease = i.run_lease
    RETURNING r.*, i.progress AS final_progress
  )
  INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                             run_lease, run_at, created_at, finalized_at, last_error, progress)
  SELECT c.job_id, c.queue, c.kind, c.args, 'completed', c.priority, c.attempt, c.max_attempts,
         c.run_lease, c.run_at, c.created_at, now(), c.last_error,
         coalesce(c.final_progress, s.progress, c.progress)
    FROM closed c
    LEFT JOIN @schema@.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease
  RETURNING id, run_lease, finalized_at;
END $$;

CREATE FUNCTION @schema@.complete_job(token text, progress jsonb DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  t record;
BEGIN
  SELECT * INTO t FROM @schema@.parse_token(token);
  RETURN QUERY SELECT c.job_id, c.run_lease, c.completed_at
    FROM @schema@.complete_batch(ARRAY[t.job_id], ARRAY[t.run_lease], ARRAY[complete_job.progress]) c;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', t.job_id, t.run_lease
      USING ERRCODE = 'TN001',
            HINT = 'the attempt was rescued, cancelled, re-claimed or already finished; this transaction must roll back';
  END IF;
END $$;

-- Closes one open attempt as failed: retryable with backoff while attempts remain (or after
-- retry_after when given), else failed (dead_letter when the queue asks). Returns the new state,
-- or NULL when the attempt was stale.
CREATE FUNCTION @schema@.fail_attempt(job_id bigint, run_lease bigint, error text,
                                      permanent boolean DEFAULT false,
                                      retry_after interval DEFAULT NULL)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  r   @schema@.receipts%ROWTYPE;
  p   jsonb;
  dlq boolean;
  err text := @schema@.bound_error(fail_attempt.error);
BEGIN
  SELECT s.progress INTO p FROM @schema@.attempt_state s
   WHERE s.job_id = fail_attempt.job_id AND s.run_lease = fail_attempt.run_lease;
  DELETE FROM @schema@.receipts x
   WHERE x.job_id = fail_attempt.job_id AND x.run_lease = fail_attempt.run_lease
  RETURNING x.* INTO r;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  p := coalesce(p, r.progress);
  IF NOT coalesce(fail_attempt.permanent, false) AND r.attempt < r.max_attempts THEN
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, last_error, progress, state)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt, r.max_attempts, r.run_lease,
            now() + CASE WHEN fail_attempt.retry_after IS NULL
                         THEN @schema@.backoff(r.queue, r.attempt)
                         ELSE greatest(fail_attempt.retry_after, '0'::interval) END,
            r.created_at, err, p, 'retryable');
    RETURN 'retryable';
  END IF;
  SELECT q.dead_letter INTO dlq FROM @schema@.queues q WHERE q.name = r.queue;
  IF coalesce(dlq, false) THEN
    INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts,
                                      run_lease, run_at, created_at, finalized_at, last_error, progress)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt, r.max_attempts, r.run_lease,
            r.run_at, r.created_at, now(), err, p);
  ELSE
    INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                               run_lease, run_at, created_at, finalized_at, last_error, progress)
    VALUES (r.job_id, r.queue, r.kind, r.args, 'failed', r.priority, r.attempt, r.max_attempts,
            r.run_lease, r.run_at, r.created_at, now(), err, p);
  END IF;
  RETURN 'failed';
END $$;

CREATE FUNCTION @schema@.fail_job(token text, error text, retry boolean DEFAULT true)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
  s text;
BEGIN
  SELECT * INTO t FROM @schema@.parse_token(token);
  s := @schema@.fail_attempt(t.job_id, t.run_lease, error, NOT coalesce(retry, true));
  IF s IS NULL THEN
    RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', t.job_id, t.run_lease
      USING ERRCODE = 'TN001';
  END IF;
  RETURN s;
END $$;

-- Gives an open attempt back without consuming an attempt. false when stale.
CREATE FUNCTION @schema@.snooze_attempt(job_id bigint, run_lease bigint, delay interval)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  r @schema@.receipts%ROWTYPE;
  p jsonb;
BEGIN
  SELECT s.progress INTO p FROM @schema@.attempt_state s
   WHERE s.job_id = snooze_attempt.job_id AND s.run_lease = snooze_attempt.run_lease;
  DELETE FROM @schema@.receipts x
   WHERE x.job_id = snooze_attempt.job_id AND x.run_lease = snooze_attempt.run_lease
  RETURNING x.* INTO r;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF snooze_attempt.delay IS NULL OR snooze_attempt.delay <= '0'::interval THEN
    INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                run_at, created_at, last_error, progress)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt - 1, r.max_attempts,
            r.run_lease, now(), r.created_at, r.last_error, coalesce(p, r.progress));
  ELSE
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, last_error, progress, state)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt - 1, r.max_attempts,
            r.run_lease, now() + snooze_attempt.delay, r.created_at, r.last_error,
            coalesce(p, r.progress), 'scheduled');
  END IF;
  RETURN true;
END $$;

-- Cancels an open attempt from its own handler. false when stale.
CREATE FUNCTION @schema@.cancel_attempt(job_id bigint, run_lease bigint, reason text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  WITH closed AS (
    DELETE FROM @schema@.receipts x
     WHERE x.job_id = cancel_attempt.job_id AND x.run_lease = cancel_attempt.run_lease
    RETURNING x.*
  )
  INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                             run_lease, run_at, created_at, finalized_at, last_error, progress)
  SELECT c.job_id, c.queue, c.kind, c.args, 'cancelled', c.priority, c.attempt, c.max_attempts,
         c.run_lease, c.run_at, c.created_at, now(),
         coalesce(@schema@.bound_error(cancel_attempt.reason), c.last_error),
         coalesce(s.progress, c.progress)
    FROM closed c
    LEFT JOIN @schema@.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease;
  RETURN FOUND;
END $$;

-- ---- administration ---------------------------------------------------------------------------

-- Cancels a job that has not finished. true when cancelled now, false when it had already
-- finished. Raises TN003 for an unknown job. A running attempt is closed (its late completion
-- will be stale) and every worker is told on the cancel channel ('<job_id>:<run_lease>').
CREATE FUNCTION @schema@.cancel_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  lease bigint;
BEGIN
  FOR round IN 1..5 LOOP
    WITH gone AS (DELETE FROM @schema@.ready x WHERE x.id = cancel_job.job_id RETURNING x.*)
    INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                               run_lease, run_at, created_at, finalized_at, last_error, progress)
    SELECT id, queue, kind, args, 'cancelled', priority, attempt, max_attempts, run_lease, run_at,
           created_at, now(), last_error, progress FROM gone;
    IF FOUND THEN RETURN true; END IF;

    WITH gone AS (DELETE FROM @schema@.deferred x WHERE x.id = cancel_job.job_id RETURNING x.*)
    INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                               run_lease, run_at, created_at, finalized_at, last_error, progress)
    SELECT id, queue, kind, args, 'cancelled', priority, attempt, max_attempts, run_lease, run_at,
           created_at, now(), last_error, progress FROM gone;
    IF FOUND THEN RETURN true; END IF;

    SELECT x.run_lease INTO lease FROM @schema@.receipts x WHERE x.job_id = cancel_job.job_id;
    IF FOUND THEN
      IF @schema@.cancel_attempt(cancel_job.job_id, lease, 'cancelled by admin') THEN
        PERFORM pg_notify(@cancel_channel@, cancel_job.job_id || ':' || lease);
        RETURN true;
      END IF;
      CONTINUE;  -- the attempt closed under us; look again
    END IF;

    IF EXISTS (SELECT 1 FROM @schema@.done x WHERE x.id = cancel_job.job_id)
       OR EXISTS (SELECT 1 FROM @schema@.dead_letter x WHERE x.id = cancel_job.job_id) THEN
      RETURN false;
    END IF;
  END LOOP;
  IF NOT EXISTS (SELECT 1 FROM @schema@.jobs x WHERE x.id = cancel_job.job_id) THEN
    RAISE EXCEPTION 'job % not found', cancel_job.job_id USING ERRCODE = 'TN003';
  END IF;
  -- The job kept moving between tables under us: a conflict the caller may simply retry.
  RAISE EXCEPTION 'job % changed state while being cancelled; try again', cancel_job.job_id
    USING ERRCODE = '40001';
END $$;

-- Admin retry of a finished job (completed, failed, cancelled, dead-lettered): runnable again at
-- once with a fresh attempt budget; its run lease keeps counting up. false when the job has not
-- finished. Raises TN003 for an unknown job.
CREATE FUNCTION @schema@.retry_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  WITH gone AS (DELETE FROM @schema@.done x WHERE x.id = retry_job.job_id RETURNING x.*)
  INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                              run_at, created_at, last_error, progress)
  SELECT id, queue, kind, args, priority, 0, max_attempts, run_lease, now(), created_at,
         last_error, progress FROM gone;
  IF FOUND THEN RETURN true; END IF;
  WITH gone AS (DELETE FROM @schema@.dead_letter x WHERE x.id = retry_job.job_id RETURNING x.*)
  INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                              run_at, created_at, last_error, progress)
  SELECT id, queue, kind, args, priority, 0, max_attempts, run_lease, now(), created_at,
         last_error, progress FROM gone;
  IF FOUND THEN RETURN true; END IF;
  IF EXISTS (SELECT 1 FROM @schema@.jobs x WHERE x.id = retry_job.job_id) THEN
    RETURN false;
  END IF;
  RAISE EXCEPTION 'job % not found', retry_job.job_id USING ERRCODE = 'TN003';
END $$;

-- ---- maintenance ------------------------------------------------------------------------------

-- Closes stale open attempts (no heartbeat, or claim if never heartbeated, for stale_after; or
-- past the hard deadline). Each becomes available at once (no backoff; the attempt counts) or
-- failed when its attempts are spent. Skips rows locked by a concurrent completion, which wins.
CREATE FUNCTION @schema@.rescue_attempts(stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  rec record;
BEGIN
  IF stale_after IS NULL OR stale_after < '0'::interval THEN
    RAISE EXCEPTION 'tenure.rescue_stale: stale_after must be a non-negative interval'
      USING ERRCODE = '22023';
  END IF;
  FOR rec IN
    WITH stale AS (
      SELECT r.job_id, r.run_lease,
             CASE WHEN r.deadline_at <= now() THEN 'rescued: hard deadline passed'
                  ELSE format('rescued: no heartbeat for %s', rescue_attempts.stale_after) END AS why,
             s.progress
        FROM @schema@.receipts r
        LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
       WHERE coalesce(s.heartbeat_at, r.claimed_at) + rescue_attempts.stale_after <= now()
          OR r.deadline_at <= now()
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

CREATE FUNCTION @schema@.rescue_stale(stale_after interval DEFAULT '30 seconds') RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT count(*) FROM @schema@.rescue_attempts($1)
$$;

-- Durable evidence about one attempt (read-only): 'open', 'completed' (by this run lease),
-- 'closed_by_other' or 'unknown_job'.
CREATE FUNCTION @schema@.attempt_evidence(job_id bigint, run_lease bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  IF EXISTS (SELECT 1 FROM @schema@.receipts r
              WHERE r.job_id = attempt_evidence.job_id AND r.run_lease = attempt_evidence.run_lease) THEN
    RETURN 'open';
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.done d
              WHERE d.id = attempt_evidence.job_id AND d.run_lease = attempt_evidence.run_lease
                AND d.state = 'completed') THEN
    RETURN 'completed';
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.jobs j WHERE j.id = attempt_evidence.job_id) THEN
    RETURN 'closed_by_other';
  END IF;
  RETURN 'unknown_job';
END $$;

-- Idle-worker registration for the NOTIFY-on-demand wake-up.
CREATE FUNCTION @schema@.worker_idle(queue text, worker text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  INSERT INTO @schema@.waiters (queue, worker) VALUES ($1, $2) ON CONFLICT DO NOTHING
$$;
CREATE FUNCTION @schema@.worker_busy(queue text, worker text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  DELETE FROM @schema@.waiters w WHERE w.queue = $1 AND w.worker = $2
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA @schema@ FROM PUBLIC;
REVOKE ALL ON SCHEMA @schema@ FROM PUBLIC;
