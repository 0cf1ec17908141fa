-- tenure migration 9: job metadata.
--
-- Every job carries `metadata`, a JSON object its producer fills with data about the job rather
-- than for its handler: a W3C trace context ({"traceparent": "00-..."}), a tenant, a request id.
-- The runtime hands it to handlers and middleware with each attempt; tenure never reads it.
--   - The column: `metadata jsonb NOT NULL DEFAULT '{}'` on ready, deferred, receipts, done and
--     dead_letter. A constant default is stored once in the catalog: adding it rewrites no table
--     and existing jobs read '{}'. The read view `jobs` shows it as its last column.
--   - Producers: enqueue and enqueue_batch take it as a last, defaulted parameter (metadata jsonb
--     DEFAULT '{}' / metadatas jsonb[] DEFAULT NULL), so every existing call keeps working. NULL is
--     stored as '{}'. Anything else that is not a JSON object, or whose text (metadata::text) is
--     longer than 8192 bytes, is refused with 22023, naming the field. PostgreSQL cannot
--     overload a function on a defaulted parameter without making calls ambiguous, so the old
--     signatures are dropped and the new ones created, with the grants they had.
--   - The claim: claim_attempts and claim return metadata as their last column (a changed return
--     type: dropped and created, with their grants). claim_attempts then returns available_at:
--     when the job became claimable (its run_at, or its created_at when later), from which the
--     worker measures pickup latency. Metadata travels with the job's row through every move
--     (promotion, claim, completion, failure, retry, snooze, rescue, cancel, admin retry), in the
--     functions below, which are the latest versions with the column added.
--   - complete_batch and heartbeat_batch no longer add `r.job_id = ANY (job_ids)` to their join
--     with the input. The plan these functions cache is generic, chosen from the estimates of the
--     first call in a session; when it became a nested loop over the input, that condition made
--     every probe of receipts_pkey sort and search the whole array (a batch of 1,000: ~200 ms
--     instead of ~5 ms). Joined on (job_id, run_lease) alone, each receipt is one key probe
--     whatever plan is cached.

ALTER TABLE @schema@.ready       ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
ALTER TABLE @schema@.deferred    ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
ALTER TABLE @schema@.receipts    ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
ALTER TABLE @schema@.done        ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
ALTER TABLE @schema@.dead_letter ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';

-- The read view, as in migration 2, plus metadata as the last column.
CREATE OR REPLACE VIEW @schema@.jobs AS
  SELECT id, queue, kind, args, 'available'::text AS state, priority::int AS priority, attempt,
         max_attempts, run_lease, run_at, created_at, NULL::timestamptz AS finalized_at,
         last_error, progress, NULL::timestamptz AS claimed_at, NULL::timestamptz AS heartbeat_at,
         NULL::text AS worker, false AS dead_lettered, metadata
    FROM @schema@.ready
  UNION ALL
  SELECT id, queue, kind, args, state, priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, NULL, last_error, progress, NULL, NULL, NULL, false, metadata
    FROM @schema@.deferred
  UNION ALL
  SELECT r.job_id, r.queue, r.kind, r.args,
         CASE WHEN s.waiting THEN 'waiting_external' ELSE 'running' END, r.priority::int,
         r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, NULL, r.last_error,
         coalesce(s.progress, r.progress), r.claimed_at, s.heartbeat_at, r.worker, false, r.metadata
    FROM @schema@.receipts r
    LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
  UNION ALL
  SELECT id, queue, kind, args, state, priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, finalized_at, last_error, progress, NULL, NULL, NULL, false, metadata
    FROM @schema@.done
  UNION ALL
  SELECT id, queue, kind, args, 'failed', priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, finalized_at, last_error, progress, NULL, NULL, NULL, true, metadata
    FROM @schema@.dead_letter;

-- ---- helpers ----------------------------------------------------------------------------------

-- Raises 22023 unless `metadata` is NULL or a JSON object of at most 8192 bytes of text.
CREATE FUNCTION @schema@.check_job_metadata(metadata jsonb, what text DEFAULT 'job')
RETURNS void LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF metadata IS NOT NULL AND jsonb_typeof(metadata) <> 'object' THEN
    RAISE EXCEPTION '%: metadata must be a JSON object (got a JSON %)', what, jsonb_typeof(metadata)
      USING ERRCODE = '22023';
  END IF;
  IF octet_length(metadata::text) > 8192 THEN
    RAISE EXCEPTION '%: metadata must be at most 8192 bytes as JSON text (got %)', what,
      octet_length(metadata::text) USING ERRCODE = '22023';
  END IF;
