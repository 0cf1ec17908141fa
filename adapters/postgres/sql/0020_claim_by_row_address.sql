-- tenure migration 20: a claim deletes the rows it locked by their address.
--
-- claim_attempts locks its jobs with `SELECT ... FOR UPDATE SKIP LOCKED` in claim order and then
-- deletes them from `ready`. Until now the delete found them again by id (`r.id = ANY (...)`),
-- which left the planner a choice between `ready_pkey` and a scan of the whole `ready_claim_idx`
-- (whose last column is id). On the statistics a VACUUM leaves after a drain (pages, no live
-- rows), and from ~150,000 jobs enqueued after it, the cached generic plan took the whole-index
-- scan: every claim read the entire claim index (~7,900 pages at 200,000 waiting jobs; a claim
-- of 8 took ~48 ms instead of ~1.6 at 300,000) until autoanalyze caught up. The delete now names
-- the locked rows by ctid (`r.ctid = ANY (...)`): a TID scan whatever the statistics say. A row
-- this transaction has locked cannot move before it ends, a row another transaction changed
-- before the lock is re-read by the lock itself, and rows of `ready` are only ever inserted and
-- deleted, so each address is the locked row's. The priority_aging branch collects addresses the
-- same way. Signature, result and grants unchanged.

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
