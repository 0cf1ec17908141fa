-- tenure migration 30: a bulk batch waits in run rows (docs/storage_ledger.md §11).
--
-- A COPY into specs used to be made claimable by one narrow `ready` row per job. It is now made
-- claimable by run rows: per (queue, priority) of the batch, its job ids in ascending slices of at
-- most 200, one row each (small enough to stay inline, and as many rows as concurrent claims need
-- to pass each other), with `taken`, how many of a row's ids claims have taken, in order. A job
-- inside a run is available while its id is past `taken`; it has no row of its own until a claim
-- takes it.
--
-- A claim locks the queue's first run rows (FOR UPDATE SKIP LOCKED: runs other claims hold are
-- skipped), enough to fill it, offers their next ids, and takes the best (priority, id) of them and
-- of the `ready` rows together (with priority_aging: the best effective priority, then id), so jobs
-- come out in the order they would have as rows, run by run within a priority. Of each run it
-- takes a prefix of what it offered; it moves `taken` by that many, or deletes the row when the
-- run is used up. A run never stays with nothing left to take. Everything after the claim is as
-- before: a claims row per claim, and a retry, rescue, snooze or resume puts the job back as a
-- `ready` or `deferred` row.
--
-- An operator's cancel of a job inside a run cuts its id out of the array under the run's row lock
-- (a SELECT ... FOR UPDATE, which waits for a claim holding the row and then checks the id is
-- still untaken on the row's latest version) and puts the job into `ready`, from where cancel_job cancels it as
-- before; if a claim took it meanwhile, cancel_job finds the open attempt instead. The jobs view,
-- queue_depths and list_queues count the untaken ids of runs as available jobs.
--
-- Only the read-back of a COPY into specs (enqueue_copied_ready) writes runs; enqueue,
-- enqueue_batch and the stage of enqueue_copied write `ready` rows as before.

CREATE SEQUENCE @schema@.run_id_seq AS bigint;
CREATE TABLE @schema@.runs (
  run_id     bigint      PRIMARY KEY,
  queue      text        NOT NULL,
  priority   smallint    NOT NULL,
  created_at timestamptz NOT NULL,   -- the batch's: when its jobs became available (their run_at)
  lo         bigint      NOT NULL,   -- min(job_ids), max(job_ids): a job's run is found by the
  hi         bigint      NOT NULL,   --   GiST index on [lo, hi], then its place in the array
  job_ids    bigint[]    NOT NULL,   -- ascending, at most 200
  taken      int         NOT NULL DEFAULT 0,  -- job_ids[1:taken] were claimed; the rest wait
  CHECK (taken >= 0 AND taken < cardinality(job_ids))
);
CREATE INDEX runs_claim_idx ON @schema@.runs (queue, priority, run_id);
CREATE INDEX runs_jobs_idx ON @schema@.runs USING gist (int8range(lo, hi, '[]'));
ALTER TABLE @schema@.runs SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                               autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);

-- The name checks of specs (migration 23) test each kind and queue with the regular expression
-- `[[:cntrl:]]`, a third of a bulk COPY's server time here. A printable ASCII name (any name
-- matching `^[ -~]*$`, a quarter of the cost) holds no control character, so it is tested first and
-- the rest as before: the same rows pass. The constraints keep their names and their exemption of
-- jobs numbered before migration 23; NOT VALID, as they were (no row is read again).
DO $$
DECLARE
  c   record;
  def text;
BEGIN
  FOR c IN SELECT con.conname, pg_catalog.pg_get_constraintdef(con.oid) AS def, x.col
             FROM pg_catalog.pg_constraint con
             JOIN (VALUES ('kind must be 1..255 characters without control characters', 'kind'),
                          ('queue must be 1..128 characters without control characters', 'queue')) AS x(name, col)
               ON x.name = con.conname
            WHERE con.conrelid = '@schema@.specs'::pg_catalog.regclass LOOP
    def := pg_catalog.replace(c.def, format('(%s !~ ''[[:cntrl:]]''::text)', c.col),
                              format('((%1$s ~ ''^[ -~]*$''::text) OR (%1$s !~ ''[[:cntrl:]]''::text))', c.col));
    IF def = c.def THEN
      RAISE EXCEPTION 'tenure migration 30: constraint "%" of specs is not as migration 23 made it: %', c.conname, c.def;
    END IF;
    EXECUTE format('ALTER TABLE @schema@.specs DROP CONSTRAINT %I, ADD CONSTRAINT %I %s', c.conname, c.conname, def);
  END LOOP;
