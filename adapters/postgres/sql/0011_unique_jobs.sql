-- tenure migration 11: unique jobs.
--
-- A producer may give a job a unique key. While a live job (scheduled, available, running,
-- waiting_external, retryable: a row of ready, deferred or receipts) of the same queue holds the
-- key, enqueueing another job with it inserts nothing and answers the holder's id. Once the
-- holder is terminal (completed, failed, cancelled) the next enqueue with the key takes it over.
--   - key_holders: one row per (queue, unique_key), naming the job that holds or last held it.
--     Its primary key is the lock: a producer inserts the row (ON CONFLICT DO NOTHING, which
--     waits for a concurrent uncommitted inserter, as a unique index does); on a conflict it
--     reads the holder and answers it while that job is live; otherwise it locks the row
--     (FOR UPDATE), looks again and moves it to its new job. Nothing about the key changes when
--     a job moves between states, so completion, failure, rescue and cancellation pay nothing.
--     Under REPEATABLE READ or SERIALIZABLE a producer that races another on the same key gets a
--     serialization failure (40001) from the insert or the lock, and sees the holder's state as
--     of its snapshot.
--   - job_keys: each keyed job's key, for display (the `jobs` view's last column, unique_key).
--   - enqueue and enqueue_batch take the key as a last, defaulted parameter (unique_key text /
--     unique_keys text[], NULL: no key). A key is 1..255 bytes without control characters, or
--     refused with 22023 naming unique_key. Keyless calls run the statements they ran before.
--     enqueue_batch answers a third column, inserted: false where the id is an existing holder's
--     (a key repeated within one batch: the later entries answer the first one's job). Keyed
--     entries are taken in (queue, key) order, so two batches never wait for each other in a cycle.
--   - retry_job of a terminal keyed job takes its key back; while another live job holds the key
--     the retry is refused with 23505 (unique_violation), naming the holder.
--   - prune_expired deletes the keys of the jobs it deletes.

CREATE TABLE @schema@.key_holders (
  queue      text   NOT NULL,
  unique_key text   NOT NULL,
  job_id     bigint NOT NULL,
  PRIMARY KEY (queue, unique_key)
);
CREATE INDEX key_holders_job ON @schema@.key_holders (job_id);

CREATE TABLE @schema@.job_keys (
  job_id     bigint PRIMARY KEY,
  queue      text   NOT NULL,
  unique_key text   NOT NULL
);

-- The read view, as in migration 9, plus unique_key as the last column.
CREATE OR REPLACE VIEW @schema@.jobs AS
  SELECT id, queue, kind, args, 'available'::text AS state, priority::int AS priority, attempt,
         max_attempts, run_lease, run_at, created_at, NULL::timestamptz AS finalized_at,
         last_error, progress, NULL::timestamptz AS claimed_at, NULL::timestamptz AS heartbeat_at,
         NULL::text AS worker, false AS dead_lettered, metadata,
         (SELECT k.unique_key FROM @schema@.job_keys k WHERE k.job_id = ready.id) AS unique_key
    FROM @schema@.ready
  UNION ALL
  SELECT id, queue, kind, args, state, priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, NULL, last_error, progress, NULL, NULL, NULL, false, metadata,
         (SELECT k.unique_key FROM @schema@.job_keys k WHERE k.job_id = deferred.id)
    FROM @schema@.deferred
  UNION ALL
  SELECT r.job_id, r.queue, r.kind, r.args,
         CASE WHEN s.waiting THEN 'waiting_external' ELSE 'running' END, r.priority::int,
         r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, NULL, r.last_error,
         coalesce(s.progress, r.progress), r.claimed_at, s.heartbeat_at, r.worker, false, r.metadata,
         (SELECT k.unique_key FROM @schema@.job_keys k WHERE k.job_id = r.job_id)
    FROM @schema@.receipts r
    LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
  UNION ALL
  SELECT id, queue, kind, args, state, priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, finalized_at, last_error, progress, NULL, NULL, NULL, false, metadata,
         (SELECT k.unique_key FROM @schema@.job_keys k WHERE k.job_id = done.id)
    FROM @schema@.done
  UNION ALL
  SELECT id, queue, kind, args, 'failed', priority::int, attempt, max_attempts, run_lease, run_at,
         created_at, finalized_at, last_error, progress, NULL, NULL, NULL, true, metadata,
         (SELECT k.unique_key FROM @schema@.job_keys k WHERE k.job_id = dead_letter.id)
    FROM @schema@.dead_letter;

-- ---- helpers ----------------------------------------------------------------------------------

-- Raises 22023 unless `unique_key` is NULL or 1..255 bytes without control characters.
CREATE FUNCTION @schema@.check_unique_key(unique_key text, what text DEFAULT 'job')
RETURNS void LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF unique_key = '' THEN
    RAISE EXCEPTION '%: unique_key must not be empty (pass NULL for no key)', what USING ERRCODE = '22023';
  END IF;
  IF octet_length(unique_key) > 255 THEN
    RAISE EXCEPTION '%: unique_key must be at most 255 bytes (got %)', what, octet_length(unique_key)
      USING ERRCODE = '22023';
  END IF;
  IF unique_key ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION '%: unique_key must not contain control characters', what USING ERRCODE = '22023';
  END IF;
END $$;

-- Inserts one checked job, keyed or not; for enqueue and enqueue_batch only (granted to nobody).
-- With a key: inserted is false and job_id the holder's while a live job of the queue holds it.
CREATE FUNCTION @schema@.enqueue_one(kind text, args jsonb, queue text, priority int, run_at timestamptz,
                                     max_attempts int, metadata jsonb, unique_key text,
                                     OUT job_id bigint, OUT inserted boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_id   bigint := nextval('@schema@.job_id_seq');
  v_now  timestamptz := now();
  holder bigint;
BEGIN
  IF enqueue_one.unique_key IS NOT NULL THEN
    <<claim_key>>
    FOR round IN 1..10 LOOP
      INSERT INTO @schema@.key_holders (queue, unique_key, job_id)
      VALUES (enqueue_one.queue, enqueue_one.unique_key, v_id)
      ON CONFLICT DO NOTHING;
      EXIT claim_key WHEN FOUND;
      -- Held (the insert waited for a concurrent holder to commit or roll back): answer a live
      -- holder without a lock, so producers of a live key never queue behind each other.
      SELECT h.job_id INTO holder FROM @schema@.key_holders h
       WHERE h.queue = enqueue_one.queue AND h.unique_key = enqueue_one.unique_key;
      CONTINUE claim_key WHEN NOT FOUND;  -- pruned in between: insert again
      IF EXISTS (SELECT 1 FROM @schema@.ready x WHERE x.id = holder)
         OR EXISTS (SELECT 1 FROM @schema@.deferred x WHERE x.id = holder)
         OR EXISTS (SELECT 1 FROM @schema@.receipts x WHERE x.job_id = holder) THEN
        job_id := holder;
        inserted := false;
        RETURN;
      END IF;
      -- The holder is terminal: lock the key, look again (another producer may have taken it
      -- over first) and take it over.
      SELECT h.job_id INTO holder FROM @schema@.key_holders h
       WHERE h.queue = enqueue_one.queue AND h.unique_key = enqueue_one.unique_key
         FOR UPDATE;
      CONTINUE claim_key WHEN NOT FOUND;
      IF EXISTS (SELECT 1 FROM @schema@.ready x WHERE x.id = holder)
         OR EXISTS (SELECT 1 FROM @schema@.deferred x WHERE x.id = holder)
         OR EXISTS (SELECT 1 FROM @schema@.receipts x WHERE x.job_id = holder) THEN
        job_id := holder;
        inserted := false;
        RETURN;
      END IF;
      UPDATE @schema@.key_holders h SET job_id = v_id
       WHERE h.queue = enqueue_one.queue AND h.unique_key = enqueue_one.unique_key;
      EXIT claim_key;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM @schema@.key_holders h
                    WHERE h.queue = enqueue_one.queue AND h.unique_key = enqueue_one.unique_key
                      AND h.job_id = v_id) THEN
      RAISE EXCEPTION 'tenure.enqueue: unique_key % of queue % kept changing hands; try again',
        enqueue_one.unique_key, enqueue_one.queue USING ERRCODE = '40001';
    END IF;
    INSERT INTO @schema@.job_keys (job_id, queue, unique_key)
    VALUES (v_id, enqueue_one.queue, enqueue_one.unique_key);
  END IF;
  IF enqueue_one.run_at IS NULL OR enqueue_one.run_at <= v_now THEN
    INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                run_at, created_at, metadata)
    VALUES (v_id, enqueue_one.queue, enqueue_one.kind, coalesce(enqueue_one.args, '{}'), enqueue_one.priority, 0,
            enqueue_one.max_attempts, 0, v_now, v_now, coalesce(enqueue_one.metadata, '{}'));
  ELSE
    INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                   run_lease, run_at, created_at, state, metadata)
    VALUES (v_id, enqueue_one.queue, enqueue_one.kind, coalesce(enqueue_one.args, '{}'), enqueue_one.priority, 0,
            enqueue_one.max_attempts, 0, enqueue_one.run_at, v_now, 'scheduled',
            coalesce(enqueue_one.metadata, '{}'));
  END IF;
  job_id := v_id;
  inserted := true;
