-- Tests of 40_callbacks.sql: register/await/park/resume/extend/complete/fail_callback over the
-- ledger layout. Run on a schema made as ledger_scenarios_pgtest.cpp makes it:
--   psql -X -v ON_ERROR_STOP=1 -v s=SCHEMA -v root=REPOSITORY -f tests/sql/ledger/40_callbacks.sql DSN
-- Every expectation raises when it fails. Concurrency runs through dblink sessions (the extension
-- is created in schema tenure_test_ext when the database has none).
\set ON_ERROR_STOP 1
\set QUIET on
\pset tuples_only on
\pset format unaligned
SET client_min_messages = warning;

DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'dblink') THEN
    CREATE SCHEMA IF NOT EXISTS tenure_test_ext;
    CREATE EXTENSION dblink SCHEMA tenure_test_ext;
  END IF;
END $$;
SELECT set_config('search_path', quote_ident(:'s') || ', '
                  || (SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'dblink')
                  || ', public', false) AS ignore \gset
-- Queue names of this run: the script may run again on the same schema.
SELECT 'cb' || (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS run \gset
SELECT set_config('tenure_test.run', :'run', false) AS ignore \gset
SELECT format('host=%s port=%s dbname=%s user=%s', coalesce(host(inet_server_addr()), 'localhost'),
              inet_server_port(), current_database(), current_user) AS dsn \gset

-- ---- helpers ----------------------------------------------------------------------------------
CREATE FUNCTION pg_temp.ok(cond boolean, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF cond IS NOT TRUE THEN
    RAISE EXCEPTION 'expectation failed: %', what;
  END IF;
END $$;

-- Enqueues one job on the queue <run>_q and claims it.
CREATE FUNCTION pg_temp.start(q text, max_attempts int DEFAULT 25,
                              OUT job_id bigint, OUT run_lease bigint, OUT secret uuid)
LANGUAGE plpgsql AS $$
BEGIN
  q := current_setting('tenure_test.run') || '_' || q;
  PERFORM enqueue('cb', '{}', q, 2, NULL, max_attempts);
  SELECT c.job_id, c.run_lease, c.secret INTO job_id, run_lease, secret FROM claim_attempts(q, 1) c;
  IF job_id IS NULL THEN
    RAISE EXCEPTION 'expected a claimed job on %', q;
  END IF;
END $$;

-- The SQLSTATE a statement raises, 'ok' when none.
CREATE FUNCTION pg_temp.sqlstate_of(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE;
END $$;

-- The closure outcome of (job_id, run_lease); NULL while open; 'none' when it names no item.
CREATE FUNCTION pg_temp.outcome(j bigint, l bigint) RETURNS text LANGUAGE sql AS $$
  SELECT CASE WHEN NOT EXISTS (SELECT FROM attempt_at(j, l)) THEN 'none'
              ELSE (SELECT x.outcome::text FROM attempt_at(j, l) a
                      JOIN closures x ON x.claim_id = a.claim_id AND x.pos = a.pos) END
$$;

-- Closes (job_id, run_lease) as another closer would (rescue 'a' by default), with no lock.
CREATE FUNCTION pg_temp.close_as(j bigint, l bigint, o "char" DEFAULT 'a') RETURNS void LANGUAGE sql AS $$
  INSERT INTO closures (claim_id, pos, outcome, closed_at) SELECT a.claim_id, a.pos, o, now() FROM attempt_at(j, l) a
$$;

-- Waits (10 s at most) until n other sessions running a statement like `pattern` wait for a lock.
CREATE FUNCTION pg_temp.blocked(pattern text, n int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..1000 LOOP
    PERFORM pg_stat_clear_snapshot();  -- pg_stat_activity is read once per transaction otherwise
    IF (SELECT count(*) FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND query LIKE pattern AND pid <> pg_backend_pid()) >= n THEN
      RETURN true;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN false;
END $$;

-- The notifications a dblink session has received on `channel` (waits up to 2 s for the first).
CREATE FUNCTION pg_temp.notified(conn text, channel text, payload text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..200 LOOP
    IF EXISTS (SELECT FROM dblink_get_notify(conn) n WHERE n.notify_name = channel AND n.extra = payload) THEN
      RETURN true;
    END IF;
    PERFORM pg_sleep(0.01);
  END LOOP;
  RETURN false;
END $$;

SELECT dblink_connect('h', :'dsn') AS ignore \gset
SELECT dblink_connect('r1', :'dsn') AS ignore \gset
SELECT dblink_connect('r2', :'dsn') AS ignore \gset
SELECT dblink_connect('l', :'dsn') AS ignore \gset

-- ---- register_callback ------------------------------------------------------------------------
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('reg') \gset
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM attempt_state WHERE job_id = :j), 'claim alone writes no lease row');
SELECT register_callback(:j, :l, '1 hour') AS id1 \gset
SELECT pg_temp.ok(:'id1' <> '', 'register returns an id');
SELECT pg_temp.ok((SELECT callback_id = :'id1' AND callback_timeout = '1 hour' AND NOT waiting
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'register materializes the lease row');
SELECT register_callback(:j, :l, '2 hours') AS id2 \gset
SELECT pg_temp.ok(:'id1' <> :'id2', 'registering again rotates the id');
SELECT pg_temp.ok(NOT resume_callback(:'id1'), 'the rotated-out id is unknown');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM await_callback(:j, :l, :'id1')), 'await of a rotated-out id is stale');
SELECT pg_temp.ok(register_callback(:j, 99, '1 hour') IS NULL, 'a lease that names no attempt registers nothing');
SELECT pg_temp.ok(register_callback(:j, :l + 1, '1 hour') IS NULL, 'a neighbouring lease registers nothing');
SELECT pg_temp.ok(register_callback(-1, :l, '1 hour') IS NULL, 'another job registers nothing');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT register_callback(%s, %s, %L)', :j, :l, '0 seconds')) = '22023',
                  'a timeout of 0 is refused');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT register_callback(%s, %s, NULL)', :j, :l)) = '22023',
                  'a NULL timeout is refused');
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id2')) = 'waiting', 'await parks');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT register_callback(%s, %s, %L)', :j, :l, '1 hour')) = '22023',
                  'no rotation while waiting');