END $$;

-- Whether a row whose xmin is `x` was written by the current transaction (its top-level
-- transaction, whose full id is `top`, or one of its subtransactions, whose ids come later; xids
-- compare modulo 2^32): a visible row whose writer is still in progress is this transaction's.
CREATE FUNCTION @schema@.written_here(x xid, top bigint) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT d < 2147483648 AND pg_xact_status((top + d)::text::xid8) IS NOT DISTINCT FROM 'in progress'
    FROM (SELECT (x::text::bigint - top % 4294967296 + 4294967296) % 4294967296 AS d) t
$$;

-- As in migration 24, reading the COPY's rows back from specs; the jobs it finds go into run rows
-- (per queue and priority, slices of at most 200 ids) instead of a ready row each. One pass over
-- the batch's rows (specs_pkey backwards from currval) gathers their ids in order and whether
-- they share one queue and one priority, as a bulk batch usually does: then, when nothing waits
-- inside the batch's id span, the run rows are written from that pass alone, with no further
-- work per job. A job of the answer that
-- already waits (a second call for the same COPY, or an n that reaches an earlier job of the same
-- subtransaction) goes into no run: the span is probed in deferred, in ready (per queue and
-- priority of the batch) and among the runs this transaction wrote, and only on a hit is each job
-- probed.
CREATE OR REPLACE FUNCTION @schema@.enqueue_copied_ready(n int) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_bitmapscan = off SET enable_sort = off SET enable_seqscan = off SET jit = off AS $$
DECLARE
  last   bigint;
  mine   xid;
  top    bigint;
  k      bigint;
  v_lo   bigint;
  v_hi   bigint;
  ids    bigint[];
  q_lo   text;
  q_hi   text;
  p_lo   smallint;
  p_hi   smallint;
  one    boolean;   -- one queue and one priority
  clash  boolean;   -- something waits inside the span
