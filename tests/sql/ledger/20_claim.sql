-- Tests of part 20 (claim_attempts, claim, claim_allowance, heartbeat_batch, attempt_checkpoint,
-- queue_depths, list_queues) on a schema made as ledger_scenarios_pgtest.cpp makes it:
--   psql -X -v ON_ERROR_STOP=1 -v s=SCHEMA -v root=REPOSITORY -f tests/sql/ledger/20_claim.sql DSN
-- Jobs are written straight into specs and ready (and closures, to close an attempt), so the
-- test depends on the tables of part 00 and on this part only, except the promotion case, which
-- calls promote_due. Two cases run a second session (a background psql) to check what the claim
-- does next to another transaction. Any failed expectation raises an exception.

\set ON_ERROR_STOP on
SET client_min_messages = warning;
SET search_path = :"s", pg_catalog;
\o /dev/null
\setenv T20_S :s
\setenv PGHOST :HOST
\setenv PGPORT :PORT
\setenv PGDATABASE :DBNAME
\setenv PGUSER :USER

CREATE FUNCTION pg_temp.expect(ok boolean, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION 'expectation failed: %', what;
  END IF;
END $$;

-- n jobs in queue q (priority p, attempt a, ...) written as enqueue would; returns their ids.
CREATE FUNCTION pg_temp.add_jobs(q text, n int, p int DEFAULT 2, a int DEFAULT 0, lease bigint DEFAULT 0,
                                 err text DEFAULT NULL, prog jsonb DEFAULT NULL, resume jsonb DEFAULT NULL,
                                 age interval DEFAULT '0', delay interval DEFAULT '0')
RETURNS TABLE(id bigint) LANGUAGE sql AS $$
  WITH s AS (
    INSERT INTO specs (queue, kind, args, priority, max_attempts, metadata, created_at)
    SELECT q, 'k' || g, jsonb_build_object('g', g), p, 7, jsonb_build_object('m', g), now() - age
      FROM generate_series(1, n) g
    RETURNING id, queue, priority, created_at
  )
  INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt, last_error, progress, resume_payload)
  SELECT id, queue, priority, created_at + delay, created_at, lease, a, err, prog, resume FROM s
  RETURNING id
$$;

-- The counts of the jobs view, as list_queues and queue_depths must give them.
CREATE FUNCTION pg_temp.view_counts() RETURNS TABLE(queue text, state text, n bigint) LANGUAGE sql AS $$
  SELECT j.queue, j.state, count(*) FROM jobs j GROUP BY 1, 2
$$;

CREATE TABLE t20_result (tag text, job_id bigint, run_lease bigint, note text);

-- ---- argument checks ----------------------------------------------------------------------------
DO $$
DECLARE st text;
BEGIN
  BEGIN PERFORM claim_attempts(NULL, 1); st := 'none';
  EXCEPTION WHEN OTHERS THEN st := SQLSTATE; END;
  PERFORM pg_temp.expect(st = '22023', 'NULL queue raises 22023, got ' || st);
  BEGIN PERFORM claim_attempts('x', 0); st := 'none';
  EXCEPTION WHEN OTHERS THEN st := SQLSTATE; END;
  PERFORM pg_temp.expect(st = '22023', 'max_jobs 0 raises 22023, got ' || st);
  BEGIN PERFORM claim_attempts('x', 10001); st := 'none';
  EXCEPTION WHEN OTHERS THEN st := SQLSTATE; END;
  PERFORM pg_temp.expect(st = '22023', 'max_jobs 10001 raises 22023, got ' || st);
  BEGIN PERFORM heartbeat_batch(ARRAY[1::bigint], ARRAY[]::bigint[]); st := 'none';
  EXCEPTION WHEN OTHERS THEN st := SQLSTATE; END;
  PERFORM pg_temp.expect(st = '22023', 'heartbeat_batch arrays of different lengths raise 22023, got ' || st);
END $$;