SELECT pg_temp.ok(resume_callback(:'id2'), 'resume');
-- Closed by another closer (rescue, cancel): everything about it is stale.
SELECT pg_temp.close_as(:j, :l);
SELECT pg_temp.ok(register_callback(:j, :l, '1 hour') IS NULL, 'a closed attempt registers nothing');

-- ---- a stale callback -------------------------------------------------------------------------
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('stale') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
SELECT pg_temp.close_as(:j, :l);
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM await_callback(:j, :l, :'id')), 'await of a closed attempt: no row');
SELECT pg_temp.ok(NOT resume_callback(:'id'), 'resume of a closed attempt');
SELECT pg_temp.ok(NOT extend_callback(:'id', '1 hour'), 'extend of a closed attempt');
SELECT pg_temp.ok(NOT complete_callback(:'id'), 'complete_callback of a closed attempt');
SELECT pg_temp.ok(NOT fail_callback(:'id', 'x'), 'fail_callback of a closed attempt');
SELECT pg_temp.ok(park_callback(:j, :l, :'id') IS NULL, 'park of a closed attempt');
SELECT pg_temp.ok((SELECT job_id IS NULL AND run_lease IS NULL FROM lock_callback(:'id')), 'lock_callback: stale');
SELECT pg_temp.ok((SELECT job_id IS NULL FROM lock_callback(gen_random_uuid())), 'lock_callback: unknown');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'a', 'the other closer''s closure is the only one');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM ready WHERE id = :j), 'no ready row made by a stale call');

-- ---- await_callback and the blocking resume ---------------------------------------------------
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('wait1') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status = 'waiting' AND payload IS NULL FROM await_callback(:j, :l, :'id')), 'await parks');
SELECT pg_temp.ok((SELECT state FROM jobs WHERE id = :j) = 'waiting_external', 'shows waiting_external');
SELECT waiting_since AS since FROM attempt_state WHERE job_id = :j AND run_lease = :l \gset
SELECT pg_temp.ok((SELECT waiting AND NOT no_handler AND callback_deadline BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes'
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'callback deadline armed');
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'polling');
SELECT pg_temp.ok((SELECT waiting_since = :'since' FROM attempt_state WHERE job_id = :j AND run_lease = :l),
                  'polling is a read');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM await_callback(:j, :l, gen_random_uuid())), 'await of another id: no row');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM await_callback(:j, :l + 1, :'id')), 'await of another lease: no row');
