-- Tests of part 10 (enqueue, unique keys, the COPY paths, promotion, schedules) over the ledger layout.
--
--   a schema installed at the version before the ledger with jobs, then upgraded (tests/adapters/postgres/ledger_scenarios_pgtest.cpp)
--   psql -X -v ON_ERROR_STOP=1 -v s=SCHEMA -v root=REPOSITORY -f tests/sql/ledger/10_enqueue.sql DSN
--
-- Expects the state --fill leaves (a legacy open attempt, a legacy completed job, one ready job,
-- one scheduled job). Claims and closures are written directly (the claim and closers are other
-- parts), as the layout defines them. Second sessions run as background psql processes started
-- from backquotes (same host, port, database and user as this one). Creates and drops the role
-- <schema>_producer. Every failed expectation raises.

\set QUIET on
\o /dev/null
SET client_min_messages = warning;
SET search_path = :"s", public;
SELECT set_config('t.s', :'s', false) \gset
\set producer :s '_producer'
\set listen_sql 'LISTEN ' :s '_wake'
\set tmp '/tmp/' :s '_10_enqueue'
\set x `rm -rf :'tmp' && mkdir -p :'tmp' && echo ok`
\setenv LG_TMP :tmp
\setenv PGHOST :HOST
\setenv PGPORT :PORT
\setenv PGDATABASE :DBNAME
\setenv PGUSER :USER
\set pgopt '--search_path=' :s
\setenv PGOPTIONS :pgopt