END $$;

-- DROP takes a function's grants with it: remember the roles that may run each replaced function
-- (those `tenure grant-producer` / `grant-worker` gave it to) and give it back to them once it is
-- created again.
SELECT pg_catalog.set_config('tenure.migrate_grantees_' || f.name,
                             coalesce((SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', ')
                                         FROM pg_catalog.pg_proc p
                                        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
                                         JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
                                        WHERE p.oid = f.sig::regprocedure
                                          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner), ''),
                             true)
  FROM (VALUES ('enqueue', '@schema@.enqueue(text, jsonb, text, int, timestamptz, int)'),
               ('enqueue_batch', '@schema@.enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[])'),
               ('claim_attempts', '@schema@.claim_attempts(text, int, text, text)'),
               ('claim', '@schema@.claim(text, int, text)')) AS f(name, sig);

DROP FUNCTION @schema@.enqueue(text, jsonb, text, int, timestamptz, int);
DROP FUNCTION @schema@.enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[]);
DROP FUNCTION @schema@.claim(text, int, text);
DROP FUNCTION @schema@.claim_attempts(text, int, text, text);

-- ---- producers --------------------------------------------------------------------------------

-- As in migration 5, plus metadata.
CREATE FUNCTION @schema@.enqueue(kind text, args jsonb DEFAULT '{}', queue text DEFAULT 'default',
                                 priority int DEFAULT 2, run_at timestamptz DEFAULT NULL,
                                 max_attempts int DEFAULT 25, metadata jsonb DEFAULT '{}')
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_id  bigint;
  v_now timestamptz := now();
BEGIN
  -- The common case is checked inline (a simple expression, no extra call); check_job,
  -- check_job_input and check_job_metadata word the error when something is off. Empty metadata
  -- is not measured.
  IF enqueue.kind IS NULL OR enqueue.kind = '' OR length(enqueue.kind) > 255
     OR enqueue.queue IS NULL OR enqueue.queue = '' OR length(enqueue.queue) > 128
     OR enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 1 AND 4
     OR enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1
     OR enqueue.kind ~ '[[:cntrl:]]' OR enqueue.queue ~ '[[:cntrl:]]'
     OR jsonb_typeof(enqueue.args) <> 'object'
     OR enqueue.run_at > '2262-04-11 23:47:16.854775+00'::timestamptz
     OR jsonb_typeof(enqueue.metadata) <> 'object'
     OR (enqueue.metadata <> '{}' AND octet_length(enqueue.metadata::text) > 8192) THEN
    PERFORM @schema@.check_job(enqueue.kind, enqueue.queue, enqueue.priority, enqueue.max_attempts,
                               'tenure.enqueue');
    PERFORM @schema@.check_job_input(enqueue.args, enqueue.run_at, 'tenure.enqueue');
    PERFORM @schema@.check_job_metadata(enqueue.metadata, 'tenure.enqueue');
  END IF;
  v_id := nextval('@schema@.job_id_seq');
  IF enqueue.run_at IS NULL OR enqueue.run_at <= v_now THEN
    INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                run_at, created_at, metadata)
    VALUES (v_id, enqueue.queue, enqueue.kind, coalesce(enqueue.args, '{}'), enqueue.priority, 0,
            enqueue.max_attempts, 0, v_now, v_now, coalesce(enqueue.metadata, '{}'));
    -- Wake-up: only when a worker of this queue said it is idle (no NOTIFY lock otherwise).
    IF EXISTS (SELECT 1 FROM @schema@.waiters w WHERE w.queue = enqueue.queue) THEN
      PERFORM pg_notify(@wake_channel@, enqueue.queue);
    END IF;
  ELSE
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, state, metadata)
    VALUES (v_id, enqueue.queue, enqueue.kind, coalesce(enqueue.args, '{}'), enqueue.priority, 0,
            enqueue.max_attempts, 0, enqueue.run_at, v_now, 'scheduled', coalesce(enqueue.metadata, '{}'));
  END IF;
  RETURN v_id;
END $$;

