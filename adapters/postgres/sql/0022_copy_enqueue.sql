-- tenure migration 22: bulk enqueue over COPY.
--
-- enqueue_batch parses its jobs from text arrays inside one statement; a large batch spends more
-- there than in inserting the rows. A bridge may instead COPY keyless jobs, inside the caller's
-- transaction, into a stage and move them into the job tables with one call:
--
--   SELECT <schema>.enqueue_copy_stage();          -- 'pg_temp.tenure_enqueue_<oid>'
--   COPY pg_temp.tenure_enqueue_<oid> (ord, kind, args, queue, priority, run_at, max_attempts,
--                                      metadata) FROM STDIN;
--   SELECT <schema>.enqueue_copied();              -- '{ids in ord order}'
--
-- The stage is a temporary table of the session (no WAL, local buffers, emptied at every commit),
-- created and owned by the schema's owner; the caller holds only INSERT on it, so it can neither
-- change the stage's checks (enqueue_batch's checks of each job, as CHECK constraints) nor read
-- what others staged (a temporary table belongs to one session). A stage of that name that the
-- schema's owner did not create is refused (42501): a caller cannot slip in an unchecked one.
-- enqueue_copied moves the staged rows into `ready` or, with a future run_at, `deferred`, wakes
-- the idle workers of the queues that got a job to run now, and answers the ids in `ord` order.
-- Ids are taken from the job sequence in the stage's physical order (one COPY into an emptied
-- temporary table: input order, so they rise with `ord`), not through a sort of whole rows, which
-- spills to disk past work_mem. The moved rows stay in the stage until the commit empties it
-- (deleting them costs a fifth of the move); the next enqueue_copy_stage of the same transaction
-- empties it first.
-- A COPY outside a transaction block commits, and its commit empties the stage, before
-- enqueue_copied runs: enqueue_copied answers NULL when nothing is staged. enqueue_copy_stage
-- answers NULL when the schema's owner may not create temporary tables in the database; the
-- caller then sends enqueue_batch. Unique keys stay with enqueue_batch. Both functions go to the
-- roles that may run enqueue_batch.

-- The name of the session's stage, and whether it exists; 42501 (naming `what`) when a relation
-- of that name exists that tenure's owner did not make as a temporary table. Granted to nobody.
CREATE FUNCTION @schema@.enqueue_stage_checked(what text, OUT stage text, OUT present boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rel regclass;
BEGIN
  stage := 'tenure_enqueue_' || '@schema@'::regnamespace::oid;
  rel := to_regclass('pg_temp.' || stage);
  present := rel IS NOT NULL;
  IF present AND NOT EXISTS (SELECT 1 FROM pg_class c
                              WHERE c.oid = rel AND c.relkind = 'r' AND c.relpersistence = 't'
                                AND c.relowner = (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user)) THEN
    RAISE EXCEPTION '%: pg_temp.% exists and is not the stage tenure made (drop it)', what, stage
      USING ERRCODE = '42501';
  END IF;
END $$;

CREATE FUNCTION @schema@.enqueue_copy_stage() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st     record := @schema@.enqueue_stage_checked('tenure.enqueue_copy_stage');
  stage  text := st.stage;
  caller text := CASE WHEN current_setting('role') = 'none' THEN session_user
                      ELSE current_setting('role') END;
  staged boolean;
BEGIN
  IF NOT st.present THEN
    -- An owner that may not create temporary tables here has no stage to offer: NULL, and the
    -- caller sends enqueue_batch instead (nothing failed, its transaction goes on).
    IF NOT has_database_privilege(current_user, current_database(), 'TEMPORARY') THEN
      RETURN NULL;
    END IF;
    EXECUTE format($stage$
      CREATE TEMPORARY TABLE %I (
        ord          int         NOT NULL,
        kind         text        NOT NULL,
        args         jsonb       NOT NULL,
        queue        text        NOT NULL,
        priority     int         NOT NULL,
        run_at       timestamptz,
        max_attempts int         NOT NULL,
        metadata     jsonb       NOT NULL,
        CONSTRAINT "kind must be 1..255 characters without control characters"
          CHECK (kind <> '' AND length(kind) <= 255 AND kind !~ '[[:cntrl:]]'),
        CONSTRAINT "queue must be 1..128 characters without control characters"
          CHECK (queue <> '' AND length(queue) <= 128 AND queue !~ '[[:cntrl:]]'),
        CONSTRAINT "priority must be 1..4" CHECK (priority BETWEEN 1 AND 4),
        CONSTRAINT "max_attempts must be at least 1" CHECK (max_attempts >= 1),
        CONSTRAINT "args must be a JSON object" CHECK (jsonb_typeof(args) = 'object'),
        CONSTRAINT "metadata must be a JSON object of at most 8192 bytes"
          CHECK (jsonb_typeof(metadata) = 'object' AND (metadata = '{}' OR octet_length(metadata::text) <= 8192)),
        CONSTRAINT "run_at must be before 2262-04-11 23:47:16.854775+00"
          CHECK (run_at IS NULL OR run_at <= '2262-04-11 23:47:16.854775+00'::timestamptz)
      ) ON COMMIT DELETE ROWS $stage$, stage);
  END IF;
  IF NOT has_table_privilege(caller, 'pg_temp.' || stage, 'INSERT') THEN
    EXECUTE format('GRANT INSERT ON TABLE pg_temp.%I TO %I', stage, caller);
  END IF;
  -- Rows an earlier batch of this transaction staged were moved by then: start empty.
  EXECUTE format('SELECT EXISTS (SELECT FROM pg_temp.%I)', stage) INTO staged;
  IF staged THEN
    EXECUTE format('TRUNCATE pg_temp.%I', stage);
  END IF;
  RETURN 'pg_temp.' || stage;
END $$;

CREATE FUNCTION @schema@.enqueue_copied() RETURNS text
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
    ), to_ready AS (
      INSERT INTO @schema@.ready (id, queue, kind, args, priority, attempt, max_attempts, run_lease,
                                  run_at, created_at, metadata)
      SELECT i.id, i.queue, i.kind, i.args, i.priority, 0, i.max_attempts, 0, now(), now(), i.metadata
        FROM numbered i WHERE i.run_at IS NULL OR i.run_at <= now()
    ), to_deferred AS (
      INSERT INTO @schema@.deferred (id, queue, kind, args, priority, attempt, max_attempts,
                                     run_lease, run_at, created_at, state, metadata)
      SELECT i.id, i.queue, i.kind, i.args, i.priority, 0, i.max_attempts, 0, i.run_at, now(),
             'scheduled', i.metadata
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

REVOKE ALL ON FUNCTION @schema@.enqueue_stage_checked(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @schema@.enqueue_copy_stage() FROM PUBLIC;
REVOKE ALL ON FUNCTION @schema@.enqueue_copied() FROM PUBLIC;

-- The roles that may run enqueue_batch (`tenure grant-producer`) get the COPY path too.
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
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.enqueue_copy_stage(), @schema@.enqueue_copied() TO ' || grantees;
  END IF;
END $$;