CREATE FUNCTION pg_temp.expect(ok boolean, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF ok IS DISTINCT FROM true THEN
    RAISE EXCEPTION 'expectation failed: %', what;
  END IF;
END $$;

-- The SQLSTATE and message an SQL text raises (NULL when it succeeds), undone either way.
CREATE FUNCTION pg_temp.err(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    EXECUTE sql;
    RAISE EXCEPTION USING ERRCODE = 'ZZ999';
  EXCEPTION WHEN SQLSTATE 'ZZ999' THEN
    RETURN NULL;
  WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
  END;
END $$;

-- A claim of the given jobs as the claim writes it: their ready rows deleted, one claims row
-- (attempt + 1, fresh secrets), the claim in open_claims. Returns the claim id.
CREATE FUNCTION pg_temp.claim(ids bigint[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  cid bigint;
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS taken (id bigint, queue text, attempt int, run_at timestamptz, ord int);
  TRUNCATE taken;
  WITH gone AS (DELETE FROM ready r WHERE r.id = ANY (ids) RETURNING r.*)
  INSERT INTO taken SELECT g.id, g.queue, g.attempt, g.run_at, array_position(ids, g.id) FROM gone g;
  PERFORM pg_temp.expect((SELECT count(*) FROM taken) = cardinality(ids), 'claim: every job was ready');
  cid := nextval(current_setting('t.s') || '.claim_id_seq');
  INSERT INTO claims (claim_id, queue, worker, claimed_at, deadline_at, lo, hi, job_ids, attempts, secrets, run_ats)
  SELECT cid, min(queue), 'w', now(), NULL, min(id), max(id), array_agg(id ORDER BY ord),
         array_agg(attempt + 1 ORDER BY ord), array_agg(gen_random_uuid() ORDER BY ord), array_agg(run_at ORDER BY ord)
    FROM taken;
  INSERT INTO open_claims (claim_id, queue) SELECT cid, min(queue) FROM taken;
  RETURN cid;
END $$;

CREATE FUNCTION pg_temp.close(cid bigint, p int, outcome "char") RETURNS void LANGUAGE sql AS $$
  INSERT INTO closures (claim_id, pos, outcome, closed_at) VALUES (cid, p, outcome, now())
$$;

-- Waits (up to 10 s) until another session runs a statement whose text contains `marker`,
-- waiting for a lock when `on_lock`.
CREATE FUNCTION pg_temp.await_session(marker text, on_lock boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..200 LOOP
    PERFORM pg_stat_clear_snapshot();
    IF EXISTS (SELECT FROM pg_stat_activity a
                WHERE a.pid <> pg_backend_pid() AND a.state = 'active' AND position(marker IN a.query) > 0
                  AND (NOT on_lock OR a.wait_event_type = 'Lock')) THEN
      RETURN;
    END IF;
    PERFORM pg_sleep(0.05);
  END LOOP;
  RAISE EXCEPTION 'no session ran %', marker;
END $$;

-- ---- enqueue ---------------------------------------------------------------------------------

BEGIN;
SELECT enqueue('k1', '{"a": 1}', 'e_q', 3, NULL, 5, '{"m": 1}') AS e1 \gset
SELECT enqueue('k2', '{}', 'e_q', run_at => now() + interval '1 hour') AS e2 \gset
SELECT enqueue('k3', NULL, 'e_q', run_at => now() - interval '1 hour', metadata => NULL) AS e3 \gset
SELECT pg_temp.expect(s.kind = 'k1' AND s.args = '{"a": 1}' AND s.queue = 'e_q' AND s.priority = 3
                      AND s.max_attempts = 5 AND s.metadata = '{"m": 1}' AND s.created_at = now(),
                      'enqueue: the spec') FROM specs s WHERE s.id = :e1;
SELECT pg_temp.expect(r.queue = 'e_q' AND r.priority = 3 AND r.run_at = now() AND r.created_at = now()
                      AND r.run_lease = 0 AND r.attempt = 0 AND r.last_error IS NULL AND r.progress IS NULL
                      AND r.resume_payload IS NULL, 'enqueue: the ready row') FROM ready r WHERE r.id = :e1;
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM deferred WHERE id IN (:e1, :e3))
                      AND NOT EXISTS (SELECT FROM ready WHERE id = :e2), 'enqueue: one place each');
SELECT pg_temp.expect(d.state = 'scheduled' AND d.run_at > now() AND d.priority = 2 AND d.run_lease = 0
                      AND d.attempt = 0 AND d.created_at = now(), 'enqueue: the deferred row')
  FROM deferred d WHERE d.id = :e2;
SELECT pg_temp.expect(s.args = '{}' AND s.metadata = '{}' AND r.run_at = now(), 'enqueue: NULLs and a past run_at')
  FROM specs s JOIN ready r USING (id) WHERE s.id = :e3;
SELECT pg_temp.expect(string_agg(state || ' ' || attempt || ' ' || run_lease, ',' ORDER BY id)
                      = 'available 0 0,scheduled 0 0,available 0 0', 'enqueue: the jobs view')
  FROM jobs WHERE id IN (:e1, :e2, :e3);
SELECT pg_temp.expect(pg_temp.err(q) LIKE '22023 tenure.enqueue: %' || w || '%', q)
  FROM (VALUES ($$SELECT enqueue('k', '{}', 'q', 9)$$, 'priority'),
               ($$SELECT enqueue('', '{}', 'q')$$, 'kind'),
               ($$SELECT enqueue('k', '{}', '')$$, 'queue'),
               ($$SELECT enqueue('k', '[1]', 'q')$$, 'args'),
               ($$SELECT enqueue('k', '{}', 'q', max_attempts => 0)$$, 'max_attempts'),
               ($$SELECT enqueue('k', '{}', 'q', run_at => 'infinity')$$, 'run_at'),
               ($$SELECT enqueue('k', '{}', 'q', metadata => '[]')$$, 'metadata'),
               ($$SELECT enqueue('k', '{}', 'q', unique_key => '')$$, 'unique_key'),
               ($$SELECT enqueue('k', '{}', 'q', unique_key => E'a\tb')$$, 'unique_key')) AS t(q, w);

COMMIT;

-- ---- enqueue_batch ---------------------------------------------------------------------------

BEGIN;
CREATE TEMP TABLE b1 AS
SELECT * FROM enqueue_batch(ARRAY['b1', 'b2', 'b3'], ARRAY['{"i": 1}', '{"i": 2}', NULL]::jsonb[],
                            ARRAY['b_q', 'b_q', 'b_r'], ARRAY[1, 2, 4],
                            ARRAY[NULL, now() + interval '1 day', now() - interval '1 day'], ARRAY[1, 2, 3],
                            ARRAY['{"x": 1}', NULL, '{}']::jsonb[]);
SELECT pg_temp.expect(array_agg(ord ORDER BY ord) = '{1,2,3}' AND bool_and(inserted)
                      AND array_agg(job_id ORDER BY ord) = (SELECT array_agg(job_id ORDER BY job_id) FROM b1),
                      'enqueue_batch: ids in ord order') FROM b1;
SELECT pg_temp.expect(string_agg(concat_ws(' ', s.kind, s.args, s.queue, s.priority, s.max_attempts, s.metadata,
                                           j.state, j.run_at = now()), ',' ORDER BY b.ord)
                      = 'b1 {"i": 1} b_q 1 1 {"x": 1} available t,b2 {"i": 2} b_q 2 2 {} scheduled f,'
                        'b3 {} b_r 4 3 {} available t', 'enqueue_batch: specs and places')
  FROM b1 b JOIN specs s ON s.id = b.job_id JOIN jobs j ON j.id = b.job_id;
SELECT pg_temp.expect((SELECT count(*) FROM ready WHERE id IN (SELECT job_id FROM b1)) = 2
                      AND (SELECT count(*) FROM deferred WHERE id IN (SELECT job_id FROM b1)) = 1,
                      'enqueue_batch: narrow rows');
SELECT pg_temp.expect(pg_temp.err($$SELECT * FROM enqueue_batch(ARRAY['a'], ARRAY['{}', '{}']::jsonb[], ARRAY['q'], ARRAY[1])$$)
                      LIKE '22023 %same length%', 'enqueue_batch: lengths');
SELECT pg_temp.expect(pg_temp.err($$SELECT * FROM enqueue_batch(ARRAY['a', 'b'], ARRAY['{}', '{}']::jsonb[], ARRAY['q', 'q'], ARRAY[1, 7])$$)
                      LIKE '22023 tenure.enqueue_batch: job 2: priority%', 'enqueue_batch: a bad job');
SELECT pg_temp.expect(pg_temp.err($$SELECT * FROM enqueue_batch(ARRAY['a'], ARRAY['{}']::jsonb[], ARRAY['q'], ARRAY[1], NULL, NULL, NULL, ARRAY[''])$$)
                      LIKE '22023 tenure.enqueue_batch: job 1: unique_key%', 'enqueue_batch: a bad key');
SELECT pg_temp.expect(count(*) = 0, 'enqueue_batch: an empty batch')
  FROM enqueue_batch(ARRAY[]::text[], ARRAY[]::jsonb[], ARRAY[]::text[], ARRAY[]::int[]);

COMMIT;

-- ---- unique keys -----------------------------------------------------------------------------

-- Ready and deferred holders answer; a repeated key in a batch answers its first job.
SELECT enqueue('u', '{}', 'u_q', unique_key => 'K1') AS k1 \gset
SELECT pg_temp.expect(enqueue('u', '{}', 'u_q', unique_key => 'K1') = :k1, 'key: a ready holder');
SELECT enqueue('u', '{}', 'u_q', run_at => now() + interval '1 hour', unique_key => 'K2') AS k2 \gset
SELECT pg_temp.expect(enqueue('u', '{}', 'u_q', unique_key => 'K2') = :k2, 'key: a deferred holder');
SELECT pg_temp.expect(enqueue('u', '{}', 'u_other', unique_key => 'K1') <> :k1, 'key: per queue');
SELECT count(*) AS specs_before FROM specs \gset
CREATE TEMP TABLE b2 AS
SELECT * FROM enqueue_batch(ARRAY['x', 'y', 'z', 'w'], ARRAY['{}', '{}', '{}', '{}']::jsonb[],
                            ARRAY['u_q', 'u_q', 'u_q', 'u_q'], ARRAY[2, 2, 2, 2], NULL, NULL, NULL,
                            ARRAY['K3', NULL, 'K3', 'K1']);
SELECT pg_temp.expect(string_agg(concat_ws(' ', ord, inserted), ',' ORDER BY ord) = '1 t,2 t,3 f,4 f'
                      AND (SELECT job_id FROM b2 WHERE ord = 1) = (SELECT job_id FROM b2 WHERE ord = 3)
                      AND (SELECT job_id FROM b2 WHERE ord = 4) = :k1, 'key: a keyed batch') FROM b2;
SELECT pg_temp.expect(count(*) = :specs_before + 2, 'key: a held key writes no spec') FROM specs;
SELECT pg_temp.expect(unique_key = 'K3', 'key: job_keys') FROM jobs WHERE id = (SELECT job_id FROM b2 WHERE ord = 1);

-- An open attempt holds its key: item 2 of a two-item claim, whose item 1 is closed; a claim
-- whose id range spans the job without holding it changes nothing.
SELECT enqueue('u', '{}', 'u_q', unique_key => 'K4') AS k4 \gset
SELECT enqueue('u', '{}', 'u_q') AS spare \gset
SELECT pg_temp.claim(ARRAY[:e1, :k4]::bigint[]) AS c1 \gset
SELECT pg_temp.close(:c1, 1, 'c');
SELECT pg_temp.expect(state = 'running', 'key: the holder runs') FROM jobs WHERE id = :k4;
SELECT pg_temp.expect(enqueue('u', '{}', 'u_q', unique_key => 'K4') = :k4, 'key: an open attempt holds it');
-- Closed retryable (a deferred row): still live.
SELECT pg_temp.close(:c1, 2, 'r');
INSERT INTO deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt)
SELECT :k4, 'u_q', 2, now() + interval '1 hour', now(), 'retryable', :c1 * 65536 + 2, 1;
SELECT pg_temp.expect(enqueue('u', '{}', 'u_q', unique_key => 'K4') = :k4, 'key: a retryable holder');
-- Its next attempt, in a later claim, open; then closed completed: the key is taken over.
DELETE FROM deferred WHERE id = :k4;
INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt)
SELECT :k4, 'u_q', 2, now(), now(), :c1 * 65536 + 2, 1;
SELECT pg_temp.claim(ARRAY[:k4]::bigint[]) AS c2 \gset
SELECT pg_temp.expect(enqueue('u', '{}', 'u_q', unique_key => 'K4') = :k4, 'key: a second attempt holds it');
SELECT pg_temp.close(:c2, 1, 'c');
SELECT pg_temp.expect(state = 'completed', 'key: the holder completed') FROM jobs WHERE id = :k4;
SELECT enqueue('u', '{}', 'u_q', unique_key => 'K4') AS k4_next \gset
SELECT pg_temp.expect(:k4_next <> :k4 AND h.job_id = :k4_next, 'key: taken over from a completed holder')
  FROM key_holders h WHERE h.queue = 'u_q' AND h.unique_key = 'K4';
SELECT pg_temp.expect(count(*) = 2, 'key: both jobs keep their key for display') FROM job_keys WHERE unique_key = 'K4';

-- A claim whose id range spans a holder it does not hold: the holder stays terminal.
SELECT enqueue('u', '{}', 'u_q', unique_key => 'K5') AS k5 \gset
SELECT enqueue('u', '{}', 'u_q') AS k5_after \gset
SELECT pg_temp.claim(ARRAY[:k5]::bigint[]) AS c3 \gset
SELECT pg_temp.close(:c3, 1, 'x');
SELECT pg_temp.claim(ARRAY[:spare, :k5_after]::bigint[]) AS c4 \gset
SELECT pg_temp.expect(:spare < :k5 AND :k5 < :k5_after, 'key: the spanning claim spans it');
SELECT pg_temp.expect(enqueue('u', '{}', 'u_q', unique_key => 'K5') <> :k5, 'key: a spanning claim holds nothing');

-- Legacy attempts (from the upgrade): the open one holds its key, the completed one does not.
SELECT l.job_id AS legacy_open, l.claim_id AS legacy_claim FROM legacy_attempts l JOIN open_attempts a USING (claim_id, pos) \gset
SELECT l.job_id AS legacy_done FROM legacy_attempts l JOIN closures x USING (claim_id, pos) WHERE x.outcome = 'c' \gset
INSERT INTO key_holders (queue, unique_key, job_id) SELECT queue, 'L1', :legacy_open FROM specs WHERE id = :legacy_open;
INSERT INTO key_holders (queue, unique_key, job_id) SELECT queue, 'L2', :legacy_done FROM specs WHERE id = :legacy_done;
SELECT pg_temp.expect(enqueue('u', '{}', queue, unique_key => 'L1') = :legacy_open, 'key: a legacy open attempt holds it')
  FROM specs WHERE id = :legacy_open;
SELECT pg_temp.expect(enqueue('u', '{}', queue, unique_key => 'L2') <> :legacy_done, 'key: a legacy completed job does not')
  FROM specs WHERE id = :legacy_done;

-- A holder gone altogether (pruned): taken over.
INSERT INTO key_holders (queue, unique_key, job_id) VALUES ('u_q', 'K6', -1);
SELECT pg_temp.expect(enqueue('u', '{}', 'u_q', unique_key => 'K6') > 0, 'key: a pruned holder');

-- Two producers of one key: the second waits for the first's insert and answers its job once it
-- commits, or takes the key once it rolls back.
BEGIN;
SELECT enqueue('u', '{}', 'u_race', unique_key => 'R1') AS r1 \gset
\set bg `(psql -X -qAt -c "SELECT enqueue('u', '{}', 'u_race', unique_key => 'R1') /* lg_race_1 */" > "$LG_TMP/race1" 2>&1; echo DONE >> "$LG_TMP/race1") >/dev/null 2>&1 & echo started`
SELECT pg_temp.await_session('lg_race_1', true);
COMMIT;
\set got `for i in $(seq 200); do grep -q DONE "$LG_TMP/race1" && break; sleep 0.05; done; head -1 "$LG_TMP/race1"`
SELECT pg_temp.expect(:'got' = :'r1', 'race: the waiting producer answers the committed holder, got ' || :'got');
BEGIN;
SELECT enqueue('u', '{}', 'u_race', unique_key => 'R2') AS r2 \gset
\set bg `(psql -X -qAt -c "SELECT enqueue('u', '{}', 'u_race', unique_key => 'R2') /* lg_race_2 */" > "$LG_TMP/race2" 2>&1; echo DONE >> "$LG_TMP/race2") >/dev/null 2>&1 & echo started`
SELECT pg_temp.await_session('lg_race_2', true);
ROLLBACK;
\set got `for i in $(seq 200); do grep -q DONE "$LG_TMP/race2" && break; sleep 0.05; done; head -1 "$LG_TMP/race2"`
SELECT pg_temp.expect(h.job_id::text = :'got' AND :'got' <> :'r2' AND EXISTS (SELECT FROM ready WHERE id = h.job_id),
                      'race: the waiting producer takes a rolled-back key, got ' || :'got')
  FROM key_holders h WHERE h.queue = 'u_race' AND h.unique_key = 'R2';
-- Taking over a terminal holder: the second producer waits for the first's row lock and then
-- answers the first's new job.
SELECT enqueue('u', '{}', 'u_race', unique_key => 'R3') AS r3_old \gset
SELECT pg_temp.claim(ARRAY[:r3_old]::bigint[]) AS c5 \gset
SELECT pg_temp.close(:c5, 1, 'f');
BEGIN;
SELECT enqueue('u', '{}', 'u_race', unique_key => 'R3') AS r3 \gset
\set bg `(psql -X -qAt -c "SELECT enqueue('u', '{}', 'u_race', unique_key => 'R3') /* lg_race_3 */" > "$LG_TMP/race3" 2>&1; echo DONE >> "$LG_TMP/race3") >/dev/null 2>&1 & echo started`
SELECT pg_temp.await_session('lg_race_3', true);
COMMIT;
\set got `for i in $(seq 200); do grep -q DONE "$LG_TMP/race3" && break; sleep 0.05; done; head -1 "$LG_TMP/race3"`
SELECT pg_temp.expect(:r3 <> :r3_old AND :'got' = :'r3', 'race: a takeover is answered to the second producer, got ' || :'got');

-- ---- the stage (migration 22) ------------------------------------------------------------------

BEGIN;
SELECT enqueue_copy_stage() AS stage \gset
SELECT pg_temp.expect(:'stage' = 'pg_temp.tenure_enqueue_' || (SELECT oid FROM pg_namespace WHERE nspname = :'s'), 'stage: its name');
COPY :stage (ord, kind, args, queue, priority, run_at, max_attempts, metadata) FROM STDIN;
1	s1	{"i":1}	s_q	1	\N	3	{"t":1}
2	s2	{}	s_q	2	2100-01-01 00:00:00+00	25	{}
3	s3	{}	s_r	4	2000-01-01 00:00:00+00	1	{}
\.
SELECT enqueue_copied() AS staged \gset
SELECT pg_temp.expect(string_agg(concat_ws(' ', s.kind, s.args, s.queue, s.priority, s.max_attempts, s.metadata, j.state,
                                           j.run_at = now(), s.created_at = now()), ',' ORDER BY a.ord)
                      = 's1 {"i": 1} s_q 1 3 {"t": 1} available t t,s2 {} s_q 2 25 {} scheduled f t,'
                        's3 {} s_r 4 1 {} available t t', 'stage: specs and places, ids in ord order')
  FROM unnest(:'staged'::bigint[]) WITH ORDINALITY a(id, ord) JOIN specs s USING (id) JOIN jobs j USING (id);
SELECT pg_temp.expect(d.run_at = '2100-01-01 00:00:00+00' AND d.state = 'scheduled', 'stage: the deferred row')
  FROM deferred d WHERE d.id = (:'staged'::bigint[])[2];
-- A second batch of the transaction starts from an empty stage.
SELECT enqueue_copy_stage() IS NOT NULL AS again \gset
COPY :stage (ord, kind, args, queue, priority, run_at, max_attempts, metadata) FROM STDIN;
1	s4	{}	s_q	2	\N	25	{}
\.
SELECT pg_temp.expect(cardinality(enqueue_copied()::bigint[]) = 1, 'stage: a second batch');
COMMIT;
SELECT pg_temp.expect(enqueue_copied() IS NULL, 'stage: emptied by the commit');

-- ---- COPY into specs (migration 23) ------------------------------------------------------------

DO $$
DECLARE
  r text := current_setting('t.s') || '_producer';
BEGIN
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
    EXECUTE format('DROP OWNED BY %I', r);
    EXECUTE format('DROP ROLE %I', r);
  END IF;
  EXECUTE format('CREATE ROLE %I', r);
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_setting('t.s'), r);
  EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.enqueue_copy_target(boolean), %1$I.enqueue_copied_ready(int), '
                 '%1$I.enqueue_copy_stage(), %1$I.enqueue_copied(), %1$I.enqueue(text, jsonb, text, int, timestamptz, int, jsonb, text) TO %2$I',
                 current_setting('t.s'), r);
  EXECUTE format('GRANT INSERT (kind, args, queue, priority, max_attempts, metadata) ON %I.specs TO %I', current_setting('t.s'), r);
  EXECUTE format('GRANT USAGE ON SEQUENCE %I.job_id_seq TO %I', current_setting('t.s'), r);
