-- tenure migration 31: a claim that finds every run row held waits for one.
--
-- A claim passes by the run rows other claims hold (FOR UPDATE SKIP LOCKED). A claim holds a run
-- row for its own transaction and takes only a prefix of its ids, so when a queue's untaken ids sit
-- in fewer run rows than there are concurrent claims, a claim could find every row held, return
-- nothing and, in `sleep` mode, join the waiters while ids remained; nothing would wake it until
-- the next enqueue or poll. Now a claim that got nothing from the runs it could lock, while run
-- rows of its queue exist and no `ready` row of it waits, waits once for the first of them (by
-- priority and run, or effective priority with priority_aging), bounded by a lock_timeout of
-- 500 ms (or the session's shorter one; a deadlock ends the wait alike), and offers that run's
-- next ids as before. The lock is taken on the row's latest version: a run the holder used up
-- and deleted is passed by, and `taken` is the one the holder left. A wait that times out leaves
-- the claim as it was (nothing from runs). Only at READ COMMITTED: at REPEATABLE READ the lock of
-- a row its holder moved fails with 40001, so such a claim passes held runs by as before.
-- Everything else is as in migration 30.
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
  -- The run rows offered to this claim (locked), element r of each array run r; NULL without one.
  r_at      tid[];
  r_prio    smallint[];
  r_since   timestamptz[];
  r_taken   int[];
  r_total   int[];
  i_run     int[];                          -- the offered ids: run r_... index, and id
  i_id      bigint[];
  b_prio    int := 32767;                   -- the lim_take-th best offered (priority, id)
  b_id      bigint := 9223372036854775807;
  t_run     int[];                          -- the ids taken from runs, by (priority, id)
  t_id      bigint[];
  rn        int;
  cnt       int;
  got       int := 0;                       -- ids offered so far
  o_at      tid;                            -- the run row just locked
  o_prio    smallint := 0;                  --   (its (priority, run_id): the next one comes after it)
  o_run     bigint := 0;
  o_since   timestamptz;
  o_taken   int;
  o_total   int;
  o_ids     bigint[];
  cand      tid[];                          -- ready rows locked as candidates
  sel       tid[];                          -- the ready rows taken, when chosen here
  waited    boolean := false;                 -- this claim waited for a held run row once
  held      boolean;
  old_lt    text;
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
  -- The run rows, one at a time until their offer fills the claim: each locked and read as its
  -- latest version (READ COMMITTED re-reads a row it waited for or found changed), so `taken` is
  -- the one the next claim of it will see. A run another claim holds is passed by; when every one
  -- is held and this claim has nothing yet, it waits once for the first (below).
  IF lim_take > 0 THEN
    LOOP
      IF lim_aging IS NULL THEN
        SELECT x.ctid, x.priority, x.run_id, x.created_at, x.taken, cardinality(x.job_ids),
               x.job_ids[x.taken + 1 : x.taken + lim_take - got]
          INTO o_at, o_prio, o_run, o_since, o_taken, o_total, o_ids
          FROM @schema@.runs x
         WHERE x.queue = claim_attempts.queue AND (x.priority, x.run_id) > (o_prio, o_run)
         ORDER BY x.priority, x.run_id
         LIMIT 1
         FOR UPDATE SKIP LOCKED;
      ELSE
        SELECT x.ctid, x.priority, x.run_id, x.created_at, x.taken, cardinality(x.job_ids),
               x.job_ids[x.taken + 1 : x.taken + lim_take - got]
          INTO o_at, o_prio, o_run, o_since, o_taken, o_total, o_ids
          FROM @schema@.runs x
         WHERE x.queue = claim_attempts.queue AND x.ctid <> ALL (coalesce(r_at, '{}'))
         ORDER BY greatest(1, x.priority - floor(greatest(0, extract(epoch FROM now() - x.created_at))
                                                  / extract(epoch FROM lim_aging))),
                  x.run_id
         LIMIT 1
         FOR UPDATE SKIP LOCKED;
      END IF;
      IF NOT FOUND THEN
        -- Every run row left is held by other claims. A claim holds one for its own few
        -- milliseconds and takes only a prefix of its ids, so one that would get nothing waits for
        -- the first run (once, at most 500 ms or the session's shorter lock_timeout) instead of
        -- leaving empty-handed, and as a waiter, while ids remain. A run used up meanwhile is
        -- passed by. Not when `ready` rows wait (it takes those, as before), and only at READ
        -- COMMITTED (at REPEATABLE READ the lock of a row the holder moved fails with 40001).
        EXIT WHEN got > 0 OR waited
               OR current_setting('transaction_isolation') <> 'read committed'
               OR NOT EXISTS (SELECT FROM @schema@.runs x WHERE x.queue = claim_attempts.queue)
               OR EXISTS (SELECT FROM @schema@.ready p WHERE p.queue = claim_attempts.queue);
        waited := true;
        old_lt := current_setting('lock_timeout');
        IF (SELECT s.setting::bigint FROM pg_settings s WHERE s.name = 'lock_timeout') NOT BETWEEN 1 AND 500 THEN
          PERFORM set_config('lock_timeout', '500ms', true);
        END IF;
        BEGIN
          IF lim_aging IS NULL THEN
            PERFORM FROM @schema@.runs x
             WHERE x.queue = claim_attempts.queue
             ORDER BY x.priority, x.run_id
             LIMIT 1
             FOR UPDATE;
          ELSE
            PERFORM FROM @schema@.runs x
             WHERE x.queue = claim_attempts.queue
             ORDER BY greatest(1, x.priority - floor(greatest(0, extract(epoch FROM now() - x.created_at))
                                                      / extract(epoch FROM lim_aging))),
                      x.run_id
             LIMIT 1
             FOR UPDATE;
          END IF;
          held := FOUND;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
          held := false;  -- as if it had passed the run by
        END;
        PERFORM set_config('lock_timeout', old_lt, true);
        EXIT WHEN NOT held;
        -- The run is this claim's now, so the pass above finds it (SKIP LOCKED passes only the
        -- locks of others) and reads it as before, from the start of the queue's runs.
        o_prio := 0;
        o_run := 0;
        CONTINUE;
      END IF;
      r_at := r_at || o_at;
      r_prio := r_prio || o_prio;
      r_since := r_since || o_since;
      r_taken := r_taken || o_taken;
      r_total := r_total || o_total;
      i_run := i_run || array_fill(cardinality(r_at), ARRAY[cardinality(o_ids)]);
      i_id := i_id || o_ids;
      got := got + cardinality(o_ids);
      EXIT WHEN got >= lim_take;
    END LOOP;
  END IF;
  IF r_at IS NOT NULL OR lim_aging IS NOT NULL THEN
    -- The candidates among ready rows, locked. Without aging, those that sort before the
    -- lim_take-th best offered id (a range of ready_claim_idx; every one the claim could take,
    -- when the runs offer fewer). With aging, the first lim_take of each priority.
    IF lim_aging IS NULL THEN
      SELECT r_prio[u.run], u.id INTO b_prio, b_id
        FROM unnest(i_run, i_id) AS u(run, id)
       ORDER BY r_prio[u.run], u.id
      OFFSET lim_take - 1 LIMIT 1;
      IF NOT FOUND THEN
        b_prio := 32767;
        b_id := 9223372036854775807;
      END IF;
      cand := ARRAY(SELECT p.ctid FROM @schema@.ready p
                     WHERE p.queue = claim_attempts.queue AND (p.priority, p.id) < (b_prio, b_id)
                     ORDER BY p.priority, p.id
                     LIMIT lim_take
                     FOR UPDATE SKIP LOCKED);
    ELSE
      cand := ARRAY(SELECT c.ctid
                      FROM generate_series(1, 4) AS l(priority)
                     CROSS JOIN LATERAL (
                           SELECT p.ctid
                             FROM @schema@.ready p
                            WHERE p.queue = claim_attempts.queue AND p.priority = l.priority
                            ORDER BY p.id
                            LIMIT lim_take
                            FOR UPDATE SKIP LOCKED) c);
    END IF;
    -- The best lim_take of both: by (priority, id), or with aging by (effective priority, id).
    SELECT coalesce(array_agg(b.at) FILTER (WHERE b.at IS NOT NULL), '{}'),
           array_agg(b.run ORDER BY b.priority, b.id) FILTER (WHERE b.at IS NULL),
           array_agg(b.id ORDER BY b.priority, b.id) FILTER (WHERE b.at IS NULL)
      INTO sel, t_run, t_id
      FROM (SELECT c.*
              FROM (SELECT p.ctid AS at, NULL::int AS run, p.id, p.priority, greatest(p.run_at, p.created_at) AS since
                      FROM @schema@.ready p WHERE p.ctid = ANY (cand)
                    UNION ALL
                    SELECT NULL::tid, u.run, u.id, r_prio[u.run], r_since[u.run]
                      FROM unnest(i_run, i_id) AS u(run, id)) c
             ORDER BY CASE WHEN lim_aging IS NULL THEN c.priority
                           ELSE greatest(1, c.priority - floor(greatest(0, extract(epoch FROM now() - c.since))
                                                               / extract(epoch FROM lim_aging))) END,
                      c.id
             LIMIT lim_take) b;
    -- Each run moves by what was taken from it, or goes when it is used up.
    FOR rn, cnt IN SELECT u.run, count(*) FROM unnest(t_run) AS u(run) GROUP BY u.run LOOP
      IF r_taken[rn] + cnt >= r_total[rn] THEN
        DELETE FROM @schema@.runs x WHERE x.ctid = r_at[rn];
      ELSE
        UPDATE @schema@.runs x SET taken = x.taken + cnt WHERE x.ctid = r_at[rn];
      END IF;
    END LOOP;
  END IF;
  RETURN QUERY
  WITH moved AS (
    DELETE FROM @schema@.ready r
     WHERE r.ctid = ANY (CASE WHEN sel IS NULL
                              THEN ARRAY(SELECT p.ctid FROM @schema@.ready p
                                          WHERE p.queue = claim_attempts.queue
                                          ORDER BY p.priority, p.id
                                          LIMIT lim_take
                                          FOR UPDATE SKIP LOCKED)
                              ELSE sel END)
    RETURNING r.id, r.priority, r.run_at, r.created_at, r.attempt, r.last_error, r.progress, r.resume_payload
  ), batch AS (
    -- One pass over the taken jobs (the deleted rows and the run's), sorted once: every array is
    -- built from the same sequence, so element pos of each is the same job. last_errors, progress
    -- and the resume payloads are NULL arrays when no job carries one.
    SELECT array_agg(m.id) AS ids, min(m.id) AS lo, max(m.id) AS hi,
           -- continuation: a resumed parked attempt keeps its attempt number.
           array_agg(m.attempt + (m.resume_payload IS NULL)::int) AS attempts,
           array_agg(gen_random_uuid()) AS secrets,
           array_agg(m.run_at) AS run_ats,
           array_agg(greatest(m.run_at, m.created_at)) AS available,
           CASE WHEN count(m.last_error) > 0 THEN array_agg(m.last_error) END AS last_errors,
           CASE WHEN count(m.progress) > 0 THEN array_agg(m.progress) END AS progress,
           CASE WHEN count(m.resume_payload) > 0 THEN array_agg(m.resume_payload) END AS resumes
      FROM (SELECT * FROM (SELECT * FROM moved
                           UNION ALL
                           SELECT u.id, r_prio[u.run], r_since[u.run], r_since[u.run], 0, NULL::text, NULL::jsonb,
                                  NULL::jsonb
                             FROM unnest(t_run, t_id) AS u(run, id)) t
             ORDER BY t.priority, t.id) m
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
