-- tenure migration 2: long attempts: progress checkpoints and external callbacks.
--
-- Same conventions as 0001: placeholders @schema@, @wake_channel@, @cancel_channel@ and (new)
-- @callback_channel@ ('<schema>_callback', payload '<job_id>:<run_lease>'); every
-- function SECURITY DEFINER with search_path = pg_catalog, pg_temp, schema-qualified names,
-- EXECUTE revoked from PUBLIC at the end.
--
-- Progress: a handler's progress lives in the attempt's materialized lease (attempt_state,
-- created by its first heartbeat or progress flush through heartbeat_batch) and is carried with
-- the job when the attempt retries, snoozes or is rescued (receipts.progress of the next attempt).

-- The progress an attempt carried in from earlier attempts (its checkpoint), guarded by
-- (job_id, run_lease): one row (progress may be NULL: no checkpoint) while the attempt is open,
-- no row when it is stale. Read-only.
CREATE FUNCTION @schema@.attempt_checkpoint(job_id bigint, run_lease bigint)
RETURNS TABLE(progress jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT r.progress FROM @schema@.receipts r WHERE r.job_id = $1 AND r.run_lease = $2
$$;


-- ---- external callbacks -----------------------------------------------------------------------
--
-- A callback lives in the attempt's materialized lease row. Its life: registered (callback_id
-- set, not resolved) -> optionally waiting (the handler parked; heartbeat and hard deadline
-- suspended, callback_deadline armed) -> resolved (resumed with a payload, or the job finished
-- from outside). Registering again rotates the id (the old one is then unknown). Every
-- transition matches the attempt's live receipt (job_id, run_lease) and locks it, so it
-- serializes with completion, rescue and cancel: exactly one wins.

ALTER TABLE @schema@.attempt_state
  ADD COLUMN callback_id       uuid,
  ADD COLUMN callback_timeout  interval,
  ADD COLUMN callback_deadline timestamptz,          -- armed only while waiting
  ADD COLUMN waiting_since     timestamptz,          -- when the attempt parked (deadline pause)
  ADD COLUMN waiting           boolean NOT NULL DEFAULT false,
  ADD COLUMN resumed           boolean NOT NULL DEFAULT false,
  ADD COLUMN resume_payload    jsonb;
CREATE UNIQUE INDEX attempt_state_callback_idx ON @schema@.attempt_state (callback_id)
  WHERE callback_id IS NOT NULL;
CREATE INDEX attempt_state_waiting_idx ON @schema@.attempt_state (callback_deadline) WHERE waiting;

-- The read view: an attempt parked on a callback shows as waiting_external. Same columns, same
-- order as migration 1.
CREATE OR REPLACE VIEW @schema@.jobs AS
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
  SELECT r.job_id, r.queue, r.kind, r.args,
         CASE WHEN s.waiting THEN 'waiting_external' ELSE 'running' END, r.priority::int,
         r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, NULL, r.last_error,
         coalesce(s.progress, r.progress), r.claimed_at, s.heartbeat_at, r.worker, false
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

-- Registers (or rotates) the attempt's callback; materializes its lease row. Returns the fresh
-- callback id, or NULL when the attempt is stale. timeout: how long the attempt may wait for it
-- once parked (positive; 22023 otherwise). Not allowed while the attempt is waiting (22023).
CREATE FUNCTION @schema@.register_callback(job_id bigint, run_lease bigint, timeout interval)
RETURNS uuid LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  id uuid := gen_random_uuid();
BEGIN
  IF register_callback.timeout IS NULL OR register_callback.timeout <= '0'::interval THEN
    RAISE EXCEPTION 'tenure.register_callback: timeout must be a positive interval' USING ERRCODE = '22023';
  END IF;
  PERFORM 1 FROM @schema@.receipts r
    WHERE r.job_id = register_callback.job_id AND r.run_lease = register_callback.run_lease
    FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.attempt_state s
              WHERE s.job_id = register_callback.job_id AND s.run_lease = register_callback.run_lease
                AND s.waiting) THEN
    RAISE EXCEPTION 'tenure.register_callback: job % run lease % is waiting for its callback',
      register_callback.job_id, register_callback.run_lease USING ERRCODE = '22023';
  END IF;
  INSERT INTO @schema@.attempt_state AS s (job_id, run_lease, heartbeat_at, callback_id, callback_timeout)
  VALUES (register_callback.job_id, register_callback.run_lease, now(), id, register_callback.timeout)
  ON CONFLICT (job_id, run_lease) DO UPDATE
    SET heartbeat_at = excluded.heartbeat_at, callback_id = excluded.callback_id,
        callback_timeout = excluded.callback_timeout, callback_deadline = NULL, waiting = false,
        resumed = false, resume_payload = NULL;
  RETURN id;