-- ---- one claim: the claim row, the results, the carried state -----------------------------------
INSERT INTO queues (name, hard_deadline) VALUES ('t20a', '10 minutes');
SELECT min(id) AS a_plain FROM pg_temp.add_jobs('t20a', 1, p => 3) \gset
SELECT min(id) AS a_err FROM pg_temp.add_jobs('t20a', 1, p => 1, a => 2, lease => 5, err => 'boom') \gset
SELECT min(id) AS a_cont FROM pg_temp.add_jobs('t20a', 1, p => 2, a => 4, lease => 9, prog => '{"step": 3}',
                                               resume => '{"answer": 42}') \gset
SELECT min(id) AS a_late FROM pg_temp.add_jobs('t20a', 1, p => 4, delay => '-1 hour') \gset
SELECT min(id) AS a_left FROM pg_temp.add_jobs('t20a', 1, p => 4) \gset
SELECT last_value AS seq_before FROM claim_id_seq \gset
CREATE TEMP TABLE got AS SELECT row_number() OVER () AS place, c.* FROM claim_attempts('t20a', 4, 'w-a') c;
SELECT claim_id AS a_claim FROM claims WHERE queue = 't20a' \gset
SELECT pg_temp.expect(:a_claim > :seq_before, 'the claim id is drawn from claim_id_seq');
SELECT pg_temp.expect((SELECT count(*) FROM got) = 4, 'four jobs claimed');
SELECT pg_temp.expect((SELECT array_agg(job_id ORDER BY place) FROM got)
                      = ARRAY[:a_err, :a_cont, :a_plain, :a_late]::bigint[], 'results in (priority, id) order');
SELECT pg_temp.expect(bool_and(g.run_lease = :a_claim * 65536 + g.place), 'run_lease = claim_id * 65536 + pos')
  FROM got g;
SELECT pg_temp.expect(bool_and(g.kind = s.kind AND g.args = s.args AND g.metadata = s.metadata
                               AND g.max_attempts = s.max_attempts), 'payload from specs')
  FROM got g JOIN specs s ON s.id = g.job_id;
SELECT pg_temp.expect((SELECT array_agg(attempt ORDER BY place) FROM got) = ARRAY[3, 4, 1, 1],
                      'attempt + 1, a continuation keeps its attempt');
SELECT pg_temp.expect((SELECT array_agg(resume_payload ORDER BY place)::text FROM got)
                      = '{NULL,"{\"answer\": 42}",NULL,NULL}', 'the continuation returns its resume payload');
SELECT pg_temp.expect(bool_and(g.deadline_at = c.claimed_at + interval '10 minutes'), 'deadline from hard_deadline')
  FROM got g, claims c WHERE c.claim_id = :a_claim;
SELECT pg_temp.expect((SELECT available_at FROM got WHERE job_id = :a_late)
                      = (SELECT created_at FROM specs WHERE id = :a_late), 'available_at = greatest(run_at, created_at)');
SELECT pg_temp.expect(c.job_ids = ARRAY[:a_err, :a_cont, :a_plain, :a_late]::bigint[]
                      AND c.attempts = ARRAY[3, 4, 1, 1]
                      AND c.secrets = (SELECT array_agg(secret ORDER BY place) FROM got)
                      AND c.lo = least(:a_err, :a_cont, :a_plain, :a_late)
                      AND c.hi = greatest(:a_err, :a_cont, :a_plain, :a_late)
                      AND c.last_errors = ARRAY['boom', NULL, NULL, NULL]
                      AND c.progress = ARRAY[NULL, '{"step": 3}'::jsonb, NULL, NULL]
                      AND c.run_leases IS NULL AND c.worker = 'w-a' AND c.queue = 't20a'
                      AND c.claimed_at > now() - interval '1 minute' AND c.deadline_at = c.claimed_at + interval '10 minutes'
                      AND c.run_ats[4] = (SELECT created_at - interval '1 hour' FROM specs WHERE id = :a_late),
                      'the claims row holds the batch in result order')
  FROM claims c WHERE c.claim_id = :a_claim;
SELECT pg_temp.expect(EXISTS (SELECT FROM open_claims WHERE claim_id = :a_claim AND queue = 't20a'), 'open_claims row');
SELECT pg_temp.expect((SELECT array_agg(id) FROM ready WHERE queue = 't20a') = ARRAY[:a_left]::bigint[],
                      'the claimed ready rows are deleted, the rest stays');
