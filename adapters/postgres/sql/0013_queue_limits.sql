-- tenure migration 13: limits per queue (max_running, rate_per_second) and priority aging.
--
-- Settings (configure_queue keys; null clears; a bad value raises 22023 naming the setting):
--   max_running      attempts of the queue open at once across every worker process: a positive
--                    whole number. Every open receipt counts, attempts parked in waiting_external
--                    included (they hold their receipt and their worker's permit).
--   rate_per_second  claims of the queue per second across every process: a positive number
--                    (0.5 = one every two seconds), at most 1,000,000. A token bucket kept in the
--                    queue's row: it holds at most `rate_burst` tokens [max(1, rate_per_second)],
--                    refills at rate_per_second from the time that passed (the database's
--                    clock_timestamp()), and each claimed job spends one. So over any span of T
--                    seconds the queue's claims are at most burst + rate_per_second * T. Setting
--                    the rate or the burst again fills the bucket.
--   rate_burst       the bucket's size: a number from 1 to 1,000,000 (null: max(1, rate)); used
--                    only while rate_per_second is set.
--   priority_aging   a positive duration: an available job's effective priority rises one level
--                    (towards 1, never past it) per interval it has waited since it became
--                    available (greatest(run_at, created_at)), so low-priority work cannot
--                    starve under a constant stream of urgent jobs.
--
-- The claim. claim_attempts already read the queue's row for the pause flag; it now reads the
-- limits in that same probe, so a queue without them claims exactly as before. With max_running
-- or rate_per_second set, claim_allowance() locks the queue's row (FOR UPDATE, to the end of the
-- claim's transaction: the queue's limited claims run one at a time across every process), counts
-- the queue's open receipts (a scan of receipts, which holds only open attempts) and refills the
-- bucket, and the claim takes at most what both allow; the tokens it spent are written back in the
-- same transaction. With priority_aging set, the claim takes the first max_jobs jobs of each of the
-- four priorities from the (queue, priority, id) index (FOR UPDATE SKIP LOCKED: up to 4 x max_jobs
-- rows are locked for the claim's transaction) and keeps the max_jobs of lowest effective
-- priority, then lowest id; the claim stays bounded and index-driven. A claim that a limit held
-- back to nothing does not join the waiters (an enqueue cannot make room), so producers send no
-- NOTIFY for a queue that waits only on its limit.

ALTER TABLE @schema@.queues
  ADD COLUMN max_running      int,
  ADD COLUMN rate_per_second  double precision,
  ADD COLUMN rate_burst       double precision,
  ADD COLUMN priority_aging   interval,
  ADD COLUMN rate_tokens      double precision,  -- the bucket: tokens left at rate_refilled_at (NULL: full)
  ADD COLUMN rate_refilled_at timestamptz,
  ADD CHECK (max_running IS NULL OR max_running > 0),
  ADD CHECK (rate_per_second IS NULL OR (rate_per_second > 0 AND rate_per_second <= 1000000)),
  ADD CHECK (rate_burst IS NULL OR (rate_burst >= 1 AND rate_burst <= 1000000)),
  ADD CHECK (priority_aging IS NULL OR priority_aging > '0'::interval);

-- ---- settings -----------------------------------------------------------------------------------

-- As in migration 8, plus the limits and aging (null when not set).
CREATE OR REPLACE FUNCTION @schema@.queue_settings_json(q @schema@.queues) RETURNS jsonb
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_build_object(
    'dead_letter', q.dead_letter,
    'hard_deadline', @schema@.duration_text(q.hard_deadline),
    'backoff_base', @schema@.duration_text(q.backoff_base),
    'backoff_cap', @schema@.duration_text(q.backoff_cap),
    'retain_completed', @schema@.duration_text(q.retain_completed),
    'retain_cancelled', @schema@.duration_text(q.retain_cancelled),
    'retain_failed', @schema@.duration_text(q.retain_failed),
    'max_running', q.max_running,
    'rate_per_second', q.rate_per_second,
    'rate_burst', q.rate_burst,
    'priority_aging', @schema@.duration_text(q.priority_aging))
$$;

-- A positive JSON number from `lo` to `hi` (a whole number when `whole`), or NULL for JSON null.
-- Raises 22023 naming `setting` for anything else.
CREATE FUNCTION @schema@.number_setting(setting text, value jsonb, lo numeric, hi numeric, whole boolean)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  x numeric;
BEGIN
  IF jsonb_typeof(value) = 'null' THEN
    RETURN NULL;
  END IF;
  IF jsonb_typeof(value) = 'number' THEN
    x := (value #>> '{}')::numeric;
  END IF;
  IF x IS NULL OR x < lo OR x > hi OR (whole AND x <> trunc(x)) THEN
    RAISE EXCEPTION 'tenure.configure_queue: % must be a % from % to %, or null for none (got %)', setting,
      CASE WHEN whole THEN 'whole number' ELSE 'number' END, lo, hi, coalesce(value::text, 'NULL')
      USING ERRCODE = '22023';
  END IF;
  RETURN x;
END $$;

-- As in migration 8, plus max_running, rate_per_second, rate_burst and priority_aging (null
-- clears each). Changing the rate or the burst fills the queue's token bucket.
CREATE OR REPLACE FUNCTION @schema@.configure_queue(queue text, settings jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  q   @schema@.queues%ROWTYPE;
  k   text;
  v   jsonb;
  known constant text := 'dead_letter, hard_deadline, backoff_base, backoff_cap, retain_completed, '
                         'retain_cancelled, retain_failed, max_running, rate_per_second, rate_burst, '
                         'priority_aging';
BEGIN
  PERFORM @schema@.check_queue_name(configure_queue.queue, 'tenure.configure_queue');
  IF settings IS NULL OR jsonb_typeof(settings) <> 'object' THEN
    RAISE EXCEPTION 'tenure.configure_queue: settings must be a JSON object (got %)',
      coalesce(jsonb_typeof(settings), 'NULL') USING ERRCODE = '22023';
  END IF;
  INSERT INTO @schema@.queues (name) VALUES (configure_queue.queue) ON CONFLICT (name) DO NOTHING;
  SELECT x.* INTO q FROM @schema@.queues x WHERE x.name = configure_queue.queue FOR UPDATE;
  FOR k, v IN SELECT e.key, e.value FROM jsonb_each(settings) e ORDER BY e.key LOOP
    CASE k
      WHEN 'dead_letter' THEN
        IF jsonb_typeof(v) <> 'boolean' THEN
          RAISE EXCEPTION 'tenure.configure_queue: dead_letter must be true or false (got %)', v::text
            USING ERRCODE = '22023';
        END IF;
        q.dead_letter := (v #>> '{}')::boolean;
      WHEN 'hard_deadline' THEN
        IF jsonb_typeof(v) = 'null' THEN
          q.hard_deadline := NULL;
        ELSE
          q.hard_deadline := @schema@.duration_setting(k, v);
          IF q.hard_deadline <= '0'::interval THEN
            RAISE EXCEPTION 'tenure.configure_queue: hard_deadline must be positive, or null for none (got %)', v::text
              USING ERRCODE = '22023';
          END IF;
        END IF;
      WHEN 'backoff_base' THEN q.backoff_base := @schema@.duration_setting(k, v);
      WHEN 'backoff_cap' THEN q.backoff_cap := @schema@.duration_setting(k, v);
      WHEN 'retain_completed' THEN q.retain_completed := @schema@.duration_setting(k, v);
      WHEN 'retain_cancelled' THEN q.retain_cancelled := @schema@.duration_setting(k, v);
      WHEN 'retain_failed' THEN q.retain_failed := @schema@.duration_setting(k, v);
      WHEN 'max_running' THEN q.max_running := @schema@.number_setting(k, v, 1, 2147483647, true);
      WHEN 'rate_per_second' THEN
        q.rate_per_second := @schema@.number_setting(k, v, 0, 1000000, false);
        IF q.rate_per_second = 0 THEN
          RAISE EXCEPTION 'tenure.configure_queue: rate_per_second must be positive, or null for none (got %)', v::text
            USING ERRCODE = '22023';
        END IF;
        q.rate_tokens := NULL;  -- a full bucket
      WHEN 'rate_burst' THEN
        q.rate_burst := @schema@.number_setting(k, v, 1, 1000000, false);
        q.rate_tokens := NULL;
      WHEN 'priority_aging' THEN
        IF jsonb_typeof(v) = 'null' THEN
          q.priority_aging := NULL;
        ELSE
          q.priority_aging := @schema@.duration_setting(k, v);
          IF q.priority_aging <= '0'::interval THEN
            RAISE EXCEPTION 'tenure.configure_queue: priority_aging must be positive, or null for none (got %)', v::text
              USING ERRCODE = '22023';
          END IF;
        END IF;
      ELSE
        RAISE EXCEPTION 'tenure.configure_queue: unknown setting %', to_jsonb(k)::text
          USING ERRCODE = '22023', HINT = 'known settings: ' || known;
    END CASE;
  END LOOP;
  IF q.backoff_cap < q.backoff_base THEN
    RAISE EXCEPTION 'tenure.configure_queue: backoff_cap (%) must not be less than backoff_base (%)',
      @schema@.duration_text(q.backoff_cap), @schema@.duration_text(q.backoff_base) USING ERRCODE = '22023';
  END IF;
  UPDATE @schema@.queues x
     SET dead_letter = q.dead_letter, hard_deadline = q.hard_deadline, backoff_base = q.backoff_base,
         backoff_cap = q.backoff_cap, retain_completed = q.retain_completed,
         retain_cancelled = q.retain_cancelled, retain_failed = q.retain_failed,
         max_running = q.max_running, rate_per_second = q.rate_per_second, rate_burst = q.rate_burst,
         priority_aging = q.priority_aging, rate_tokens = q.rate_tokens
   WHERE x.name = q.name;
  RETURN @schema@.queue_settings_json(q);
END $$;

-- As in migration 8; the default settings row of a queue without one has the new columns (NULL).
CREATE OR REPLACE FUNCTION @schema@.list_queues()
RETURNS TABLE(queue text, paused boolean, settings jsonb, counts jsonb, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH c AS (
    SELECT j.queue, j.state, count(*) AS n FROM @schema@.jobs j GROUP BY j.queue, j.state
  ), names AS (
    SELECT c.queue FROM c UNION SELECT q.name FROM @schema@.queues q
  )
  SELECT n.queue, coalesce(q.paused, false),
         @schema@.queue_settings_json(coalesce(q, ROW(n.queue, false, NULL, '1 second', '1 hour', false,
                                                      '24 hours', '24 hours', '7 days',
                                                      NULL, NULL, NULL, NULL, NULL, NULL)::@schema@.queues)),
         (SELECT jsonb_object_agg(s.state, coalesce((SELECT c.n FROM c WHERE c.queue = n.queue AND c.state = s.state), 0)
                                  ORDER BY s.ord)
            FROM unnest(ARRAY['scheduled', 'available', 'running', 'waiting_external', 'retryable',
                              'completed', 'failed', 'cancelled']) WITH ORDINALITY AS s(state, ord)),
         (SELECT clock_timestamp() - min(r.run_at) FROM @schema@.ready r WHERE r.queue = n.queue)
    FROM names n LEFT JOIN @schema@.queues q ON q.name = n.queue
   ORDER BY n.queue
$$;

-- ---- the claim ----------------------------------------------------------------------------------

-- How many jobs a claim of `queue` may take now (at most max_jobs), for a queue with max_running
-- or rate_per_second set. Locks the queue's row until the claim's transaction ends, so the
-- queue's limited claims run one at a time and each counts what the ones before it committed.
-- `tokens` and `at`: the refilled bucket (NULL without a rate); the claim writes back
-- tokens - claimed. Only claim_attempts calls it.
CREATE FUNCTION @schema@.claim_allowance(queue text, max_jobs int, OUT allowed int, OUT tokens double precision,
                                         OUT at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = on AS $$
#variable_conflict use_column
DECLARE
  q @schema@.queues%ROWTYPE;
BEGIN
  allowed := claim_allowance.max_jobs;
  SELECT x.* INTO q FROM @schema@.queues x WHERE x.name = claim_allowance.queue FOR UPDATE;
  IF q.max_running IS NOT NULL THEN
    -- receipts holds only open attempts and has no queue index: a scan of them all.
    allowed := least(allowed, greatest(0, q.max_running - (SELECT count(*) FROM @schema@.receipts r
                                                           WHERE r.queue = claim_allowance.queue)));
  END IF;
  IF q.rate_per_second IS NOT NULL THEN
    at := clock_timestamp();  -- after the lock: the refills of successive claims never overlap
    tokens := least(coalesce(q.rate_burst, greatest(1, q.rate_per_second)),
                    coalesce(q.rate_tokens + q.rate_per_second * greatest(0, extract(epoch FROM at - q.rate_refilled_at)),
                             'Infinity'));
    allowed := least(allowed, floor(tokens));
  END IF;
END $$;

-- As in migration 9, plus the limits and aging of this migration: the pause probe also reads them
-- (a queue without them claims as before); max_running / rate_per_second cap the jobs taken
-- (claim_allowance) and the spent tokens are written back; priority_aging picks the candidates
-- by effective priority.
CREATE OR REPLACE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
                                                   idle_mode text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, max_attempts int,
              deadline_at timestamptz, secret uuid, metadata jsonb, available_at timestamptz)
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
