-- tenure migration 24: the ledger layout (docs/storage_ledger.md).
--
-- A job's payload is written once, into `specs`, and never copied. `ready` and `deferred` become
-- narrow rows that say where a job waits. A claim deletes the `ready` rows it takes, as before, and
-- appends one `claims` row per statement: arrays of the batch's job ids, attempts, secrets and the
-- state carried from earlier attempts. An attempt is item `pos` of claim `claim_id`, and its run
-- lease names that place: run_lease = claim_id * 65536 + pos (pos 1..10000, a claim takes at most
-- 10,000 jobs). Claim ids come from a sequence drawn after the claim has locked its rows, so a
-- job's later claim always has the larger id: run leases stay monotonic per job. Every closing
-- transition appends one `closures` row keyed by (claim_id, pos): that key is the guard, a second
-- closure of one attempt cannot commit. An attempt is open when its item exists and has no closure.
--
-- Attempts opened before this migration keep their run leases (all below 65,536): each becomes a
-- claim of one item whose lease is stored in `claims.run_leases`, found through `legacy_attempts`.
-- Terminal history (`done`) becomes specs, one-item claims and terminal closures the same way.
--
-- The tables of the old layout that tests and operators read keep their names as views:
-- `receipts` (the open attempts) and `done` (the terminal ones), over the same columns.

LOCK TABLE @schema@.ready, @schema@.deferred, @schema@.receipts, @schema@.done, @schema@.attempt_state
  IN ACCESS EXCLUSIVE MODE;

-- The jobs view is made again at the end over the new tables; remember who may read it.
SELECT pg_catalog.set_config('tenure.migrate_jobs_readers',
                             coalesce((SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', ')
                                         FROM pg_catalog.pg_class c
                                        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
                                         JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
                                        WHERE c.oid = '@schema@.jobs'::pg_catalog.regclass
                                          AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner), ''),
                             true);
DROP VIEW @schema@.jobs;

-- specs: the wide `ready` of schema 23 renamed, so the producers' column grants (INSERT on kind,
-- args, queue, priority, max_attempts, metadata), the column defaults and enqueue's CHECK
-- constraints carry over to the table their COPY now writes.
ALTER TABLE @schema@.ready RENAME TO specs;
ALTER INDEX @schema@.ready_pkey RENAME TO specs_pkey;
DROP INDEX @schema@.ready_claim_idx;
ALTER TABLE @schema@.specs RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                                  autovacuum_vacuum_cost_delay, vacuum_truncate);

CREATE TABLE @schema@.ready (
  id             bigint      PRIMARY KEY,
  queue          text        NOT NULL,
  priority       smallint    NOT NULL,
  run_at         timestamptz NOT NULL,
  created_at     timestamptz NOT NULL,
  run_lease      bigint      NOT NULL,  -- the job's last attempt's lease (0 before its first claim)
  attempt        int         NOT NULL,  -- attempts started so far
  last_error     text,
  progress       jsonb,
  resume_payload jsonb                  -- a resumed parked attempt's continuation
);
CREATE INDEX ready_claim_idx ON @schema@.ready (queue, priority, id);
ALTER TABLE @schema@.ready SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
                                autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);
INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error,
                            progress, resume_payload)
SELECT id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress, resume_payload
  FROM @schema@.specs;
ALTER TABLE @schema@.specs
  DROP COLUMN attempt, DROP COLUMN run_lease, DROP COLUMN run_at, DROP COLUMN last_error,
  DROP COLUMN progress, DROP COLUMN resume_payload;

ALTER TABLE @schema@.deferred RENAME TO deferred_v23;
ALTER INDEX @schema@.deferred_pkey RENAME TO deferred_v23_pkey;
ALTER INDEX @schema@.deferred_queue_due_idx RENAME TO deferred_v23_queue_due_idx;
ALTER INDEX @schema@.deferred_due_idx RENAME TO deferred_v23_due_idx;
CREATE TABLE @schema@.deferred (
  id           bigint      PRIMARY KEY,
  queue        text        NOT NULL,
  priority     smallint    NOT NULL,
  run_at       timestamptz NOT NULL,
  created_at   timestamptz NOT NULL,
  state        text        NOT NULL CHECK (state IN ('scheduled', 'retryable')),
  run_lease    bigint      NOT NULL,
  attempt      int         NOT NULL,
  last_error   text,
  progress     jsonb
);
CREATE INDEX deferred_queue_due_idx ON @schema@.deferred (queue, run_at);
CREATE INDEX deferred_due_idx ON @schema@.deferred (run_at);

-- One row per claim statement. Arrays are in claim order; item pos is element pos of each.
CREATE SEQUENCE @schema@.claim_id_seq AS bigint;
CREATE TABLE @schema@.claims (
  claim_id    bigint      PRIMARY KEY,
  queue       text        NOT NULL,
  worker      text,
  claimed_at  timestamptz NOT NULL,
  deadline_at timestamptz,            -- claimed_at + the queue's hard_deadline, when it has one
  lo          bigint      NOT NULL,   -- min(job_ids), max(job_ids): a job's claims are found by
  hi          bigint      NOT NULL,   --   the GiST index on [lo, hi], then array_position
  job_ids     bigint[]    NOT NULL,
  attempts    int[]       NOT NULL,
  secrets     uuid[]      NOT NULL,
  run_ats     timestamptz[] NOT NULL, -- when each job became available (the jobs view's run_at)
  last_errors text[],                 -- carried from earlier attempts; NULL when none of them has one
  progress    jsonb[],                -- carried checkpointed progress; NULL when none has any
  run_leases  bigint[]                -- only on claims made by this migration: the leases of
                                      --   attempts opened before it; NULL on every other claim
) WITH (toast_tuple_target = 8160);   -- claims of up to ~200 jobs stay inline: no TOAST writes,
                                      --   and reading one item does not detoast the arrays
CREATE INDEX claims_jobs_idx ON @schema@.claims USING gist (int8range(lo, hi, '[]'));

-- The claims that may still hold an open attempt: inserted by the claim, deleted by the
-- maintenance pass once every item is closed. Rescue, running counts and the receipts view read
-- these, never the whole history.
CREATE TABLE @schema@.open_claims (
  claim_id bigint PRIMARY KEY,
  queue    text   NOT NULL
);
ALTER TABLE @schema@.open_claims SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
                                      autovacuum_vacuum_cost_delay = 0, vacuum_truncate = false);

-- One row per closed attempt. outcome: 'c' completed, 'f' failed, 'x' cancelled, 'd' failed into
-- the dead-letter table (terminal); 'r' failed and retryable, 's' snoozed, 'a' rescued back to
-- ready, 'p' parked attempt resumed (its continuation is a new claim), 'e' released by an
-- operator's retry (not terminal: the job waits again).
CREATE TABLE @schema@.closures (
  claim_id   bigint      NOT NULL,
  pos        int         NOT NULL,
  outcome    "char"      NOT NULL CHECK (outcome IN ('c', 'f', 'x', 'd', 'r', 's', 'a', 'p', 'e')),
  closed_at  timestamptz NOT NULL,
  last_error text,
  progress   jsonb,
  PRIMARY KEY (claim_id, pos)
);

-- Attempts opened before this migration, by their old (job_id, run_lease).
CREATE TABLE @schema@.legacy_attempts (
  job_id    bigint NOT NULL,
  run_lease bigint NOT NULL,
  claim_id  bigint NOT NULL,
  pos       int    NOT NULL,
  PRIMARY KEY (job_id, run_lease)
);

-- The waiting jobs of schema 23: payload into specs, the rest narrow.
INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
SELECT id, queue, kind, args, priority, max_attempts, metadata, created_at FROM @schema@.deferred_v23;
INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt,
                               last_error, progress)
SELECT id, queue, priority, run_at, created_at, state, run_lease, attempt, last_error, progress
  FROM @schema@.deferred_v23;
DROP TABLE @schema@.deferred_v23;

-- Open attempts and terminal history: a one-item claim each, keeping the old run lease. (A table
-- of the schema, dropped below, not a temporary one: the installing role may lack TEMPORARY.)
CREATE TABLE @schema@.migrate_24 AS
SELECT nextval('@schema@.claim_id_seq') AS claim_id, r.job_id, r.run_lease, r.queue, r.kind, r.args,
       r.priority, r.attempt, r.max_attempts, r.run_at, r.created_at, r.claimed_at, r.deadline_at,
       r.worker, r.last_error, r.progress, r.secret, r.metadata,
       NULL::"char" AS outcome, NULL::timestamptz AS finalized_at, NULL::text AS final_error,
       NULL::jsonb AS final_progress
  FROM @schema@.receipts r;
INSERT INTO @schema@.migrate_24
SELECT nextval('@schema@.claim_id_seq'), d.id, d.run_lease, d.queue, d.kind, d.args, d.priority,
       d.attempt, d.max_attempts, d.run_at, d.created_at, d.finalized_at, NULL, NULL, NULL, NULL,
       gen_random_uuid(), d.metadata,
       CASE d.state WHEN 'completed' THEN 'c' WHEN 'failed' THEN 'f' ELSE 'x' END::"char",
       d.finalized_at, d.last_error, d.progress
  FROM @schema@.done d;
INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
SELECT job_id, queue, kind, args, priority, max_attempts, metadata, created_at FROM @schema@.migrate_24;
INSERT INTO @schema@.claims (claim_id, queue, worker, claimed_at, deadline_at, lo, hi, job_ids, attempts,
                             secrets, run_ats, last_errors, progress, run_leases)
SELECT claim_id, queue, worker, claimed_at, deadline_at, job_id, job_id, ARRAY[job_id], ARRAY[attempt],
       ARRAY[secret], ARRAY[run_at],
       CASE WHEN outcome IS NULL AND last_error IS NOT NULL THEN ARRAY[last_error] END,
       CASE WHEN outcome IS NULL AND progress IS NOT NULL THEN ARRAY[progress] END,
       ARRAY[run_lease]
  FROM @schema@.migrate_24;
INSERT INTO @schema@.legacy_attempts (job_id, run_lease, claim_id, pos)
SELECT job_id, run_lease, claim_id, 1 FROM @schema@.migrate_24;
INSERT INTO @schema@.open_claims (claim_id, queue)
SELECT claim_id, queue FROM @schema@.migrate_24 WHERE outcome IS NULL;
INSERT INTO @schema@.closures (claim_id, pos, outcome, closed_at, last_error, progress)
SELECT claim_id, 1, outcome, finalized_at, final_error, final_progress
  FROM @schema@.migrate_24 WHERE outcome IS NOT NULL;
DROP TABLE @schema@.migrate_24;
DROP TABLE @schema@.receipts;
DROP TABLE @schema@.done;

-- The item of (job_id, run_lease): its claim and place, decoded from the lease, or for an attempt
-- opened before this migration, looked up. No row when the lease names no item of this job.
CREATE FUNCTION @schema@.attempt_at(job_id bigint, run_lease bigint, OUT claim_id bigint, OUT pos int)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT c.claim_id, (attempt_at.run_lease & 65535)::int
    FROM @schema@.claims c
   WHERE attempt_at.run_lease >= 65536
     AND c.claim_id = attempt_at.run_lease >> 16
     AND c.job_ids[(attempt_at.run_lease & 65535)::int] = attempt_at.job_id
     AND c.run_leases IS NULL
  UNION ALL
  SELECT l.claim_id, l.pos
    FROM @schema@.legacy_attempts l
   WHERE attempt_at.run_lease < 65536
     AND l.job_id = attempt_at.job_id AND l.run_lease = attempt_at.run_lease
$$;

-- The name of a closure's outcome, as the jobs view and the done view show a terminal one.
CREATE FUNCTION @schema@.outcome_state(outcome "char") RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE outcome WHEN 'c' THEN 'completed' WHEN 'f' THEN 'failed' WHEN 'x' THEN 'cancelled'
                      WHEN 'd' THEN 'dead_lettered' WHEN 'r' THEN 'retried' WHEN 's' THEN 'snoozed'
                      WHEN 'a' THEN 'rescued' WHEN 'p' THEN 'resumed' WHEN 'e' THEN 'released' END
$$;

-- The advisory lock key of one attempt (with classid hashtext('@schema@.attempt')): a closer in a
-- caller's transaction holds it to its commit; rescue and cancel try it and pass the attempt by.
CREATE FUNCTION @schema@.attempt_lock_key(job_id bigint, run_lease bigint) RETURNS int
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT pg_catalog.hashint8(job_id # (run_lease << 24))
$$;

-- A resumed attempt's own hard deadline, pushed back by the time it waited for its callback (the
-- claim's deadline_at is its whole batch's); NULL: the claim's.
ALTER TABLE @schema@.attempt_state ADD COLUMN deadline_at timestamptz;