SELECT pg_temp.expect((SELECT count(*) FROM jobs j JOIN got g ON g.job_id = j.id
                        WHERE j.state = 'running' AND j.run_lease = g.run_lease AND j.attempt = g.attempt
                          AND j.worker = 'w-a') = 4, 'the jobs view shows the four running attempts');
SELECT pg_temp.expect((SELECT progress FROM jobs WHERE id = :a_cont) = '{"step": 3}', 'carried progress shown');
-- A batch carrying no error and no progress stores NULL arrays.
SELECT min(id) AS b_job FROM pg_temp.add_jobs('t20b', 2) \gset
SELECT count(*) FROM claim_attempts('t20b', 5, 'w-b') \gset
SELECT pg_temp.expect(last_errors IS NULL AND progress IS NULL AND cardinality(job_ids) = 2 AND deadline_at IS NULL,
                      'NULL arrays when no item carries one, no deadline without hard_deadline')
  FROM claims WHERE queue = 't20b';

-- ---- a claim that takes nothing writes nothing ----------------------------------------------------
SELECT last_value AS seq_before, is_called AS called_before FROM claim_id_seq \gset
SELECT count(*) AS claims_before FROM claims \gset
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20-empty', 10, 'w')) = 0, 'empty queue: nothing');
SELECT pg_temp.expect((SELECT last_value FROM claim_id_seq) = :seq_before, 'empty claim draws no claim id');
SELECT pg_temp.expect((SELECT count(*) FROM claims) = :claims_before, 'empty claim writes no claims row');

-- ---- claim(): tokens over the new run leases ----------------------------------------------------
SELECT min(id) AS t_job FROM pg_temp.add_jobs('t20t', 1) \gset
SELECT * FROM claim('t20t', 1, 'w-t') \gset tok_
SELECT pg_temp.expect(:tok_job_id = :t_job, 'claim() claims');
SELECT pg_temp.expect(:'tok_token' = make_token(c.job_ids[1], c.claim_id * 65536 + 1, c.secrets[1])
                      AND :tok_run_lease = c.claim_id * 65536 + 1,
                      'claim() returns the token of the new item')
  FROM claims c WHERE c.queue = 't20t';

-- ---- pause --------------------------------------------------------------------------------------
SELECT min(id) AS p_job FROM pg_temp.add_jobs('t20p', 2) \gset
INSERT INTO queues (name, paused) VALUES ('t20p', true);
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20p', 5, 'w')) = 0, 'a paused queue claims nothing');
SELECT pg_temp.expect((SELECT count(*) FROM ready WHERE queue = 't20p') = 2, 'and keeps its jobs');
UPDATE queues SET paused = false WHERE name = 't20p';
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20p', 5, 'w')) = 2, 'resumed: claims');

-- ---- max_running: open attempts counted from open_claims less closures ---------------------------
INSERT INTO queues (name, max_running) VALUES ('t20m', 3);
SELECT count(*) FROM pg_temp.add_jobs('t20m', 8) \gset
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20m', 2, 'w')) = 2, 'max_running 3: 2 of 2');
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20m', 5, 'w')) = 1, 'max_running 3: then 1');
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20m', 5, 'w')) = 0, 'max_running 3: then 0');
-- close one item of the first claim: one place frees up
INSERT INTO closures (claim_id, pos, outcome, closed_at)
SELECT min(claim_id), 2, 'c', now() FROM claims WHERE queue = 't20m';
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20m', 5, 'w')) = 1, 'a closure frees one place');
-- a fully closed claim still in open_claims counts nothing
INSERT INTO closures (claim_id, pos, outcome, closed_at)
SELECT min(claim_id), 1, 'r', now() FROM claims WHERE queue = 't20m';
SELECT pg_temp.expect((SELECT count(*) FROM open_claims WHERE queue = 't20m') = 3, 'fully closed claim not yet removed');
SELECT pg_temp.expect((SELECT allowed FROM claim_allowance('t20m', 5)) = 1, 'claim_allowance counts open items only');
-- the attempt opened before the upgrade (job 1 of queue q, lease 1) counts too
INSERT INTO queues (name, max_running) VALUES ('q', 2) ON CONFLICT (name) DO UPDATE SET max_running = 2;
SELECT pg_temp.expect((SELECT allowed FROM claim_allowance('q', 5)) = 1, 'the legacy open attempt counts');
UPDATE queues SET max_running = NULL WHERE name = 'q';