SELECT dblink_exec('l', format('LISTEN %I', :'s' || '_callback')) AS ignore \gset
SELECT pg_temp.ok(resume_callback(:'id', '{"ok": true}'), 'resume');
SELECT pg_temp.ok(pg_temp.notified('l', :'s' || '_callback', :j || ':' || :l), 'resume notifies the callback channel');
SELECT pg_temp.ok((SELECT state FROM jobs WHERE id = :j) = 'running', 'running again');
SELECT pg_temp.ok((SELECT run_lease FROM jobs WHERE id = :j) = :l, 'same run lease');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) IS NULL, 'a blocking resume closes nothing');
SELECT pg_temp.ok((SELECT status = 'resumed' AND payload = '{"ok": true}' FROM await_callback(:j, :l, :'id')),
                  'await answers the payload');
SELECT pg_temp.ok((SELECT resumed AND NOT waiting AND callback_deadline IS NULL AND waiting_since IS NULL
                          AND deadline_at IS NULL
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'resolved; no hard deadline to move');
SELECT pg_temp.ok(NOT resume_callback(:'id'), 'already resolved');
SELECT pg_temp.ok(NOT extend_callback(:'id', '1 hour'), 'extend of a resolved callback');
SELECT pg_temp.ok(NOT complete_callback(:'id'), 'complete_callback of a resolved callback');
-- A second callback in the same attempt.
SELECT register_callback(:j, :l, '1 hour') AS id2 \gset
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM await_callback(:j, :l, :'id')), 'the first id is gone with the rotation');
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id2')) = 'waiting', 'second wait');
SELECT pg_temp.ok(resume_callback(:'id2', NULL), 'resume with a NULL payload');
SELECT pg_temp.ok((SELECT payload = '{}' FROM await_callback(:j, :l, :'id2')), 'a NULL payload is stored as {}');

-- A resume that arrives before the handler waits is kept.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('wait2') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(resume_callback(:'id', '{"early": 1}'), 'early resume');
SELECT pg_temp.ok((SELECT state FROM jobs WHERE id = :j) = 'running', 'never parked');
SELECT pg_temp.ok((SELECT status = 'resumed' AND payload = '{"early": 1}' FROM await_callback(:j, :l, :'id')),
                  'the wait returns at once');