END $$;

SET ROLE :producer;
SELECT pg_temp.expect(enqueue_copy_target(false) = :'s' || '.specs', 'copy: the target');
BEGIN;
SELECT pg_temp.expect(enqueue_copy_target(true) = :'stage', 'copy: scheduled jobs take the stage');
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT pg_temp.expect(enqueue_copy_target(false) = :'stage', 'copy: SERIALIZABLE takes the stage');
COMMIT;
RESET ROLE;
SELECT format('REVOKE INSERT (metadata) ON %I.specs FROM %I', :'s', :'producer') \gexec
SET ROLE :producer;
BEGIN;
SELECT pg_temp.expect(enqueue_copy_target(false) = :'stage', 'copy: without every column grant, the stage');
COMMIT;
RESET ROLE;
SELECT format('GRANT INSERT (metadata) ON %I.specs TO %I', :'s', :'producer') \gexec

-- What the producer may not do, and the checks of specs.
SET ROLE :producer;
SELECT pg_temp.expect(pg_temp.err(q) LIKE e || ' %', q)
  FROM (VALUES ('INSERT INTO specs (id, kind, queue) VALUES (1, ''k'', ''q'')', '42501'),
               ('INSERT INTO specs (kind, queue, created_at) VALUES (''k'', ''q'', now())', '42501'),
               ('INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt) VALUES (1, ''q'', 2, now(), now(), 0, 0)', '42501'),
               ('SELECT * FROM specs', '42501'),
               ('SELECT setval(''job_id_seq'', 1)', '42501'),
               ('INSERT INTO specs (kind, args, queue, priority, max_attempts, metadata) VALUES (''k'', ''{}'', ''q'', 9, 25, ''{}'')', '23514'),
               ('INSERT INTO specs (kind, args, queue, priority, max_attempts, metadata) VALUES (E''k\n'', ''{}'', ''q'', 2, 25, ''{}'')', '23514'),
               ('INSERT INTO specs (kind, args, queue, priority, max_attempts, metadata) VALUES (''k'', ''[]'', ''q'', 2, 25, ''{}'')', '23514')) AS t(q, e);