-- ---- rate_per_second ----------------------------------------------------------------------------
INSERT INTO queues (name, rate_per_second, rate_burst) VALUES ('t20r', 0.001, 2);
SELECT count(*) FROM pg_temp.add_jobs('t20r', 5) \gset
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20r', 5, 'w')) = 2, 'the bucket allows its burst');
SELECT pg_temp.expect(rate_tokens < 0.01 AND rate_refilled_at IS NOT NULL, 'the tokens spent are written back')
  FROM queues WHERE name = 't20r';
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20r', 5, 'w')) = 0, 'then the bucket is empty');

-- ---- priority_aging -----------------------------------------------------------------------------
INSERT INTO queues (name, priority_aging) VALUES ('t20g', '1 minute');
SELECT min(id) AS g_old FROM pg_temp.add_jobs('t20g', 1, p => 4, age => '1 hour') \gset
SELECT min(id) AS g_new FROM pg_temp.add_jobs('t20g', 1, p => 1) \gset
SELECT min(id) AS g_mid FROM pg_temp.add_jobs('t20g', 1, p => 3) \gset
SELECT pg_temp.expect((SELECT array_agg(job_id) FROM claim_attempts('t20g', 1, 'w')) = ARRAY[:g_old]::bigint[],
                      'an aged job goes first');
SELECT pg_temp.expect((SELECT array_agg(job_id) FROM claim_attempts('t20g', 5, 'w')) = ARRAY[:g_new, :g_mid]::bigint[],
                      'then the rest in (priority, id) order');
SELECT pg_temp.expect(job_ids = ARRAY[:g_new, :g_mid]::bigint[], 'aged claim row in result order')
  FROM claims WHERE queue = 't20g' ORDER BY claim_id DESC LIMIT 1;

-- ---- promotion of due jobs ----------------------------------------------------------------------
INSERT INTO specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
VALUES (nextval('job_id_seq'), 't20d', 'kd', '{}', 2, 7, '{}', now() - interval '1 minute');
INSERT INTO deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt, last_error)
SELECT id, queue, priority, now() - interval '1 second', created_at, 'retryable', 77, 1, 'e1'
  FROM specs WHERE queue = 't20d';
SELECT * FROM claim_attempts('t20d', 1, 'w') \gset d_
SELECT pg_temp.expect(:d_attempt = 2 AND :d_run_lease >= 65536, 'a due job is promoted and claimed');
SELECT pg_temp.expect(last_errors = ARRAY['e1'], 'its last error carried') FROM claims WHERE queue = 't20d';

-- ---- waiters ------------------------------------------------------------------------------------
SELECT count(*) FROM claim_attempts('t20w', 1, 'w-idle', 'sleep') \gset
SELECT pg_temp.expect(EXISTS (SELECT FROM waiters WHERE queue = 't20w' AND worker = 'w-idle'), 'an empty sleep claim waits');
SELECT count(*) FROM pg_temp.add_jobs('t20w', 1) \gset
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20w', 1, 'w-idle', 'sleep')) = 1, 'woken claim takes the job');
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM waiters WHERE queue = 't20w' AND worker = 'w-idle'), 'and stops waiting');
INSERT INTO queues (name, max_running) VALUES ('t20w', 1) ON CONFLICT (name) DO UPDATE SET max_running = 1;
SELECT count(*) FROM claim_attempts('t20w', 1, 'w-idle', 'sleep') \gset
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM waiters WHERE queue = 't20w'), 'a claim held back by its limit does not wait');

-- ---- monotonic leases: a job claimed again gets a larger lease ----------------------------------
SELECT min(id) AS m_job FROM pg_temp.add_jobs('t20n', 1) \gset
SELECT run_lease AS m_lease1 FROM claim_attempts('t20n', 1, 'w') \gset
INSERT INTO closures (claim_id, pos, outcome, closed_at) VALUES (:m_lease1 >> 16, 1, 'r', now());
INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt)
SELECT id, queue, priority, now(), created_at, :m_lease1, 1 FROM specs WHERE id = :m_job;
SELECT run_lease AS m_lease2, attempt AS m_attempt2 FROM claim_attempts('t20n', 1, 'w') \gset
SELECT pg_temp.expect(:m_lease2 > :m_lease1 AND :m_attempt2 = 2, 'the next claim of a job has a larger lease');