-- Retention's queue: one row per claim whose items are all closed. The maintenance pass writes it
-- as it takes the claim out of open_claims, in the same statement (a job's terminal record without
-- an attempt, which never is in open_claims, gets it with the record). ripe_at is when the claim
-- row may go: the latest, over its closures, of closed_at plus its queue's retention for the
-- outcome (retain_completed for 'c', retain_cancelled for 'x', retain_failed for 'f', nothing for
-- the others), and at least its last closure plus the prune floor (5 minutes). prune_expired
-- reads the ripe rows only, oldest first: neither the claims whose retention has not passed nor
-- the closures it keeps, and a completion writes nothing here (the closure and its key are all a
-- job's end costs). It checks a ripe row against the queue's settings of then: a retention
-- lengthened since the claim settled moves ripe_at on; one shortened since applies to the claim at
-- its old ripe_at. When it removes the claim row it sets retired_at; the claim's closures stay a
-- day longer, so that a late closer of one of its attempts (a stale worker, or a caller whose read
-- of the claim item or whose REPEATABLE READ snapshot predates the removal) still collides with
-- the attempt's closure and changes nothing. Then they go with the row, found by retired_at.
CREATE TABLE @schema@.settled_claims (
  claim_id   bigint      PRIMARY KEY,
  queue      text        NOT NULL,
  ripe_at    timestamptz NOT NULL,
  retired_at timestamptz             -- when retention removed the claim row; NULL before
);
CREATE INDEX settled_claims_ripe_idx ON @schema@.settled_claims (ripe_at) WHERE retired_at IS NULL;
CREATE INDEX settled_claims_retired_idx ON @schema@.settled_claims (retired_at) WHERE retired_at IS NOT NULL;

-- The terminal history of schema 23 (the one-item claims made above outside open_claims, each
-- with its closure) settles now.
INSERT INTO @schema@.settled_claims (claim_id, queue, ripe_at)
SELECT c.claim_id, c.queue,
       x.closed_at + greatest('5 minutes'::interval,
                              CASE x.outcome WHEN 'c' THEN coalesce(q.retain_completed, '24 hours'::interval)
                                             WHEN 'x' THEN coalesce(q.retain_cancelled, '24 hours'::interval)
                                             WHEN 'f' THEN coalesce(q.retain_failed, '7 days'::interval)
                                             ELSE '0'::interval END)
  FROM @schema@.claims c
  JOIN @schema@.closures x ON x.claim_id = c.claim_id
  LEFT JOIN @schema@.queues q ON q.name = c.queue
 WHERE NOT EXISTS (SELECT FROM @schema@.open_claims o WHERE o.claim_id = c.claim_id);
-- ---- enqueue ----------------------------------------------------------------------------------
--
-- A job is enqueued as one `specs` row (its payload, written once) and one narrow `ready` row (to
-- run now) or `deferred` row (scheduled), in the producer's transaction and in one statement
-- (a data-modifying CTE): the checks, unique keys, wake-ups and error codes are those of schema 23.
-- A unique key's holder is live while its job has a `ready` or `deferred` row or an open attempt
-- (a claim item without a closure, found through the claims' id ranges).
--
-- The COPY straight path writes `specs` (the renamed wide table: the producers' INSERT on its six
-- job columns, USAGE on the job sequence, the column defaults and the CHECK constraints carry
-- over), and enqueue_copied_ready, which reads the rows back as before, inserts their narrow
-- `ready` rows in one INSERT ... SELECT. Until that call the copied jobs are payload only: no
-- claim can see them, and a transaction that commits without it leaves specs rows that no state
-- names (the bridges always call it). check_unique_key, enqueue_stage_checked,
-- enqueue_copy_stage and enqueue_due_schedules touch no job table and are unchanged.

-- As in migration 11, over the ledger layout.
CREATE OR REPLACE FUNCTION @schema@.enqueue_one(kind text, args jsonb, queue text, priority int, run_at timestamptz,
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
      -- Live: waiting in ready or deferred, or an open attempt (one statement, one snapshot: a
      -- claim deletes the ready row and appends its claim item in one transaction).
      IF EXISTS (SELECT 1 FROM @schema@.ready x WHERE x.id = holder)
         OR EXISTS (SELECT 1 FROM @schema@.deferred x WHERE x.id = holder)
         OR EXISTS (SELECT 1 FROM @schema@.claims c
                     WHERE int8range(c.lo, c.hi, '[]') @> holder AND c.job_ids @> ARRAY[holder]
                       AND NOT EXISTS (SELECT 1 FROM @schema@.closures x
                                        WHERE x.claim_id = c.claim_id
                                          AND x.pos = array_position(c.job_ids, holder))) THEN
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
         OR EXISTS (SELECT 1 FROM @schema@.claims c
                     WHERE int8range(c.lo, c.hi, '[]') @> holder AND c.job_ids @> ARRAY[holder]
                       AND NOT EXISTS (SELECT 1 FROM @schema@.closures x
                                        WHERE x.claim_id = c.claim_id
                                          AND x.pos = array_position(c.job_ids, holder))) THEN
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
    WITH spec AS (
      INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
      VALUES (v_id, enqueue_one.queue, enqueue_one.kind, coalesce(enqueue_one.args, '{}'), enqueue_one.priority,
              enqueue_one.max_attempts, coalesce(enqueue_one.metadata, '{}'), v_now)
    )
    INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt)
    VALUES (v_id, enqueue_one.queue, enqueue_one.priority, v_now, v_now, 0, 0);
  ELSE
    WITH spec AS (
      INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
      VALUES (v_id, enqueue_one.queue, enqueue_one.kind, coalesce(enqueue_one.args, '{}'), enqueue_one.priority,
              enqueue_one.max_attempts, coalesce(enqueue_one.metadata, '{}'), v_now)
    )
    INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt)
    VALUES (v_id, enqueue_one.queue, enqueue_one.priority, enqueue_one.run_at, v_now, 'scheduled', 0, 0);
  END IF;
  job_id := v_id;
  inserted := true;
END $$;

-- As in migration 11, over the ledger layout. Without a key: one statement writes the spec and
-- the narrow row.
CREATE OR REPLACE FUNCTION @schema@.enqueue(kind text, args jsonb DEFAULT '{}', queue text DEFAULT 'default',
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
    WITH spec AS (
      INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
      VALUES (v_id, enqueue.queue, enqueue.kind, coalesce(enqueue.args, '{}'), enqueue.priority,
              enqueue.max_attempts, coalesce(enqueue.metadata, '{}'), v_now)
    )
    INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt)
    VALUES (v_id, enqueue.queue, enqueue.priority, v_now, v_now, 0, 0);
    -- Wake-up: only when a worker of this queue said it is idle (no NOTIFY lock otherwise).
    IF EXISTS (SELECT 1 FROM @schema@.waiters w WHERE w.queue = enqueue.queue) THEN
      PERFORM pg_notify(@wake_channel@, enqueue.queue);
    END IF;
  ELSE
    WITH spec AS (
      INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
      VALUES (v_id, enqueue.queue, enqueue.kind, coalesce(enqueue.args, '{}'), enqueue.priority,
              enqueue.max_attempts, coalesce(enqueue.metadata, '{}'), v_now)
    )
    INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt)
    VALUES (v_id, enqueue.queue, enqueue.priority, enqueue.run_at, v_now, 'scheduled', 0, 0);
  END IF;
  RETURN v_id;
END $$;

-- As in migration 11, over the ledger layout: without keys, one statement numbers the batch and
-- writes its specs and narrow rows.
CREATE OR REPLACE FUNCTION @schema@.enqueue_batch(kinds text[], args jsonb[], queues text[], priorities int[],
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
    ), to_specs AS (
      INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
      SELECT i.id, i.queue, i.kind, coalesce(i.args, '{}'), i.priority, i.max_attempts,
             coalesce(i.metadata, '{}'), now()
        FROM input i
    ), to_ready AS (
      INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt)
      SELECT i.id, i.queue, i.priority, now(), now(), 0, 0
        FROM input i WHERE i.run_at IS NULL OR i.run_at <= now()
    ), to_deferred AS (
      INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt)
      SELECT i.id, i.queue, i.priority, i.run_at, now(), 'scheduled', 0, 0
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

-- As in migration 22: the staged rows become specs plus their narrow ready or deferred rows, in
-- one statement.
CREATE OR REPLACE FUNCTION @schema@.enqueue_copied() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET synchronize_seqscans = off AS $$
DECLARE
  st     record := @schema@.enqueue_stage_checked('tenure.enqueue_copied');
  stage  text := st.stage;
  ids    text;
  q      text;
BEGIN
  IF NOT st.present THEN
    RETURN NULL;
  END IF;
  EXECUTE format($move$
    WITH numbered AS MATERIALIZED (
      SELECT nextval('@schema@.job_id_seq') AS id, s.* FROM pg_temp.%I s
    ), to_specs AS (
      INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
      SELECT i.id, i.queue, i.kind, i.args, i.priority, i.max_attempts, i.metadata, now()
        FROM numbered i
    ), to_ready AS (
      INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt)
      SELECT i.id, i.queue, i.priority, now(), now(), 0, 0
        FROM numbered i WHERE i.run_at IS NULL OR i.run_at <= now()
    ), to_deferred AS (
      INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt)
      SELECT i.id, i.queue, i.priority, i.run_at, now(), 'scheduled', 0, 0
        FROM numbered i WHERE i.run_at > now()
    )
    SELECT array_agg(id ORDER BY ord)::text FROM numbered $move$, stage) INTO ids;
  -- Wake-up: one NOTIFY per queue with a job ready now and an idle worker (the stage is read
  -- again only while some worker is idle).
  IF EXISTS (SELECT FROM @schema@.waiters) THEN
    FOR q IN EXECUTE format('SELECT DISTINCT queue FROM pg_temp.%I WHERE run_at IS NULL OR run_at <= now()', stage)
    LOOP
      IF EXISTS (SELECT FROM @schema@.waiters x WHERE x.queue = q) THEN
        PERFORM pg_notify(@wake_channel@, q);
      END IF;
    END LOOP;
  END IF;
  RETURN ids;
END $$;

-- As in migration 23, with the COPY going into specs: '@schema@.specs' when `scheduled` is false,
-- the transaction is not SERIALIZABLE and the caller may insert the six job columns of specs and
-- use the sequence; otherwise what enqueue_copy_stage answers.
CREATE OR REPLACE FUNCTION @schema@.enqueue_copy_target(scheduled boolean) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  caller text := CASE WHEN current_setting('role') = 'none' THEN session_user
                      ELSE current_setting('role') END;
BEGIN
  -- A SERIALIZABLE transaction takes the stage: the read-back of a COPY into specs steps over
  -- other producers' rows in its id range, which SERIALIZABLE counts as conflicts (40001).
  IF scheduled IS FALSE AND current_setting('transaction_isolation') <> 'serializable'
     AND has_sequence_privilege(caller, '@schema@.job_id_seq', 'USAGE')
     AND NOT EXISTS (SELECT FROM unnest(ARRAY['kind', 'args', 'queue', 'priority', 'max_attempts', 'metadata']) c
                      WHERE NOT has_column_privilege(caller, '@schema@.specs', c, 'INSERT')) THEN
    RETURN '@schema@.specs';
  END IF;
  RETURN @schema@.enqueue_copy_stage();
END $$;

