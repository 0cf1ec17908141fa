-- tenure migration 32: a second read-back of a COPY after a claim in the same transaction places
-- no claimed job again.
--
-- enqueue_copied_ready may be called again for the same COPY (it answers the same ids and places
-- no job twice: a job of the batch that already waits in `ready`, `deferred` or untaken in a run
-- this transaction wrote is left where it is). A job that a claim in the same transaction took
-- (from its run, or from a `ready` row) waited in none of those, so a second call after such a
-- claim wrote it into a new run row and a later claim opened a second attempt of it. The probe of
-- the batch's id span now also looks at the claims this transaction wrote (claims_jobs_idx, then
-- written_here on each row whose span meets the batch's), and the job-by-job path leaves out a job
-- such a claim holds. A cancel in the same transaction records a claims row too, so a job it
-- cancelled is left out alike. Everything else is as in migration 30.
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
                      AND @schema@.written_here(r.xmin, top))
        -- a claim in this transaction took some of them (from a run, or a ready row)
        OR EXISTS (SELECT FROM @schema@.claims c
                    WHERE int8range(c.lo, c.hi, '[]') && int8range(v_lo, v_hi, '[]')
                      AND @schema@.written_here(c.xmin, top));
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
                                   AND r.job_ids[r.taken + 1:] @> ARRAY[s.id] OFFSET 0)
                AND NOT EXISTS (SELECT FROM @schema@.claims c
                                 WHERE int8range(c.lo, c.hi, '[]') @> s.id AND @schema@.written_here(c.xmin, top)
                                   AND c.job_ids @> ARRAY[s.id] OFFSET 0)))
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