-- ---- heartbeat_batch ----------------------------------------------------------------------------
-- open attempts of claim a_claim (pos 1..4), the legacy open attempt (1, 1), the legacy closed
-- one (2, 1), a wrong job for a lease, a place past the claim's end, a lease of no claim.
SELECT array_agg(g.job_id ORDER BY g.place) AS hb_j, array_agg(g.run_lease ORDER BY g.place) AS hb_l FROM got g \gset
SELECT pg_temp.expect((SELECT count(*) FROM heartbeat_batch(ARRAY[1, 2, :a_plain, :a_plain, 1]::bigint[],
                                                            ARRAY[1, 1, :a_claim * 65536 + 1, :a_claim * 65536 + 9,
                                                                  99 * 65536 + 1]::bigint[])) = 1,
                      'heartbeat: only the legacy open attempt of these');
SELECT pg_temp.expect(EXISTS (SELECT FROM attempt_state WHERE job_id = 1 AND run_lease = 1), 'legacy heartbeat written');
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM attempt_state WHERE job_id = 2) AND
                      NOT EXISTS (SELECT FROM attempt_state WHERE job_id = :a_plain), 'stale pairs write nothing');
SELECT pg_temp.expect((SELECT array_agg(job_id ORDER BY job_id) FROM heartbeat_batch(:'hb_j', :'hb_l',
                        ARRAY['{"p": 1}', NULL, '{"p": 3}', NULL]::jsonb[]))
                      = (SELECT array_agg(j ORDER BY j) FROM unnest(:'hb_j'::bigint[]) j), 'heartbeat: every open item');
SELECT pg_temp.expect((SELECT count(*) FROM attempt_state s JOIN got g ON g.job_id = s.job_id AND g.run_lease = s.run_lease) = 4,
                      'attempt_state rows keyed by the new leases');
-- progress: a later beat without progress keeps it, duplicates keep the one with progress
SELECT count(*) FROM heartbeat_batch(ARRAY[:a_err, :a_err]::bigint[], ARRAY[:a_claim * 65536 + 1, :a_claim * 65536 + 1]::bigint[],
                                     ARRAY[NULL, '{"p": 2}']::jsonb[]) \gset
SELECT count(*) FROM heartbeat_batch(ARRAY[:a_err]::bigint[], ARRAY[:a_claim * 65536 + 1]::bigint[]) \gset
SELECT pg_temp.expect(progress = '{"p": 2}', 'heartbeat progress kept') FROM attempt_state
 WHERE job_id = :a_err AND run_lease = :a_claim * 65536 + 1;
-- a closed item is beaten no more
INSERT INTO closures (claim_id, pos, outcome, closed_at) VALUES (:a_claim, 3, 'c', now());
SELECT pg_temp.expect((SELECT count(*) FROM heartbeat_batch(:'hb_j', :'hb_l')) = 3, 'a closed attempt is not beaten');

-- ---- attempt_checkpoint -------------------------------------------------------------------------
SELECT pg_temp.expect((SELECT array_agg(progress) FROM attempt_checkpoint(:a_cont, :a_claim * 65536 + 2))
                      = ARRAY['{"step": 3}'::jsonb], 'checkpoint: the carried progress');
SELECT pg_temp.expect((SELECT count(*) FROM attempt_checkpoint(:a_err, :a_claim * 65536 + 1)) = 1
                      AND (SELECT progress FROM attempt_checkpoint(:a_err, :a_claim * 65536 + 1)) IS NULL,
                      'checkpoint: one NULL row for an open attempt without one');
SELECT pg_temp.expect((SELECT count(*) FROM attempt_checkpoint(:a_plain, :a_claim * 65536 + 3)) = 0, 'checkpoint: closed, no row');
SELECT pg_temp.expect((SELECT count(*) FROM attempt_checkpoint(:a_plain, :a_claim * 65536 + 1)) = 0, 'checkpoint: wrong job, no row');
SELECT pg_temp.expect((SELECT count(*) FROM attempt_checkpoint(1, 1)) = 1, 'checkpoint: legacy open attempt');
SELECT pg_temp.expect((SELECT count(*) FROM attempt_checkpoint(2, 1)) = 0, 'checkpoint: legacy closed attempt');

