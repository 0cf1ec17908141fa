-- tenure trace recorder: opt-in row-level triggers on tenure's state tables that append every
-- committed change of a job's row to @schema@.trace_events, and a commit-order number per
-- transaction to @schema@.trace_commits. Installed by `tenure trace install` (and by tests); never
-- by a migration: without it, tenure's tables carry no trigger and its functions do no trace work.
--
-- Placeholder @schema@ (a validated, unquoted identifier), replaced by the installer.
--
-- One event per row inserted into or deleted from ready, deferred and dead_letter (and per job id
-- entering or leaving a run row's untaken part, as a ready row's), and per attempt
-- opened or closed (statement-level triggers with transition tables: one set-based insert per
-- statement; an UPDATE that changes a row's job, run lease or state is recorded as its delete and
-- its insert). Attempts are recorded in the vocabulary of the per-job rows the checker replays: an
-- item of a claims row is a 'receipts' insert (running); its closure is that row's delete, and a
-- terminal closure is also a 'done' insert (its removal by retention, or its release by an
-- operator's retry, a 'done' delete),
-- and per change of attempt_state.waiting (waiting_external). Each event names the tenure
-- functions on the call stack (`who`, outermost first, from PG_CONTEXT) and the session's
-- application_name. Events are transactional: a rolled-back transaction or savepoint takes its
-- events with it.
--
-- Commit order: a deferred constraint trigger on trace_events runs once per transaction at COMMIT
-- (before it is durable) and takes the next value of trace_commit_seq. Two transactions that
-- conflict on a row (one waited for the other's lock, or read what the other committed) get
-- their numbers in commit order, which is what a per-job replay needs.

CREATE TABLE @schema@.trace_events (
  seq      bigserial   PRIMARY KEY,
  xid      xid8        NOT NULL DEFAULT pg_current_xact_id(),
  tbl      text        NOT NULL,   -- ready, deferred, receipts, done, dead_letter, attempt_state, business
                                   -- (receipts, done: attempts opened and closed, see above)
  op       "char"      NOT NULL,   -- 'I' insert, 'D' delete, 'W' waiting changed (attempt_state)
  job_id   bigint      NOT NULL,
  run_lease bigint     NOT NULL,
  state    text        NOT NULL,   -- the row's job state (business: the table's name)
  flag     boolean     NOT NULL DEFAULT false,  -- ready: a continuation (resume_payload set)
  who      text        NOT NULL,
  app      text        NOT NULL,
  at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE SEQUENCE @schema@.trace_commit_seq AS bigint;

CREATE TABLE @schema@.trace_commits (
  xid        xid8        PRIMARY KEY,
  commit_seq bigint      NOT NULL UNIQUE,
  at         timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Business tables watched for caller-owned finalization (property 4): one row per table.
CREATE TABLE @schema@.trace_business (
  name         text PRIMARY KEY,  -- qualified table name as given
  job_column   text NOT NULL,
  lease_column text NOT NULL
);

-- The tenure functions on the stack, outermost first, separated by '>' ('' outside any).
CREATE FUNCTION @schema@.trace_who(context text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(string_agg(f, '>' ORDER BY n DESC), '')
    FROM (SELECT n, coalesce(substring(line FROM '^PL/pgSQL function (?:[a-z0-9_]+\.)?([a-z0-9_]+)\('),
                              substring(line FROM '^SQL function "([a-z0-9_]+)"')) AS f
            FROM regexp_split_to_table(context, E'\n') WITH ORDINALITY AS l(line, n)) x
   WHERE f IS NOT NULL AND f NOT LIKE 'trace\_%'
$$;

-- The `who` of the trigger's caller: the stack's text without the trigger function's own line.
-- Called once per statement (and per rare row-level event).
CREATE FUNCTION @schema@.trace_caller(context text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT @schema@.trace_who(substr(context, strpos(context, E'\n') + 1))
$$;

-- Statement-level: every row a statement inserted into (deleted from) one of the state tables,
-- one set-based insert per statement. The branches read each table's own columns (PL/pgSQL
-- compiles a trigger function per table, and a branch only when it first runs).
CREATE FUNCTION @schema@.trace_rows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ctx text;
  w   text;
  a   text := coalesce(current_setting('application_name', true), '');
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NOT EXISTS (SELECT 1 FROM trace_new) THEN RETURN NULL; END IF;
  ELSIF NOT EXISTS (SELECT 1 FROM trace_old) THEN
    RETURN NULL;
  END IF;
  GET DIAGNOSTICS ctx = PG_CONTEXT;
  w := @schema@.trace_caller(ctx);
  IF TG_OP = 'INSERT' THEN
    IF TG_TABLE_NAME = 'ready' THEN
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, flag, who, app)
      SELECT 'ready', 'I', x.id, x.run_lease, 'available', x.resume_payload IS NOT NULL, w, a FROM trace_new x;
    ELSIF TG_TABLE_NAME = 'claims' THEN
      -- Items of a claim (a claims row with run_leases set is a finished job's record, not an attempt).
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT 'receipts', 'I', u.job_id, x.claim_id * 65536 + u.pos, 'running', w, a
        FROM trace_new x CROSS JOIN LATERAL unnest(x.job_ids) WITH ORDINALITY AS u(job_id, pos)
       WHERE x.run_leases IS NULL
       ORDER BY x.claim_id, u.pos;
    ELSIF TG_TABLE_NAME = 'closures' THEN
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT e.tbl, e.op, c.job_ids[x.pos], coalesce(c.run_leases[x.pos], c.claim_id * 65536 + x.pos), e.state, w, a
        FROM trace_new x
        JOIN @schema@.claims c ON c.claim_id = x.claim_id
       CROSS JOIN LATERAL (VALUES (1, 'receipts', 'D'::"char", 'running'),
                                  (2, 'done', 'I'::"char", @schema@.outcome_state(x.outcome))) AS e(k, tbl, op, state)
       WHERE (e.k = 1 AND (c.run_leases IS NULL
                           OR EXISTS (SELECT FROM @schema@.open_claims o WHERE o.claim_id = c.claim_id)))
          OR (e.k = 2 AND x.outcome IN ('c', 'f', 'x'))
       ORDER BY x.claim_id, x.pos, e.k;
    ELSIF TG_TABLE_NAME = 'dead_letter' THEN
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT 'dead_letter', 'I', x.id, x.run_lease, 'failed', w, a FROM trace_new x;
    ELSE  -- deferred, done: the row's state
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT TG_TABLE_NAME, 'I', x.id, x.run_lease, x.state, w, a FROM trace_new x;
    END IF;
  ELSE
    IF TG_TABLE_NAME = 'ready' THEN
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, flag, who, app)
      SELECT 'ready', 'D', x.id, x.run_lease, 'available', x.resume_payload IS NOT NULL, w, a FROM trace_old x;
    ELSIF TG_TABLE_NAME = 'closures' THEN
      -- Retention: a terminal record leaves. Closures and their claims row are deleted by separate
      -- statements; whichever goes first records it (the other finds its partner gone).
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT 'done', 'D', c.job_ids[x.pos], coalesce(c.run_leases[x.pos], c.claim_id * 65536 + x.pos),
             @schema@.outcome_state(x.outcome), w, a
        FROM trace_old x JOIN @schema@.claims c ON c.claim_id = x.claim_id
       WHERE x.outcome IN ('c', 'f', 'x');
    ELSIF TG_TABLE_NAME = 'claims' THEN
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT 'done', 'D', x.job_ids[f.pos], coalesce(x.run_leases[f.pos], x.claim_id * 65536 + f.pos),
             @schema@.outcome_state(f.outcome), w, a
        FROM trace_old x JOIN @schema@.closures f ON f.claim_id = x.claim_id
       WHERE f.outcome IN ('c', 'f', 'x');
    ELSIF TG_TABLE_NAME = 'dead_letter' THEN
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT 'dead_letter', 'D', x.id, x.run_lease, 'failed', w, a FROM trace_old x;
    ELSE
      INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
      SELECT TG_TABLE_NAME, 'D', x.id, x.run_lease, x.state, w, a FROM trace_old x;
    END IF;
  END IF;
  RETURN NULL;
END $$;

-- Row-level, for the rare updates that change what the trace shows (tenure's functions never
-- change a row's job, run lease or state in place; a hand-written UPDATE may): the old row's
-- delete and the new row's insert. And attempt_state.waiting (waiting_external) changes.
CREATE FUNCTION @schema@.trace_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ctx text;
  w   text;
  a   text := coalesce(current_setting('application_name', true), '');
  o   jsonb := to_jsonb(OLD);
  n   jsonb := to_jsonb(NEW);
BEGIN
  GET DIAGNOSTICS ctx = PG_CONTEXT;
  w := @schema@.trace_caller(ctx);
  IF TG_TABLE_NAME = 'closures' THEN
    -- A closure's outcome changed: a terminal one released (retry_job) leaves the job's finished
    -- rows, one written (by hand) enters them.
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
    SELECT 'done', x.op, c.job_ids[OLD.pos], coalesce(c.run_leases[OLD.pos], c.claim_id * 65536 + OLD.pos),
           @schema@.outcome_state(x.outcome), w, a
      FROM @schema@.claims c
     CROSS JOIN LATERAL (VALUES (1, 'D'::"char", OLD.outcome), (2, 'I'::"char", NEW.outcome)) AS x(k, op, outcome)
     WHERE c.claim_id = OLD.claim_id AND x.outcome IN ('c', 'f', 'x')
     ORDER BY x.k;
    RETURN NULL;
  END IF;
  IF TG_TABLE_NAME = 'attempt_state' THEN
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
    VALUES ('attempt_state', 'W', (n->>'job_id')::bigint, (n->>'run_lease')::bigint,
            CASE WHEN (n->>'waiting')::boolean THEN 'waiting_external' ELSE 'running' END, w, a);
    RETURN NULL;
  END IF;
  INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, flag, who, app)
  SELECT TG_TABLE_NAME, x.op, coalesce(x.r->>'id', x.r->>'job_id')::bigint, (x.r->>'run_lease')::bigint,
         CASE TG_TABLE_NAME WHEN 'ready' THEN 'available' WHEN 'receipts' THEN 'running'
                            WHEN 'dead_letter' THEN 'failed' ELSE x.r->>'state' END,
         TG_TABLE_NAME = 'ready' AND coalesce(jsonb_typeof(x.r->'resume_payload'), 'null') <> 'null', w, a
    FROM (VALUES (1, 'D'::"char", o), (2, 'I'::"char", n)) AS x(k, op, r)
   ORDER BY x.k;
  RETURN NULL;
END $$;

-- Run rows (a bulk batch's jobs, schema 30), in the vocabulary of ready rows: an id that enters a
-- run's untaken part is a 'ready' insert, one that leaves it (taken by a claim, cut out by a
-- cancel, or deleted with the run) a 'ready' delete. Statement-level, one set-based insert each.
CREATE FUNCTION @schema@.trace_runs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ctx text;
  w   text;
  a   text := coalesce(current_setting('application_name', true), '');
BEGIN
  GET DIAGNOSTICS ctx = PG_CONTEXT;
  w := @schema@.trace_caller(ctx);
  IF TG_OP = 'INSERT' THEN
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
    SELECT 'ready', 'I', u.id, 0, 'available', w, a
      FROM trace_new x CROSS JOIN LATERAL unnest(x.job_ids[x.taken + 1:]) AS u(id)
     ORDER BY u.id;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
    SELECT 'ready', 'D', u.id, 0, 'available', w, a
      FROM trace_old x CROSS JOIN LATERAL unnest(x.job_ids[x.taken + 1:]) AS u(id)
     ORDER BY u.id;
  ELSE
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
    SELECT 'ready', 'D', u.id, 0, 'available', w, a
      FROM trace_old o
      JOIN trace_new n ON n.run_id = o.run_id
     CROSS JOIN LATERAL (SELECT unnest(o.job_ids[o.taken + 1:]) EXCEPT SELECT unnest(n.job_ids[n.taken + 1:])) AS u(id)
     ORDER BY u.id;
  END IF;
  RETURN NULL;
END $$;

-- Business rows (caller-owned writes): one 'I' event per row inserted, naming (job, run lease)
-- from the columns given as trigger arguments.
CREATE FUNCTION @schema@.trace_business_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ctx text;
  n   jsonb := to_jsonb(NEW);
BEGIN
  GET DIAGNOSTICS ctx = PG_CONTEXT;
  INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
  VALUES ('business', 'I', (n->>TG_ARGV[0])::bigint, (n->>TG_ARGV[1])::bigint,
          TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, @schema@.trace_caller(ctx),
          coalesce(current_setting('application_name', true), ''));
  RETURN NULL;
END $$;

-- At COMMIT (deferred), once per transaction: its commit-order number.
CREATE FUNCTION @schema@.trace_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  x text := pg_current_xact_id()::text;
BEGIN
  IF current_setting('tenure_trace.committed', true) IS DISTINCT FROM x THEN
    INSERT INTO @schema@.trace_commits (xid, commit_seq)
    VALUES (x::xid8, nextval('@schema@.trace_commit_seq'))
    ON CONFLICT (xid) DO NOTHING;
    PERFORM set_config('tenure_trace.committed', x, true);
  END IF;
  RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER trace_commit AFTER INSERT ON @schema@.trace_events
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION @schema@.trace_commit();

CREATE TRIGGER trace_insert AFTER INSERT ON @schema@.ready REFERENCING NEW TABLE AS trace_new
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_delete AFTER DELETE ON @schema@.ready REFERENCING OLD TABLE AS trace_old
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_update AFTER UPDATE ON @schema@.ready FOR EACH ROW
  WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease
        OR (OLD.resume_payload IS NULL) IS DISTINCT FROM (NEW.resume_payload IS NULL))
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_insert AFTER INSERT ON @schema@.runs REFERENCING NEW TABLE AS trace_new
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_runs();
CREATE TRIGGER trace_delete AFTER DELETE ON @schema@.runs REFERENCING OLD TABLE AS trace_old
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_runs();
CREATE TRIGGER trace_update AFTER UPDATE ON @schema@.runs REFERENCING OLD TABLE AS trace_old NEW TABLE AS trace_new
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_runs();
CREATE TRIGGER trace_insert AFTER INSERT ON @schema@.deferred REFERENCING NEW TABLE AS trace_new
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_delete AFTER DELETE ON @schema@.deferred REFERENCING OLD TABLE AS trace_old
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_update AFTER UPDATE ON @schema@.deferred FOR EACH ROW
  WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease
        OR OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_insert AFTER INSERT ON @schema@.claims REFERENCING NEW TABLE AS trace_new
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_delete AFTER DELETE ON @schema@.claims REFERENCING OLD TABLE AS trace_old
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_insert AFTER INSERT ON @schema@.closures REFERENCING NEW TABLE AS trace_new
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_delete AFTER DELETE ON @schema@.closures REFERENCING OLD TABLE AS trace_old
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_update AFTER UPDATE ON @schema@.closures FOR EACH ROW
  WHEN (OLD.outcome IS DISTINCT FROM NEW.outcome
        AND (OLD.outcome IN ('c', 'f', 'x') OR NEW.outcome IN ('c', 'f', 'x')))
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_insert AFTER INSERT ON @schema@.dead_letter REFERENCING NEW TABLE AS trace_new
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_delete AFTER DELETE ON @schema@.dead_letter REFERENCING OLD TABLE AS trace_old
  FOR EACH STATEMENT EXECUTE FUNCTION @schema@.trace_rows();
CREATE TRIGGER trace_update AFTER UPDATE ON @schema@.dead_letter FOR EACH ROW
  WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease)
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_waiting AFTER INSERT ON @schema@.attempt_state FOR EACH ROW
  WHEN (NEW.waiting) EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_waiting_update AFTER UPDATE ON @schema@.attempt_state FOR EACH ROW
  WHEN (OLD.waiting IS DISTINCT FROM NEW.waiting) EXECUTE FUNCTION @schema@.trace_row();

REVOKE ALL ON FUNCTION @schema@.trace_who(text), @schema@.trace_caller(text), @schema@.trace_rows(),
  @schema@.trace_row(), @schema@.trace_runs(), @schema@.trace_business_row(), @schema@.trace_commit() FROM PUBLIC;