RESET ROLE;

-- One transaction: COPY, read back (a second call answers the same ids and writes nothing; a
-- larger n answers NULL), then a savepoint rolled back and one released.
SET ROLE :producer;
BEGIN;
SELECT enqueue_copy_target(false) AS target \gset
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
c1	{"i":1}	c_q	1	3	{"t":1}
c2	{}	c_q	4	25	{}
c3	{}	c_r	2	1	{}
\.
SELECT enqueue_copied_ready(3) AS copied \gset
SELECT pg_temp.expect(enqueue_copied_ready(3) = :'copied', 'copy: a second read-back answers the same ids');
SELECT pg_temp.expect(enqueue_copied_ready(4) IS NULL, 'copy: only three rows were written');
SELECT pg_temp.expect(enqueue_copied_ready(0) IS NULL AND enqueue_copied_ready(NULL) IS NULL, 'copy: n < 1');
SAVEPOINT a;
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
gone	{}	c_q	2	25	{}
\.
SELECT enqueue_copied_ready(1) AS rolled_back \gset
ROLLBACK TO a;
SELECT pg_temp.expect(enqueue_copied_ready(1) IS NULL, 'copy: the last id drawn was rolled back');
SAVEPOINT b;
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
c4	{}	c_q	2	25	{}
c5	{}	c_q	2	25	{}
\.
SELECT enqueue_copied_ready(2) AS in_savepoint \gset
SAVEPOINT c;
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
c6	{}	c_q	2	25	{}
\.
RELEASE c;
SELECT enqueue_copied_ready(1) AS after_release \gset
RELEASE b;
SELECT pg_temp.expect(enqueue_copied_ready(2) IS NULL, 'copy: the savepoint''s rows carry their subtransaction''s xid');
COMMIT;
RESET ROLE;
SELECT pg_temp.expect(string_agg(concat_ws(' ', s.kind, s.args, s.queue, s.priority, s.max_attempts, s.metadata, r.priority,
                                           r.queue, r.run_at = s.created_at, r.run_lease, r.attempt), ',' ORDER BY a.ord)
                      = 'c1 {"i": 1} c_q 1 3 {"t": 1} 1 c_q t 0 0,c2 {} c_q 4 25 {} 4 c_q t 0 0,c3 {} c_r 2 1 {} 2 c_r t 0 0',
                      'copy: the rows in input order, each in one run row of its queue and priority')
  FROM unnest(:'copied'::bigint[]) WITH ORDINALITY a(id, ord) JOIN specs s USING (id)
  JOIN LATERAL (SELECT x.priority, x.queue, x.created_at AS run_at, 0 AS run_lease, 0 AS attempt
                  FROM runs x WHERE x.job_ids[x.taken + 1:] @> ARRAY[a.id]) r ON true;
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM ready WHERE id = ANY (:'copied'::bigint[])), 'copy: no ready row per job');
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM specs WHERE id = ANY (:'rolled_back'::bigint[]))
                      AND NOT EXISTS (SELECT FROM runs WHERE job_ids && :'rolled_back'::bigint[]), 'copy: rolled back');