-- ---- queue_depths and list_queues agree with the jobs view --------------------------------------
-- one attempt parked on a callback, and a stale waiting state of a closed attempt
UPDATE attempt_state SET waiting = true WHERE job_id = :a_cont AND run_lease = :a_claim * 65536 + 2;
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, waiting) VALUES (:a_plain, :a_claim * 65536 + 3, now(), true)
ON CONFLICT (job_id, run_lease) DO UPDATE SET waiting = true;
-- terminal records: a failed and a cancelled item
INSERT INTO closures (claim_id, pos, outcome, closed_at)
SELECT claim_id, 1, 'f', now() FROM claims WHERE queue = 't20b'
UNION ALL SELECT claim_id, 2, 'x', now() FROM claims WHERE queue = 't20b';
SELECT pg_temp.expect(NOT EXISTS (
         SELECT v.queue, v.state, v.n FROM pg_temp.view_counts() v
         EXCEPT
         SELECT l.queue, e.key, e.value::bigint FROM list_queues() l, jsonb_each_text(l.counts) e WHERE e.value <> '0')
       AND NOT EXISTS (
         SELECT l.queue, e.key, e.value::bigint FROM list_queues() l, jsonb_each_text(l.counts) e WHERE e.value <> '0'
         EXCEPT
         SELECT v.queue, v.state, v.n FROM pg_temp.view_counts() v),
       'list_queues counts = the jobs view''s');
SELECT pg_temp.expect(NOT EXISTS (
         SELECT v.queue, v.state, v.n FROM pg_temp.view_counts() v
          WHERE v.state IN ('available', 'scheduled', 'retryable', 'running', 'waiting_external')
         EXCEPT
         SELECT d.queue, x.state, x.n FROM queue_depths() d
          CROSS JOIN LATERAL (VALUES ('available', d.available), ('scheduled', d.scheduled), ('retryable', d.retryable),
                                     ('running', d.running), ('waiting_external', d.waiting_external)) x(state, n)
          WHERE x.n <> 0)
       AND NOT EXISTS (
         SELECT d.queue, x.state, x.n FROM queue_depths() d
          CROSS JOIN LATERAL (VALUES ('available', d.available), ('scheduled', d.scheduled), ('retryable', d.retryable),
                                     ('running', d.running), ('waiting_external', d.waiting_external)) x(state, n)
          WHERE x.n <> 0
         EXCEPT
         SELECT v.queue, v.state, v.n FROM pg_temp.view_counts() v
          WHERE v.state IN ('available', 'scheduled', 'retryable', 'running', 'waiting_external')),
       'queue_depths = the jobs view''s unfinished counts');
SELECT pg_temp.expect(waiting_external = 1 AND running = 2, 'waiting_external of t20a') FROM queue_depths() WHERE queue = 't20a';
-- a queue whose claims are all closed (still in open_claims) and that has no settings is not listed
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM queue_depths() WHERE queue = 't20b'), 'a drained queue has no depth row');

-- ---- a second session ---------------------------------------------------------------------------
-- SKIP LOCKED: an open claim's rows are passed by, not waited for, and a claim that finds only
-- locked rows draws no claim id.
SELECT count(*) FROM pg_temp.add_jobs('t20c', 5) \gset
BEGIN;
SELECT array_agg(job_id) AS c_mine FROM claim_attempts('t20c', 2, 'w-main') \gset
\! psql -X -q -v ON_ERROR_STOP=1 -c "SET statement_timeout = '10s'" -c "INSERT INTO $T20_S.t20_result SELECT 'skip', job_id, run_lease FROM $T20_S.claim_attempts('t20c', 5, 'w-bg')" -c "INSERT INTO $T20_S.t20_result (tag) VALUES ('skip-done')" >/dev/null 2>&1 &
DO $$
BEGIN
  FOR i IN 1..200 LOOP
    EXIT WHEN EXISTS (SELECT FROM t20_result WHERE tag = 'skip-done');
    PERFORM pg_sleep(0.05);
  END LOOP;
  PERFORM pg_temp.expect(EXISTS (SELECT FROM t20_result WHERE tag = 'skip-done'), 'the second claim ran without waiting');