-- As in migration 5, plus metadatas (NULL: every job's metadata is '{}').
CREATE FUNCTION @schema@.enqueue_batch(kinds text[], args jsonb[], queues text[], priorities int[],
                                       run_ats timestamptz[] DEFAULT NULL,
                                       max_attempts int[] DEFAULT NULL,
                                       metadatas jsonb[] DEFAULT NULL)
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
     OR (enqueue_batch.max_attempts IS NOT NULL AND cardinality(enqueue_batch.max_attempts) <> n)
     OR (metadatas IS NOT NULL AND cardinality(metadatas) <> n) THEN
    RAISE EXCEPTION 'tenure.enqueue_batch: all arrays must have the same length (%)', n
      USING ERRCODE = '22023';
  END IF;
  FOR bad IN
    SELECT u.i, u.k, u.q, u.p, u.m, u.a, u.r, u.d
      FROM unnest(kinds, queues, priorities,
                  coalesce(enqueue_batch.max_attempts, array_fill(25, ARRAY[n])),
                  enqueue_batch.args,
                  coalesce(run_ats, array_fill(NULL::timestamptz, ARRAY[n])),
                  coalesce(metadatas, array_fill(NULL::jsonb, ARRAY[n])))
           WITH ORDINALITY AS u(k, q, p, m, a, r, d, i)
     WHERE u.k IS NULL OR u.k = '' OR length(u.k) > 255 OR u.k ~ '[[:cntrl:]]'
        OR u.q IS NULL OR u.q = '' OR length(u.q) > 128 OR u.q ~ '[[:cntrl:]]'
        OR u.p IS NULL OR u.p NOT BETWEEN 1 AND 4 OR u.m IS NULL OR u.m < 1
        OR jsonb_typeof(u.a) <> 'object' OR u.r > '2262-04-11 23:47:16.854775+00'::timestamptz
        OR jsonb_typeof(u.d) <> 'object' OR (u.d <> '{}' AND octet_length(u.d::text) > 8192)
     ORDER BY u.i LIMIT 1
  LOOP
    PERFORM @schema@.check_job(bad.k, bad.q, bad.p, bad.m, format('tenure.enqueue_batch: job %s', bad.i));
    PERFORM @schema@.check_job_input(bad.a, bad.r, format('tenure.enqueue_batch: job %s', bad.i));
    PERFORM @schema@.check_job_metadata(bad.d, format('tenure.enqueue_batch: job %s', bad.i));
  END LOOP;

  RETURN QUERY
  WITH input AS MATERIALIZED (
    SELECT nextval('@schema@.job_id_seq') AS id, u.*
      FROM unnest(kinds, enqueue_batch.args, queues, priorities,
                  coalesce(run_ats, array_fill(NULL::timestamptz, ARRAY[n])),
                  coalesce(enqueue_batch.max_attempts, array_fill(25, ARRAY[n])),
                  coalesce(metadatas, array_fill(NULL::jsonb, ARRAY[n])))
           WITH ORDINALITY AS u(kind, args, queue, priority, run_at, max_attempts, metadata, ord)
  ), to_ready AS (
    INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                run_at, created_at, metadata)
    SELECT i.id, i.queue, i.kind, coalesce(i.args, '{}'), i.priority, 0, i.max_attempts, 0, now(), now(),
           coalesce(i.metadata, '{}')
      FROM input i WHERE i.run_at IS NULL OR i.run_at <= now()
  ), to_deferred AS (
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, state, metadata)
    SELECT i.id, i.queue, i.kind, coalesce(i.args, '{}'), i.priority, 0, i.max_attempts, 0,
           i.run_at, now(), 'scheduled', coalesce(i.metadata, '{}')
      FROM input i WHERE i.run_at > now()
  )
  SELECT i.ord, i.id FROM input i ORDER BY i.ord;

  -- Wake-up: one NOTIFY per queue of the batch that has an idle worker.
  PERFORM pg_notify(@wake_channel@, w.queue)
     FROM (SELECT DISTINCT u.q AS queue FROM unnest(queues) AS u(q)) w
    WHERE EXISTS (SELECT 1 FROM @schema@.waiters x WHERE x.queue = w.queue);
END $$;

-- ---- workers ----------------------------------------------------------------------------------

-- As in migration 1, plus metadata.
CREATE OR REPLACE FUNCTION @schema@.promote_due(queue text DEFAULT NULL, max_jobs int DEFAULT 1000)
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
                              run_at, created_at, last_error, progress, metadata)
  SELECT id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at,
         last_error, progress, metadata
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

-- As in migration 8, plus metadata: carried into the receipt and returned as the last column.
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

-- As in migration 6, plus metadata as the last column.
CREATE FUNCTION @schema@.claim(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, token text, metadata jsonb)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT c.job_id, c.run_lease, c.kind, c.args, c.attempt, @schema@.make_token(c.job_id, c.run_lease, c.secret),
         c.metadata
    FROM @schema@.claim_attempts($1, $2, $3, NULL) c