SELECT pg_temp.expect(string_agg(s.kind, ',' ORDER BY s.id) = 'c4,c5,c6' AND count(r.run_id) = 3, 'copy: savepoints')
  FROM specs s LEFT JOIN runs r ON r.job_ids @> ARRAY[s.id]
 WHERE s.id = ANY (:'in_savepoint'::bigint[] || :'after_release'::bigint[]);
SELECT pg_temp.expect(count(*) = 6 AND bool_and(state = 'available'), 'copy: the jobs view')
  FROM jobs WHERE kind LIKE 'c_' AND queue IN ('c_q', 'c_r');
-- A later transaction of the session, and a session that drew no id, are answered nothing.
SET ROLE :producer;
SELECT pg_temp.expect(enqueue_copied_ready(1) IS NULL, 'copy: an earlier transaction''s rows');
RESET ROLE;
\set got `psql -X -qAt -c "SELECT enqueue_copied_ready(1) IS NULL"`
SELECT pg_temp.expect(:'got' = 't', 'copy: a session that drew no id');

-- Another session numbers a job between two COPYs: the read-back steps over it.
SET ROLE :producer;
BEGIN;
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
i1	{}	i_q	2	25	{}
\.
\set other `psql -X -qAt -c "SELECT enqueue('other', '{}', 'i_q')"`
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
i2	{}	i_q	2	25	{}
\.
SELECT enqueue_copied_ready(2) AS interleaved \gset
COMMIT;
RESET ROLE;
SELECT pg_temp.expect(string_agg(s.kind, ',' ORDER BY s.id) = 'i1,i2' AND :'other'::bigint > min(s.id)
                      AND :'other'::bigint < max(s.id), 'copy: another session''s job in between is not answered')
  FROM specs s WHERE s.id = ANY (:'interleaved'::bigint[]);