BEGIN
  IF n IS NULL OR n < 1 THEN
    RETURN NULL;
  END IF;
  BEGIN
    last := currval('@schema@.job_id_seq');
  EXCEPTION WHEN object_not_in_prerequisite_state THEN
    RETURN NULL;  -- the session never drew an id
  END;
  SELECT s.xmin INTO mine FROM @schema@.specs s WHERE s.id = last;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  -- The row must be this transaction's (as in migration 24).
  top := pg_current_xact_id()::text::bigint;
  IF NOT @schema@.written_here(mine, top) THEN
    RETURN NULL;
  END IF;
  SELECT count(*), min(p.id), max(p.id), array_agg(p.id ORDER BY p.id),
         min(p.queue), max(p.queue), min(p.priority), max(p.priority)
    INTO k, v_lo, v_hi, ids, q_lo, q_hi, p_lo, p_hi
    FROM (SELECT s.id, s.queue, s.priority
            FROM @schema@.specs s
           WHERE s.id <= last AND s.xmin = mine
           ORDER BY s.id DESC
           LIMIT n) p;
  IF k <> n THEN
    RETURN NULL;
  END IF;
  one := q_lo = q_hi AND p_lo = p_hi;
  -- Only a run this transaction wrote can hold its jobs (no other transaction sees them): the
  -- runs of other producers whose spans interleave with this batch's are passed by on their xmin.
  clash := EXISTS (SELECT FROM @schema@.deferred d WHERE d.id BETWEEN v_lo AND v_hi)
        OR EXISTS (SELECT FROM @schema@.runs r
                    WHERE int8range(r.lo, r.hi, '[]') && int8range(v_lo, v_hi, '[]')
                      AND @schema@.written_here(r.xmin, top));
  IF NOT clash THEN
    -- The whole key of ready_claim_idx per (queue, priority): for an id alone the planner may scan
    -- all of it when ready's statistics say it is small.
    IF one THEN
      clash := EXISTS (SELECT FROM @schema@.ready r
                        WHERE r.queue = q_lo AND r.priority = p_lo AND r.id BETWEEN v_lo AND v_hi);
    ELSE
      clash := EXISTS (SELECT FROM (SELECT DISTINCT s.queue, s.priority
                                      FROM unnest(ids) AS u(id) JOIN @schema@.specs s ON s.id = u.id) g,
                                   LATERAL (SELECT FROM @schema@.ready r
                                             WHERE r.queue = g.queue AND r.priority = g.priority
                                               AND r.id BETWEEN v_lo AND v_hi
                                             LIMIT 1) x);
    END IF;
  END IF;
  -- One queue and priority with nothing waiting in the span: the batch's ids as gathered. Else
  -- (something waits there, another session's job or one of this batch, or the batch spans
  -- several queues or priorities) job by job, each that waits nowhere yet. Either way, slices of
  -- at most 200 ids, one run row each.
  WITH fresh AS (
    SELECT s.id, s.queue, s.priority
      FROM unnest(ids) AS u(id)
      JOIN @schema@.specs s ON s.id = u.id
     WHERE NOT (one AND NOT clash)
       AND (NOT clash
            OR (NOT EXISTS (SELECT FROM @schema@.ready r
                             WHERE r.queue = s.queue AND r.priority = s.priority AND r.id = s.id OFFSET 0)
                AND NOT EXISTS (SELECT FROM @schema@.deferred d WHERE d.id = s.id OFFSET 0)
                AND NOT EXISTS (SELECT FROM @schema@.runs r
                                 WHERE int8range(r.lo, r.hi, '[]') @> s.id AND @schema@.written_here(r.xmin, top)
                                   AND r.job_ids[r.taken + 1:] @> ARRAY[s.id] OFFSET 0)))
  ), grouped AS (
    SELECT q_lo AS queue, p_lo AS priority, ids WHERE one AND NOT clash
    UNION ALL
    SELECT f.queue, f.priority, array_agg(f.id ORDER BY f.id) FROM fresh f GROUP BY f.queue, f.priority
  )
  INSERT INTO @schema@.runs (run_id, queue, priority, created_at, lo, hi, job_ids)
  SELECT nextval('@schema@.run_id_seq'), g.queue, g.priority, now(), c.ids[1], c.ids[cardinality(c.ids)], c.ids
    FROM grouped g
   CROSS JOIN LATERAL (SELECT g.ids[(i - 1) * 200 + 1 : i * 200] AS ids
                         FROM generate_series(1, (cardinality(g.ids) + 199) / 200) AS i) c;
  -- Wake-up: one NOTIFY per queue of the batch with an idle worker.
  IF EXISTS (SELECT FROM @schema@.waiters) THEN
    PERFORM pg_notify(@wake_channel@, q.queue)
       FROM (SELECT q_lo AS queue WHERE one
             UNION ALL
             SELECT DISTINCT s.queue FROM unnest(ids) AS u(id) JOIN @schema@.specs s ON s.id = u.id WHERE NOT one) q
      WHERE EXISTS (SELECT FROM @schema@.waiters x WHERE x.queue = q.queue);
  END IF;
  RETURN ids::text;
END $$;

-- As in migration 28, also taking jobs from run rows. When the queue has no run row the claim
-- locks and deletes ready rows exactly as before. Otherwise it locks the first run rows it can (by
-- priority, then run; with priority_aging, by effective priority), one at a time until they offer
-- enough ids to fill the claim, offers each one's next ids, locks the ready rows that can come before the lim_take-th best of the
-- offer (all it could take, when the runs offer fewer; with aging, the first lim_take of each
-- priority, as before), and takes the best lim_take of both. What it takes from each run is a
-- prefix of that run's offer (one priority, one age, ascending ids), so `taken` moves by a count,
-- or the run row is deleted when it is used up.
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
  -- the one the next claim of it will see. A run another claim holds is passed by.
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
      EXIT WHEN NOT FOUND;
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