$$;

DO $$
DECLARE
  f text;
  sig text;
BEGIN
  FOR f, sig IN VALUES ('enqueue', 'enqueue(text, jsonb, text, int, timestamptz, int, jsonb)'),
                       ('enqueue_batch', 'enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[])'),
                       ('claim_attempts', 'claim_attempts(text, int, text, text)'),
                       ('claim', 'claim(text, int, text)') LOOP
    IF pg_catalog.current_setting('tenure.migrate_grantees_' || f) <> '' THEN
      EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.' || sig || ' TO '
              || pg_catalog.current_setting('tenure.migrate_grantees_' || f);
    END IF;
  END LOOP;
END $$;

-- As in migration 3, without `r.job_id = ANY (job_ids)`: each receipt is one probe of its key.
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
  )
  INSERT INTO @schema@.attempt_state AS s (job_id, run_lease, heartbeat_at, progress)
  SELECT r.job_id, r.run_lease, now(), i.progress
    FROM @schema@.receipts r JOIN input i ON i.job_id = r.job_id AND i.run_lease = r.run_lease
   ORDER BY r.job_id
  ON CONFLICT (job_id, run_lease) DO UPDATE
    SET heartbeat_at = excluded.heartbeat_at, progress = coalesce(excluded.progress, s.progress)
  RETURNING s.job_id, s.run_lease;
END $$;

-- As in migration 3, plus metadata, and each receipt found by one probe of its key (as above).
CREATE OR REPLACE FUNCTION @schema@.complete_batch(job_ids bigint[], run_leases bigint[],
                                                   progress jsonb[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
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
    DELETE FROM @schema@.receipts r
     USING input i LEFT JOIN @schema@.attempt_state s
             ON s.job_id = i.job_id AND s.run_lease = i.run_lease
     WHERE r.job_id = i.job_id AND r.run_lease = i.run_lease AND s.waiting IS NOT TRUE
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

-- As in migration 1, plus metadata.
CREATE OR REPLACE FUNCTION @schema@.fail_attempt(job_id bigint, run_lease bigint, error text,
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
                                   run_lease, run_at, created_at, last_error, progress, state, metadata)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt, r.max_attempts, r.run_lease,
            now() + CASE WHEN fail_attempt.retry_after IS NULL
                         THEN @schema@.backoff(r.queue, r.attempt)
                         ELSE greatest(fail_attempt.retry_after, '0'::interval) END,
            r.created_at, err, p, 'retryable', r.metadata);
    RETURN 'retryable';
  END IF;
  SELECT q.dead_letter INTO dlq FROM @schema@.queues q WHERE q.name = r.queue;
  IF coalesce(dlq, false) THEN
    INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts,
                                      run_lease, run_at, created_at, finalized_at, last_error, progress,
                                      metadata)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt, r.max_attempts, r.run_lease,
            r.run_at, r.created_at, now(), err, p, r.metadata);
  ELSE
    INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                               run_lease, run_at, created_at, finalized_at, last_error, progress, metadata)
    VALUES (r.job_id, r.queue, r.kind, r.args, 'failed', r.priority, r.attempt, r.max_attempts,
            r.run_lease, r.run_at, r.created_at, now(), err, p, r.metadata);
  END IF;
  RETURN 'failed';
END $$;

-- As in migration 1, plus metadata.
CREATE OR REPLACE FUNCTION @schema@.snooze_attempt(job_id bigint, run_lease bigint, delay interval)
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
                                run_at, created_at, last_error, progress, metadata)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt - 1, r.max_attempts,
            r.run_lease, now(), r.created_at, r.last_error, coalesce(p, r.progress), r.metadata);
  ELSE
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, last_error, progress, state, metadata)
    VALUES (r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt - 1, r.max_attempts,
            r.run_lease, now() + snooze_attempt.delay, r.created_at, r.last_error,
            coalesce(p, r.progress), 'scheduled', r.metadata);
  END IF;
  RETURN true;
END $$;