SELECT pg_temp.expect(count(*) = 3 AND bool_and(state = 'available'), 'copy: each job waits once') FROM jobs WHERE queue = 'i_q';
SELECT pg_temp.expect((SELECT array_agg(u.id ORDER BY u.id) FROM runs r, unnest(r.job_ids) u(id) WHERE r.queue = 'i_q')
                      = :'interleaved'::bigint[] AND EXISTS (SELECT FROM ready WHERE id = :'other'::bigint),
                      'copy: the copied jobs in one run row, the other session''s job in its ready row');

-- An n reaching an earlier job of the same transaction (a scheduled one): it keeps its one place.
SET ROLE :producer;
BEGIN;
SELECT enqueue('early', '{}', 'n_q', run_at => now() + interval '1 hour') AS early \gset
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
n1	{}	n_q	2	25	{}
\.
SELECT enqueue_copied_ready(2) AS reach \gset
COMMIT;
RESET ROLE;
SELECT pg_temp.expect(:'reach'::bigint[] @> ARRAY[:early]::bigint[], 'copy: the earlier job is in the answer, as before');
SELECT pg_temp.expect(string_agg(state, ',' ORDER BY id) = 'scheduled,available'
                      AND NOT EXISTS (SELECT FROM ready WHERE id = :early), 'copy: no second place')
  FROM jobs WHERE queue = 'n_q';