-- As in migration 23, reading the rows back from specs (currval, that row's xmin: this
-- transaction's or one of its subtransactions', in progress; the n highest ids at or below it with
-- that xmin), then making them claimable, in the same statement: one INSERT ... SELECT of their
-- narrow ready rows, the transaction's now() as run_at. Specs rows are never updated, so an xmin
-- is always its enqueuer's. specs holds every job down to retention, not only the waiting ones:
-- the read-back walks specs_pkey backwards from currval and stops at the n-th row (no bitmap scan
-- of every id below it, no sort; the SET clauses), and finding fewer than n rows writes nothing
-- and answers NULL. A job of the answer that already waits (a second call for the same COPY, or
-- an n that reaches an earlier job of the same subtransaction) gets no second row. The batch's id
-- span is probed first; only when something waits inside it is each job probed (OFFSET 0 keeps
-- them probes, not a join over all of ready or deferred).
CREATE OR REPLACE FUNCTION @schema@.enqueue_copied_ready(n int) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_bitmapscan = off SET enable_sort = off SET enable_seqscan = off AS $$
DECLARE
  last   bigint;
  mine   xid;
  top    bigint;
  delta  bigint;
  wake   boolean;
  ids    bigint[];
  queues text[];
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
  -- The row must be this transaction's: written by its top-level transaction or by one of its
  -- subtransactions, whose ids come later (xids compared modulo 2^32, as they wrap), and still in
  -- progress (a row an earlier transaction of this session wrote is not this one's).
  top := pg_current_xact_id()::text::bigint;
  delta := (mine::text::bigint - top % 4294967296 + 4294967296) % 4294967296;
  IF delta >= 2147483648
     OR pg_xact_status((top + delta)::text::xid8) IS DISTINCT FROM 'in progress' THEN
    RETURN NULL;
  END IF;
  -- The queues to wake are gathered only while some worker is idle.
  wake := EXISTS (SELECT FROM @schema@.waiters);
  WITH picked AS MATERIALIZED (
    SELECT s.id, s.queue, s.priority, s.created_at
      FROM @schema@.specs s
     WHERE s.id <= last AND s.xmin = mine
     ORDER BY s.id DESC
     LIMIT n
  ), span AS MATERIALIZED (
    SELECT count(*) AS k, min(p.id) AS lo, max(p.id) AS hi FROM picked p
  ), clash AS MATERIALIZED (
    -- Whether anything waits between the lowest and the highest picked id: one range probe of
    -- deferred and one of ready per (queue, priority) of the batch (the whole key of
    -- ready_claim_idx, which the planner may take for an id alone, as a scan of the whole index,
    -- when ready's statistics say it is small). Usually nothing does, and the rows go in unprobed.
    SELECT EXISTS (SELECT FROM @schema@.deferred d, span WHERE d.id BETWEEN span.lo AND span.hi)
        OR EXISTS (SELECT FROM (SELECT DISTINCT p.queue, p.priority FROM picked p) g, span,
                               LATERAL (SELECT FROM @schema@.ready r
                                         WHERE r.queue = g.queue AND r.priority = g.priority
                                           AND r.id BETWEEN span.lo AND span.hi
                                         LIMIT 1) x) AS any
  ), placed AS (
    INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt)
    SELECT p.id, p.queue, p.priority, now(), p.created_at, 0, 0
      FROM picked p
     WHERE (SELECT s.k FROM span s) = n
       -- Something waits in the span (another session's job, or one of this batch): one probe
       -- of each key per job.
       AND (NOT (SELECT c.any FROM clash c)
            OR (NOT EXISTS (SELECT FROM @schema@.ready r
                             WHERE r.queue = p.queue AND r.priority = p.priority AND r.id = p.id OFFSET 0)
                AND NOT EXISTS (SELECT FROM @schema@.deferred d WHERE d.id = p.id OFFSET 0)))
  )
  SELECT array_agg(p.id ORDER BY p.id), array_agg(DISTINCT p.queue) FILTER (WHERE wake)
    INTO ids, queues
    FROM picked p;
  IF coalesce(cardinality(ids), 0) <> n THEN
    RETURN NULL;
  END IF;
  -- Wake-up: one NOTIFY per queue of the batch with an idle worker.
  IF wake THEN
    PERFORM pg_notify(@wake_channel@, q.queue)
       FROM unnest(queues) AS q(queue)
      WHERE EXISTS (SELECT FROM @schema@.waiters x WHERE x.queue = q.queue);
  END IF;
  RETURN ids::text;
END $$;

-- As in migration 21 (due rows picked through the run_at index, deleted by address), moving the
-- narrow deferred rows into ready; the maintenance pass sweeps the attempt_state of attempts that
-- are not open (no claim item at their lease, or one with a closure).
CREATE OR REPLACE FUNCTION @schema@.promote_due(queue text DEFAULT NULL, max_jobs int DEFAULT 1000)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_bitmapscan = off SET enable_sort = off AS $$
#variable_conflict use_column
DECLARE
  n bigint;
BEGIN
  WITH moved AS (
    DELETE FROM @schema@.deferred d
     WHERE d.ctid = ANY (ARRAY(SELECT p.ctid FROM @schema@.deferred p
                                WHERE (promote_due.queue IS NULL OR p.queue = promote_due.queue)
                                  AND p.run_at <= now()
                                ORDER BY p.run_at
                                LIMIT promote_due.max_jobs
                                FOR UPDATE SKIP LOCKED))
    RETURNING d.*
  )
  INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress)
  SELECT id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress
    FROM moved;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF promote_due.queue IS NULL THEN
    -- Maintenance pass: forget idle registrations nobody refreshed (their worker is gone), and
    -- sweep the materialized state of attempts that are closed.
    DELETE FROM @schema@.waiters w WHERE w.since < now() - interval '5 minutes';
    DELETE FROM @schema@.attempt_state s
     WHERE NOT (
       (s.run_lease >= 65536
        AND EXISTS (SELECT FROM @schema@.claims c
                     WHERE c.claim_id = s.run_lease >> 16
                       AND c.job_ids[(s.run_lease & 65535)::int] = s.job_id
                       AND c.run_leases IS NULL
                       AND NOT EXISTS (SELECT FROM @schema@.closures x
                                        WHERE x.claim_id = c.claim_id AND x.pos = (s.run_lease & 65535)::int)))
       OR (s.run_lease < 65536
           AND EXISTS (SELECT FROM @schema@.legacy_attempts l
                        WHERE l.job_id = s.job_id AND l.run_lease = s.run_lease
                          AND NOT EXISTS (SELECT FROM @schema@.closures x
                                           WHERE x.claim_id = l.claim_id AND x.pos = l.pos))));
  END IF;
  RETURN n;
END $$;

-- ---- the claim ----------------------------------------------------------------------------------
--
-- claim_attempts: pause, limits, rate bucket, promotion probe, priority_aging and the pick are
-- those of migration 20: the picked `ready` rows are locked (FOR UPDATE SKIP LOCKED) and deleted
-- by their address. What it writes instead of one receipt per job is one `claims` row for the
-- batch and its `open_claims` entry, in the same statement: the deleted rows are folded into
-- arrays in claim order (priority, id), so item pos is the job returned in place pos, and its run
-- lease is claim_id * 65536 + pos. The payload (kind, args, metadata, max_attempts) is read from
-- specs by id and not copied. The claim id is drawn by the INSERT, which reads the aggregate of
-- every deleted row, so it is drawn after the claim has locked and deleted its rows: a job's later
-- claim has the larger id and run leases stay monotonic per job. A claim that took nothing writes
-- nothing and draws no id. A parked attempt's continuation (resume_payload set) keeps its attempt
-- number but is a new item with a new run lease. The queue's hard deadline is read in the pause
-- probe, which reads the queue's row anyway. Signature, result (order included) and grants
-- unchanged.
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
    RETURNING r.id, r.priority, r.run_at, r.created_at, r.attempt, r.last_error, r.progress, r.resume_payload
  ), batch AS (
    -- One pass over the deleted rows, sorted once: every array is built from the same sequence,
    -- so element pos of each is the same job. last_errors, progress and the resume payloads are
    -- NULL arrays when no job carries one.
    SELECT array_agg(m.id) AS ids, min(m.id) AS lo, max(m.id) AS hi,
           -- continuation: a resumed parked attempt keeps its attempt number.
           array_agg(m.attempt + (m.resume_payload IS NULL)::int) AS attempts,
           array_agg(gen_random_uuid()) AS secrets,
           array_agg(m.run_at) AS run_ats,
           array_agg(greatest(m.run_at, m.created_at)) AS available,
           CASE WHEN count(m.last_error) > 0 THEN array_agg(m.last_error) END AS last_errors,
           CASE WHEN count(m.progress) > 0 THEN array_agg(m.progress) END AS progress,
           CASE WHEN count(m.resume_payload) > 0 THEN array_agg(m.resume_payload) END AS resumes
      FROM (SELECT * FROM moved ORDER BY moved.priority, moved.id) m
  ), opened AS (
    INSERT INTO @schema@.claims (claim_id, queue, worker, claimed_at, deadline_at, lo, hi, job_ids, attempts,
                                 secrets, run_ats, last_errors, progress)
    SELECT nextval('@schema@.claim_id_seq'), claim_attempts.queue, claim_attempts.worker, now(),
           now() + lim_deadline, b.lo, b.hi, b.ids, b.attempts, b.secrets, b.run_ats, b.last_errors, b.progress
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

-- claim (the token-returning entry point of migration 14) is a SQL function over claim_attempts
-- and keeps working unchanged: its tokens carry the new run leases.

-- As in migration 13, with the open attempts counted from the ledger: the queue's entries in
-- open_claims, each its items less its closures. Each claim row and its closures are read by key
-- (a probe per open claim of the queue, whatever the size of the history); open_claims is read
-- whole, as receipts was.
CREATE OR REPLACE FUNCTION @schema@.claim_allowance(queue text, max_jobs int, OUT allowed int, OUT tokens double precision,
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
    allowed := least(allowed, greatest(0, q.max_running - coalesce(
                 (SELECT sum((SELECT cardinality(c.job_ids)
                                     - (SELECT count(*) FROM @schema@.closures x WHERE x.claim_id = c.claim_id)
                                FROM @schema@.claims c WHERE c.claim_id = o.claim_id))
                    FROM @schema@.open_claims o
                   WHERE o.queue = claim_allowance.queue), 0)::bigint));
  END IF;
  IF q.rate_per_second IS NOT NULL THEN
    at := clock_timestamp();  -- after the lock: the refills of successive claims never overlap
    tokens := least(coalesce(q.rate_burst, greatest(1, q.rate_per_second)),
                    coalesce(q.rate_tokens + q.rate_per_second * greatest(0, extract(epoch FROM at - q.rate_refilled_at)),
                             'Infinity'));
    allowed := least(allowed, floor(tokens));
  END IF;
END $$;

-- ---- heartbeats and checkpoints -----------------------------------------------------------------

-- As in migration 9, for open attempts: an input pair is located as its claim item (decoded from
-- the run lease, or through legacy_attempts for a lease from before migration 24; both are key
-- probes) and written only when that item has no closure. Same results: the pairs written.
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
  SELECT i.job_id, i.run_lease, now(), i.progress
    FROM input i
   CROSS JOIN LATERAL (
         SELECT c.claim_id, (i.run_lease & 65535)::int AS pos
           FROM @schema@.claims c
          WHERE i.run_lease >= 65536 AND c.claim_id = i.run_lease >> 16
            AND c.job_ids[(i.run_lease & 65535)::int] = i.job_id AND c.run_leases IS NULL
         UNION ALL
         SELECT l.claim_id, l.pos
           FROM @schema@.legacy_attempts l
          WHERE i.run_lease < 65536 AND l.job_id = i.job_id AND l.run_lease = i.run_lease) a
   WHERE NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos)
   ORDER BY i.job_id
  ON CONFLICT (job_id, run_lease) DO UPDATE
    SET heartbeat_at = excluded.heartbeat_at, progress = coalesce(excluded.progress, s.progress)
  RETURNING s.job_id, s.run_lease;
END $$;

-- As in migration 2: the progress the attempt carried in (its claim item's), one row while the
-- attempt is open, none when (job_id, run_lease) names no open attempt.
CREATE OR REPLACE FUNCTION @schema@.attempt_checkpoint(job_id bigint, run_lease bigint)
RETURNS TABLE(progress jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT a.progress
    FROM (SELECT c.claim_id, ($2 & 65535)::int AS pos, c.progress[($2 & 65535)::int] AS progress
            FROM @schema@.claims c
           WHERE $2 >= 65536 AND c.claim_id = $2 >> 16 AND c.job_ids[($2 & 65535)::int] = $1
             AND c.run_leases IS NULL
          UNION ALL
          SELECT c.claim_id, l.pos, c.progress[l.pos]
            FROM @schema@.legacy_attempts l
            JOIN @schema@.claims c ON c.claim_id = l.claim_id
           WHERE $2 < 65536 AND l.job_id = $1 AND l.run_lease = $2) a
   WHERE NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos)
$$;

-- ---- what operators and metrics read ------------------------------------------------------------

-- As in migration 10, with running and waiting_external counted over the open attempts: each
-- claim in open_claims counts its items less its closures (the claim row and its closures read by
-- key, once per claim rather than once per item), and the attempts parked on a callback
-- (attempt_state.waiting, of an item without a closure) move from running to waiting_external.
-- A claim whose items are all closed, not yet removed from open_claims, counts nothing. Without
-- JIT: the estimates of the per-claim counts of closures put the statement above jit_above_cost,
-- and compiling it took longer than running it (~0.5 s of 0.7 s after a drain of 1,000,000 jobs).
CREATE OR REPLACE FUNCTION @schema@.queue_depths()
RETURNS TABLE(queue text, available bigint, scheduled bigint, retryable bigint, running bigint,
              waiting_external bigint, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
  WITH c AS (
    SELECT r.queue, count(*) AS available, 0::bigint AS scheduled, 0::bigint AS retryable,
           0::bigint AS running, 0::bigint AS waiting, min(greatest(r.run_at, r.created_at)) AS since
      FROM @schema@.ready r GROUP BY r.queue
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

-- As in migration 13, with the counts per state read where each state lives instead of deriving
-- every job's state through the jobs view (a claim lookup per job): ready, deferred, the open
-- attempts counted as in queue_depths, the terminal closures and dead_letter. The same counts as
-- the jobs view: a job's terminal closure (completed, failed, cancelled) is its last word, since
-- an operator's retry turns it into a release ('e') before the job waits again, and retention
-- removes it together with the job's spec. The claim's queue is the job's. Without JIT, as
-- queue_depths (1.3 s against 0.3 s after a drain of 1,000,000 jobs).
CREATE OR REPLACE FUNCTION @schema@.list_queues()
RETURNS TABLE(queue text, paused boolean, settings jsonb, counts jsonb, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
  WITH c AS (
    SELECT u.queue, u.state, sum(u.n)::bigint AS n
      FROM (SELECT r.queue, 'available'::text AS state, count(*) AS n FROM @schema@.ready r GROUP BY r.queue
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
         (SELECT clock_timestamp() - min(r.run_at) FROM @schema@.ready r WHERE r.queue = n.queue)
    FROM names n LEFT JOIN @schema@.queues q ON q.name = n.queue
   ORDER BY n.queue
$$;

-- worker_idle and worker_busy write only waiters: unchanged.
-- ---- closing an attempt ------------------------------------------------------------------------
--
-- Completion, failure, snooze and cancel append the attempt's closure: INSERT INTO closures
-- ... ON CONFLICT (claim_id, pos) DO NOTHING. The key is the guard: of two closers of one attempt
-- the second waits for the first at READ COMMITTED and inserts nothing once it commits (a stale
-- close changes nothing, as a DELETE of a missing receipt did); whatever else the transition
-- writes (the job's deferred, ready or dead_letter row) is written only for the closure that went
-- in, in the same statement. An item is found from its run lease (both branches of attempt_at,
-- inlined where a statement handles a batch or runs in a caller's transaction); its secret, job
-- id and attempt are in the claim row, which is never updated.
--
-- The advisory lock of an attempt: the closers that run in a caller's transaction (complete_job,
-- and fail_job and heartbeat(token) through lock_token_attempt) hold it to their commit, so
-- rescue and an operator's cancel, which only try it, pass their attempt by instead of waiting on
-- a business transaction. They take it only once the token's secret is found right: a wrong
-- secret is answered without taking or waiting for a lock, so a probe neither delays an attempt
-- nor holds it out of rescue. The batch closers of the runtime do not take it.

-- As in migration 18, over the ledger: each (job_id, run_lease) is located (a run lease of this
-- layout names its claim and place; an older one is looked up in legacy_attempts), checked
-- against the given secret, refused while waiting on a callback, and closed as completed. The
-- closure keeps the final progress (the given one, else the attempt's); the progress carried
-- from earlier attempts stays in the claim row and readers fall back to it. Closures are
-- inserted in key order, so two batches that share attempts wait for each other in one order.
-- A claim of more than a few dozen jobs keeps its arrays in TOAST: the batch's items are grouped
-- by claim, and each claim row is read and its arrays detoasted once per statement (the slices
-- [1:] are flat copies; OFFSET 0 keeps them from being recomputed per item), not once per item.
CREATE OR REPLACE FUNCTION @schema@.complete_batch(job_ids bigint[], run_leases bigint[],
                                                   progress jsonb[] DEFAULT NULL, secrets uuid[] DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  c_ids   bigint[];  -- the attempts found: claim, place, job, lease, progress to write
  c_poss  int[];
  c_jobs  bigint[];
  c_lease bigint[];
  c_prog  jsonb[];
  w_ids   bigint[];  -- the closures written
  w_poss  int[];
  w_at    timestamptz[];
BEGIN
  IF cardinality(job_ids) IS DISTINCT FROM cardinality(run_leases)
     OR (complete_batch.progress IS NOT NULL
         AND cardinality(complete_batch.progress) IS DISTINCT FROM cardinality(job_ids))
     OR (complete_batch.secrets IS NOT NULL
         AND cardinality(complete_batch.secrets) IS DISTINCT FROM cardinality(job_ids)) THEN
    RAISE EXCEPTION 'tenure.complete_batch: arrays must have the same length' USING ERRCODE = '22023';
  END IF;
  -- The open items the pairs name (secret checked when given), those waiting on a callback left out.
    WITH input AS (
      SELECT DISTINCT ON (u.job_id, u.run_lease) u.job_id, u.run_lease, u.progress, u.secret
        FROM unnest(job_ids, run_leases, complete_batch.progress, complete_batch.secrets)
             AS u(job_id, run_lease, progress, secret)
       ORDER BY u.job_id, u.run_lease, u.progress IS NULL
    ), by_claim AS (
      SELECT coalesce(l.claim_id, i.run_lease >> 16) AS claim_id,
             array_agg(coalesce(l.pos, (i.run_lease & 65535)::int)) AS poss, array_agg(i.job_id) AS jobs,
             array_agg(i.run_lease) AS leases, array_agg(i.progress) AS progs, array_agg(i.secret) AS secs
        FROM input i
        LEFT JOIN @schema@.legacy_attempts l
               ON i.run_lease < 65536 AND l.job_id = i.job_id AND l.run_lease = i.run_lease
       WHERE i.run_lease >= 65536 OR l.claim_id IS NOT NULL
       GROUP BY 1
    ), item AS (
      SELECT g.claim_id, q.pos, q.job_id, q.run_lease, q.progress
        FROM by_claim g
       CROSS JOIN LATERAL (SELECT x.job_ids[1:] AS job_ids, x.secrets[1:] AS secrets, x.run_leases IS NULL AS decoded
                             FROM @schema@.claims x WHERE x.claim_id = g.claim_id OFFSET 0) c
       CROSS JOIN LATERAL unnest(g.poss, g.jobs, g.leases, g.progs, g.secs) AS q(pos, job_id, run_lease, progress, secret)
       WHERE c.job_ids[q.pos] = q.job_id AND (c.decoded OR q.run_lease < 65536)
         AND (q.secret IS NULL OR c.secrets[q.pos] = q.secret)
  )
  SELECT array_agg(t.claim_id ORDER BY t.claim_id, t.pos), array_agg(t.pos ORDER BY t.claim_id, t.pos),
         array_agg(t.job_id ORDER BY t.claim_id, t.pos), array_agg(t.run_lease ORDER BY t.claim_id, t.pos),
         array_agg(coalesce(t.progress, s.progress) ORDER BY t.claim_id, t.pos)
    INTO c_ids, c_poss, c_jobs, c_lease, c_prog
    FROM item t
    LEFT JOIN @schema@.attempt_state s ON s.job_id = t.job_id AND s.run_lease = t.run_lease
   WHERE s.waiting IS NOT TRUE;
  -- A plain insert: the closure key refuses a second closure. ON CONFLICT DO NOTHING would say so
  -- without an error, but writes a confirmation record per row (48 bytes of WAL per job); a batch
  -- that meets a closure (a stale item, or a closer that committed first) is written again
  -- with it, in the rare path.
  BEGIN
    WITH won AS (
      INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, progress)
      SELECT u.claim_id, u.pos, 'c', now(), u.progress
        FROM unnest(c_ids, c_poss, c_prog) AS u(claim_id, pos, progress)
      RETURNING x.claim_id, x.pos, x.closed_at
    )
    SELECT array_agg(w.claim_id), array_agg(w.pos), array_agg(w.closed_at) INTO w_ids, w_poss, w_at FROM won w;
  EXCEPTION WHEN unique_violation THEN
    WITH won AS (
      INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, progress)
      SELECT u.claim_id, u.pos, 'c', now(), u.progress
        FROM unnest(c_ids, c_poss, c_prog) AS u(claim_id, pos, progress)
      ON CONFLICT (claim_id, pos) DO NOTHING
      RETURNING x.claim_id, x.pos, x.closed_at
    )
    SELECT array_agg(w.claim_id), array_agg(w.pos), array_agg(w.closed_at) INTO w_ids, w_poss, w_at FROM won w;
  END;
  -- The winners' pairs, as the items named them.
  RETURN QUERY
  SELECT c.job_id, c.run_lease, w.closed_at
    FROM unnest(w_ids, w_poss, w_at) AS w(claim_id, pos, closed_at)
    JOIN unnest(c_ids, c_poss, c_jobs, c_lease) AS c(claim_id, pos, job_id, run_lease)
      ON c.claim_id = w.claim_id AND c.pos = w.pos;
END $$;

-- As in migration 15 (the token's fast path inline, the secret compared by digest, a stale,
-- second or wrong-secret completion raising TN001), over the ledger, in three steps: the item
-- and its secret are read from the claim row (never updated, so this needs no lock) and a wrong
-- secret is refused there; the attempt's advisory lock is taken (attempt_lock_key's expression
-- inline: a call of that SQL function adds about a third to this function's time); then the
-- closure goes in unless the attempt is waiting on a callback, in a statement of its own, so at
-- READ COMMITTED it sees whatever a closer it waited for committed.
CREATE OR REPLACE FUNCTION @schema@.complete_job(token text, progress jsonb DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  t       record;
  p       text[] := pg_catalog.string_to_array(token, ':');
  v_claim bigint;
  v_pos   int;
BEGIN
  -- parse_token's fast path inline (numbers of at most 18 digits fit bigint); any other text,
  -- malformed or not, goes through parse_token, which raises TN002 or parses it.
  IF pg_catalog.cardinality(p) = 4 AND p[1] = 'tn2'
     AND octet_length(p[2]) BETWEEN 1 AND 18 AND pg_catalog.left(p[2], 1) <> '0'
     AND pg_catalog.translate(p[2], '0123456789', '') = ''
     AND octet_length(p[3]) BETWEEN 1 AND 18 AND pg_catalog.left(p[3], 1) <> '0'
     AND pg_catalog.translate(p[3], '0123456789', '') = ''
     AND octet_length(p[4]) = 32 AND pg_catalog.translate(p[4], '0123456789abcdef', '') = '' THEN
    SELECT p[2]::bigint AS job_id, p[3]::bigint AS run_lease, p[4]::uuid AS secret INTO t;
  ELSE
    SELECT * INTO t FROM @schema@.parse_token(token);
  END IF;
  SELECT a.claim_id, a.pos INTO v_claim, v_pos
    FROM (SELECT c.claim_id, (t.run_lease & 65535)::int AS pos, c.secrets[(t.run_lease & 65535)::int] AS secret
            FROM @schema@.claims c
           WHERE t.run_lease >= 65536 AND c.claim_id = t.run_lease >> 16
             AND c.job_ids[(t.run_lease & 65535)::int] = t.job_id AND c.run_leases IS NULL
          UNION ALL
          SELECT l.claim_id, l.pos, c.secrets[l.pos]
            FROM @schema@.legacy_attempts l JOIN @schema@.claims c ON c.claim_id = l.claim_id
           WHERE t.run_lease < 65536 AND l.job_id = t.job_id AND l.run_lease = t.run_lease) a
   -- secret_matches inline: digests compared, so the comparison's time says nothing of the secret
   WHERE pg_catalog.sha256(pg_catalog.uuid_send(a.secret)) = pg_catalog.sha256(pg_catalog.uuid_send(t.secret));
  IF FOUND THEN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('@schema@.attempt'),
                                             pg_catalog.hashint8(t.job_id # (t.run_lease << 24)));
    RETURN QUERY
    WITH won AS (
      INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, progress)
      SELECT v_claim, v_pos, 'c', now(), coalesce(complete_job.progress, s.progress)
        FROM (SELECT) one
        LEFT JOIN @schema@.attempt_state s ON s.job_id = t.job_id AND s.run_lease = t.run_lease
       WHERE s.waiting IS NOT TRUE
      ON CONFLICT (claim_id, pos) DO NOTHING
      RETURNING x.closed_at
    )
    SELECT t.job_id, t.run_lease, w.closed_at FROM won w;
    IF FOUND THEN
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', t.job_id, t.run_lease
    USING ERRCODE = 'TN001',
          HINT = 'the attempt was rescued, cancelled, re-claimed or already finished; this transaction must roll back';
END $$;

-- As in migration 6: live only when the attempt is open (its item exists without a closure) and
-- the token's secret is its secret. Reads by key and takes no lock.
CREATE OR REPLACE FUNCTION @schema@.token_attempt(token text, OUT job_id bigint, OUT run_lease bigint, OUT live boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  t      record;
  stored uuid;
BEGIN
  SELECT * INTO t FROM @schema@.parse_token(token_attempt.token);
  SELECT a.secret INTO stored
    FROM (SELECT c.claim_id, (t.run_lease & 65535)::int AS pos, c.secrets[(t.run_lease & 65535)::int] AS secret
            FROM @schema@.claims c
           WHERE t.run_lease >= 65536 AND c.claim_id = t.run_lease >> 16
             AND c.job_ids[(t.run_lease & 65535)::int] = t.job_id AND c.run_leases IS NULL
          UNION ALL
          SELECT l.claim_id, l.pos, c.secrets[l.pos]
            FROM @schema@.legacy_attempts l JOIN @schema@.claims c ON c.claim_id = l.claim_id
           WHERE t.run_lease < 65536 AND l.job_id = t.job_id AND l.run_lease = t.run_lease) a
   WHERE NOT EXISTS (SELECT 1 FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos);
  job_id := t.job_id;
  run_lease := t.run_lease;
  live := @schema@.secret_matches(stored, t.secret);
END $$;

-- As in migration 16, with the attempt's advisory lock in place of the receipt's row lock: once
-- token_attempt has found the token live, the lock is taken (to the end of the transaction) and
-- the attempt is looked at again in a statement of its own: live only if it is still open and the
-- secret is still its secret. A wrong secret is answered from token_attempt alone, without a lock.
-- At REPEATABLE READ that look reads the transaction's snapshot, which may predate a closure
-- committed meanwhile; where the receipt's row lock then failed with 40001, the closure key is
-- asked, as lock_callback asks it: an insert of the attempt's closure, undone at once, fails with
-- 40001 on a committed closure the snapshot does not see. READ COMMITTED needs no such insert.
-- Internal.
CREATE OR REPLACE FUNCTION @schema@.lock_token_attempt(token text, OUT job_id bigint, OUT run_lease bigint, OUT live boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  t record;
  given uuid;
  item record;
BEGIN
  SELECT * INTO t FROM @schema@.token_attempt(lock_token_attempt.token);
  job_id := t.job_id;
  run_lease := t.run_lease;
  live := false;
  IF t.live THEN
    given := (SELECT p.secret FROM @schema@.parse_token(lock_token_attempt.token) p);
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('@schema@.attempt'),
                                             @schema@.attempt_lock_key(t.job_id, t.run_lease));
    SELECT a.claim_id, a.pos INTO item
      FROM (SELECT c.claim_id, (t.run_lease & 65535)::int AS pos, c.secrets[(t.run_lease & 65535)::int] AS secret
              FROM @schema@.claims c
             WHERE t.run_lease >= 65536 AND c.claim_id = t.run_lease >> 16
               AND c.job_ids[(t.run_lease & 65535)::int] = t.job_id AND c.run_leases IS NULL
            UNION ALL
            SELECT l.claim_id, l.pos, c.secrets[l.pos]
              FROM @schema@.legacy_attempts l JOIN @schema@.claims c ON c.claim_id = l.claim_id
             WHERE t.run_lease < 65536 AND l.job_id = t.job_id AND l.run_lease = t.run_lease) a
     WHERE @schema@.secret_matches(a.secret, given)
       AND NOT EXISTS (SELECT 1 FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos);
    live := FOUND;
    IF live AND pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
      BEGIN
        INSERT INTO @schema@.closures (claim_id, pos, outcome, closed_at)
        VALUES (item.claim_id, item.pos, 'x', now())
        ON CONFLICT (claim_id, pos) DO NOTHING;
        RAISE EXCEPTION 'probe';
      EXCEPTION WHEN raise_exception THEN
        NULL;
      END;
    END IF;
  END IF;
END $$;

-- As in migration 16: through lock_token_attempt, which now holds the attempt's advisory lock.
CREATE OR REPLACE FUNCTION @schema@.heartbeat(token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
BEGIN
  SELECT * INTO t FROM @schema@.lock_token_attempt(token);
  IF NOT t.live THEN
    RETURN false;
  END IF;
  RETURN EXISTS (SELECT 1 FROM @schema@.heartbeat_batch(ARRAY[t.job_id], ARRAY[t.run_lease]));
END $$;

-- As in migration 9, over the ledger, in one statement: the attempt is closed as 'r' (failed,
-- retryable: its narrow deferred row carries the error and the progress, run at the backoff or
-- after retry_after) while attempts remain and the failure is not permanent; else as 'd' with
-- the job's dead_letter row (its payload copied from specs) when the queue dead-letters; else as
-- 'f', the error and the attempt's progress in the closure. The outcome is decided from the claim
-- row, the spec and the queue before the closure goes in; the rows that follow it are written
-- only when it did. NULL when the attempt was stale.
CREATE OR REPLACE FUNCTION @schema@.fail_attempt(job_id bigint, run_lease bigint, error text,
                                                 permanent boolean DEFAULT false,
                                                 retry_after interval DEFAULT NULL)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  err text := @schema@.bound_error(fail_attempt.error);
  o   "char";
BEGIN
  WITH a AS (
    SELECT l.claim_id, l.pos, sp.queue, sp.kind, sp.args, sp.priority, c.attempts[l.pos] AS attempt,
           sp.max_attempts, c.run_ats[l.pos] AS run_at, sp.created_at, sp.metadata,
           s.progress AS live_progress, coalesce(s.progress, c.progress[l.pos]) AS carried_progress,
           CASE WHEN NOT coalesce(fail_attempt.permanent, false) AND c.attempts[l.pos] < sp.max_attempts
                  THEN 'r'
                WHEN coalesce((SELECT q.dead_letter FROM @schema@.queues q WHERE q.name = sp.queue), false)
                  THEN 'd'
                ELSE 'f' END::"char" AS outcome
      FROM @schema@.attempt_at(fail_attempt.job_id, fail_attempt.run_lease) l
      JOIN @schema@.claims c ON c.claim_id = l.claim_id
      JOIN @schema@.specs sp ON sp.id = fail_attempt.job_id
      LEFT JOIN @schema@.attempt_state s
             ON s.job_id = fail_attempt.job_id AND s.run_lease = fail_attempt.run_lease
  ), won AS (
    INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, last_error, progress)
    SELECT a.claim_id, a.pos, a.outcome, now(),
           CASE WHEN a.outcome = 'f' THEN err END, CASE WHEN a.outcome = 'f' THEN a.live_progress END
      FROM a
    ON CONFLICT (claim_id, pos) DO NOTHING
    RETURNING x.outcome
  ), retried AS (
    INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt,
                                   last_error, progress)
    SELECT fail_attempt.job_id, a.queue, a.priority,
           now() + CASE WHEN fail_attempt.retry_after IS NULL
                        THEN @schema@.backoff(a.queue, a.attempt)
                        ELSE greatest(fail_attempt.retry_after, '0'::interval) END,
           a.created_at, 'retryable', fail_attempt.run_lease, a.attempt, err, a.carried_progress
      FROM a JOIN won w ON w.outcome = 'r'
  ), buried AS (
    INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                      run_at, created_at, finalized_at, last_error, progress, metadata)
    SELECT fail_attempt.job_id, a.queue, a.kind, a.args, a.priority, a.attempt, a.max_attempts,
           fail_attempt.run_lease, a.run_at, a.created_at, now(), err, a.carried_progress, a.metadata
      FROM a JOIN won w ON w.outcome = 'd'
  )
  SELECT w.outcome INTO o FROM won w;
  RETURN CASE o WHEN 'r' THEN 'retryable' WHEN 'd' THEN 'failed' WHEN 'f' THEN 'failed' END;
END $$;

-- As in migration 16: through lock_token_attempt, which now holds the attempt's advisory lock.
CREATE OR REPLACE FUNCTION @schema@.fail_job(token text, error text, retry boolean DEFAULT true)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
  s text;
BEGIN
  SELECT * INTO t FROM @schema@.lock_token_attempt(token);
  IF t.live THEN
    s := @schema@.fail_attempt(t.job_id, t.run_lease, error, NOT coalesce(retry, true));
    IF s IS NOT NULL THEN
      RETURN s;
    END IF;
  END IF;
  RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', t.job_id, t.run_lease
    USING ERRCODE = 'TN001';
END $$;

-- As in migration 9, over the ledger, in one statement: the attempt is closed as 's' and the job
-- waits again with its run lease, the attempt given back (attempt - 1), its carried error and its
-- progress: in ready when delay is not positive, else scheduled in deferred. false when stale.
CREATE OR REPLACE FUNCTION @schema@.snooze_attempt(job_id bigint, run_lease bigint, delay interval)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  closed bigint;
BEGIN
  WITH a AS (
    SELECT l.claim_id, l.pos, sp.queue, sp.priority, sp.created_at, c.attempts[l.pos] AS attempt,
           c.last_errors[l.pos] AS last_error, coalesce(s.progress, c.progress[l.pos]) AS progress
      FROM @schema@.attempt_at(snooze_attempt.job_id, snooze_attempt.run_lease) l
      JOIN @schema@.claims c ON c.claim_id = l.claim_id
      JOIN @schema@.specs sp ON sp.id = snooze_attempt.job_id
      LEFT JOIN @schema@.attempt_state s
             ON s.job_id = snooze_attempt.job_id AND s.run_lease = snooze_attempt.run_lease
  ), won AS (
    INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at)
    SELECT a.claim_id, a.pos, 's', now() FROM a
    ON CONFLICT (claim_id, pos) DO NOTHING
    RETURNING x.claim_id
  ), now_ready AS (
    INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error,
                                progress)
    SELECT snooze_attempt.job_id, a.queue, a.priority, now(), a.created_at, snooze_attempt.run_lease,
           a.attempt - 1, a.last_error, a.progress
      FROM a JOIN won w ON true
     WHERE snooze_attempt.delay IS NULL OR snooze_attempt.delay <= '0'::interval
  ), later AS (
    INSERT INTO @schema@.deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt,
                                   last_error, progress)
    SELECT snooze_attempt.job_id, a.queue, a.priority, now() + snooze_attempt.delay, a.created_at,
           'scheduled', snooze_attempt.run_lease, a.attempt - 1, a.last_error, a.progress
      FROM a JOIN won w ON true
     WHERE snooze_attempt.delay > '0'::interval
  )
  SELECT w.claim_id INTO closed FROM won w;
  RETURN FOUND;
END $$;

-- As in migration 9, over the ledger: the attempt is closed as 'x', the reason (when given) and
-- the attempt's progress in the closure; readers fall back to the carried error and progress.
-- false when stale.
CREATE OR REPLACE FUNCTION @schema@.cancel_attempt(job_id bigint, run_lease bigint, reason text DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, last_error, progress)
  SELECT l.claim_id, l.pos, 'x', now(), @schema@.bound_error(cancel_attempt.reason), s.progress
    FROM @schema@.attempt_at(cancel_attempt.job_id, cancel_attempt.run_lease) l
    LEFT JOIN @schema@.attempt_state s
           ON s.job_id = cancel_attempt.job_id AND s.run_lease = cancel_attempt.run_lease
  ON CONFLICT (claim_id, pos) DO NOTHING;
  RETURN FOUND;
END $$;

-- As in migration 17, over the ledger: 'open' when the item of (job_id, run_lease) exists without
-- a closure, 'completed' when its closure is a completion, 'closed_by_other' when it has another
-- closure or the job exists without that attempt (its spec, or its dead_letter row), else
-- 'unknown_job'. One statement, so every answer of a batch is read from one snapshot; no read of
-- the jobs view. The attempts are grouped by claim as in complete_batch, each claim row read once;
-- an attempt whose lease names no claim is in a group of its own that finds none.
CREATE OR REPLACE FUNCTION @schema@.attempt_evidence_batch(job_ids bigint[], run_leases bigint[])
RETURNS TABLE(ord bigint, evidence text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(job_ids) IS DISTINCT FROM cardinality(run_leases) THEN
    RAISE EXCEPTION 'tenure.attempt_evidence_batch: arrays must have the same length' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  WITH by_claim AS (
    SELECT CASE WHEN u.run_lease >= 65536 THEN u.run_lease >> 16 ELSE l.claim_id END AS claim_id,
           array_agg(u.ord) AS ords, array_agg(u.job_id) AS jobs, array_agg(u.run_lease) AS leases,
           array_agg(CASE WHEN u.run_lease >= 65536 THEN (u.run_lease & 65535)::int ELSE l.pos END) AS poss
      FROM unnest(job_ids, run_leases) WITH ORDINALITY AS u(job_id, run_lease, ord)
      LEFT JOIN @schema@.legacy_attempts l
             ON u.run_lease < 65536 AND l.job_id = u.job_id AND l.run_lease = u.run_lease
     GROUP BY 1
  )
  SELECT q.ord,
         CASE WHEN c.job_ids[q.pos] = q.job_id AND (c.decoded OR q.run_lease < 65536) THEN
                CASE coalesce((SELECT x.outcome::text FROM @schema@.closures x
                                WHERE x.claim_id = g.claim_id AND x.pos = q.pos), '')
                  WHEN '' THEN 'open' WHEN 'c' THEN 'completed' ELSE 'closed_by_other' END
              WHEN EXISTS (SELECT 1 FROM @schema@.specs sp WHERE sp.id = q.job_id)
                OR EXISTS (SELECT 1 FROM @schema@.dead_letter d WHERE d.id = q.job_id) THEN 'closed_by_other'
              ELSE 'unknown_job' END
    FROM by_claim g
    LEFT JOIN LATERAL (SELECT x.job_ids[1:] AS job_ids, x.run_leases IS NULL AS decoded
                         FROM @schema@.claims x WHERE x.claim_id = g.claim_id OFFSET 0) c ON true
   CROSS JOIN LATERAL unnest(g.ords, g.jobs, g.leases, g.poss) AS q(ord, job_id, run_lease, pos)
   ORDER BY q.ord;
END $$;

-- The evidence of one attempt: attempt_evidence_batch's answer for it.
CREATE OR REPLACE FUNCTION @schema@.attempt_evidence(job_id bigint, run_lease bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  RETURN (SELECT b.evidence
            FROM @schema@.attempt_evidence_batch(ARRAY[attempt_evidence.job_id],
                                                 ARRAY[attempt_evidence.run_lease]) b);
END $$;

-- ---- external callbacks and parked attempts -----------------------------------------------------
--
-- A callback still lives in its attempt's attempt_state row, keyed by (job_id, run_lease), with
-- the life of migrations 2 and 14: registered -> waiting (a blocking handler polling it, or parked
-- with no handler) -> resolved. What changes is how a transition knows that the attempt is open
-- and how it keeps the attempt's closers out while it decides:
--   - open means: (job_id, run_lease) names a claim item (attempt_at) that has no closure;
--   - where a transition locked the attempt's receipt, it takes the attempt's advisory lock
--     (held to its commit, no WAL) and then reads again. Completions and failures by token,
--     rescue and cancel take the same lock (rescue and cancel only when it is free), so one of
--     them, or one resume, wins; a closer that takes no lock (a runtime's batch) is refused by
--     the closure key, and the transition then answers stale.
-- A waiting attempt is open: it has no closure, only attempt_state.waiting. complete_callback and
-- fail_callback close it as any completion or failure does ('c'; 'r', 'f' or 'd').
--
-- Parking then resuming: the resume closes the parked attempt ('p') and inserts its ready row in
-- the same statement, with the resume payload, the attempt's run lease (the job's last) and its
-- attempt number; its progress, which the continuation needs, moves from the attempt's
-- attempt_state row into that ready row, and the attempt_state row is deleted as before (its
-- callback is resolved; nothing else in it serves the continuation). The claim that takes the ready row opens the continuation as a new item: a new run
-- lease and secret, the same attempt number. The parked attempt's (job_id, run_lease) then names
-- a closed item, so a holder of its token can no longer write, without the secret having to tell
-- the two apart as it did when the continuation kept the run lease.

-- Locks the open attempt of an unresolved callback. Internal. As in migration 2: job_id and
-- run_lease NULL when the callback is unknown, resolved or its attempt is not open. The attempt's
-- advisory lock is taken on the callback's attempt, then everything is read again: a resume,
-- rotation or closure committed while this call waited is seen (a new snapshot at READ
-- COMMITTED). At REPEATABLE READ the snapshot may predate a closure committed meanwhile, which
-- that read cannot see; where a receipt's lock then failed with 40001, the closure key is asked:
-- an insert of the attempt's closure, undone at once, fails with 40001 on a committed closure its
-- snapshot does not see (and does nothing else). READ COMMITTED does not need it and writes none.
CREATE OR REPLACE FUNCTION @schema@.lock_callback(callback_id uuid, OUT job_id bigint, OUT run_lease bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  j bigint;
  l bigint;
  item record;
BEGIN
  SELECT s.job_id, s.run_lease INTO j, l
    FROM @schema@.attempt_state s
   WHERE s.callback_id = lock_callback.callback_id AND NOT s.resumed;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('@schema@.attempt'), @schema@.attempt_lock_key(j, l));
  SELECT a.claim_id, a.pos INTO item
    FROM @schema@.attempt_state s
   CROSS JOIN LATERAL @schema@.attempt_at(s.job_id, s.run_lease) a
   WHERE s.job_id = j AND s.run_lease = l
     AND s.callback_id = lock_callback.callback_id AND NOT s.resumed
     AND NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos);
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
    BEGIN
      INSERT INTO @schema@.closures (claim_id, pos, outcome, closed_at)
      VALUES (item.claim_id, item.pos, 'p', now())
      ON CONFLICT (claim_id, pos) DO NOTHING;
      RAISE EXCEPTION 'probe';
    EXCEPTION WHEN raise_exception THEN
      NULL;
    END;
  END IF;
  job_id := j;
  run_lease := l;
END $$;

-- As in migration 2, under the attempt's advisory lock: a fresh callback id, NULL when
-- (job_id, run_lease) is not an open attempt, 22023 for a timeout that is not positive or while
-- the attempt waits.
CREATE OR REPLACE FUNCTION @schema@.register_callback(job_id bigint, run_lease bigint, timeout interval)
RETURNS uuid LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  id uuid := gen_random_uuid();
BEGIN
  IF register_callback.timeout IS NULL OR register_callback.timeout <= '0'::interval THEN
    RAISE EXCEPTION 'tenure.register_callback: timeout must be a positive interval' USING ERRCODE = '22023';
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('@schema@.attempt'),
                                @schema@.attempt_lock_key(register_callback.job_id, register_callback.run_lease));
  IF NOT EXISTS (SELECT FROM @schema@.attempt_at(register_callback.job_id, register_callback.run_lease) a
                  WHERE NOT EXISTS (SELECT FROM @schema@.closures x
                                     WHERE x.claim_id = a.claim_id AND x.pos = a.pos)) THEN
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

-- As in migration 2: one row while the attempt is open and callback_id is its callback, none
-- when stale; the first call parks the attempt, under the attempt's advisory lock, and the
-- parking update itself checks again that the attempt is open. Polling reads and locks nothing.
CREATE OR REPLACE FUNCTION @schema@.await_callback(job_id bigint, run_lease bigint, callback_id uuid)
RETURNS TABLE(status text, payload jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  st @schema@.attempt_state%ROWTYPE;
BEGIN
  SELECT s.* INTO st FROM @schema@.attempt_state s
   WHERE s.job_id = await_callback.job_id AND s.run_lease = await_callback.run_lease
     AND s.callback_id = await_callback.callback_id
     AND EXISTS (SELECT FROM @schema@.attempt_at(s.job_id, s.run_lease) a
                  WHERE NOT EXISTS (SELECT FROM @schema@.closures x
                                     WHERE x.claim_id = a.claim_id AND x.pos = a.pos));
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
    -- Park: take the attempt's lock (serializes with resume, rescue, cancel), then look again.
    PERFORM pg_advisory_xact_lock(hashtext('@schema@.attempt'),
                                  @schema@.attempt_lock_key(await_callback.job_id, await_callback.run_lease));
    UPDATE @schema@.attempt_state s
       SET waiting = true, callback_deadline = now() + s.callback_timeout, waiting_since = now()
     WHERE s.job_id = await_callback.job_id AND s.run_lease = await_callback.run_lease
       AND s.callback_id = await_callback.callback_id AND NOT s.resumed AND NOT s.waiting
       AND EXISTS (SELECT FROM @schema@.attempt_at(s.job_id, s.run_lease) a
                    WHERE NOT EXISTS (SELECT FROM @schema@.closures x
                                       WHERE x.claim_id = a.claim_id AND x.pos = a.pos));
    IF NOT FOUND THEN
      -- Resumed, rotated or closed between the read and the lock: answer from the current row.
      RETURN QUERY SELECT CASE WHEN s.resumed THEN 'resumed' ELSE 'waiting' END,
                          CASE WHEN s.resumed THEN s.resume_payload END
                     FROM @schema@.attempt_state s
                    WHERE s.job_id = await_callback.job_id AND s.run_lease = await_callback.run_lease
                      AND s.callback_id = await_callback.callback_id
                      AND EXISTS (SELECT FROM @schema@.attempt_at(s.job_id, s.run_lease) a
                                   WHERE NOT EXISTS (SELECT FROM @schema@.closures x
                                                      WHERE x.claim_id = a.claim_id AND x.pos = a.pos));
      RETURN;
    END IF;
  END IF;
  status := 'waiting';
  payload := NULL;
  RETURN NEXT;
END $$;

-- Closes the parked attempt (job_id, run_lease) as resumed ('p') and, only when that closure is
-- the one that won, in the same statement: its ready row (the job's run lease and attempt number
-- kept, `payload` as its resume payload, never NULL, the attempt's latest progress), and the
-- deletion of its attempt_state row (resolved: its callback id is unknown from now on). Wakes the
-- queue's sleeping workers. The caller holds the attempt's advisory lock; a closer that takes
-- none may have closed it first, and then nothing is written (the caller checks the ready row).
-- Internal.
CREATE OR REPLACE FUNCTION @schema@.continue_parked(job_id bigint, run_lease bigint, payload jsonb)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  q text;
BEGIN
  WITH item AS (
    SELECT a.claim_id, a.pos, c.attempts[a.pos] AS attempt, c.last_errors[a.pos] AS last_error,
           c.progress[a.pos] AS progress
      FROM @schema@.attempt_at(continue_parked.job_id, continue_parked.run_lease) a
      JOIN @schema@.claims c ON c.claim_id = a.claim_id
  ), closed AS (
    INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at)
    SELECT i.claim_id, i.pos, 'p', now() FROM item i
    ON CONFLICT (claim_id, pos) DO NOTHING
    RETURNING x.claim_id, x.pos
  ), continued AS (
    INSERT INTO @schema@.ready AS r (id, queue, priority, run_at, created_at, run_lease, attempt, last_error,
                                     progress, resume_payload)
    SELECT sp.id, sp.queue, sp.priority, now(), sp.created_at, continue_parked.run_lease, i.attempt,
           i.last_error, coalesce(s.progress, i.progress), coalesce(continue_parked.payload, '{}')
      FROM closed x
      JOIN item i ON i.claim_id = x.claim_id AND i.pos = x.pos
      JOIN @schema@.specs sp ON sp.id = continue_parked.job_id
      LEFT JOIN @schema@.attempt_state s
             ON s.job_id = continue_parked.job_id AND s.run_lease = continue_parked.run_lease
    RETURNING r.queue
  ), forgotten AS (
    DELETE FROM @schema@.attempt_state s
     USING closed x
     WHERE s.job_id = continue_parked.job_id AND s.run_lease = continue_parked.run_lease
  )
  SELECT c.queue INTO q FROM continued c;
  IF q IS NOT NULL AND EXISTS (SELECT 1 FROM @schema@.waiters w WHERE w.queue = q) THEN
    PERFORM pg_notify(@wake_channel@, q);
  END IF;
END $$;

-- As in migration 14, under the attempt's advisory lock instead of the receipt's row lock:
-- 'parked', 'resumed' (resumed before it parked: continued as a resume of a parked attempt is),
-- or NULL (not open, callback_id not its callback, or closed by another closer meanwhile).
CREATE OR REPLACE FUNCTION @schema@.park_callback(job_id bigint, run_lease bigint, callback_id uuid)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  st @schema@.attempt_state%ROWTYPE;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('@schema@.attempt'),
                                @schema@.attempt_lock_key(park_callback.job_id, park_callback.run_lease));
  SELECT s.* INTO st FROM @schema@.attempt_state s
   WHERE s.job_id = park_callback.job_id AND s.run_lease = park_callback.run_lease
     AND s.callback_id = park_callback.callback_id
     AND EXISTS (SELECT FROM @schema@.attempt_at(s.job_id, s.run_lease) a
                  WHERE NOT EXISTS (SELECT FROM @schema@.closures x
                                     WHERE x.claim_id = a.claim_id AND x.pos = a.pos));
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF st.resumed THEN
    PERFORM @schema@.continue_parked(park_callback.job_id, park_callback.run_lease, st.resume_payload);
    IF NOT EXISTS (SELECT 1 FROM @schema@.ready r
                    WHERE r.id = park_callback.job_id AND r.run_lease = park_callback.run_lease
                      AND r.resume_payload IS NOT NULL) THEN
      RETURN NULL;
    END IF;
    RETURN 'resumed';
  END IF;
  UPDATE @schema@.attempt_state s
     SET no_handler = true, waiting = true,
         callback_deadline = CASE WHEN s.waiting THEN s.callback_deadline ELSE now() + s.callback_timeout END,
         waiting_since = CASE WHEN s.waiting THEN s.waiting_since ELSE now() END
   WHERE s.job_id = park_callback.job_id AND s.run_lease = park_callback.run_lease;
  RETURN 'parked';
END $$;

-- As in migration 14: a parked attempt is closed and continued by a new claim (continue_parked);
-- true only when that closure won. A blocking waiter is resumed in place with its run lease; its
-- hard deadline, suspended while it waited, is pushed back by the time it waited. The claim's
-- deadline_at is its whole batch's, so the attempt's own goes to attempt_state.deadline_at
-- (rescue and the receipts view read coalesce(attempt_state.deadline_at, the claim's)).
CREATE OR REPLACE FUNCTION @schema@.resume_callback(callback_id uuid, payload jsonb DEFAULT '{}')
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM @schema@.lock_callback(resume_callback.callback_id);
  IF a.job_id IS NULL THEN
    RETURN false;
  END IF;
  IF EXISTS (SELECT 1 FROM @schema@.attempt_state s
              WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease AND s.no_handler) THEN
    PERFORM @schema@.continue_parked(a.job_id, a.run_lease, coalesce(resume_callback.payload, '{}'));
    RETURN EXISTS (SELECT 1 FROM @schema@.ready r
                    WHERE r.id = a.job_id AND r.run_lease = a.run_lease AND r.resume_payload IS NOT NULL);
  END IF;
  UPDATE @schema@.attempt_state s
     SET resumed = true, resume_payload = coalesce(resume_callback.payload, '{}'), waiting = false,
         callback_deadline = NULL, waiting_since = NULL, heartbeat_at = now(),
         deadline_at = CASE WHEN s.waiting AND s.waiting_since IS NOT NULL
                            THEN coalesce(s.deadline_at,
                                          (SELECT c.deadline_at
                                             FROM @schema@.attempt_at(a.job_id, a.run_lease) t
                                             JOIN @schema@.claims c ON c.claim_id = t.claim_id))
                                 + (now() - s.waiting_since)
                            ELSE s.deadline_at END
   WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease;
  PERFORM pg_notify(@callback_channel@, a.job_id || ':' || a.run_lease);
  RETURN true;
END $$;

-- As in migration 2, through lock_callback.
CREATE OR REPLACE FUNCTION @schema@.extend_callback(callback_id uuid, timeout interval)
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

-- As in migration 2: the attempt's completion ('c'), its final progress the one given, else the
-- attempt's; the closure is written here, so a waiting attempt needs no un-waiting first. false
-- when unknown, resolved, not open, or closed meanwhile by a closer that takes no lock. The
-- callback is then marked resolved (no longer waiting: rescue's callback timeouts pass it by).
CREATE OR REPLACE FUNCTION @schema@.complete_callback(callback_id uuid, progress jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM @schema@.lock_callback(complete_callback.callback_id);
  IF a.job_id IS NULL THEN
    RETURN false;
  END IF;
  -- The wait is resolved first, then the attempt completed (waiting_external -> running ->
  -- completed in one transaction, as a handler's own completion would be): a batch closer
  -- still refuses the attempt while this transaction is open (it reads it waiting).
  UPDATE @schema@.attempt_state s SET resumed = true, waiting = false, callback_deadline = NULL
   WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease;
  INSERT INTO @schema@.closures (claim_id, pos, outcome, closed_at, progress)
  SELECT t.claim_id, t.pos, 'c', now(),
         coalesce(complete_callback.progress,
                  (SELECT s.progress FROM @schema@.attempt_state s
                    WHERE s.job_id = a.job_id AND s.run_lease = a.run_lease))
    FROM @schema@.attempt_at(a.job_id, a.run_lease) t
  ON CONFLICT (claim_id, pos) DO NOTHING;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify(@cancel_channel@, a.job_id || ':' || a.run_lease);
  RETURN true;
END $$;

-- As in migration 2: the attempt fails through fail_attempt ('r' while attempts remain and retry
-- is true, else 'f', or 'd' into a dead-letter queue). false when unknown, resolved, not open, or
-- closed meanwhile by a closer that takes no lock.
CREATE OR REPLACE FUNCTION @schema@.fail_callback(callback_id uuid, error text, retry boolean DEFAULT false)
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
  IF @schema@.fail_attempt(a.job_id, a.run_lease, fail_callback.error,
                           NOT coalesce(fail_callback.retry, false)) IS NULL THEN
    RETURN false;
  END IF;
  PERFORM pg_notify(@cancel_channel@, a.job_id || ':' || a.run_lease);
  RETURN true;
END $$;

-- ---- rescue, retention and the operator's cancel and retry ------------------------------------
--
-- Rescue reads the open attempts (the items of open_claims without a closure) with their
-- attempt_state, never the claim history. It takes a stale attempt's advisory lock with
-- pg_try_advisory_xact_lock and passes the attempt by when a caller's transaction holds it (as
-- SKIP LOCKED on the receipt did), then looks again in a statement of its own and closes what is
-- still stale: 'a' with the job's narrow ready row while attempts remain, else 'd' with its
-- dead_letter row or 'f'. Every transition a callback makes (resume, extend, park) holds the same
-- lock, so the second look sees any of them that committed before the lock was taken; that is
-- what migration 4's lock of the waiting attempt_state rows was for.
--
-- The maintenance pass takes fully closed claims out of open_claims and, in the same statement,
-- enters each in settled_claims with the time it ripens: the latest, over its closures, of
-- closed_at plus its queue's retention for the outcome ('c' retain_completed, 'x'
-- retain_cancelled, 'f' retain_failed, no retention for the others), and never before its last
-- closure plus the prune floor (5 minutes). A claim without a terminal closure (every item
-- retried, snoozed, rescued, parked, released or dead-lettered) has no history to keep: it ripens
-- at its last closure plus the floor. A job's terminal record without an attempt (cancel_job of
-- a waiting job), never in open_claims, is entered with the record.
--
-- Retention reads the ripe rows of settled_claims only, oldest first, and removes a claim row
-- once it is ripe under its queue's settings of now and its last closure is past the pass's
-- floor (which keeps a completion's evidence readable). With the row go the specs of the jobs
-- whose last word it holds (a terminal or dead-letter item, no later claim, not waiting in ready
-- or deferred, no dead_letter row: a dead-lettered job's spec goes with that row), and their keys
-- and attempt_state, as prune did with a done row. A job retried since its claim settled ('e')
-- waits again or has a later claim, so its spec stays; the claim keeps the ripe_at of its
-- terminal closure, later than it needs. The claim's closures stay a day longer, its
-- settled_claims row marked retired: a late closer of one of its attempts (a stale worker, or a
-- caller's closer that read the claim item before the row went, in an earlier statement or an
-- older REPEATABLE READ snapshot) still collides with the attempt's closure and changes nothing,
-- where with the closure gone its insert would go in: a second finalization, and for a retry or
-- snooze a ready or deferred row of a job without a spec. A closer that starts once the row has
-- gone finds no item. Nothing reads a closure without its claim row (every reader goes through
-- claims), so the kept closures are invisible, and retention's scan reads neither them nor the
-- claims whose retention has not passed.
--
-- rescue_attempts, prune_expired and maintain run with jit off: their statements are index
-- probes per open claim or per item whose estimates pass jit_above_cost, and compiling them
-- (tens of milliseconds, every pass) cost more than running them.

-- As in migration 9 (migration 4's rules), over the ledger: an attempt is stale when it is not
-- waiting and its heartbeat (its claim time when it never wrote one) is stale_after old or its
-- hard deadline has passed (its own in attempt_state once a resume pushed it back, else the
-- claim's), or when it waits and its callback deadline has passed. The candidates are read,
-- their locks tried (skipped when held), and what is still stale under the lock is closed in one
-- statement in key order; the ready, dead_letter and result rows are those of the closures that
-- went in. The closure holds the error and the attempt's progress when it is the job's end
-- ('f'); otherwise the job's ready or dead_letter row carries them. Each rescued attempt's
-- holder is told on the cancel channel, as before.
CREATE OR REPLACE FUNCTION @schema@.rescue_attempts(stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
#variable_conflict use_column
DECLARE
  rec      record;
  v_claims bigint[];
  v_poss   int[];
BEGIN
  IF stale_after IS NULL OR stale_after < '0'::interval THEN
    RAISE EXCEPTION 'tenure.rescue_stale: stale_after must be a non-negative interval'
      USING ERRCODE = '22023';
  END IF;
  -- The candidates, each lock tried once: the try sits outside the fenced scan, so it runs only
  -- for stale attempts and no lock is taken on a live one.
  SELECT array_agg(t.claim_id ORDER BY t.claim_id, t.pos), array_agg(t.pos ORDER BY t.claim_id, t.pos)
    INTO v_claims, v_poss
    FROM (SELECT a.claim_id, a.pos, a.job_id, a.run_lease
            FROM @schema@.open_attempts a
            LEFT JOIN @schema@.attempt_state s ON s.job_id = a.job_id AND s.run_lease = a.run_lease
           WHERE (NOT coalesce(s.waiting, false)
                  AND (coalesce(s.heartbeat_at, a.claimed_at) + rescue_attempts.stale_after <= now()
                       OR coalesce(s.deadline_at, a.deadline_at) <= now()))
              OR (s.waiting AND s.callback_deadline <= now())
          OFFSET 0) t
   WHERE pg_try_advisory_xact_lock(hashtext('@schema@.attempt'), @schema@.attempt_lock_key(t.job_id, t.run_lease));
  IF v_claims IS NULL THEN
    RETURN;
  END IF;
  FOR rec IN
    WITH stale AS MATERIALIZED (
      -- Under the locks, from a fresh snapshot: still open and still stale.
      SELECT c.claim_id, t.pos, c.job_ids[t.pos] AS job_id,
             coalesce(c.run_leases[t.pos], c.claim_id * 65536 + t.pos) AS run_lease, c.queue,
             c.attempts[t.pos] AS attempt, c.run_ats[t.pos] AS run_at,
             coalesce(s.progress, c.progress[t.pos]) AS carried, s.progress AS live_progress,
             CASE WHEN s.waiting THEN 'rescued: callback timed out'
                  WHEN coalesce(s.deadline_at, c.deadline_at) <= now() THEN 'rescued: hard deadline passed'
                  ELSE format('rescued: no heartbeat for %s', rescue_attempts.stale_after) END AS why
        FROM unnest(v_claims, v_poss) AS t(claim_id, pos)
        JOIN @schema@.claims c ON c.claim_id = t.claim_id
        LEFT JOIN @schema@.attempt_state s
               ON s.job_id = c.job_ids[t.pos] AND s.run_lease = coalesce(c.run_leases[t.pos], c.claim_id * 65536 + t.pos)
       WHERE NOT EXISTS (SELECT FROM @schema@.closures x WHERE x.claim_id = c.claim_id AND x.pos = t.pos)
         AND ((NOT coalesce(s.waiting, false)
               AND (coalesce(s.heartbeat_at, c.claimed_at) + rescue_attempts.stale_after <= now()
                    OR coalesce(s.deadline_at, c.deadline_at) <= now()))
              OR (s.waiting AND s.callback_deadline <= now()))
    ), decided AS MATERIALIZED (
      SELECT t.*, sp.kind, sp.args, sp.priority, sp.max_attempts, sp.created_at, sp.metadata,
             CASE WHEN t.attempt < sp.max_attempts THEN 'a'
                  WHEN coalesce(q.dead_letter, false) THEN 'd'
                  ELSE 'f' END::"char" AS outcome
        FROM stale t
        JOIN @schema@.specs sp ON sp.id = t.job_id
        LEFT JOIN @schema@.queues q ON q.name = t.queue
    ), won AS (
      INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, last_error, progress)
      SELECT d.claim_id, d.pos, d.outcome, now(),
             CASE WHEN d.outcome = 'f' THEN d.why END, CASE WHEN d.outcome = 'f' THEN d.live_progress END
        FROM decided d
       ORDER BY d.claim_id, d.pos
      ON CONFLICT (claim_id, pos) DO NOTHING
      RETURNING x.claim_id, x.pos
    ), closed AS (
      SELECT d.* FROM decided d JOIN won w ON w.claim_id = d.claim_id AND w.pos = d.pos
    ), back AS (
      -- available at once, no backoff; the attempt counts (the next claim opens attempt + 1)
      INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error,
                                  progress)
      SELECT c.job_id, c.queue, c.priority, now(), c.created_at, c.run_lease, c.attempt, c.why, c.carried
        FROM closed c WHERE c.outcome = 'a'
    ), buried AS (
      INSERT INTO @schema@.dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                        run_at, created_at, finalized_at, last_error, progress, metadata)
      SELECT c.job_id, c.queue, c.kind, c.args, c.priority, c.attempt, c.max_attempts, c.run_lease,
             c.run_at, c.created_at, now(), c.why, c.carried, c.metadata
        FROM closed c WHERE c.outcome = 'd'
    )
    SELECT c.job_id, c.run_lease, c.queue, c.outcome FROM closed c ORDER BY c.job_id
  LOOP
    PERFORM pg_notify(@cancel_channel@, rec.job_id || ':' || rec.run_lease);
    job_id := rec.job_id;
    run_lease := rec.run_lease;
    queue := rec.queue;
    new_state := CASE WHEN rec.outcome = 'a' THEN 'available' ELSE 'failed' END;
    RETURN NEXT;
  END LOOP;
END $$;

-- As in migration 1.
CREATE OR REPLACE FUNCTION @schema@.rescue_stale(stale_after interval DEFAULT '30 seconds') RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT count(*) FROM @schema@.rescue_attempts($1)
$$;

-- As in migration 11 (retention per queue and terminal state, the prune floor, statements of at
-- most `batch` and passes of at most `max_rows`, the result), over the ledger. The unit is a
-- claim item: a claim row goes whole, and counts as many as it has items (a row larger than
-- `batch` goes alone in its statement; one larger than what is left of `max_rows` waits for the
-- next pass). The result counts the finished jobs removed, as before: the completed, failed and
-- cancelled items of the removed rows, and the dead_letter rows.
--   - The claims are taken from settled_claims, ripe_at past, oldest first, in pages of `batch`
--     rows after the last one read (FOR UPDATE SKIP LOCKED: a concurrent pass leaves them to
--     this one). Each is checked against its queue's settings of now: when a retention grew
--     since the claim settled, ripe_at moves to the later time and the row waits for it. A
--     retention shortened after a claim settled applies to it only at its old ripe_at (no pass
--     reads the row before). A row whose last closure is within this pass's floor (stale_after,
--     when longer than 5 minutes) waits too, its ripe_at kept: the floor is the caller's.
--   - dead_letter as before, and the spec of each removed row (dead-lettered jobs keep their spec
--     as long as their row).
-- Each claim row is locked (FOR UPDATE SKIP LOCKED: retry_job locks the claim of the terminal item
-- it retries) before the statement that removes it decides, from its own snapshot, which specs go;
-- one so passed by is read again by the next pass. A removed row's closures stay and its
-- settled_claims row is marked retired (see above). First of all, each pass deletes the closures
-- of the claims retired more than a day ago, oldest retirement first, with their settled_claims
-- rows: counted against `max_rows` as closures, a claim's closures together in statements of at
-- most `batch` (as claim rows go), not in the result. A day is far beyond any closer's
-- read-then-insert: a closure can only be missed by a closer that read the claim item before the
-- row went and still has not inserted a day later (a REPEATABLE READ transaction held open for a
-- day). Forgetting goes first so that the kept closures stay about a day's worth however far
-- behind the rest is.
CREATE OR REPLACE FUNCTION @schema@.prune_expired(stale_after interval DEFAULT '30 seconds', max_rows int DEFAULT 50000,
                                                  batch int DEFAULT 5000)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
  floor_age interval := greatest(coalesce(prune_expired.stale_after, '0'::interval), '5 minutes'::interval);
  v_now     timestamptz := now();
  budget    bigint := prune_expired.max_rows;
  total     bigint := 0;
  want      bigint;
  n         bigint;
  m         bigint;
  got       bigint;
  qn        text;
  keep      interval;
  victims   bigint[];
  locked    bigint[];
  cut       boolean;
  cur_r     timestamptz := '-infinity';
  cur_c     bigint := 0;
  last_r    timestamptz;
  last_c    bigint;
  later     bigint[];
  later_at  timestamptz[];
BEGIN
  IF prune_expired.max_rows IS NULL OR prune_expired.max_rows < 0
     OR prune_expired.batch IS NULL OR prune_expired.batch < 1 THEN
    RAISE EXCEPTION 'tenure.prune_expired: max_rows must be >= 0 and batch >= 1' USING ERRCODE = '22023';
  END IF;
  -- The closures of claims retired more than a day ago, as many claims as fit (each has at least
  -- one closure, so `want` of them are enough to fill the statement).
  LOOP
    want := least(prune_expired.batch, budget);
    EXIT WHEN want <= 0;
    victims := ARRAY(
      SELECT v.claim_id
        FROM (SELECT r.claim_id, r.ord, sum(z.n) OVER (ORDER BY r.ord) AS running
                FROM (SELECT s.claim_id, row_number() OVER (ORDER BY s.retired_at) AS ord
                        FROM (SELECT s.claim_id, s.retired_at FROM @schema@.settled_claims s
                               WHERE s.retired_at < v_now - interval '1 day'
                               ORDER BY s.retired_at
                               LIMIT want) s) r
               CROSS JOIN LATERAL (SELECT count(*) AS n FROM @schema@.closures x WHERE x.claim_id = r.claim_id) z) v
       WHERE v.running <= want OR (v.ord = 1 AND v.running <= budget)
       ORDER BY v.ord);
    EXIT WHEN cardinality(victims) = 0;
    WITH forgotten AS (
      DELETE FROM @schema@.closures x WHERE x.claim_id = ANY (victims) RETURNING x.claim_id
    ), cleared AS (
      DELETE FROM @schema@.settled_claims s WHERE s.claim_id = ANY (victims)
    )
    SELECT count(*) INTO n FROM forgotten;
    budget := budget - n;
  END LOOP;
  LOOP
    want := least(prune_expired.batch, budget);
    EXIT WHEN want <= 0;
    -- A page of ripe claims after the last one read, each checked against its queue now (one
    -- probe of claims and of closures per row). Of those that may go, in page order, as many as
    -- fit; the cursor stops before the first that does not (read again by the next statement).
    WITH page AS MATERIALIZED (
      SELECT s.claim_id, s.ripe_at
        FROM @schema@.settled_claims s
       WHERE s.retired_at IS NULL AND s.ripe_at <= v_now
         AND s.ripe_at >= cur_r AND (s.ripe_at, s.claim_id) > (cur_r, cur_c)
       ORDER BY s.ripe_at, s.claim_id
       LIMIT want
         FOR UPDATE SKIP LOCKED
    ), checked AS (
      SELECT p.claim_id, p.ripe_at, row_number() OVER (ORDER BY p.ripe_at, p.claim_id) AS ord, k.items, k.ripe_now,
             coalesce(k.closed AND k.ripe_now <= v_now, false) AS may_go
        FROM page p
        LEFT JOIN LATERAL (
              SELECT cardinality(c.job_ids) AS items,
                     greatest(z.last_closed + '5 minutes'::interval, z.kept_until) AS ripe_now,
                     z.n = cardinality(c.job_ids) AND z.last_closed <= v_now - floor_age AS closed
                FROM @schema@.claims c
                LEFT JOIN @schema@.queues q ON q.name = c.queue
               CROSS JOIN LATERAL (
                     SELECT count(*) AS n, max(y.closed_at) AS last_closed,
                            max(y.closed_at + CASE y.outcome WHEN 'c' THEN coalesce(q.retain_completed, '24 hours'::interval)
                                                             WHEN 'x' THEN coalesce(q.retain_cancelled, '24 hours'::interval)
                                                             WHEN 'f' THEN coalesce(q.retain_failed, '7 days'::interval)
                                                             ELSE '0'::interval END) AS kept_until
                       FROM @schema@.closures y WHERE y.claim_id = c.claim_id) z
               WHERE c.claim_id = p.claim_id
              OFFSET 0) k ON true
    ), fitted AS (
      SELECT e.*,
             e.may_go AND (sum(e.items) FILTER (WHERE e.may_go) OVER (ORDER BY e.ord) <= want
                           OR (count(*) FILTER (WHERE e.may_go) OVER (ORDER BY e.ord) = 1 AND e.items <= budget)) AS fits
        FROM checked e
    ), marked AS (
      SELECT f.*, bool_or(f.may_go AND NOT f.fits) OVER (ORDER BY f.ord) AS from_cut FROM fitted f
    )
    SELECT coalesce(array_agg(v.claim_id ORDER BY v.ord) FILTER (WHERE v.fits), '{}'),
           coalesce(bool_or(v.from_cut), false),
           (array_agg(v.ripe_at ORDER BY v.ord DESC) FILTER (WHERE NOT v.from_cut))[1],
           (array_agg(v.claim_id ORDER BY v.ord DESC) FILTER (WHERE NOT v.from_cut))[1],
           count(*),
           coalesce(array_agg(v.claim_id) FILTER (WHERE v.ripe_now > v_now), '{}'),
           coalesce(array_agg(v.ripe_now) FILTER (WHERE v.ripe_now > v_now), '{}')
      INTO victims, cut, last_r, last_c, got, later, later_at
      FROM marked v;
    EXIT WHEN got = 0;
    IF cardinality(later) > 0 THEN
      -- a retention that grew since the claim settled: it ripens later
      UPDATE @schema@.settled_claims s SET ripe_at = u.ripe_at
        FROM unnest(later, later_at) AS u(claim_id, ripe_at)
       WHERE s.claim_id = u.claim_id;
    END IF;
    -- the oldest row that may go is larger than what this pass has left
    EXIT WHEN cardinality(victims) = 0 AND cut;
    locked := ARRAY(SELECT c.claim_id FROM @schema@.claims c WHERE c.claim_id = ANY (victims)
                     ORDER BY c.claim_id FOR UPDATE SKIP LOCKED);
    IF cardinality(locked) > 0 THEN
      WITH items AS MATERIALIZED (
        SELECT c.claim_id, u.pos::int AS pos, u.job_id,
               coalesce(c.run_leases[u.pos], c.claim_id * 65536 + u.pos) AS run_lease,
               c.run_leases IS NOT NULL AS listed,
               (SELECT x.outcome FROM @schema@.closures x WHERE x.claim_id = c.claim_id AND x.pos = u.pos) AS outcome
          FROM @schema@.claims c
         CROSS JOIN LATERAL unnest(c.job_ids) WITH ORDINALITY AS u(job_id, pos)
         WHERE c.claim_id = ANY (locked)
      ), ended AS (
        -- The jobs whose last word is here (their latest claim is this one): read after the
        -- lock, so a retry that committed is seen.
        SELECT i.job_id FROM items i
         WHERE i.outcome IN ('c', 'f', 'x', 'd')
           AND NOT EXISTS (SELECT FROM @schema@.ready r WHERE r.id = i.job_id)
           AND NOT EXISTS (SELECT FROM @schema@.deferred d WHERE d.id = i.job_id)
           AND NOT EXISTS (SELECT FROM @schema@.dead_letter d WHERE d.id = i.job_id)
           AND (SELECT max(l.claim_id) FROM @schema@.claims l
                 WHERE int8range(l.lo, l.hi, '[]') @> i.job_id AND l.job_ids @> ARRAY[i.job_id]) = i.claim_id
      ), gone AS (
        DELETE FROM @schema@.specs s USING ended e WHERE s.id = e.job_id RETURNING s.id
      ), swept AS (
        DELETE FROM @schema@.attempt_state s USING gone g WHERE s.job_id = g.id
      ), unkeyed AS (
        DELETE FROM @schema@.job_keys k USING gone g WHERE k.job_id = g.id RETURNING k.job_id
      ), released AS (
        DELETE FROM @schema@.key_holders h USING unkeyed u WHERE h.job_id = u.job_id
      ), unmapped AS (
        DELETE FROM @schema@.legacy_attempts l USING items i
         WHERE i.listed AND l.job_id = i.job_id AND l.run_lease = i.run_lease
      ), dropped AS (
        DELETE FROM @schema@.claims c WHERE c.claim_id = ANY (locked)
      ), retired AS (
        -- its closures stay: see above
        UPDATE @schema@.settled_claims s SET retired_at = now() WHERE s.claim_id = ANY (locked)
      )
      SELECT count(*), count(*) FILTER (WHERE i.outcome IN ('c', 'f', 'x')) INTO n, m FROM items i;
      total := total + m;
      budget := budget - n;
    END IF;
    cur_r := last_r;
    cur_c := last_c;
    EXIT WHEN NOT cut AND got < want;
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
      ), unspecced AS (
        DELETE FROM @schema@.specs s USING gone g
         WHERE s.id = g.id
           AND NOT EXISTS (SELECT FROM @schema@.ready r WHERE r.id = g.id)
           AND NOT EXISTS (SELECT FROM @schema@.deferred d WHERE d.id = g.id)
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

-- As in migration 12, plus two sweeps after rescue. open_claims loses the claims whose every item
-- is closed, oldest first, at most 10,000 per pass, and each goes into settled_claims in the same
-- statement with the time it ripens (see above; the 5-minute floor: a pass with a longer
-- stale_after holds the claim until its own floor has passed, without moving ripe_at).
-- attempt_state loses the rows of attempts that are not open (no claim item at their lease, or
-- one with a closure), the attempts rescue has just closed included.
CREATE OR REPLACE FUNCTION @schema@.maintain(holder text, term bigint, stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
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
  PERFORM @schema@.enqueue_due_schedules(NULL);
  RETURN QUERY SELECT r.job_id, r.run_lease, r.queue, r.new_state FROM @schema@.rescue_attempts(stale_after) r;
  WITH settled AS MATERIALIZED (
    SELECT w.claim_id, w.queue, greatest(z.last_closed + '5 minutes'::interval, z.kept_until) AS ripe_at
      FROM @schema@.open_claims w
      -- (one claims_pkey probe per open claim, as in open_attempts)
     CROSS JOIN LATERAL (SELECT c.job_ids FROM @schema@.claims c WHERE c.claim_id = w.claim_id OFFSET 0) c
      LEFT JOIN @schema@.queues q ON q.name = w.queue
     CROSS JOIN LATERAL (
           SELECT count(*) AS n, max(x.closed_at) AS last_closed,
                  max(x.closed_at + CASE x.outcome WHEN 'c' THEN coalesce(q.retain_completed, '24 hours'::interval)
                                                   WHEN 'x' THEN coalesce(q.retain_cancelled, '24 hours'::interval)
                                                   WHEN 'f' THEN coalesce(q.retain_failed, '7 days'::interval)
                                                   ELSE '0'::interval END) AS kept_until
             FROM @schema@.closures x WHERE x.claim_id = w.claim_id) z
     WHERE z.n = cardinality(c.job_ids)
     ORDER BY w.claim_id
     LIMIT 10000
  ), unlisted AS (
    DELETE FROM @schema@.open_claims o USING settled s WHERE o.claim_id = s.claim_id RETURNING o.claim_id
  )
  INSERT INTO @schema@.settled_claims (claim_id, queue, ripe_at)
  SELECT s.claim_id, s.queue, s.ripe_at FROM settled s JOIN unlisted u ON u.claim_id = s.claim_id;
  DELETE FROM @schema@.attempt_state s
   WHERE NOT (
     (s.run_lease >= 65536
      AND EXISTS (SELECT FROM @schema@.claims c
                   WHERE c.claim_id = s.run_lease >> 16
                     AND c.job_ids[(s.run_lease & 65535)::int] = s.job_id
                     AND c.run_leases IS NULL
                     AND NOT EXISTS (SELECT FROM @schema@.closures x
                                      WHERE x.claim_id = c.claim_id AND x.pos = (s.run_lease & 65535)::int)))
     OR (s.run_lease < 65536
         AND EXISTS (SELECT FROM @schema@.legacy_attempts l
                      WHERE l.job_id = s.job_id AND l.run_lease = s.run_lease
                        AND NOT EXISTS (SELECT FROM @schema@.closures x
                                         WHERE x.claim_id = l.claim_id AND x.pos = l.pos))));
  PERFORM @schema@.prune_expired(stale_after);
END $$;

-- As in migration 9, over the ledger. A ready or deferred job gets its terminal record: its row
-- is deleted, and a claim row of one item (its run lease, attempt, run_at, carried error and
-- progress; no worker, not in open_claims) with a cancelled closure is written in the same
-- statement, its id drawn after the delete, and settles there (it ripens at the queue's
-- retain_cancelled). A running job's open attempt, found as the job's
-- latest claim item without a closure, is closed through cancel_attempt under the attempt's
-- advisory lock, taken only when free: while a caller's transaction holds it (a completion,
-- failure or heartbeat by token in progress) the job is looked at again a little later (at most
-- 0.3 s in all) instead of waiting for that transaction, and after five looks the cancel answers
-- 40001, as when the job kept moving under it. true when cancelled now, false when the job had
-- finished (its latest item terminal, or a dead_letter row), TN003 when unknown.
CREATE OR REPLACE FUNCTION @schema@.cancel_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  l       record;
  v_found boolean;
BEGIN
  FOR round IN 1..5 LOOP
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

-- As in migration 11, over the ledger. A finished job is one whose latest claim item (found
-- through the claims' id ranges, then array_position) has a completed, failed or cancelled closure
-- and that waits nowhere, or one with a dead_letter row. The claim row of that item is locked
-- (FOR UPDATE: a second retry of the job waits for this one, and retention, which removes the
-- row with the job's spec, skips it) and the job read again from a fresh snapshot; a
-- dead_letter row is locked as before. Its key is taken back as before, then it is made ready
-- with its run lease, attempt 0, its last error and progress. The terminal closure stays as the
-- attempt's history, released ('e'); the jobs view shows the ready row, which wins over the claim
-- items. The claim keeps its settled_claims row and ripe_at (or settles later, when still in
-- open_claims): retention removes the row then, and the job's spec stays while the job waits or
-- has a later claim. A
-- dead-lettered job's row is deleted and its spec written again from it when retention has
-- removed it (or it was dead-lettered before this layout). false when the job has not finished,
-- TN003 when unknown, 23505 when a live job holds its key.
CREATE OR REPLACE FUNCTION @schema@.retry_job(job_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  k        record;
  holder   bigint;
  l        record;
  dl       @schema@.dead_letter%ROWTYPE;
  v_claim  bigint;
  finished boolean := false;
  buried   boolean := false;
BEGIN
  SELECT t.claim_id, x.outcome INTO l
    FROM (SELECT c.claim_id, array_position(c.job_ids, retry_job.job_id) AS pos
            FROM @schema@.claims c
           WHERE int8range(c.lo, c.hi, '[]') @> retry_job.job_id AND c.job_ids @> ARRAY[retry_job.job_id]
           ORDER BY c.claim_id + 0 DESC  -- + 0: through claims_jobs_idx
           LIMIT 1) t
    LEFT JOIN @schema@.closures x ON x.claim_id = t.claim_id AND x.pos = t.pos;
  IF FOUND AND l.outcome IN ('c', 'f', 'x') THEN
    SELECT c.claim_id INTO v_claim FROM @schema@.claims c WHERE c.claim_id = l.claim_id FOR UPDATE;
    IF FOUND THEN
      SELECT t.claim_id, t.pos, coalesce(t.run_leases[t.pos], t.claim_id * 65536 + t.pos) AS run_lease,
             x.outcome, coalesce(x.last_error, t.last_errors[t.pos]) AS last_error,
             coalesce(x.progress, t.progress[t.pos]) AS progress
        INTO l
        FROM (SELECT c.claim_id, c.run_leases, c.last_errors, c.progress,
                     array_position(c.job_ids, retry_job.job_id) AS pos
                FROM @schema@.claims c
               WHERE int8range(c.lo, c.hi, '[]') @> retry_job.job_id AND c.job_ids @> ARRAY[retry_job.job_id]
               ORDER BY c.claim_id + 0 DESC  -- + 0: through claims_jobs_idx
               LIMIT 1) t
        LEFT JOIN @schema@.closures x ON x.claim_id = t.claim_id AND x.pos = t.pos;
      finished := FOUND AND l.claim_id = v_claim AND l.outcome IN ('c', 'f', 'x')
                  AND NOT EXISTS (SELECT 1 FROM @schema@.ready r WHERE r.id = retry_job.job_id)
                  AND NOT EXISTS (SELECT 1 FROM @schema@.deferred d WHERE d.id = retry_job.job_id);
    END IF;
  END IF;
  IF NOT finished THEN
    SELECT d.* INTO dl FROM @schema@.dead_letter d WHERE d.id = retry_job.job_id FOR UPDATE;
    buried := FOUND;
  END IF;
  IF NOT finished AND NOT buried THEN
    IF EXISTS (SELECT 1 FROM @schema@.jobs x WHERE x.id = retry_job.job_id) THEN
      RETURN false;
    END IF;
    RAISE EXCEPTION 'job % not found', retry_job.job_id USING ERRCODE = 'TN003';
  END IF;
  -- A terminal keyed job takes its key back first, unless another live job holds it (one in
  -- ready or deferred, or whose latest claim item is open).
  SELECT x.queue, x.unique_key INTO k FROM @schema@.job_keys x WHERE x.job_id = retry_job.job_id;
  IF FOUND THEN
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
              OR EXISTS (SELECT 1
                           FROM (SELECT c.claim_id, array_position(c.job_ids, holder) AS pos
                                   FROM @schema@.claims c
                                  WHERE int8range(c.lo, c.hi, '[]') @> holder AND c.job_ids @> ARRAY[holder]
                                  ORDER BY c.claim_id + 0 DESC  -- + 0: through claims_jobs_idx
                                  LIMIT 1) h
                          WHERE NOT EXISTS (SELECT 1 FROM @schema@.closures x
                                             WHERE x.claim_id = h.claim_id AND x.pos = h.pos))) THEN
        RAISE EXCEPTION 'job % cannot be retried: its unique_key % is held by live job % of queue %',
          retry_job.job_id, k.unique_key, holder, k.queue USING ERRCODE = '23505';
      END IF;
      UPDATE @schema@.key_holders h SET job_id = retry_job.job_id
       WHERE h.queue = k.queue AND h.unique_key = k.unique_key AND h.job_id IS DISTINCT FROM retry_job.job_id;
    END IF;
  END IF;
  IF finished THEN
    -- The finished attempt is released: its terminal record leaves the done view, the queue
    -- counts and the evidence (which now answers closed_by_other for it, as for any attempt
    -- whose job went on).
    UPDATE @schema@.closures x SET outcome = 'e' WHERE x.claim_id = l.claim_id AND x.pos = l.pos;
    INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress)
    SELECT sp.id, sp.queue, sp.priority, now(), sp.created_at, l.run_lease, 0, l.last_error, l.progress
      FROM @schema@.specs sp WHERE sp.id = retry_job.job_id;
    RETURN FOUND;
  END IF;
  DELETE FROM @schema@.dead_letter d WHERE d.id = retry_job.job_id;
  INSERT INTO @schema@.specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
  VALUES (dl.id, dl.queue, dl.kind, dl.args, dl.priority, dl.max_attempts, dl.metadata, dl.created_at)
  ON CONFLICT (id) DO NOTHING;
  INSERT INTO @schema@.ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress)
  VALUES (dl.id, dl.queue, dl.priority, now(), dl.created_at, dl.run_lease, 0, dl.last_error, dl.progress);
  RETURN true;
END $$;

-- Every item of every claim, with its run lease.
CREATE VIEW @schema@.claim_items AS
SELECT c.claim_id, u.pos::int AS pos, u.job_id,
       coalesce(c.run_leases[u.pos], c.claim_id * 65536 + u.pos) AS run_lease,
       c.queue, c.worker, c.claimed_at, c.deadline_at,
       c.attempts[u.pos] AS attempt, c.secrets[u.pos] AS secret, c.run_ats[u.pos] AS run_at,
       c.last_errors[u.pos] AS last_error, c.progress[u.pos] AS progress
  FROM @schema@.claims c
 CROSS JOIN LATERAL unnest(c.job_ids) WITH ORDINALITY AS u(job_id, pos);

-- The open attempts: items of the claims in open_claims without a closure.
CREATE VIEW @schema@.open_attempts AS
SELECT c.claim_id, u.pos::int AS pos, u.job_id,
       coalesce(c.run_leases[u.pos], c.claim_id * 65536 + u.pos) AS run_lease,
       c.queue, c.worker, c.claimed_at, c.deadline_at,
       c.attempts[u.pos] AS attempt, c.secrets[u.pos] AS secret, c.run_ats[u.pos] AS run_at,
       c.last_errors[u.pos] AS last_error, c.progress[u.pos] AS progress
  FROM @schema@.open_claims o
 -- driven by open_claims, one claims_pkey probe each (OFFSET 0 keeps it a probe): as a join, the
 -- planner may scan every claim and test every item against closures before it looks at
 -- open_claims, when open_claims' statistics were taken in the middle of a drain
 CROSS JOIN LATERAL (SELECT c.* FROM @schema@.claims c WHERE c.claim_id = o.claim_id OFFSET 0) c
 -- the anti-join inside the lateral: planned per claim (one probe of closures_pkey per item by
 -- its full key), where outside it reads the claim's closures once per item
 CROSS JOIN LATERAL (SELECT u.job_id, u.pos FROM unnest(c.job_ids) WITH ORDINALITY AS u(job_id, pos)
                      WHERE NOT EXISTS (SELECT FROM @schema@.closures x
                                         WHERE x.claim_id = c.claim_id AND x.pos = u.pos)) u;

-- The tables of schema 23, as views over the same columns: one row per open attempt ...
CREATE VIEW @schema@.receipts AS
SELECT a.job_id, a.run_lease, s.queue, s.kind, s.args, s.priority, a.attempt, s.max_attempts,
       a.run_at, s.created_at, a.claimed_at, coalesce(st.deadline_at, a.deadline_at) AS deadline_at, a.worker,
       a.last_error, a.progress, a.secret, s.metadata
  FROM @schema@.open_attempts a
  JOIN @schema@.specs s ON s.id = a.job_id
  LEFT JOIN @schema@.attempt_state st ON st.job_id = a.job_id AND st.run_lease = a.run_lease;

-- ... and one per finished job (completed, failed, cancelled; dead-lettered jobs are in dead_letter).
CREATE VIEW @schema@.done AS
SELECT i.job_id AS id, s.queue, s.kind, s.args, CASE x.outcome WHEN 'c' THEN 'completed' WHEN 'f' THEN 'failed' ELSE 'cancelled' END AS state, s.priority,
       i.attempt, s.max_attempts, i.run_lease, i.run_at, s.created_at, x.closed_at AS finalized_at,
       coalesce(x.last_error, i.last_error) AS last_error, coalesce(x.progress, i.progress) AS progress,
       s.metadata
  FROM @schema@.closures x
  JOIN @schema@.claim_items i ON i.claim_id = x.claim_id AND i.pos = x.pos
  JOIN @schema@.specs s ON s.id = i.job_id
 WHERE x.outcome IN ('c', 'f', 'x');

-- (The views spell the outcome names out: a function called in a view needs EXECUTE of whoever
-- reads it.)
-- The one read view, over the same columns as before. A job's state: its ready or deferred row,
-- else its latest claim item (open: running or waiting_external; closed: the terminal outcome).
-- ready is read by its whole claim key (a ready row has its spec's queue and priority): for an id
-- alone the planner may scan all of ready_claim_idx when ready's statistics say it is small.
-- Driven from specs, so a filter on id reads one job (its claims through the GiST index).
CREATE VIEW @schema@.jobs AS
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

DO $$
BEGIN
  IF pg_catalog.current_setting('tenure.migrate_jobs_readers') <> '' THEN
    EXECUTE 'GRANT SELECT ON @schema@.jobs TO ' || pg_catalog.current_setting('tenure.migrate_jobs_readers');
  END IF;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