SELECT pg_temp.ok((SELECT NOT waiting FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'not waiting');

-- ---- the hard deadline of a blocking waiter ---------------------------------------------------
INSERT INTO queues (name, hard_deadline) VALUES ((:'run' || '_deadline'), '1 hour')
  ON CONFLICT (name) DO UPDATE SET hard_deadline = excluded.hard_deadline;
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('deadline') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
-- It had 10 minutes left when it parked an hour ago.
UPDATE claims SET deadline_at = now() - interval '50 minutes' WHERE claim_id = :l >> 16;
UPDATE attempt_state SET waiting_since = now() - interval '1 hour' WHERE job_id = :j AND run_lease = :l;
SELECT pg_temp.ok(resume_callback(:'id'), 'resume');
SELECT pg_temp.ok((SELECT round(extract(epoch FROM deadline_at - now()) / 60) = 10
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'the remaining 10 minutes are kept');
SELECT pg_temp.ok((SELECT deadline_at < now() FROM claims WHERE claim_id = :l >> 16), 'the claim row is not written');
-- A second wait moves the attempt's own deadline again.
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting again');
UPDATE attempt_state SET waiting_since = now() - interval '30 minutes' WHERE job_id = :j AND run_lease = :l;
SELECT pg_temp.ok(resume_callback(:'id'), 'resume');
SELECT pg_temp.ok((SELECT round(extract(epoch FROM deadline_at - now()) / 60) = 40
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'the waits add up');
-- An early resume (no wait) moves nothing.
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(resume_callback(:'id'), 'early resume');
SELECT pg_temp.ok((SELECT round(extract(epoch FROM deadline_at - now()) / 60) = 40
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'unchanged without a wait');

-- ---- extend_callback --------------------------------------------------------------------------
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('extend') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(extend_callback(:'id', '3 hours'), 'extend before waiting');
SELECT pg_temp.ok((SELECT callback_timeout = '3 hours' AND callback_deadline IS NULL
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'the timeout moves, nothing armed');
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
SELECT pg_temp.ok((SELECT callback_deadline BETWEEN now() + interval '179 minutes' AND now() + interval '181 minutes'
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'armed with the extended timeout');
SELECT pg_temp.ok(extend_callback(:'id', '10 minutes'), 'extend while waiting');
SELECT pg_temp.ok((SELECT callback_deadline BETWEEN now() + interval '9 minutes' AND now() + interval '11 minutes'
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'counts from now');
SELECT pg_temp.ok(NOT extend_callback(gen_random_uuid(), '1 hour'), 'unknown');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT extend_callback(%L, %L)', :'id', '-1 second')) = '22023',
                  'a negative timeout is refused');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT extend_callback(%L, NULL)', :'id')) = '22023',
                  'a NULL timeout is refused');

-- ---- complete_callback ------------------------------------------------------------------------
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('complete1') \gset
SELECT pg_temp.ok(EXISTS (SELECT FROM heartbeat_batch(ARRAY[:j::bigint], ARRAY[:l::bigint], ARRAY['{"n": 1}'::jsonb])),
                  'a checkpoint');
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
SELECT dblink_exec('l', format('LISTEN %I', :'s' || '_cancel')) AS ignore \gset
SELECT pg_temp.ok(complete_callback(:'id', '{"final": true}'), 'complete_callback');
SELECT pg_temp.ok(pg_temp.notified('l', :'s' || '_cancel', :j || ':' || :l), 'the handler is told on the cancel channel');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'c', 'closed as completed');
SELECT pg_temp.ok((SELECT state = 'completed' AND progress = '{"final": true}' AND run_lease = :l FROM jobs WHERE id = :j),
                  'completed with the given progress');
SELECT pg_temp.ok((SELECT resumed AND NOT waiting AND callback_deadline IS NULL
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'resolved, no longer waiting');
SELECT pg_temp.ok(NOT complete_callback(:'id'), 'a second complete_callback');
SELECT pg_temp.ok(NOT resume_callback(:'id'), 'resume after completion');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM await_callback(:j, :l, :'id')), 'await after completion: stale');
SELECT pg_temp.ok((SELECT count(*) FROM done WHERE id = :j) = 1, 'one terminal record');
-- No progress given: the attempt's own.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('complete2') \gset
SELECT pg_temp.ok(EXISTS (SELECT FROM heartbeat_batch(ARRAY[:j::bigint], ARRAY[:l::bigint], ARRAY['{"n": 2}'::jsonb])),
                  'a checkpoint');
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(complete_callback(:'id'), 'complete_callback of an attempt that never waited');
SELECT pg_temp.ok((SELECT state = 'completed' AND progress = '{"n": 2}' FROM jobs WHERE id = :j), 'the attempt''s progress');

-- ---- fail_callback ----------------------------------------------------------------------------
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('fail1', 5) \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(fail_callback(:'id', 'provider said no', true), 'fail_callback, retry');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'r', 'closed as retryable');
SELECT pg_temp.ok((SELECT state = 'retryable' AND last_error = 'provider said no' AND run_lease = :l AND attempt = 1
                     FROM jobs WHERE id = :j), 'retryable');
SELECT pg_temp.ok(NOT fail_callback(:'id', 'again', true), 'a second fail_callback');
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('fail2', 5) \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
SELECT pg_temp.ok(fail_callback(:'id', 'provider said never'), 'fail_callback, for good');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'f', 'closed as failed');
SELECT pg_temp.ok((SELECT state = 'failed' AND last_error = 'provider said never' FROM jobs WHERE id = :j), 'failed');
SELECT pg_temp.ok((SELECT resumed AND NOT waiting FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'resolved');
SELECT pg_temp.ok(NOT fail_callback(:'id', 'again'), 'a second fail_callback');
-- Retry asked, attempts spent: failed.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('fail3', 1) \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(fail_callback(:'id', 'spent', true), 'fail_callback, retry, attempts spent');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'f', 'closed as failed');
-- A dead-letter queue.
INSERT INTO queues (name, dead_letter) VALUES ((:'run' || '_dlq'), true)
  ON CONFLICT (name) DO UPDATE SET dead_letter = true;
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('dlq', 5) \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(fail_callback(:'id', 'into the dead letters'), 'fail_callback into a dead-letter queue');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'd', 'closed as dead-lettered');
SELECT pg_temp.ok((SELECT state = 'failed' AND dead_lettered FROM jobs WHERE id = :j), 'in dead_letter');