-- ---- wake-ups: NOTIFY only for queues with an idle worker, and only for jobs to run now ---------

INSERT INTO waiters (queue, worker) VALUES ('w_one', 'w'), ('w_sched', 'w'), ('w_batch', 'w'), ('w_stage', 'w'),
                                           ('w_copy', 'w'), ('w_key', 'w');
\set bg `(psql -X -qAt -c :'listen_sql' -c "SELECT pg_sleep(4) /* lg_listen */" -c "SELECT 'DONE'" > "$LG_TMP/listen" 2>&1) >/dev/null 2>&1 & echo started`
SELECT pg_temp.await_session('lg_listen', false);
SELECT enqueue('w', '{}', 'w_none') IS NULL AS x \gset
SELECT enqueue('w', '{}', 'w_one') IS NULL AS x \gset
SELECT enqueue('w', '{}', 'w_sched', run_at => now() + interval '1 hour') IS NULL AS x \gset
SELECT enqueue('w', '{}', 'w_key', unique_key => 'W') IS NULL AS x \gset
SELECT count(*) AS x FROM enqueue_batch(ARRAY['w', 'w'], ARRAY['{}', '{}']::jsonb[], ARRAY['w_batch', 'w_none2'], ARRAY[2, 2]) \gset
BEGIN;
SELECT enqueue_copy_stage() IS NULL AS x \gset
COPY :stage (ord, kind, args, queue, priority, run_at, max_attempts, metadata) FROM STDIN;
1	w	{}	w_stage	2	\N	25	{}
2	w	{}	w_none3	2	\N	25	{}
\.
SELECT enqueue_copied() IS NULL AS x \gset
COMMIT;
BEGIN;
COPY :target (kind, args, queue, priority, max_attempts, metadata) FROM STDIN;
w	{}	w_copy	2	25	{}
w	{}	w_none4	2	25	{}
w	{}	w_copy	2	25	{}
\.
SELECT enqueue_copied_ready(3) IS NULL AS x \gset
COMMIT;
\set got `for i in $(seq 200); do grep -q DONE "$LG_TMP/listen" && break; sleep 0.05; done; grep -o 'with payload "[^"]*"' "$LG_TMP/listen" | sort | tr '\n' ' '`
SELECT pg_temp.expect(:'got' = 'with payload "w_batch" with payload "w_copy" with payload "w_key" with payload "w_one" with payload "w_stage" ',
                      'wake-ups: ' || :'got');
DELETE FROM waiters WHERE worker = 'w';

-- ---- promote_due -------------------------------------------------------------------------------

-- A scheduled job made due, a retryable one with an earlier attempt's state, one of another
-- queue, one not due, one locked by another session.
SELECT enqueue('p', '{}', 'p_q', run_at => now() + interval '1 hour') AS p1 \gset
SELECT enqueue('p', '{}', 'p_q', run_at => now() + interval '1 hour') AS p2 \gset
SELECT enqueue('p', '{}', 'p_other', run_at => now() + interval '1 hour') AS p3 \gset
SELECT enqueue('p', '{}', 'p_q', run_at => now() + interval '1 hour') AS p4 \gset
SELECT enqueue('p', '{}', 'p_q', run_at => now() + interval '1 hour') AS p5 \gset
UPDATE deferred SET run_at = now() - interval '1 minute' WHERE id IN (:p1, :p3, :p5);
UPDATE deferred SET run_at = now() - interval '2 minutes', state = 'retryable', run_lease = 5 * 65536 + 3, attempt = 2,
                    last_error = 'boom', progress = '{"step": 2}' WHERE id = :p2;