-- A job inside a run, cut out of it under the run's row lock and put into ready as a row of its
-- own (as it would have waited before schema 30): true when it was still untaken. The lock waits
-- for a claim that holds the run row and then checks the id on the row's latest version (READ
-- COMMITTED), so a job a claim took is never cut out. A run left with nothing to take is deleted.
CREATE FUNCTION @schema@.release_from_run(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  r record;
BEGIN
  SELECT x.run_id, x.queue, x.priority, x.created_at, x.taken, cardinality(x.job_ids) AS total
    INTO r
    FROM @schema@.runs x
   WHERE int8range(x.lo, x.hi, '[]') @> release_from_run.job_id
     AND x.job_ids[x.taken + 1:] @> ARRAY[release_from_run.job_id]
     FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF r.taken + 1 >= r.total THEN
    DELETE FROM @schema@.runs x WHERE x.run_id = r.run_id;
  ELSE
    UPDATE @schema@.runs x
       SET job_ids = x.job_ids[1:x.taken] || array_remove(x.job_ids[x.taken + 1:], release_from_run.job_id)
     WHERE x.run_id = r.run_id;
  END IF;
  INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt)
  VALUES (release_from_run.job_id, r.queue, r.priority, r.created_at, r.created_at, 0, 0);
  RETURN true;
END $$;

-- As in migration 24, a job inside a run first cut out of it.
CREATE OR REPLACE FUNCTION @schema@.cancel_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  l       record;
  v_found boolean;