-- ---- park_callback and the parked resume ------------------------------------------------------
SELECT job_id AS j, run_lease AS l, secret AS sec FROM pg_temp.start('park') \gset
SELECT pg_temp.ok(EXISTS (SELECT FROM heartbeat_batch(ARRAY[:j::bigint], ARRAY[:l::bigint], ARRAY['{"step": 1}'::jsonb])),
                  'a checkpoint');
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(park_callback(:j, :l, gen_random_uuid()) IS NULL, 'park with another callback id');
SELECT pg_temp.ok(park_callback(:j, :l + 1, :'id') IS NULL, 'park with another lease');
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'parked', 'parked');
SELECT callback_deadline AS cbd FROM attempt_state WHERE job_id = :j AND run_lease = :l \gset
SELECT pg_temp.ok((SELECT waiting AND no_handler AND callback_deadline IS NOT NULL AND waiting_since IS NOT NULL
                     FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'waiting with no handler');
SELECT pg_temp.ok((SELECT state FROM jobs WHERE id = :j) = 'waiting_external', 'waiting_external');
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'parked', 'parked again');
SELECT pg_temp.ok((SELECT callback_deadline = :'cbd' FROM attempt_state WHERE job_id = :j AND run_lease = :l),
                  'the callback deadline is kept');
INSERT INTO waiters (queue, worker) VALUES ((:'run' || '_park'), 'sleeper');
SELECT dblink_exec('l', format('LISTEN %I', :'s' || '_wake')) AS ignore \gset
SELECT pg_temp.ok(resume_callback(:'id', '{"paid": true}'), 'resume of a parked attempt');
SELECT pg_temp.ok(pg_temp.notified('l', :'s' || '_wake', (:'run' || '_park')), 'the queue''s sleeping workers are woken');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'p', 'the parked attempt is closed as resumed');
SELECT pg_temp.ok((SELECT run_lease = :l AND attempt = 1 AND resume_payload = '{"paid": true}' AND progress = '{"step": 1}'
                     FROM ready WHERE id = :j), 'its continuation waits in ready: lease, attempt, payload, progress');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM attempt_state WHERE job_id = :j AND run_lease = :l),
                  'its attempt_state row is gone');
SELECT pg_temp.ok((SELECT state = 'available' AND run_lease = :l AND attempt = 1 AND progress = '{"step": 1}'
                     FROM jobs WHERE id = :j), 'available');
SELECT pg_temp.ok(NOT resume_callback(:'id'), 'a second resume');
SELECT pg_temp.ok(NOT complete_callback(:'id'), 'complete_callback after the resume');
SELECT pg_temp.ok(park_callback(:j, :l, :'id') IS NULL, 'park after the resume');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM await_callback(:j, :l, :'id')), 'await after the resume');
SELECT pg_temp.ok(register_callback(:j, :l, '1 hour') IS NULL, 'register on the parked lease');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM heartbeat_batch(ARRAY[:j::bigint], ARRAY[:l::bigint])),
                  'a heartbeat of the parked lease');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM attempt_checkpoint(:j, :l)), 'the parked lease has no checkpoint');
-- The continuation: a new claim item, new run lease and secret, the same attempt, the payload.
DELETE FROM waiters WHERE queue = (:'run' || '_park');
SELECT job_id AS cj, run_lease AS cl, secret AS csec, attempt AS ca, resume_payload AS cp
  FROM claim_attempts((:'run' || '_park'), 1) \gset
SELECT pg_temp.ok(:cj = :j AND :cl > :l AND :'csec' <> :'sec' AND :ca = 1 AND :'cp' = '{"paid": true}',
                  'the continuation: same job and attempt, new lease and secret, the payload');
SELECT pg_temp.ok((SELECT progress = '{"step": 1}' FROM attempt_checkpoint(:j, :cl)), 'the progress carried in');
SELECT pg_temp.ok((SELECT state = 'running' AND run_lease = :cl AND attempt = 1 FROM jobs WHERE id = :j), 'running');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'p', 'the parked attempt stays closed');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM heartbeat_batch(ARRAY[:j::bigint], ARRAY[:l::bigint])),
                  'the old lease cannot write');
-- The old token names the closed attempt: refused (TN001), whatever its secret.
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT * FROM complete_job(%L)', make_token(:j, :l, :'sec'))) = 'TN001',
                  'complete_job with the token from before the park');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT fail_job(%L, %L, false)', make_token(:j, :l, :'sec'), 'late')) = 'TN001',
                  'fail_job with the token from before the park');
SELECT pg_temp.ok(pg_temp.outcome(:j, :cl) IS NULL, 'the continuation is still open');
-- The continuation has callbacks of its own.
SELECT register_callback(:j, :cl, '1 hour') AS cid \gset
SELECT pg_temp.ok(park_callback(:j, :cl, :'cid') = 'parked', 'the continuation parks');
SELECT pg_temp.ok(resume_callback(:'cid', '{"paid": 2}'), 'and is resumed');
SELECT pg_temp.ok((SELECT run_lease = :cl AND attempt = 1 AND resume_payload = '{"paid": 2}' FROM ready WHERE id = :j),
                  'a second continuation');