\set bg `(psql -X -qAt -c "BEGIN" -c "SELECT 1 FROM deferred WHERE id = :p5 FOR UPDATE" -c "SELECT pg_sleep(2) /* lg_lock_p5 */" -c "COMMIT" > "$LG_TMP/lock" 2>&1; echo DONE >> "$LG_TMP/lock") >/dev/null 2>&1 & echo started`
SELECT pg_temp.await_session('lg_lock_p5', false);
SELECT pg_temp.expect(promote_due('p_q', 1) = 1, 'promote: max_jobs');
SELECT pg_temp.expect(r.run_at < now() - interval '90 seconds' AND r.run_lease = 5 * 65536 + 3 AND r.attempt = 2
                      AND r.last_error = 'boom' AND r.progress = '{"step": 2}' AND r.resume_payload IS NULL
                      AND r.created_at = s.created_at AND r.priority = s.priority AND r.queue = 'p_q',
                      'promote: the earliest due first, its state kept') FROM ready r JOIN specs s USING (id) WHERE r.id = :p2;
SELECT pg_temp.expect(promote_due('p_q', 10) = 1, 'promote: the locked row is passed by');
SELECT pg_temp.expect(string_agg(concat_ws(' ', id, state), ',' ORDER BY id)
                      = concat_ws(',', :p1 || ' available', :p2 || ' available', :p3 || ' scheduled', :p4 || ' scheduled',
                                  :p5 || ' scheduled'), 'promote: by queue, due only, locked passed')
  FROM jobs WHERE id IN (:p1, :p2, :p3, :p4, :p5);
\set got `for i in $(seq 200); do grep -q DONE "$LG_TMP/lock" && break; sleep 0.05; done; cat "$LG_TMP/lock"`
-- The maintenance pass (no queue): every due job, stale waiters, and the state of attempts that
-- are not open.
INSERT INTO waiters (queue, worker, since) VALUES ('p_q', 'stale', now() - interval '10 minutes'), ('p_q', 'fresh', now());
SELECT pg_temp.claim(ARRAY[:p1, :p2]::bigint[]) AS c6 \gset
SELECT pg_temp.close(:c6, 1, 'c');
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at)
VALUES (:p1, :c6 * 65536 + 1, now()),                     -- closed: swept
       (:p2, :c6 * 65536 + 2, now()),                     -- open: kept
       (:p2, :c6 * 65536 + 1, now()),                     -- the item holds another job: swept
       (:p2, (:c6 + 1000) * 65536 + 1, now()),            -- no such claim: swept
       (:legacy_open, 1, now()),                          -- legacy, open: kept
       (:legacy_done, 1, now()),                          -- legacy, completed: swept
       (:legacy_open, 2, now()),                          -- legacy lease of no attempt: swept
       (:legacy_open, :legacy_claim * 65536 + 1, now());  -- a new-style lease naming a legacy item: swept
SELECT pg_temp.expect(promote_due('p_q') = 1, 'promote: the row no longer locked');
SELECT pg_temp.expect(count(*) = 8, 'promote: a queue''s pass sweeps nothing')
  FROM attempt_state WHERE job_id IN (:p1, :p2, :legacy_open, :legacy_done);
SELECT pg_temp.expect(promote_due() >= 1, 'promote: the maintenance pass');
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM deferred WHERE id IN (:p3, :p5) OR run_at <= now()), 'promote: every due job');
SELECT pg_temp.expect(string_agg(concat_ws(' ', job_id, run_lease), ',' ORDER BY job_id, run_lease)
                      = concat_ws(',', :legacy_open || ' 1', :p2 || ' ' || (:c6 * 65536 + 2)), 'promote: the sweep')
  FROM attempt_state WHERE job_id IN (:p1, :p2, :legacy_open, :legacy_done);
SELECT pg_temp.expect(string_agg(worker, ',') = 'fresh', 'promote: stale waiters') FROM waiters WHERE queue = 'p_q';
DELETE FROM waiters WHERE queue = 'p_q';

-- ---- schedules ---------------------------------------------------------------------------------

SELECT next_slot AS slot FROM schedule_upsert(:'s' || '_every_minute', '* * * * *', 'sched', '{"s": 1}', 'sch_q') \gset
SELECT pg_temp.expect(enqueue_due_schedules(:'slot'::timestamptz + interval '1 second') = 1, 'schedules: the due slot');
SELECT pg_temp.expect(enqueue_due_schedules(:'slot'::timestamptz + interval '2 seconds') = 0, 'schedules: once');
SELECT pg_temp.expect(j.kind = 'sched' AND j.args = '{"s": 1}' AND j.state = 'available'
                      AND j.metadata ->> 'schedule' = :'s' || '_every_minute' AND j.unique_key LIKE 'schedule:%'
                      AND EXISTS (SELECT FROM ready r WHERE r.id = j.id), 'schedules: the job')
  FROM jobs j WHERE j.id = (SELECT last_job_id FROM schedules WHERE name = :'s' || '_every_minute');
SELECT schedule_remove(:'s' || '_every_minute') AS x \gset

-- ---- cleanup -----------------------------------------------------------------------------------

SELECT format('DROP OWNED BY %I', :'producer') \gexec
SELECT format('DROP ROLE %I', :'producer') \gexec
\set x `rm -rf "$LG_TMP"`
\echo 10_enqueue: all expectations held