BEGIN
  FOR round IN 1..5 LOOP
    -- A job inside a run is first cut out of it into ready (nothing, when it is not in one).
    PERFORM @schema@.release_from_run(cancel_job.job_id);
    -- (a job waits in ready or in deferred, never in both)
    WITH from_ready AS (DELETE FROM @schema@.ready x WHERE x.id = cancel_job.job_id
                        RETURNING x.id, x.queue, x.attempt, x.run_at, x.last_error, x.progress, x.run_lease),
    from_deferred AS (DELETE FROM @schema@.deferred x WHERE x.id = cancel_job.job_id
                      RETURNING x.id, x.queue, x.attempt, x.run_at, x.last_error, x.progress, x.run_lease),
    gone AS (SELECT * FROM from_ready UNION ALL SELECT * FROM from_deferred),
    recorded AS (
      INSERT INTO @schema@.claims AS c (claim_id, queue, worker, claimed_at, deadline_at, lo, hi, job_ids, attempts,
                                        secrets, run_ats, last_errors, progress, run_leases)
      SELECT nextval('@schema@.claim_id_seq'), g.queue, NULL, now(), NULL, g.id, g.id, ARRAY[g.id], ARRAY[g.attempt],
             ARRAY[gen_random_uuid()], ARRAY[g.run_at],
             CASE WHEN g.last_error IS NOT NULL THEN ARRAY[g.last_error] END,
             CASE WHEN g.progress IS NOT NULL THEN ARRAY[g.progress] END, ARRAY[g.run_lease]
        FROM gone g
      RETURNING c.claim_id, c.queue
    ), settled AS (
      INSERT INTO @schema@.settled_claims (claim_id, queue, ripe_at)
      SELECT r.claim_id, r.queue,
             now() + greatest('5 minutes'::interval,
                              coalesce((SELECT q.retain_cancelled FROM @schema@.queues q WHERE q.name = r.queue),
                                       '24 hours'::interval))
        FROM recorded r
    )
    INSERT INTO @schema@.closures (claim_id, pos, outcome, closed_at)
    SELECT r.claim_id, 1, 'x', now() FROM recorded r;
    IF FOUND THEN RETURN true; END IF;

    SELECT k.claim_id, k.pos, coalesce(k.run_leases[k.pos], k.claim_id * 65536 + k.pos) AS run_lease, x.outcome
      INTO l
      FROM (SELECT c.claim_id, c.run_leases, array_position(c.job_ids, cancel_job.job_id) AS pos
              FROM @schema@.claims c
             WHERE int8range(c.lo, c.hi, '[]') @> cancel_job.job_id AND c.job_ids @> ARRAY[cancel_job.job_id]
             ORDER BY c.claim_id + 0 DESC  -- + 0: through claims_jobs_idx
             LIMIT 1) k
      LEFT JOIN @schema@.closures x ON x.claim_id = k.claim_id AND x.pos = k.pos;
    v_found := FOUND;
    IF v_found AND l.outcome IS NULL THEN
      -- An operator's cancel waits for a closer in a caller's transaction (as it waited for the
      -- receipt's row lock before), then finds the attempt closed and loses; the session's
      -- lock_timeout bounds the wait. Only rescue never waits on a caller.
      PERFORM pg_advisory_xact_lock(hashtext('@schema@.attempt'),
                                    @schema@.attempt_lock_key(cancel_job.job_id, l.run_lease));
      IF @schema@.cancel_attempt(cancel_job.job_id, l.run_lease, 'cancelled by admin') THEN
        PERFORM pg_notify(@cancel_channel@, cancel_job.job_id || ':' || l.run_lease);
        RETURN true;
      END IF;
      CONTINUE;  -- the attempt closed under us; look again
    END IF;

    IF (v_found AND l.outcome IN ('c', 'f', 'x'))
       OR EXISTS (SELECT 1 FROM @schema@.dead_letter x WHERE x.id = cancel_job.job_id) THEN
      RETURN false;
    END IF;
  END LOOP;
  IF NOT EXISTS (SELECT 1 FROM @schema@.jobs x WHERE x.id = cancel_job.job_id) THEN
    RAISE EXCEPTION 'job % not found', cancel_job.job_id USING ERRCODE = 'TN003';
  END IF;
  -- The job kept moving under us, or its attempt stayed locked: a conflict the caller may retry.
  RAISE EXCEPTION 'job % changed state while being cancelled; try again', cancel_job.job_id
    USING ERRCODE = '40001';
END $$;

-- As in migration 24, with the untaken jobs of runs counted as available.
CREATE OR REPLACE FUNCTION @schema@.queue_depths()
RETURNS TABLE(queue text, available bigint, scheduled bigint, retryable bigint, running bigint,
              waiting_external bigint, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
  WITH c AS (
    SELECT r.queue, count(*) AS available, 0::bigint AS scheduled, 0::bigint AS retryable,
           0::bigint AS running, 0::bigint AS waiting, min(greatest(r.run_at, r.created_at)) AS since
      FROM @schema@.ready r GROUP BY r.queue
    UNION ALL
    SELECT r.queue, sum(cardinality(r.job_ids) - r.taken), 0, 0, 0, 0, min(r.created_at)
      FROM @schema@.runs r GROUP BY r.queue
    UNION ALL
    SELECT d.queue, 0, count(*) FILTER (WHERE d.state = 'scheduled'), count(*) FILTER (WHERE d.state = 'retryable'),
           0, 0, NULL
      FROM @schema@.deferred d GROUP BY d.queue
    UNION ALL
    SELECT o.queue, 0, 0, 0, o.n, 0, NULL
      FROM (SELECT o.queue,
                   (SELECT cardinality(c.job_ids) - (SELECT count(*) FROM @schema@.closures x WHERE x.claim_id = c.claim_id)
                      FROM @schema@.claims c WHERE c.claim_id = o.claim_id) AS n
              FROM @schema@.open_claims o) o
     WHERE o.n > 0
    UNION ALL
    SELECT a.queue, 0, 0, 0, -1, 1, NULL
      FROM @schema@.attempt_state s
     CROSS JOIN LATERAL (
           SELECT c.queue, c.claim_id, (s.run_lease & 65535)::int AS pos
             FROM @schema@.claims c
            WHERE s.run_lease >= 65536 AND c.claim_id = s.run_lease >> 16
              AND c.job_ids[(s.run_lease & 65535)::int] = s.job_id AND c.run_leases IS NULL
           UNION ALL
           SELECT c.queue, l.claim_id, l.pos
             FROM @schema@.legacy_attempts l JOIN @schema@.claims c ON c.claim_id = l.claim_id
            WHERE s.run_lease < 65536 AND l.job_id = s.job_id AND l.run_lease = s.run_lease) a
     WHERE s.waiting
       AND NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos)
    UNION ALL
    SELECT q.name, 0, 0, 0, 0, 0, NULL FROM @schema@.queues q
  )
  SELECT c.queue, sum(c.available)::bigint, sum(c.scheduled)::bigint, sum(c.retryable)::bigint,
         sum(c.running)::bigint, sum(c.waiting)::bigint,
         coalesce(greatest(clock_timestamp() - min(c.since), '0'::interval), '0'::interval)
    FROM c GROUP BY c.queue ORDER BY c.queue
$$;

-- As in migration 24, with the untaken jobs of runs counted as available.
CREATE OR REPLACE FUNCTION @schema@.list_queues()
RETURNS TABLE(queue text, paused boolean, settings jsonb, counts jsonb, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
  WITH c AS (
    SELECT u.queue, u.state, sum(u.n)::bigint AS n
      FROM (SELECT r.queue, 'available'::text AS state, count(*) AS n FROM @schema@.ready r GROUP BY r.queue
            UNION ALL
            SELECT r.queue, 'available', sum(cardinality(r.job_ids) - r.taken) FROM @schema@.runs r GROUP BY r.queue
            UNION ALL
            SELECT d.queue, d.state, count(*) FROM @schema@.deferred d GROUP BY d.queue, d.state
            UNION ALL
            SELECT o.queue, 'running',
                   (SELECT cardinality(c.job_ids) - (SELECT count(*) FROM @schema@.closures x WHERE x.claim_id = c.claim_id)
                      FROM @schema@.claims c WHERE c.claim_id = o.claim_id)
              FROM @schema@.open_claims o
            UNION ALL
            SELECT a.queue, v.state, v.n
              FROM @schema@.attempt_state s
             CROSS JOIN (VALUES ('running', -1), ('waiting_external', 1)) AS v(state, n)
             CROSS JOIN LATERAL (
                   SELECT c.queue, c.claim_id, (s.run_lease & 65535)::int AS pos
                     FROM @schema@.claims c
                    WHERE s.run_lease >= 65536 AND c.claim_id = s.run_lease >> 16
                      AND c.job_ids[(s.run_lease & 65535)::int] = s.job_id AND c.run_leases IS NULL
                   UNION ALL
                   SELECT c.queue, l.claim_id, l.pos
                     FROM @schema@.legacy_attempts l JOIN @schema@.claims c ON c.claim_id = l.claim_id
                    WHERE s.run_lease < 65536 AND l.job_id = s.job_id AND l.run_lease = s.run_lease) a
             WHERE s.waiting
               AND NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos)
            UNION ALL
            SELECT t.queue, @schema@.outcome_state(t.outcome), t.n
              FROM (SELECT k.queue, x.outcome, count(*) AS n
                      FROM @schema@.closures x
                      JOIN @schema@.claims k ON k.claim_id = x.claim_id
                     WHERE x.outcome IN ('c', 'f', 'x')
                     GROUP BY k.queue, x.outcome) t
            UNION ALL
            SELECT l.queue, 'failed', count(*) FROM @schema@.dead_letter l GROUP BY l.queue) u
     GROUP BY u.queue, u.state
    HAVING sum(u.n) > 0
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
         clock_timestamp() - least((SELECT min(r.run_at) FROM @schema@.ready r WHERE r.queue = n.queue),
                                   (SELECT min(r.created_at) FROM @schema@.runs r WHERE r.queue = n.queue))
    FROM names n LEFT JOIN @schema@.queues q ON q.name = n.queue
   ORDER BY n.queue
$$;

-- As in migration 24, with a job inside a run available (attempt 0, available since its batch
-- committed). A job in a run has never been claimed, so no claim item of it exists to exclude.
CREATE OR REPLACE VIEW @schema@.jobs AS
SELECT s.id, s.queue, s.kind, s.args, st.state, s.priority::int AS priority, st.attempt, s.max_attempts,
       st.run_lease, st.run_at, s.created_at, st.finalized_at, st.last_error, st.progress,
       st.claimed_at, st.heartbeat_at, st.worker, false AS dead_lettered, s.metadata,
       (SELECT k.unique_key FROM @schema@.job_keys k WHERE k.job_id = s.id) AS unique_key
  FROM @schema@.specs s
 CROSS JOIN LATERAL (
   SELECT 'available'::text AS state, r.attempt, r.run_lease, r.run_at, NULL::timestamptz AS finalized_at,
          r.last_error, r.progress, NULL::timestamptz AS claimed_at, NULL::timestamptz AS heartbeat_at,
          NULL::text AS worker
     FROM @schema@.ready r WHERE r.queue = s.queue AND r.priority = s.priority AND r.id = s.id
   UNION ALL
   SELECT d.state, d.attempt, d.run_lease, d.run_at, NULL, d.last_error, d.progress, NULL, NULL, NULL
     FROM @schema@.deferred d WHERE d.id = s.id
   UNION ALL
   SELECT 'available', 0, 0::bigint, r.created_at, NULL, NULL, NULL, NULL, NULL, NULL
     FROM @schema@.runs r
    WHERE int8range(r.lo, r.hi, '[]') @> s.id AND r.job_ids[r.taken + 1:] @> ARRAY[s.id]
   UNION ALL
   SELECT CASE x.outcome WHEN 'c' THEN 'completed' WHEN 'f' THEN 'failed' WHEN 'x' THEN 'cancelled'
                         ELSE CASE WHEN a.waiting THEN 'waiting_external' ELSE 'running' END END,
          l.attempts[l.pos], coalesce(l.run_leases[l.pos], l.claim_id * 65536 + l.pos), l.run_ats[l.pos],
          x.closed_at, coalesce(x.last_error, l.last_errors[l.pos]),
          coalesce(x.progress, a.progress, l.progress[l.pos]),
          CASE WHEN x.outcome IS NULL THEN l.claimed_at END, CASE WHEN x.outcome IS NULL THEN a.heartbeat_at END,
          CASE WHEN x.outcome IS NULL THEN l.worker END
     FROM (SELECT c.*, array_position(c.job_ids, s.id) AS pos
             FROM @schema@.claims c
            WHERE int8range(c.lo, c.hi, '[]') @> s.id AND c.job_ids @> ARRAY[s.id]
            ORDER BY c.claim_id + 0 DESC LIMIT 1) l  -- + 0: through claims_jobs_idx, not claims_pkey backwards
     LEFT JOIN @schema@.closures x ON x.claim_id = l.claim_id AND x.pos = l.pos
     LEFT JOIN @schema@.attempt_state a
            ON x.outcome IS NULL AND a.job_id = s.id
           AND a.run_lease = coalesce(l.run_leases[l.pos], l.claim_id * 65536 + l.pos)
    WHERE NOT EXISTS (SELECT FROM @schema@.ready r WHERE r.queue = s.queue AND r.priority = s.priority AND r.id = s.id)
      AND NOT EXISTS (SELECT FROM @schema@.deferred d WHERE d.id = s.id)
      AND (x.outcome IS NULL OR x.outcome IN ('c', 'f', 'x'))
 ) st
UNION ALL
SELECT id, queue, kind, args, 'failed', priority::int, attempt, max_attempts, run_lease, run_at,
       created_at, finalized_at, last_error, progress, NULL, NULL, NULL, true, metadata,
       (SELECT k.unique_key FROM @schema@.job_keys k WHERE k.job_id = dead_letter.id)
  FROM @schema@.dead_letter;

REVOKE ALL ON FUNCTION @schema@.release_from_run(bigint), @schema@.written_here(xid, bigint) FROM PUBLIC;