-- Resumed before it parked: continued at once.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('park2') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(resume_callback(:'id', '{"early": true}'), 'early resume');
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'resumed', 'park answers resumed');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'p', 'closed as resumed');
SELECT pg_temp.ok((SELECT run_lease = :l AND attempt = 1 AND resume_payload = '{"early": true}' FROM ready WHERE id = :j),
                  'continued with the early payload');
SELECT pg_temp.ok(NOT EXISTS (SELECT FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'row gone');
SELECT pg_temp.ok(park_callback(:j, :l, :'id') IS NULL, 'a second park');

-- ---- an attempt opened before migration 24 (the scenario install makes one) ----------------------------------
SELECT count(*) > 0 AS has_legacy
  FROM legacy_attempts la
 WHERE NOT EXISTS (SELECT FROM closures x WHERE x.claim_id = la.claim_id AND x.pos = la.pos) \gset
\if :has_legacy
SELECT la.job_id AS j, la.run_lease AS l, c.queue AS q
  FROM legacy_attempts la JOIN claims c ON c.claim_id = la.claim_id
 WHERE NOT EXISTS (SELECT FROM closures x WHERE x.claim_id = la.claim_id AND x.pos = la.pos)
 ORDER BY la.job_id LIMIT 1 \gset
SELECT attempt AS la FROM jobs WHERE id = :j \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(:'id' <> '', 'register on a legacy lease');
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'a legacy attempt waits');
SELECT pg_temp.ok(resume_callback(:'id', '{"legacy": 1}'), 'and is resumed in place');
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'parked', 'a legacy attempt parks');
SELECT pg_temp.ok(resume_callback(:'id', '{"legacy": 2}'), 'and is continued');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'p', 'the legacy item is closed');
SELECT pg_temp.ok((SELECT run_lease = :l AND attempt = :la AND resume_payload = '{"legacy": 2}' FROM ready WHERE id = :j),
                  'its continuation keeps the legacy lease until claimed');
SELECT c.run_lease AS cl, c.attempt AS ca FROM claim_attempts(:'q', 100) c WHERE c.job_id = :j \gset
SELECT pg_temp.ok(:cl >= 65536 AND :ca = :la, 'claimed: a ledger lease, the same attempt');
SELECT pg_temp.ok(register_callback(:j, :l, '1 hour') IS NULL, 'the legacy lease is stale');
\else
\echo 'no open attempt from before migration 24 (the scenario install makes one): legacy case skipped'
\endif

-- ---- concurrency ------------------------------------------------------------------------------
-- Two resumes of a waiting attempt held back by a third session: exactly one wins.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race1') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT * FROM dblink('h', format('SELECT pg_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))::text',
                                 :'s' || '.attempt', :'s', :j, :l)) AS t(x text) \gset
SELECT dblink_send_query('r1', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{"by": 1}')) AS ignore \gset
SELECT dblink_send_query('r2', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{"by": 2}')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%resume_callback%', 2), 'both resumes wait for the attempt''s lock');
SELECT dblink_exec('h', 'COMMIT') AS ignore \gset
SELECT w AS w1 FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT w AS w2 FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT pg_temp.ok(:'w1'::boolean <> :'w2'::boolean, 'exactly one resume wins');
SELECT pg_temp.ok((SELECT status = 'resumed' AND payload IN ('{"by": 1}', '{"by": 2}') FROM await_callback(:j, :l, :'id')),
                  'the winner''s payload');

-- The same with a parked attempt: one closure, one continuation.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race2') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'parked', 'parked');
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT * FROM dblink('h', format('SELECT pg_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))::text',
                                 :'s' || '.attempt', :'s', :j, :l)) AS t(x text) \gset
SELECT dblink_send_query('r1', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{"by": 1}')) AS ignore \gset
SELECT dblink_send_query('r2', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{"by": 2}')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%resume_callback%', 2), 'both resumes wait');
SELECT dblink_exec('h', 'COMMIT') AS ignore \gset
SELECT w AS w1 FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT w AS w2 FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT pg_temp.ok(:'w1'::boolean <> :'w2'::boolean, 'exactly one resume of a parked attempt wins');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'p' AND (SELECT count(*) FROM ready WHERE id = :j) = 1,
                  'one closure, one continuation');

