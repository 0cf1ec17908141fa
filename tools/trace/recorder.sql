-- tenure trace recorder: opt-in row-level triggers on tenure's state tables that append every
-- committed change of a job's row to @schema@.trace_events, and a commit-order number per
-- transaction to @schema@.trace_commits. Installed by `tenure trace install` (and by tests); never
-- by a migration: without it, tenure's tables carry no trigger and its functions do no trace work.
--
-- Placeholder @schema@ (a validated, unquoted identifier), replaced by the installer.
--
-- One event per row inserted into or deleted from ready, deferred, receipts, done, dead_letter (an
-- UPDATE that changes a row's job, run lease or state is recorded as its delete and its insert),
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

CREATE FUNCTION @schema@.trace_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ctx text;
  w   text;
  a   text := coalesce(current_setting('application_name', true), '');
  o   jsonb;
  n   jsonb;
BEGIN
  GET DIAGNOSTICS ctx = PG_CONTEXT;
  w := @schema@.trace_who(ctx);
  IF TG_OP IN ('DELETE', 'UPDATE') THEN
    o := to_jsonb(OLD);
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    n := to_jsonb(NEW);
  END IF;
  IF TG_TABLE_NAME = 'attempt_state' THEN
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, who, app)
    VALUES ('attempt_state', 'W', (n->>'job_id')::bigint, (n->>'run_lease')::bigint,
            CASE WHEN (n->>'waiting')::boolean THEN 'waiting_external' ELSE 'running' END, w, a);
    RETURN NULL;
  END IF;
  IF o IS NOT NULL THEN
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, flag, who, app)
    VALUES (TG_TABLE_NAME, 'D', coalesce(o->>'id', o->>'job_id')::bigint, (o->>'run_lease')::bigint,
            CASE TG_TABLE_NAME WHEN 'ready' THEN 'available' WHEN 'receipts' THEN 'running'
                               WHEN 'dead_letter' THEN 'failed' ELSE o->>'state' END,
            TG_TABLE_NAME = 'ready' AND o->'resume_payload' IS NOT NULL
              AND jsonb_typeof(o->'resume_payload') <> 'null', w, a);
  END IF;
  IF n IS NOT NULL THEN
    INSERT INTO @schema@.trace_events (tbl, op, job_id, run_lease, state, flag, who, app)
    VALUES (TG_TABLE_NAME, 'I', coalesce(n->>'id', n->>'job_id')::bigint, (n->>'run_lease')::bigint,
            CASE TG_TABLE_NAME WHEN 'ready' THEN 'available' WHEN 'receipts' THEN 'running'
                               WHEN 'dead_letter' THEN 'failed' ELSE n->>'state' END,
            TG_TABLE_NAME = 'ready' AND n->'resume_payload' IS NOT NULL
              AND jsonb_typeof(n->'resume_payload') <> 'null', w, a);
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
          TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, @schema@.trace_who(ctx),
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

CREATE TRIGGER trace_row AFTER INSERT OR DELETE ON @schema@.ready
  FOR EACH ROW EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row_update AFTER UPDATE ON @schema@.ready FOR EACH ROW
  WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease
        OR (OLD.resume_payload IS NULL) IS DISTINCT FROM (NEW.resume_payload IS NULL))
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row AFTER INSERT OR DELETE ON @schema@.deferred
  FOR EACH ROW EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row_update AFTER UPDATE ON @schema@.deferred FOR EACH ROW
  WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease
        OR OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row AFTER INSERT OR DELETE ON @schema@.receipts
  FOR EACH ROW EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row_update AFTER UPDATE ON @schema@.receipts FOR EACH ROW
  WHEN (OLD.job_id IS DISTINCT FROM NEW.job_id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease)
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row AFTER INSERT OR DELETE ON @schema@.done
  FOR EACH ROW EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row_update AFTER UPDATE ON @schema@.done FOR EACH ROW
  WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease
        OR OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row AFTER INSERT OR DELETE ON @schema@.dead_letter
  FOR EACH ROW EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_row_update AFTER UPDATE ON @schema@.dead_letter FOR EACH ROW
  WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.run_lease IS DISTINCT FROM NEW.run_lease)
  EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_waiting AFTER INSERT ON @schema@.attempt_state FOR EACH ROW
  WHEN (NEW.waiting) EXECUTE FUNCTION @schema@.trace_row();
CREATE TRIGGER trace_waiting_update AFTER UPDATE ON @schema@.attempt_state FOR EACH ROW
  WHEN (OLD.waiting IS DISTINCT FROM NEW.waiting) EXECUTE FUNCTION @schema@.trace_row();

REVOKE ALL ON FUNCTION @schema@.trace_who(text), @schema@.trace_row(), @schema@.trace_business_row(),
  @schema@.trace_commit() FROM PUBLIC;