END $$;
SELECT pg_temp.expect((SELECT count(*) FROM t20_result WHERE tag = 'skip') = 3
                      AND NOT EXISTS (SELECT FROM t20_result WHERE tag = 'skip' AND job_id = ANY (:'c_mine'::bigint[])),
                      'the second claim took the other three');
SELECT pg_temp.expect((SELECT min(run_lease) >> 16 FROM t20_result WHERE tag = 'skip')
                      > (SELECT claim_id FROM claims c WHERE c.job_ids && :'c_mine'::bigint[]),
                      'ids in the order the claims drew them');
SELECT last_value AS seq_before FROM claim_id_seq \gset
\! psql -X -q -v ON_ERROR_STOP=1 -c "SET statement_timeout = '10s'" -c "INSERT INTO $T20_S.t20_result SELECT 'locked', job_id FROM $T20_S.claim_attempts('t20c', 5, 'w-bg')" -c "INSERT INTO $T20_S.t20_result (tag) VALUES ('locked-done')" >/dev/null 2>&1 &
DO $$
BEGIN
  FOR i IN 1..200 LOOP
    EXIT WHEN EXISTS (SELECT FROM t20_result WHERE tag = 'locked-done');
    PERFORM pg_sleep(0.05);
  END LOOP;
  PERFORM pg_temp.expect(EXISTS (SELECT FROM t20_result WHERE tag = 'locked-done'), 'the third claim ran');
END $$;
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM t20_result WHERE tag = 'locked'), 'only locked rows: nothing claimed');
SELECT pg_temp.expect((SELECT last_value FROM claim_id_seq) = :seq_before, 'and no claim id drawn');
ROLLBACK;
SELECT pg_temp.expect((SELECT count(*) FROM ready WHERE queue = 't20c') = 2, 'a rolled back claim leaves its jobs ready');
SELECT pg_temp.expect(NOT EXISTS (SELECT FROM claims c WHERE c.job_ids && :'c_mine'::bigint[]), 'and no claim row');

-- max_running: a limited queue's claims take turns on its row; the second counts what the first
-- committed.
INSERT INTO queues (name, max_running) VALUES ('t20l', 3);
SELECT count(*) FROM pg_temp.add_jobs('t20l', 6) \gset
BEGIN;
SELECT pg_temp.expect((SELECT count(*) FROM claim_attempts('t20l', 2, 'w-main')) = 2, 'first limited claim: 2');
\! psql -X -q -v ON_ERROR_STOP=1 -c "SET statement_timeout = '20s'" -c "INSERT INTO $T20_S.t20_result SELECT 'limit', job_id FROM $T20_S.claim_attempts('t20l', 5, 'w-bg')" -c "INSERT INTO $T20_S.t20_result (tag) VALUES ('limit-done')" >/dev/null 2>&1 &
DO $$
BEGIN
  -- the second claim waits for the queue's row
  FOR i IN 1..200 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                       WHERE NOT l.granted AND a.query LIKE '%claim_attempts(''t20l''%');
    PERFORM pg_sleep(0.05);
  END LOOP;
  PERFORM pg_temp.expect(EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                                  WHERE NOT l.granted AND a.query LIKE '%claim_attempts(''t20l''%'),
                         'the second limited claim waits');
  PERFORM pg_temp.expect(NOT EXISTS (SELECT FROM t20_result WHERE tag = 'limit-done'), 'and has not finished');
END $$;
COMMIT;
DO $$
BEGIN
  FOR i IN 1..200 LOOP
    EXIT WHEN EXISTS (SELECT FROM t20_result WHERE tag = 'limit-done');
    PERFORM pg_sleep(0.05);
  END LOOP;
  PERFORM pg_temp.expect(EXISTS (SELECT FROM t20_result WHERE tag = 'limit-done'), 'the second limited claim ended');
END $$;
SELECT pg_temp.expect((SELECT count(*) FROM t20_result WHERE tag = 'limit') = 1, 'it took the one place left');

DROP TABLE t20_result;
\o
\echo 'tests/20_claim.sql: all expectations met'