END $$;

-- DROP takes a function's grants with it: remember who may run enqueue and enqueue_batch (as
-- migration 9 does) and give them back once the new ones exist.
SELECT pg_catalog.set_config('tenure.migrate_grantees_' || f.name,
                             coalesce((SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', ')
                                         FROM pg_catalog.pg_proc p
                                        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
                                         JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
                                        WHERE p.oid = f.sig::regprocedure
                                          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner), ''),
                             true)
  FROM (VALUES ('enqueue', '@schema@.enqueue(text, jsonb, text, int, timestamptz, int, jsonb)'),
               ('enqueue_batch', '@schema@.enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[])'))
       AS f(name, sig);

DROP FUNCTION @schema@.enqueue(text, jsonb, text, int, timestamptz, int, jsonb);
DROP FUNCTION @schema@.enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[]);

-- ---- producers --------------------------------------------------------------------------------

-- As in migration 9, plus unique_key. Without a key it runs exactly what it ran before.
CREATE FUNCTION @schema@.enqueue(kind text, args jsonb DEFAULT '{}', queue text DEFAULT 'default',
                                 priority int DEFAULT 2, run_at timestamptz DEFAULT NULL,
                                 max_attempts int DEFAULT 25, metadata jsonb DEFAULT '{}',
                                 unique_key text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_id  bigint;
  v_now timestamptz := now();
BEGIN
  IF enqueue.kind IS NULL OR enqueue.kind = '' OR length(enqueue.kind) > 255
     OR enqueue.queue IS NULL OR enqueue.queue = '' OR length(enqueue.queue) > 128
     OR enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 1 AND 4
     OR enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1
     OR enqueue.kind ~ '[[:cntrl:]]' OR enqueue.queue ~ '[[:cntrl:]]'
     OR jsonb_typeof(enqueue.args) <> 'object'
     OR enqueue.run_at > '2262-04-11 23:47:16.854775+00'::timestamptz
     OR jsonb_typeof(enqueue.metadata) <> 'object'
     OR (enqueue.metadata <> '{}' AND octet_length(enqueue.metadata::text) > 8192)
     OR (enqueue.unique_key IS NOT NULL
         AND (enqueue.unique_key = '' OR octet_length(enqueue.unique_key) > 255
              OR enqueue.unique_key ~ '[[:cntrl:]]')) THEN
    PERFORM @schema@.check_job(enqueue.kind, enqueue.queue, enqueue.priority, enqueue.max_attempts,
                               'tenure.enqueue');
    PERFORM @schema@.check_job_input(enqueue.args, enqueue.run_at, 'tenure.enqueue');
    PERFORM @schema@.check_job_metadata(enqueue.metadata, 'tenure.enqueue');
    PERFORM @schema@.check_unique_key(enqueue.unique_key, 'tenure.enqueue');
  END IF;
  IF enqueue.unique_key IS NOT NULL THEN
    SELECT o.job_id INTO v_id
      FROM @schema@.enqueue_one(enqueue.kind, enqueue.args, enqueue.queue, enqueue.priority, enqueue.run_at,
                                enqueue.max_attempts, enqueue.metadata, enqueue.unique_key) o;
    IF EXISTS (SELECT 1 FROM @schema@.waiters w WHERE w.queue = enqueue.queue) THEN
      PERFORM pg_notify(@wake_channel@, enqueue.queue);
    END IF;
    RETURN v_id;
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

-- As in migration 9, plus unique_keys (NULL, or all NULL: no job has a key, and the batch runs
-- the one set-based statement it ran before) and the inserted column.
CREATE FUNCTION @schema@.enqueue_batch(kinds text[], args jsonb[], queues text[], priorities int[],
                                       run_ats timestamptz[] DEFAULT NULL,
                                       max_attempts int[] DEFAULT NULL,
                                       metadatas jsonb[] DEFAULT NULL,
                                       unique_keys text[] DEFAULT NULL)
RETURNS TABLE(ord bigint, job_id bigint, inserted boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  n    int := coalesce(cardinality(kinds), 0);
  bad  record;
  rec  record;
  one  record;
  ids  bigint[];
  news boolean[];
BEGIN
  IF coalesce(cardinality(enqueue_batch.args), 0) <> n OR coalesce(cardinality(queues), 0) <> n
     OR coalesce(cardinality(priorities), 0) <> n
     OR (run_ats IS NOT NULL AND cardinality(run_ats) <> n)
     OR (enqueue_batch.max_attempts IS NOT NULL AND cardinality(enqueue_batch.max_attempts) <> n)
     OR (metadatas IS NOT NULL AND cardinality(metadatas) <> n)
     OR (unique_keys IS NOT NULL AND cardinality(unique_keys) <> n) THEN
    RAISE EXCEPTION 'tenure.enqueue_batch: all arrays must have the same length (%)', n
      USING ERRCODE = '22023';
  END IF;
  IF cardinality(array_remove(unique_keys, NULL)) = 0 THEN
    unique_keys := NULL;
  END IF;
  FOR bad IN
    SELECT u.i, u.k, u.q, u.p, u.m, u.a, u.r, u.d, u.u
      FROM unnest(kinds, queues, priorities,
                  coalesce(enqueue_batch.max_attempts, array_fill(25, ARRAY[n])),
                  enqueue_batch.args,
                  coalesce(run_ats, array_fill(NULL::timestamptz, ARRAY[n])),
                  coalesce(metadatas, array_fill(NULL::jsonb, ARRAY[n])),
                  coalesce(unique_keys, array_fill(NULL::text, ARRAY[n])))
           WITH ORDINALITY AS u(k, q, p, m, a, r, d, u, i)
     WHERE u.k IS NULL OR u.k = '' OR length(u.k) > 255 OR u.k ~ '[[:cntrl:]]'
        OR u.q IS NULL OR u.q = '' OR length(u.q) > 128 OR u.q ~ '[[:cntrl:]]'
        OR u.p IS NULL OR u.p NOT BETWEEN 1 AND 4 OR u.m IS NULL OR u.m < 1
        OR jsonb_typeof(u.a) <> 'object' OR u.r > '2262-04-11 23:47:16.854775+00'::timestamptz
        OR jsonb_typeof(u.d) <> 'object' OR (u.d <> '{}' AND octet_length(u.d::text) > 8192)
        OR (u.u IS NOT NULL AND (u.u = '' OR octet_length(u.u) > 255 OR u.u ~ '[[:cntrl:]]'))
     ORDER BY u.i LIMIT 1
  LOOP
    PERFORM @schema@.check_job(bad.k, bad.q, bad.p, bad.m, format('tenure.enqueue_batch: job %s', bad.i));
    PERFORM @schema@.check_job_input(bad.a, bad.r, format('tenure.enqueue_batch: job %s', bad.i));
    PERFORM @schema@.check_job_metadata(bad.d, format('tenure.enqueue_batch: job %s', bad.i));
    PERFORM @schema@.check_unique_key(bad.u, format('tenure.enqueue_batch: job %s', bad.i));
  END LOOP;

  IF unique_keys IS NULL THEN
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
    SELECT i.ord, i.id, true FROM input i ORDER BY i.ord;
  ELSE
    -- One job at a time, keyed ones first in (queue, key) order: a key repeated in the batch
    -- finds its first entry's job, and concurrent batches take their keys in the same order.
    ids := array_fill(NULL::bigint, ARRAY[n]);
    news := array_fill(NULL::boolean, ARRAY[n]);
    FOR rec IN
      SELECT u.*
        FROM unnest(kinds, enqueue_batch.args, queues, priorities,
                    coalesce(run_ats, array_fill(NULL::timestamptz, ARRAY[n])),
                    coalesce(enqueue_batch.max_attempts, array_fill(25, ARRAY[n])),
                    coalesce(metadatas, array_fill(NULL::jsonb, ARRAY[n])), unique_keys)
             WITH ORDINALITY AS u(kind, args, queue, priority, run_at, max_attempts, metadata, unique_key, ord)
       ORDER BY u.unique_key IS NULL, u.queue, u.unique_key, u.ord
    LOOP
      SELECT o.job_id, o.inserted INTO one
        FROM @schema@.enqueue_one(rec.kind, rec.args, rec.queue, rec.priority, rec.run_at, rec.max_attempts,
                                  rec.metadata, rec.unique_key) o;
      ids[rec.ord] := one.job_id;
      news[rec.ord] := one.inserted;
    END LOOP;
    RETURN QUERY SELECT g::bigint, ids[g], news[g] FROM generate_series(1, n) g;
  END IF;

  -- Wake-up: one NOTIFY per queue of the batch that has an idle worker.
  PERFORM pg_notify(@wake_channel@, w.queue)
     FROM (SELECT DISTINCT u.q AS queue FROM unnest(queues) AS u(q)) w
    WHERE EXISTS (SELECT 1 FROM @schema@.waiters x WHERE x.queue = w.queue);
END $$;

DO $$
DECLARE
  f text;
  sig text;
BEGIN
  FOR f, sig IN VALUES ('enqueue', 'enqueue(text, jsonb, text, int, timestamptz, int, jsonb, text)'),
                       ('enqueue_batch', 'enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[], text[])') LOOP
    IF pg_catalog.current_setting('tenure.migrate_grantees_' || f) <> '' THEN
      EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.' || sig || ' TO '
              || pg_catalog.current_setting('tenure.migrate_grantees_' || f);
    END IF;
  END LOOP;
END $$;

-- ---- administration ---------------------------------------------------------------------------

-- As in migration 9, plus the job's unique key (see above).
CREATE OR REPLACE FUNCTION @schema@.retry_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  k      record;
  holder bigint;
BEGIN
  -- A terminal keyed job takes its key back first, unless another live job holds it.
  SELECT x.queue, x.unique_key INTO k FROM @schema@.job_keys x WHERE x.job_id = retry_job.job_id;
  IF FOUND AND (EXISTS (SELECT 1 FROM @schema@.done x WHERE x.id = retry_job.job_id)
                OR EXISTS (SELECT 1 FROM @schema@.dead_letter x WHERE x.id = retry_job.job_id)) THEN
    INSERT INTO @schema@.key_holders (queue, unique_key, job_id)
    VALUES (k.queue, k.unique_key, retry_job.job_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
      SELECT h.job_id INTO holder FROM @schema@.key_holders h
       WHERE h.queue = k.queue AND h.unique_key = k.unique_key
         FOR UPDATE;
      IF holder <> retry_job.job_id
         AND (EXISTS (SELECT 1 FROM @schema@.ready x WHERE x.id = holder)
              OR EXISTS (SELECT 1 FROM @schema@.deferred x WHERE x.id = holder)
              OR EXISTS (SELECT 1 FROM @schema@.receipts x WHERE x.job_id = holder)) THEN
        RAISE EXCEPTION 'job % cannot be retried: its unique_key % is held by live job % of queue %',
          retry_job.job_id, k.unique_key, holder, k.queue USING ERRCODE = '23505';
      END IF;
      UPDATE @schema@.key_holders h SET job_id = retry_job.job_id
       WHERE h.queue = k.queue AND h.unique_key = k.unique_key AND h.job_id IS DISTINCT FROM retry_job.job_id;
    END IF;
  END IF;
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

-- As in migration 8, plus the keys of the jobs it deletes (job_keys, and key_holders rows that
-- still name them).
CREATE OR REPLACE FUNCTION @schema@.prune_expired(stale_after interval DEFAULT '30 seconds', max_rows int DEFAULT 50000,
                                       batch int DEFAULT 5000)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  floor_age interval := greatest(coalesce(prune_expired.stale_after, '0'::interval), '5 minutes'::interval);
  budget    bigint := prune_expired.max_rows;
  total     bigint := 0;
  want      bigint;
  n         bigint;
  qn        text;
  cfg       record;
  st        text;
  keep      interval;
BEGIN
  IF prune_expired.max_rows IS NULL OR prune_expired.max_rows < 0
     OR prune_expired.batch IS NULL OR prune_expired.batch < 1 THEN
    RAISE EXCEPTION 'tenure.prune_expired: max_rows must be >= 0 and batch >= 1' USING ERRCODE = '22023';
  END IF;
  -- done: the distinct queues through the retention index (one probe per queue).
  qn := (SELECT min(d.queue) FROM @schema@.done d);
  WHILE qn IS NOT NULL AND budget > 0 LOOP
    SELECT coalesce(q.retain_completed, '24 hours'::interval) AS completed,
           coalesce(q.retain_cancelled, '24 hours'::interval) AS cancelled,
           coalesce(q.retain_failed, '7 days'::interval) AS failed
      INTO cfg FROM (SELECT 1) one LEFT JOIN @schema@.queues q ON q.name = qn;
    FOREACH st IN ARRAY ARRAY['completed', 'cancelled', 'failed'] LOOP
      keep := greatest(CASE st WHEN 'completed' THEN cfg.completed WHEN 'cancelled' THEN cfg.cancelled
                               ELSE cfg.failed END, floor_age);
      LOOP
        want := least(prune_expired.batch, budget);
        EXIT WHEN want <= 0;
        WITH victims AS (
          SELECT d.id FROM @schema@.done d
           WHERE d.queue = qn AND d.state = st AND d.finalized_at < now() - keep
           ORDER BY d.finalized_at
           LIMIT want
             FOR UPDATE SKIP LOCKED
        ), gone AS (
          DELETE FROM @schema@.done d USING victims v WHERE d.id = v.id RETURNING d.id
        ), swept AS (
          DELETE FROM @schema@.attempt_state s USING gone g WHERE s.job_id = g.id
        ), unkeyed AS (
          DELETE FROM @schema@.job_keys k USING gone g WHERE k.job_id = g.id RETURNING k.job_id
        ), released AS (
          DELETE FROM @schema@.key_holders h USING unkeyed u WHERE h.job_id = u.job_id
        )
        SELECT count(*) INTO n FROM gone;
        total := total + n;
        budget := budget - n;
        EXIT WHEN n < want;
      END LOOP;
    END LOOP;
    qn := (SELECT min(d.queue) FROM @schema@.done d WHERE d.queue > qn);
  END LOOP;
  -- dead_letter: failed jobs of dead-lettering queues, kept as long as failed ones.
  qn := (SELECT min(d.queue) FROM @schema@.dead_letter d);
  WHILE qn IS NOT NULL AND budget > 0 LOOP
    keep := greatest((SELECT coalesce(q.retain_failed, '7 days'::interval)
                        FROM (SELECT 1) one LEFT JOIN @schema@.queues q ON q.name = qn), floor_age);
    LOOP
      want := least(prune_expired.batch, budget);
      EXIT WHEN want <= 0;
      WITH victims AS (
        SELECT d.id FROM @schema@.dead_letter d
         WHERE d.queue = qn AND d.finalized_at < now() - keep
         ORDER BY d.finalized_at
         LIMIT want
           FOR UPDATE SKIP LOCKED
      ), gone AS (
        DELETE FROM @schema@.dead_letter d USING victims v WHERE d.id = v.id RETURNING d.id
      ), swept AS (
        DELETE FROM @schema@.attempt_state s USING gone g WHERE s.job_id = g.id
      ), unkeyed AS (
        DELETE FROM @schema@.job_keys k USING gone g WHERE k.job_id = g.id RETURNING k.job_id
      ), released AS (
        DELETE FROM @schema@.key_holders h USING unkeyed u WHERE h.job_id = u.job_id
      )
      SELECT count(*) INTO n FROM gone;
      total := total + n;
      budget := budget - n;
      EXIT WHEN n < want;
    END LOOP;
    qn := (SELECT min(d.queue) FROM @schema@.dead_letter d WHERE d.queue > qn);
  END LOOP;
  RETURN total;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
