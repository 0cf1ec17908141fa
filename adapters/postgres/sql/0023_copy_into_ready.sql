-- tenure migration 23: bulk enqueue over COPY straight into `ready`.
--
-- Migration 22's COPY writes the jobs twice: into the session's stage, then into the job tables.
-- A batch of jobs to run now (none scheduled, none keyed) may instead go straight into `ready`:
--
--   SELECT <schema>.enqueue_copy_target(false);       -- '<schema>.ready', or a stage as in 22
--   COPY <schema>.ready (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
--   SELECT <schema>.enqueue_copied_ready(<n>);        -- '{ids in input order}'
--
-- What a producer may write there is exactly what enqueue_batch would write for it:
-- - INSERT is granted on those six columns only. The others take their defaults: the id from the
--   job sequence (rows numbered in input order, as COPY evaluates defaults row by row), attempt
--   and run lease 0, run_at and created_at the transaction's now(), no error, no progress, no
--   resume payload. A producer cannot pick an id, a lease or a time.
-- - enqueue_batch's checks of each job are CHECK constraints of `ready`, for every job numbered
--   from now on. tenure's own moves into `ready` (promotion, retry, rescue) carry rows that passed
--   the same rules at enqueue and are never updated in place, so they satisfy them too.
-- - No SELECT, UPDATE or DELETE on any job table: a producer reads nothing back but through
--   enqueue_copied_ready, which answers only the ids of rows its own (sub)transaction wrote.
-- - USAGE on the job sequence (the id default calls nextval): a producer can draw ids, which
--   costs nothing but numbers; setval needs UPDATE, which it does not get.
--
-- enqueue_copied_ready(n) finds the n rows of the COPY from the last id the session drew
-- (currval: the COPY's last row), the transaction id that row carries (its xmin: the writing
-- transaction, or the savepoint's subtransaction it ran in, which must be this transaction's and
-- in progress, else NULL), and the n highest ids at or below it with that xmin (rows other
-- sessions numbered in between carry other transaction ids; rows of an earlier batch in the same
-- transaction have lower ids). It wakes the idle workers of their
-- queues as enqueue_copied does and answers the ids in input order; NULL when the session drew
-- no id, or when fewer than n such rows exist (nothing was copied just before).
--
-- enqueue_copy_target(scheduled) answers '<schema>.ready' when `scheduled` is false, the
-- transaction is not SERIALIZABLE (the read-back steps over other producers' rows, which would
-- count as conflicts there) and the calling role may insert those columns and use the sequence;
-- otherwise it does what enqueue_copy_stage does (a stage's name, or NULL when there is none).
-- Both functions go to the roles that may run enqueue_batch, which also get the column grants and
-- the sequence.

ALTER TABLE @schema@.ready
  ALTER COLUMN id SET DEFAULT nextval('@schema@.job_id_seq'),
  ALTER COLUMN attempt SET DEFAULT 0,
  ALTER COLUMN run_lease SET DEFAULT 0,
  ALTER COLUMN run_at SET DEFAULT now(),
  ALTER COLUMN created_at SET DEFAULT now(),
  ALTER COLUMN max_attempts SET DEFAULT 25,
  ALTER COLUMN priority SET DEFAULT 2,
  ALTER COLUMN args SET DEFAULT '{}';

-- The checks hold for every job numbered after this migration (ids above the sequence's value
-- now, which a producer's row always gets: its COPY waits for this migration's lock on `ready`
-- and draws its ids after). Jobs numbered before it came through the enqueue functions of their
-- day, whose rules were fewer in the oldest schemas; tenure moves them into `ready` again
-- (promotion, retry, rescue) unchecked, so an old job can never stop those passes.
DO $$
DECLARE
  legacy bigint;
BEGIN
  LOCK TABLE @schema@.ready IN ACCESS EXCLUSIVE MODE;
  SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO legacy FROM @schema@.job_id_seq s;
  EXECUTE pg_catalog.format($checks$
    ALTER TABLE @schema@.ready
      ADD CONSTRAINT "kind must be 1..255 characters without control characters"
        CHECK (id <= %1$s OR (kind <> '' AND length(kind) <= 255 AND kind !~ '[[:cntrl:]]')) NOT VALID,
      ADD CONSTRAINT "queue must be 1..128 characters without control characters"
        CHECK (id <= %1$s OR (queue <> '' AND length(queue) <= 128 AND queue !~ '[[:cntrl:]]')) NOT VALID,
      ADD CONSTRAINT "priority must be 1..4" CHECK (id <= %1$s OR priority BETWEEN 1 AND 4) NOT VALID,
      ADD CONSTRAINT "max_attempts must be at least 1" CHECK (id <= %1$s OR max_attempts >= 1) NOT VALID,
      ADD CONSTRAINT "args must be a JSON object" CHECK (id <= %1$s OR jsonb_typeof(args) = 'object') NOT VALID,
      ADD CONSTRAINT "metadata must be a JSON object of at most 8192 bytes"
        CHECK (id <= %1$s OR (jsonb_typeof(metadata) = 'object'
                              AND (metadata = '{}' OR octet_length(metadata::text) <= 8192))) NOT VALID
  $checks$, legacy);
END $$;

CREATE FUNCTION @schema@.enqueue_copy_target(scheduled boolean) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  caller text := CASE WHEN current_setting('role') = 'none' THEN session_user
                      ELSE current_setting('role') END;
BEGIN
  -- A SERIALIZABLE transaction takes the stage: the read-back of a COPY into `ready` steps over
  -- other producers' rows in its id range, which SERIALIZABLE counts as conflicts (40001).
  IF scheduled IS FALSE AND current_setting('transaction_isolation') <> 'serializable'
     AND has_sequence_privilege(caller, '@schema@.job_id_seq', 'USAGE')
     AND NOT EXISTS (SELECT FROM unnest(ARRAY['kind', 'args', 'queue', 'priority', 'max_attempts', 'metadata']) c
                      WHERE NOT has_column_privilege(caller, '@schema@.ready', c, 'INSERT')) THEN
    RETURN '@schema@.ready';
  END IF;
  RETURN @schema@.enqueue_copy_stage();
END $$;

CREATE FUNCTION @schema@.enqueue_copied_ready(n int) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  last  bigint;
  mine  xid;
  top   bigint;
  delta bigint;
  ids   bigint[];
BEGIN
  IF n IS NULL OR n < 1 THEN
    RETURN NULL;
  END IF;
  BEGIN
    last := currval('@schema@.job_id_seq');
  EXCEPTION WHEN object_not_in_prerequisite_state THEN
    RETURN NULL;  -- the session never drew an id
  END;
  SELECT r.xmin INTO mine FROM @schema@.ready r WHERE r.id = last;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  -- The row must be this transaction's: written by its top-level transaction or by one of its
  -- subtransactions, whose ids come later (xids compared modulo 2^32, as they wrap), and still in
  -- progress (a later transaction that committed, e.g. a promotion that moved an older job of this
  -- session back into `ready`, is not this one).
  top := pg_current_xact_id()::text::bigint;
  delta := (mine::text::bigint - top % 4294967296 + 4294967296) % 4294967296;
  IF delta >= 2147483648
     OR pg_xact_status((top + delta)::text::xid8) IS DISTINCT FROM 'in progress' THEN
    RETURN NULL;
  END IF;
  SELECT array_agg(s.id ORDER BY s.id) INTO ids
    FROM (SELECT r.id FROM @schema@.ready r
           WHERE r.id <= last AND r.xmin = mine
           ORDER BY r.id DESC
           LIMIT n) s;
  IF coalesce(cardinality(ids), 0) <> n THEN
    RETURN NULL;
  END IF;
  -- Wake-up: one NOTIFY per queue of the batch with an idle worker (the rows are read again only
  -- while some worker is idle).
  IF EXISTS (SELECT FROM @schema@.waiters) THEN
    PERFORM pg_notify(@wake_channel@, w.queue)
       FROM (SELECT DISTINCT r.queue FROM @schema@.ready r
              WHERE r.id = ANY (ids) AND EXISTS (SELECT FROM @schema@.waiters x WHERE x.queue = r.queue)) w;
  END IF;
  RETURN ids::text;
END $$;

REVOKE ALL ON FUNCTION @schema@.enqueue_copy_target(boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @schema@.enqueue_copied_ready(int) FROM PUBLIC;

-- The roles that may run enqueue_batch (`tenure grant-producer`) get the direct path too.
DO $$
DECLARE
  grantees text;
BEGIN
  SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', ') INTO grantees
    FROM pg_catalog.pg_proc p
   CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
    JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
   WHERE p.oid = '@schema@.enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[], text[])'::pg_catalog.regprocedure
     AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;
  IF grantees IS NOT NULL THEN
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.enqueue_copy_target(boolean), @schema@.enqueue_copied_ready(int) TO '
            || grantees;
    EXECUTE 'GRANT INSERT (kind, args, queue, priority, max_attempts, metadata) ON TABLE @schema@.ready TO '
            || grantees;
    EXECUTE 'GRANT USAGE ON SEQUENCE @schema@.job_id_seq TO ' || grantees;
  END IF;
END $$;