-- A park and a resume of one attempt, in both orders: the job ends continued with the payload.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race3') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT * FROM dblink('h', format('SELECT pg_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))::text',
                                 :'s' || '.attempt', :'s', :j, :l)) AS t(x text) \gset
SELECT dblink_send_query('r1', format('SELECT %I.park_callback(%s, %s, %L)', :'s', :j, :l, :'id')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%park_callback%', 1), 'the park waits');
SELECT dblink_send_query('r2', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{"x": 1}')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%resume_callback%', 1), 'the resume waits');
SELECT dblink_exec('h', 'COMMIT') AS ignore \gset
SELECT p AS p1 FROM dblink_get_result('r1') AS t(p text) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(p text) \gset
SELECT w AS w2 FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT pg_temp.ok(:'p1' = 'parked' AND :'w2'::boolean, 'park first, then the resume continues it');
SELECT pg_temp.ok((SELECT resume_payload = '{"x": 1}' FROM ready WHERE id = :j), 'continued');
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race4') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT * FROM dblink('h', format('SELECT pg_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))::text',
                                 :'s' || '.attempt', :'s', :j, :l)) AS t(x text) \gset
SELECT dblink_send_query('r2', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{"x": 2}')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%resume_callback%', 1), 'the resume waits');
SELECT dblink_send_query('r1', format('SELECT %I.park_callback(%s, %s, %L)', :'s', :j, :l, :'id')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%park_callback%', 1), 'the park waits');
SELECT dblink_exec('h', 'COMMIT') AS ignore \gset
SELECT p AS p1 FROM dblink_get_result('r1') AS t(p text) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(p text) \gset
SELECT w AS w2 FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT pg_temp.ok(:'p1' = 'resumed' AND :'w2'::boolean, 'resume first, then the park continues it');
SELECT pg_temp.ok((SELECT resume_payload = '{"x": 2}' FROM ready WHERE id = :j) AND pg_temp.outcome(:j, :l) = 'p',
                  'continued');

-- A closer holding the attempt's lock (rescue, cancel, a completion by token) closes it while a
-- resume waits: the resume is refused once it commits.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race5') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT * FROM dblink('h', format('SELECT pg_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))::text',
                                 :'s' || '.attempt', :'s', :j, :l)) AS t(x text) \gset
SELECT dblink_exec('h', format('INSERT INTO %I.closures (claim_id, pos, outcome, closed_at) SELECT claim_id, pos, %L, now() FROM %I.attempt_at(%s, %s)',
                               :'s', 'a', :'s', :j, :l)) AS ignore \gset
SELECT dblink_send_query('r1', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{}')) AS ignore \gset
SELECT dblink_send_query('r2', format('SELECT %I.complete_callback(%L)', :'s', :'id')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%_callback(%', 2), 'resume and complete_callback wait');
SELECT dblink_exec('h', 'COMMIT') AS ignore \gset
SELECT w AS w1 FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT w AS w2 FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT pg_temp.ok(NOT :'w1'::boolean AND NOT :'w2'::boolean, 'both refused after the closer committed');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'a', 'the closer''s closure stands');

-- complete_callback and resume race: exactly one of them.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race6') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT * FROM dblink('h', format('SELECT pg_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))::text',
                                 :'s' || '.attempt', :'s', :j, :l)) AS t(x text) \gset
