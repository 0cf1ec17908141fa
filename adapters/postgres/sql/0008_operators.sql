-- tenure migration 8: queue administration (pause, resume, configure) and retention of finished
-- jobs.
--
-- Pause. A paused queue is claimed by nobody: claim_attempts takes a shared advisory lock on its
--   queue for the rest of its transaction and then reads the pause flag; pause_queue takes the
--   same lock exclusively before it sets the flag. So pause_queue waits for the claims of that
--   queue in progress to commit, and once it has returned no claim of the queue commits again
--   until resume_queue. Running attempts are not touched: heartbeats, completions, failures,
--   rescue and promotion go on as before. resume_queue sends one NOTIFY on the wake channel (a
--   rare operator action), so sleeping workers claim at once.
-- Configure. configure_queue(queue, settings jsonb) changes any of a queue's settings: the
--   dead-letter flag, the hard deadline, the backoff base and cap, and how long finished jobs are
--   kept (retain_completed, retain_cancelled, retain_failed). Durations are strings: a whole
--   number and a unit ('0s', '250ms', '90s', '15m', '2h', '7d'), or PostgreSQL interval text
--   ('1 hour 30 minutes') without months or years. Unknown keys and bad values raise 22023 and
--   change nothing.
-- Retention. The leader's fenced maintain() pass also deletes finished jobs kept longer than
--   their queue's retention (defaults: completed 24 hours, cancelled 24 hours, failed and
--   dead-lettered 7 days), never one finished less than the prune floor ago (5 minutes, or the
--   pass's stale_after when that is longer), in statements of at most 5,000 rows and at most
--   50,000 rows per pass. Everything kept about a pruned job goes: its done or dead_letter row
--   (with its args and progress) and any attempt_state row (callback state) left of it.
--
-- Roles: `tenure grant-admin ROLE` gives pause_queue, resume_queue, configure_queue and
-- list_queues, and nothing else.

ALTER TABLE @schema@.queues
  ADD COLUMN paused           boolean  NOT NULL DEFAULT false,
  ADD COLUMN retain_completed interval NOT NULL DEFAULT '24 hours',
  ADD COLUMN retain_cancelled interval NOT NULL DEFAULT '24 hours',
  ADD COLUMN retain_failed    interval NOT NULL DEFAULT '7 days',
  ADD CHECK (retain_completed >= '0'::interval AND retain_cancelled >= '0'::interval
             AND retain_failed >= '0'::interval);

-- Retention scans walk exactly the expired rows of one queue and state, oldest first.
CREATE INDEX done_retention_idx ON @schema@.done (queue, state, finalized_at);
CREATE INDEX dead_letter_retention_idx ON @schema@.dead_letter (queue, finalized_at);

-- ---- helpers ----------------------------------------------------------------------------------

-- Raises 22023 unless `queue` is a valid queue name (as enqueue checks it).
CREATE FUNCTION @schema@.check_queue_name(queue text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF queue IS NULL OR queue = '' OR length(queue) > 128 OR queue ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION '%: queue must be 1..128 printable characters', what USING ERRCODE = '22023';
  END IF;
END $$;

-- A duration setting from its JSON value: a string, either '<digits><unit>' with unit us, ms, s,
-- m (minutes), h or d (24 hours), or PostgreSQL interval text without months or years. Raises
-- 22023 naming `setting` for anything else, for a negative duration, and beyond 36,500 days.
CREATE FUNCTION @schema@.duration_setting(setting text, value jsonb) RETURNS interval
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t  text;
  m  text[];
  iv interval;
  us numeric;
BEGIN
  IF value IS NULL OR jsonb_typeof(value) <> 'string' THEN
    RAISE EXCEPTION 'tenure.configure_queue: % must be a duration string such as ''90s'', ''15m'', ''2h'' or ''7d'' (got %)',
      setting, coalesce(value::text, 'NULL') USING ERRCODE = '22023';
  END IF;
  t := value #>> '{}';
  m := regexp_match(t, '^\s*([0-9]{1,15})\s*(us|ms|s|m|h|d)\s*$');
  IF m IS NOT NULL THEN
    us := m[1]::numeric * CASE m[2] WHEN 'us' THEN 1 WHEN 'ms' THEN 1000 WHEN 's' THEN 1000000
                                     WHEN 'm' THEN 60000000 WHEN 'h' THEN 3600000000
                                     ELSE 86400000000 END;
  ELSE
    BEGIN
      iv := t::interval;
    EXCEPTION WHEN OTHERS THEN
      RAISE EXCEPTION 'tenure.configure_queue: % must be a duration such as ''90s'', ''15m'', ''2h'' or ''7d'' (got ''%'')',
        setting, t USING ERRCODE = '22023';
    END;
    IF extract(month FROM iv) <> 0 OR extract(year FROM iv) <> 0 THEN
      RAISE EXCEPTION 'tenure.configure_queue: % must not count months or years, which have no fixed length (got ''%''): use days',
        setting, t USING ERRCODE = '22023';
    END IF;
    us := extract(epoch FROM iv) * 1000000;
  END IF;
  IF us < 0 THEN
    RAISE EXCEPTION 'tenure.configure_queue: % must not be negative (got ''%'')', setting, t USING ERRCODE = '22023';
  END IF;
  IF us > 36500::numeric * 86400000000 THEN
    RAISE EXCEPTION 'tenure.configure_queue: % must be at most 36500d (got ''%'')', setting, t USING ERRCODE = '22023';
  END IF;
  RETURN make_interval(secs => (us / 1000000)::double precision);
END $$;

-- The compact text of a duration: the largest unit that states it exactly ('90s', '2h', '7d',
-- '1500ms'); NULL for NULL.
CREATE FUNCTION @schema@.duration_text(d interval) RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  us numeric := round(extract(epoch FROM d) * 1000000);
BEGIN
  IF us IS NULL THEN RETURN NULL; END IF;
  IF us = 0 THEN RETURN '0s'; END IF;
  IF us % 86400000000 = 0 THEN RETURN (us / 86400000000)::bigint || 'd'; END IF;
  IF us % 3600000000 = 0 THEN RETURN (us / 3600000000)::bigint || 'h'; END IF;
  IF us % 60000000 = 0 THEN RETURN (us / 60000000)::bigint || 'm'; END IF;
  IF us % 1000000 = 0 THEN RETURN (us / 1000000)::bigint || 's'; END IF;
  IF us % 1000 = 0 THEN RETURN (us / 1000)::bigint || 'ms'; END IF;
  RETURN us::bigint || 'us';
END $$;

-- A queue's settings as JSON (every key configure_queue knows, durations as duration_text).
CREATE FUNCTION @schema@.queue_settings_json(q @schema@.queues) RETURNS jsonb
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_build_object(
    'dead_letter', q.dead_letter,
    'hard_deadline', @schema@.duration_text(q.hard_deadline),
    'backoff_base', @schema@.duration_text(q.backoff_base),
    'backoff_cap', @schema@.duration_text(q.backoff_cap),
    'retain_completed', @schema@.duration_text(q.retain_completed),
    'retain_cancelled', @schema@.duration_text(q.retain_cancelled),
    'retain_failed', @schema@.duration_text(q.retain_failed))
$$;

-- ---- administration ---------------------------------------------------------------------------

-- Pauses `queue`: no claim of it commits once this has returned, until resume_queue. Waits for
-- the queue's claims in progress (they hold the queue's advisory lock FOR SHARE). true when the
-- queue was running, false when it was already paused.
CREATE FUNCTION @schema@.pause_queue(queue text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM @schema@.check_queue_name(pause_queue.queue, 'tenure.pause_queue');
  PERFORM pg_advisory_xact_lock(hashtext('@schema@.queue_claims'), hashtext(pause_queue.queue));
  INSERT INTO @schema@.queues AS q (name, paused) VALUES (pause_queue.queue, true)
  ON CONFLICT (name) DO UPDATE SET paused = true WHERE NOT q.paused;
  RETURN FOUND;
END $$;

-- Resumes `queue` and wakes its sleeping workers (one NOTIFY on the wake channel). true when the
-- queue was paused, false when it was running.
CREATE FUNCTION @schema@.resume_queue(queue text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM @schema@.check_queue_name(resume_queue.queue, 'tenure.resume_queue');
  UPDATE @schema@.queues q SET paused = false WHERE q.name = resume_queue.queue AND q.paused;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify(@wake_channel@, resume_queue.queue);
  RETURN true;
END $$;

-- Changes some of `queue`'s settings (a JSON object; keys not given keep their value) and returns
-- all of them. Keys: dead_letter (true/false), hard_deadline (a positive duration, or null for
-- none), backoff_base, backoff_cap (durations, base <= cap), retain_completed, retain_cancelled,
-- retain_failed (durations, 0 = as soon as the prune floor allows). Raises 22023 for an unknown
-- key or a bad value, naming it; nothing is changed then.
CREATE FUNCTION @schema@.configure_queue(queue text, settings jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  q   @schema@.queues%ROWTYPE;
  k   text;
  v   jsonb;
  known constant text := 'dead_letter, hard_deadline, backoff_base, backoff_cap, retain_completed, '
                         'retain_cancelled, retain_failed';
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
         retain_cancelled = q.retain_cancelled, retain_failed = q.retain_failed
   WHERE x.name = q.name;
  RETURN @schema@.queue_settings_json(q);
END $$;

-- Every queue that holds a job or has settings: whether it is paused, its settings, its jobs per
-- state and the age of its oldest available job (NULL when none). Counting reads every job
-- (finished ones included): an operator's query, not one for a hot loop.
CREATE FUNCTION @schema@.list_queues()
RETURNS TABLE(queue text, paused boolean, settings jsonb, counts jsonb, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH c AS (
    SELECT j.queue, j.state, count(*) AS n FROM @schema@.jobs j GROUP BY j.queue, j.state
  ), names AS (
    SELECT c.queue FROM c UNION SELECT q.name FROM @schema@.queues q
  )
  SELECT n.queue, coalesce(q.paused, false),
         @schema@.queue_settings_json(coalesce(q, ROW(n.queue, false, NULL, '1 second', '1 hour', false,
                                                      '24 hours', '24 hours', '7 days')::@schema@.queues)),
         (SELECT jsonb_object_agg(s.state, coalesce((SELECT c.n FROM c WHERE c.queue = n.queue AND c.state = s.state), 0)
                                  ORDER BY s.ord)
            FROM unnest(ARRAY['scheduled', 'available', 'running', 'waiting_external', 'retryable',
                              'completed', 'failed', 'cancelled']) WITH ORDINALITY AS s(state, ord)),
         (SELECT clock_timestamp() - min(r.run_at) FROM @schema@.ready r WHERE r.queue = n.queue)
    FROM names n LEFT JOIN @schema@.queues q ON q.name = n.queue
   ORDER BY n.queue
$$;

-- ---- the claim skips a paused queue -------------------------------------------------------------

-- As in migration 6, plus the pause check first: the queue's advisory lock FOR SHARE (held to the
-- end of the transaction, so pause_queue waits for this claim), then the flag. A paused queue
-- returns no row and does no wake-up bookkeeping (resume_queue wakes its workers).
CREATE OR REPLACE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
                                                   idle_mode text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, max_attempts int,
              deadline_at timestamptz, secret uuid)
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
                                   worker, last_error, progress, secret)
    SELECT m.id, m.run_lease + 1, m.queue, m.kind, m.args, m.priority, m.attempt + 1,
           m.max_attempts, m.run_at, m.created_at, now(),
           now() + (SELECT q.hard_deadline FROM @schema@.queues q WHERE q.name = claim_attempts.queue),
           claim_attempts.worker, m.last_error, m.progress, gen_random_uuid()
      FROM moved m
    RETURNING job_id, run_lease, kind, args, attempt, max_attempts, deadline_at, secret, priority
  )
  SELECT o.job_id, o.run_lease, o.kind, o.args, o.attempt, o.max_attempts, o.deadline_at, o.secret
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

-- ---- retention ----------------------------------------------------------------------------------

-- Deletes finished jobs kept longer than their queue's retention (a queue without settings keeps
-- completed and cancelled jobs 24 hours, failed ones 7 days), but never one finished less than
-- the prune floor ago: 5 minutes, or stale_after when that is longer. Queue by queue, state by
-- state, oldest first, in statements of at most `batch` rows and at most `max_rows` rows in all;
-- rows locked by someone else (an admin retry) are skipped. With each job goes any attempt_state
-- row left of it. Returns how many jobs were deleted. Only the schema's owner runs it (maintain()
-- calls it inside the leader's fenced pass).
CREATE FUNCTION @schema@.prune_expired(stale_after interval DEFAULT '30 seconds', max_rows int DEFAULT 50000,
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

-- As in migration 7, plus retention: promotion, rescue, then prune_expired(stale_after) (at most
-- 50,000 jobs per pass, in statements of 5,000), all in the fenced transaction.
CREATE OR REPLACE FUNCTION @schema@.maintain(holder text, term bigint, stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM 1 FROM @schema@.leadership l
   WHERE l.name = 'maintenance' AND l.holder = maintain.holder AND l.term = maintain.term
     AND l.expires_at > clock_timestamp()
     FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tenure.maintain: % does not hold maintenance leadership term %', maintain.holder, maintain.term
      USING ERRCODE = 'TN004';
  END IF;
  PERFORM @schema@.promote_due(NULL, 10000);
  RETURN QUERY SELECT r.job_id, r.run_lease, r.queue, r.new_state FROM @schema@.rescue_attempts(stale_after) r;
  PERFORM @schema@.prune_expired(stale_after);
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
