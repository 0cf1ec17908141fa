-- tenure migration 5: enqueue refuses what the C++ side cannot represent.
--
-- args must be a JSON object (or NULL, stored as {}): handlers read named fields from it, and
-- a scalar or an array was stored as given and only failed once a handler looked at it.
-- run_at must be before 2262-04-11 23:47:16.854775 UTC, the last microsecond a 64-bit count of
-- nanoseconds since 1970 holds (std::chrono::system_clock in the SDK and the CLI). 'infinity'
-- and year 10000 were accepted and made a job that never ran and that no tool could show. Past
-- times (even '-infinity') still mean "now". Both are refused with 22023, like the other fields.
-- Signatures are unchanged; the hot path keeps one inline check and calls the wording function
-- only when something is off.

CREATE FUNCTION @schema@.check_job_input(args jsonb, run_at timestamptz, what text DEFAULT 'job')
RETURNS void LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF args IS NOT NULL AND jsonb_typeof(args) <> 'object' THEN
    RAISE EXCEPTION '%: args must be a JSON object (got a JSON %)', what, jsonb_typeof(args)
      USING ERRCODE = '22023';
  END IF;
  IF run_at > '2262-04-11 23:47:16.854775+00'::timestamptz THEN
    RAISE EXCEPTION '%: run_at must be before 2262-04-11 23:47:16.854775+00 (got %)', what, run_at
      USING ERRCODE = '22023';
  END IF;
END $$;

REVOKE ALL ON FUNCTION @schema@.check_job_input(jsonb, timestamptz, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @schema@.enqueue(kind text, args jsonb DEFAULT '{}', queue text DEFAULT 'default',
                                            priority int DEFAULT 2, run_at timestamptz DEFAULT NULL,
                                            max_attempts int DEFAULT 25)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_id  bigint;
  v_now timestamptz := now();
BEGIN
  -- The common case is checked inline (a simple expression, no extra call); check_job and
  -- check_job_input word the error when something is off.
  IF enqueue.kind IS NULL OR enqueue.kind = '' OR length(enqueue.kind) > 255
     OR enqueue.queue IS NULL OR enqueue.queue = '' OR length(enqueue.queue) > 128
     OR enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 1 AND 4
     OR enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1
     OR enqueue.kind ~ '[[:cntrl:]]' OR enqueue.queue ~ '[[:cntrl:]]'
     OR jsonb_typeof(enqueue.args) <> 'object'
     OR enqueue.run_at > '2262-04-11 23:47:16.854775+00'::timestamptz THEN
    PERFORM @schema@.check_job(enqueue.kind, enqueue.queue, enqueue.priority, enqueue.max_attempts,
                               'tenure.enqueue');
    PERFORM @schema@.check_job_input(enqueue.args, enqueue.run_at, 'tenure.enqueue');
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

CREATE OR REPLACE FUNCTION @schema@.enqueue_batch(kinds text[], args jsonb[], queues text[], priorities int[],
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
    SELECT u.i, u.k, u.q, u.p, u.m, u.a, u.r
      FROM unnest(kinds, queues, priorities,
                  coalesce(enqueue_batch.max_attempts, array_fill(25, ARRAY[n])),
                  enqueue_batch.args,
                  coalesce(run_ats, array_fill(NULL::timestamptz, ARRAY[n])))
           WITH ORDINALITY AS u(k, q, p, m, a, r, i)
     WHERE u.k IS NULL OR u.k = '' OR length(u.k) > 255 OR u.k ~ '[[:cntrl:]]'
        OR u.q IS NULL OR u.q = '' OR length(u.q) > 128 OR u.q ~ '[[:cntrl:]]'
        OR u.p IS NULL OR u.p NOT BETWEEN 1 AND 4 OR u.m IS NULL OR u.m < 1
        OR jsonb_typeof(u.a) <> 'object' OR u.r > '2262-04-11 23:47:16.854775+00'::timestamptz
     ORDER BY u.i LIMIT 1
  LOOP
    PERFORM @schema@.check_job(bad.k, bad.q, bad.p, bad.m, format('tenure.enqueue_batch: job %s', bad.i));
    PERFORM @schema@.check_job_input(bad.a, bad.r, format('tenure.enqueue_batch: job %s', bad.i));
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