END $$;

-- The handler's side of waiting, guarded by (job_id, run_lease, callback_id): one row while the
-- attempt is live and the callback is its current one, no row when stale. status 'resumed'
-- (with the payload) when the callback was resumed, else 'waiting': the first call parks the
-- attempt (waiting, callback_deadline = now() + timeout); later calls only read. Polling it is
-- how a handler waits.
CREATE FUNCTION @schema@.await_callback(job_id bigint, run_lease bigint, callback_id uuid)
RETURNS TABLE(status text, payload jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  st @schema@.attempt_state%ROWTYPE;
BEGIN
  SELECT s.* INTO st FROM @schema@.attempt_state s
    JOIN @schema@.receipts r ON r.job_id = s.job_id AND r.run_lease = s.run_lease
   WHERE s.job_id = await_callback.job_id AND s.run_lease = await_callback.run_lease
     AND s.callback_id = await_callback.callback_id;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF st.resumed THEN
    status := 'resumed';
    payload := st.resume_payload;
    RETURN NEXT;
    RETURN;
  END IF;
  IF NOT st.waiting THEN
    -- Park: lock the receipt (serializes with resume, rescue, cancel), then look again.
    PERFORM 1 FROM @schema@.receipts r
      WHERE r.job_id = await_callback.job_id AND r.run_lease = await_callback.run_lease FOR UPDATE;
    IF NOT FOUND THEN
      RETURN;
    END IF;
    UPDATE @schema@.attempt_state s
       SET waiting = true, callback_deadline = now() + s.callback_timeout, waiting_since = now()
     WHERE s.job_id = await_callback.job_id AND s.run_lease = await_callback.run_lease
       AND s.callback_id = await_callback.callback_id AND NOT s.resumed AND NOT s.waiting;
    IF NOT FOUND THEN
      -- Resumed (or rotated) between the read and the lock: answer from the current row.
      RETURN QUERY SELECT CASE WHEN s.resumed THEN 'resumed' ELSE 'waiting' END,
                          CASE WHEN s.resumed THEN s.resume_payload END
                     FROM @schema@.attempt_state s
                    WHERE s.job_id = await_callback.job_id AND s.run_lease = await_callback.run_lease
                      AND s.callback_id = await_callback.callback_id;
      RETURN;
    END IF;
  END IF;
  status := 'waiting';
  payload := NULL;
  RETURN NEXT;
END $$;

-- Locks the live attempt of an unresolved callback (receipt and lease row). Internal.
CREATE FUNCTION @schema@.lock_callback(callback_id uuid, OUT job_id bigint, OUT run_lease bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  SELECT s.job_id, s.run_lease INTO job_id, run_lease
    FROM @schema@.attempt_state s
    JOIN @schema@.receipts r ON r.job_id = s.job_id AND r.run_lease = s.run_lease
   WHERE s.callback_id = lock_callback.callback_id AND NOT s.resumed
     FOR UPDATE OF r, s;
END $$;

-- Resumes a waiting (or about to wait) attempt with a payload. true when this call resumed it;
-- false when the callback is unknown, already resolved (exactly one of concurrent resumes wins),
-- or its attempt is stale (rescued, cancelled, finished). The waiting handler is woken on the
-- callback channel; the attempt runs on with the same run lease, its heartbeat restarted.
CREATE FUNCTION @schema@.resume_callback(callback_id uuid, payload jsonb DEFAULT '{}')
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM @schema@.lock_callback(resume_callback.callback_id);
  IF a.job_id IS NULL THEN
    RETURN false;
  END IF;
  -- The hard deadline was suspended while the attempt waited: push it back by the time spent
  -- parked, so a long wait does not make the resumed attempt overdue at once.
  UPDATE @schema@.receipts r
     SET deadline_at = r.deadline_at + (now() - s.waiting_since)
    FROM @schema@.attempt_state s
   WHERE r.job_id = a.job_id AND r.run_lease = a.run_lease AND r.deadline_at IS NOT NULL
     AND s.job_id = r.job_id AND s.run_lease = r.run_lease AND s.waiting AND s.waiting_since IS NOT NULL;
  UPDATE @schema@.attempt_state s
     SET resumed = true, resume_payload = coalesce(resume_callback.payload, '{}'), waiting = false,
         callback_deadline = NULL, waiting_since = NULL, heartbeat_at = now()
   WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease;
  PERFORM pg_notify(@callback_channel@, a.job_id || ':' || a.run_lease);
  RETURN true;
END $$;

-- Moves the callback timeout of a registered, unresolved callback: the new timeout counts from
-- now when the attempt is already waiting. false when unknown, resolved or stale.
CREATE FUNCTION @schema@.extend_callback(callback_id uuid, timeout interval)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  a record;
BEGIN
  IF extend_callback.timeout IS NULL OR extend_callback.timeout <= '0'::interval THEN
    RAISE EXCEPTION 'tenure.extend_callback: timeout must be a positive interval' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO a FROM @schema@.lock_callback(extend_callback.callback_id);
  IF a.job_id IS NULL THEN
    RETURN false;
  END IF;
  UPDATE @schema@.attempt_state s
     SET callback_timeout = extend_callback.timeout,
         callback_deadline = CASE WHEN s.waiting THEN now() + extend_callback.timeout END
   WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease;
  RETURN true;
END $$;

-- Finishes the job of a registered, unresolved callback from outside, as completed (progress,
-- when given, is stored as its final progress). false when unknown, resolved or stale. The
-- handler, if waiting, is woken with a stale attempt (its own late outcome is discarded).
CREATE FUNCTION @schema@.complete_callback(callback_id uuid, progress jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM @schema@.lock_callback(complete_callback.callback_id);
  IF a.job_id IS NULL THEN
    RETURN false;
  END IF;
  UPDATE @schema@.attempt_state s SET resumed = true, waiting = false, callback_deadline = NULL
   WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease;
  PERFORM 1 FROM @schema@.complete_batch(ARRAY[a.job_id], ARRAY[a.run_lease],
                                         ARRAY[complete_callback.progress]);
  PERFORM pg_notify(@cancel_channel@, a.job_id || ':' || a.run_lease);
  RETURN true;
END $$;

-- Fails the job of a registered, unresolved callback from outside: retried with backoff while
-- attempts remain when retry is true, else failed for good. false when unknown, resolved or stale.
CREATE FUNCTION @schema@.fail_callback(callback_id uuid, error text, retry boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM @schema@.lock_callback(fail_callback.callback_id);
  IF a.job_id IS NULL THEN
    RETURN false;
  END IF;
  UPDATE @schema@.attempt_state s SET resumed = true, waiting = false, callback_deadline = NULL
   WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease;
  PERFORM @schema@.fail_attempt(a.job_id, a.run_lease, fail_callback.error,
                                NOT coalesce(fail_callback.retry, false));
  PERFORM pg_notify(@cancel_channel@, a.job_id || ':' || a.run_lease);
  RETURN true;
END $$;
-- ---- changed from migration 1 ----------------------------------------------------------------

-- Rescue: a waiting attempt's heartbeat and hard deadline are suspended; it is rescued only when
-- its callback times out (retried while attempts remain, else failed), with the same rules as a
-- stale attempt otherwise.
CREATE OR REPLACE FUNCTION @schema@.rescue_attempts(stale_after interval DEFAULT '30 seconds')
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
             CASE WHEN s.waiting THEN 'rescued: callback timed out'
                  WHEN r.deadline_at <= now() THEN 'rescued: hard deadline passed'
                  ELSE format('rescued: no heartbeat for %s', rescue_attempts.stale_after) END AS why,
             s.progress
        FROM @schema@.receipts r
        LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
       WHERE (NOT coalesce(s.waiting, false)
              AND (coalesce(s.heartbeat_at, r.claimed_at) + rescue_attempts.stale_after <= now()
                   OR r.deadline_at <= now()))
          OR (s.waiting AND s.callback_deadline <= now())
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

-- Completion: a waiting attempt is not completed by its token until it is resumed (the callback
-- owns it meanwhile; complete_callback finishes it from outside). Same statement otherwise.
CREATE OR REPLACE FUNCTION @schema@.complete_batch(job_ids bigint[], run_leases bigint[],
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
    -- The lease row is read once, in the join that also refuses a waiting attempt (one index
    -- probe per item, as in migration 1).
    DELETE FROM @schema@.receipts r
     USING input i LEFT JOIN @schema@.attempt_state s
             ON s.job_id = i.job_id AND s.run_lease = i.run_lease
     WHERE r.job_id = i.job_id AND r.run_lease = i.run_lease AND s.waiting IS NOT TRUE
    RETURNING r.*, coalesce(i.progress, s.progress) AS final_progress
  )
  INSERT INTO @schema@.done (id, queue, kind, args, state, priority, attempt, max_attempts,
                             run_lease, run_at, created_at, finalized_at, last_error, progress)
  SELECT c.job_id, c.queue, c.kind, c.args, 'completed', c.priority, c.attempt, c.max_attempts,
         c.run_lease, c.run_at, c.created_at, now(), c.last_error,
         coalesce(c.final_progress, c.progress)
    FROM closed c
  RETURNING id, run_lease, finalized_at;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