SELECT dblink_send_query('r1', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{}')) AS ignore \gset
SELECT dblink_send_query('r2', format('SELECT %I.complete_callback(%L)', :'s', :'id')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%_callback(%', 2), 'both wait');
SELECT dblink_exec('h', 'COMMIT') AS ignore \gset
SELECT w AS w1 FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT w AS w2 FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r2') AS t(w boolean) \gset
SELECT pg_temp.ok(:'w1'::boolean <> :'w2'::boolean, 'exactly one of resume and complete_callback');
SELECT pg_temp.ok(CASE WHEN :'w2'::boolean THEN pg_temp.outcome(:j, :l) = 'c' ELSE pg_temp.outcome(:j, :l) IS NULL END,
                  'the state follows the winner');

-- A closer that takes no lock (a runtime's batch) inserts the parked attempt's closure first:
-- the resume waits on the closure key and is refused; nothing is continued.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race7') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'parked', 'parked');
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT dblink_exec('h', format('INSERT INTO %I.closures (claim_id, pos, outcome, closed_at) SELECT claim_id, pos, %L, now() FROM %I.attempt_at(%s, %s)',
                               :'s', 'x', :'s', :j, :l)) AS ignore \gset
SELECT dblink_send_query('r1', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{}')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%resume_callback%', 1), 'the resume waits on the closure key');
SELECT dblink_exec('h', 'COMMIT') AS ignore \gset
SELECT w AS w1 FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT pg_temp.ok(NOT :'w1'::boolean, 'the resume lost to the batch closer');
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'x' AND NOT EXISTS (SELECT FROM ready WHERE id = :j),
                  'nothing continued');
SELECT pg_temp.ok(EXISTS (SELECT FROM attempt_state WHERE job_id = :j AND run_lease = :l), 'nothing deleted');
-- ... and when that closer rolls back, the resume wins.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('race8') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'parked', 'parked');
SELECT dblink_exec('h', 'BEGIN') AS ignore \gset
SELECT dblink_exec('h', format('INSERT INTO %I.closures (claim_id, pos, outcome, closed_at) SELECT claim_id, pos, %L, now() FROM %I.attempt_at(%s, %s)',
                               :'s', 'x', :'s', :j, :l)) AS ignore \gset
SELECT dblink_send_query('r1', format('SELECT %I.resume_callback(%L, %L)', :'s', :'id', '{}')) AS ignore \gset
SELECT pg_temp.ok(pg_temp.blocked('%resume_callback%', 1), 'the resume waits on the closure key');
SELECT dblink_exec('h', 'ROLLBACK') AS ignore \gset
SELECT w AS w1 FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT count(*) AS ignore FROM dblink_get_result('r1') AS t(w boolean) \gset
SELECT pg_temp.ok(:'w1'::boolean AND pg_temp.outcome(:j, :l) = 'p' AND EXISTS (SELECT FROM ready WHERE id = :j),
                  'the resume won');

-- REPEATABLE READ: a closure committed after the caller's snapshot, which the snapshot cannot
-- see, makes a resume or an extend fail with 40001 (as the receipt's lock did); at READ
-- COMMITTED the same call is refused (false).
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('rr1') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) AS ignore FROM closures \gset
SELECT dblink_exec('h', format('INSERT INTO %I.closures (claim_id, pos, outcome, closed_at) SELECT claim_id, pos, %L, now() FROM %I.attempt_at(%s, %s)',
                               :'s', 'a', :'s', :j, :l)) AS ignore \gset
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) IS NULL, 'the snapshot still sees it open');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT resume_callback(%L)', :'id')) = '40001', 'resume at REPEATABLE READ: 40001');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT extend_callback(%L, %L)', :'id', '1 hour')) = '40001', 'extend: 40001');
SELECT pg_temp.ok(pg_temp.sqlstate_of(format('SELECT complete_callback(%L)', :'id')) = '40001', 'complete_callback: 40001');
ROLLBACK;
SELECT pg_temp.ok(NOT resume_callback(:'id'), 'at READ COMMITTED: refused');
-- Nothing closed meanwhile: the probe leaves nothing behind.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('rr2') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok((SELECT status FROM await_callback(:j, :l, :'id')) = 'waiting', 'waiting');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) AS ignore FROM closures \gset
SELECT pg_temp.ok(extend_callback(:'id', '2 hours'), 'extend at REPEATABLE READ');
SELECT pg_temp.ok(resume_callback(:'id', '{"rr": 1}'), 'resume at REPEATABLE READ');
COMMIT;
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) IS NULL, 'still open: the probe was undone');
SELECT pg_temp.ok((SELECT payload = '{"rr": 1}' FROM await_callback(:j, :l, :'id')), 'resumed');
-- A parked attempt resumed at REPEATABLE READ is continued.
SELECT job_id AS j, run_lease AS l FROM pg_temp.start('rr3') \gset
SELECT register_callback(:j, :l, '1 hour') AS id \gset
SELECT pg_temp.ok(park_callback(:j, :l, :'id') = 'parked', 'parked');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.ok(resume_callback(:'id', '{"rr": 2}'), 'resume of a parked attempt at REPEATABLE READ');
COMMIT;
SELECT pg_temp.ok(pg_temp.outcome(:j, :l) = 'p' AND (SELECT resume_payload = '{"rr": 2}' FROM ready WHERE id = :j),
                  'continued');

SELECT dblink_disconnect('h') AS ignore \gset
SELECT dblink_disconnect('r1') AS ignore \gset
SELECT dblink_disconnect('r2') AS ignore \gset
SELECT dblink_disconnect('l') AS ignore \gset
\echo '40_callbacks: all expectations held'