-- As in migration 1, plus metadata.
CREATE OR REPLACE FUNCTION @schema@.cancel_attempt(job_id bigint, run_lease bigint, reason text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  WITH closed AS (
    DELETE FROM @schema@.receipts x
     WHERE x.job_id = cancel_attempt.job_id AND x.run_lease = cancel_attempt.run_lease
    RETURNING x.*
  )
  INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                             run_lease, run_at, created_at, finalized_at, last_error, progress, metadata)
  SELECT c.job_id, c.queue, c.kind, c.args, 'cancelled', c.priority, c.attempt, c.max_attempts,
         c.run_lease, c.run_at, c.created_at, now(),
         coalesce(@schema@.bound_error(cancel_attempt.reason), c.last_error),
         coalesce(s.progress, c.progress), c.metadata
    FROM closed c
    LEFT JOIN @schema@.attempt_state s ON s.job_id = c.job_id AND s.run_lease = c.run_lease;
  RETURN FOUND;
END $$;

-- ---- administration ---------------------------------------------------------------------------

-- As in migration 1, plus metadata.
CREATE OR REPLACE FUNCTION @schema@.cancel_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  lease bigint;
BEGIN
  FOR round IN 1..5 LOOP
    WITH gone AS (DELETE FROM @schema@.ready x WHERE x.id = cancel_job.job_id RETURNING x.*)
    INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                               run_lease, run_at, created_at, finalized_at, last_error, progress, metadata)
    SELECT id, queue, kind, args, 'cancelled', priority, attempt, max_attempts, run_lease, run_at,
           created_at, now(), last_error, progress, metadata FROM gone;
    IF FOUND THEN RETURN true; END IF;

    WITH gone AS (DELETE FROM @schema@.deferred x WHERE x.id = cancel_job.job_id RETURNING x.*)
    INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                               run_lease, run_at, created_at, finalized_at, last_error, progress, metadata)
    SELECT id, queue, kind, args, 'cancelled', priority, attempt, max_attempts, run_lease, run_at,
           created_at, now(), last_error, progress, metadata FROM gone;
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

-- As in migration 1, plus metadata.
CREATE OR REPLACE FUNCTION @schema@.retry_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  WITH gone AS (DELETE FROM @schema@.done x WHERE x.id = retry_job.job_id RETURNING x.*)
  INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                              run_at, created_at, last_error, progress, metadata)
  SELECT id, queue, kind, args, priority, 0, max_attempts, run_lease, now(), created_at,
         last_error, progress, metadata FROM gone;
  IF FOUND THEN RETURN true; END IF;
  WITH gone AS (DELETE FROM @schema@.dead_letter x WHERE x.id = retry_job.job_id RETURNING x.*)
  INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                              run_at, created_at, last_error, progress, metadata)
  SELECT id, queue, kind, args, priority, 0, max_attempts, run_lease, now(), created_at,
         last_error, progress, metadata FROM gone;
  IF FOUND THEN RETURN true; END IF;
  IF EXISTS (SELECT 1 FROM @schema@.jobs x WHERE x.id = retry_job.job_id) THEN
    RETURN false;
  END IF;
  RAISE EXCEPTION 'job % not found', retry_job.job_id USING ERRCODE = 'TN003';
END $$;

-- ---- maintenance ------------------------------------------------------------------------------

-- As in migration 4, plus metadata.
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
                                  run_at, created_at, last_error, progress, metadata)
      VALUES (rec.job_id, rec.queue, rec.kind, rec.args, rec.priority, rec.attempt, rec.max_attempts,
              rec.run_lease, now(), rec.created_at, rec.why, coalesce(rec.live_progress, rec.progress),
              rec.metadata);
      new_state := 'available';
    ELSIF rec.dlq THEN
      INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts,
                                        run_lease, run_at, created_at, finalized_at, last_error, progress,
                                        metadata)
      VALUES (rec.job_id, rec.queue, rec.kind, rec.args, rec.priority, rec.attempt, rec.max_attempts,
              rec.run_lease, rec.run_at, rec.created_at, now(), rec.why,
              coalesce(rec.live_progress, rec.progress), rec.metadata);
      new_state := 'failed';
    ELSE
      INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                                 run_lease, run_at, created_at, finalized_at, last_error, progress, metadata)
      VALUES (rec.job_id, rec.queue, rec.kind, rec.args, 'failed', rec.priority, rec.attempt,
              rec.max_attempts, rec.run_lease, rec.run_at, rec.created_at, now(), rec.why,
              coalesce(rec.live_progress, rec.progress), rec.metadata);
      new_state := 'failed';
    END IF;
    PERFORM pg_notify(@cancel_channel@, rec.job_id || ':' || rec.run_lease);
    job_id := rec.job_id;
    run_lease := rec.run_lease;
    queue := rec.queue;
    RETURN NEXT;
  END LOOP;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
