-- Tests of part 50 (rescue_attempts, rescue_stale, prune_expired, maintain, cancel_job,
-- retry_job) over the ledger layout.
--
--   a schema installed at the version before the ledger with jobs, then upgraded (tests/adapters/postgres/ledger_scenarios_pgtest.cpp)
--   psql -X -v ON_ERROR_STOP=1 -v s=SCHEMA -v root=REPOSITORY -f tests/sql/ledger/50_admin.sql DSN
--
-- Needs the state --fill leaves: job 1 open with the legacy run lease 1, job 2 completed with the
-- legacy run lease 1, job 3 available, job 4 scheduled. Other jobs are written directly into
-- the layout (spec and ready row; a claims row and its open_claims entry; closures; the claim's
-- settled_claims row as the maintenance pass writes it, which the maintain section checks against
-- the pass's own), so the tests depend on no other part's enqueue, claim or closers, except
-- complete_job and complete_batch (a caller's closer beside rescue and cancel, a late closer after
-- them), fail_attempt, snooze_attempt and cancel_attempt (late closers of a pruned claim;
-- cancel_job calls the last), attempt_evidence, list_queues and queue_depths, and what maintain
-- calls (promote_due, enqueue_due_schedules); the last section installs the trace recorder
-- (tools/trace/recorder.sql). Time passes by moving timestamps back (a settled
-- claim's closures and its ripe_at together). Second sessions run psql (same host, port,
-- database, user), in the background when they must wait. Every failed expectation raises.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;
SET search_path = :"s", public;
\pset format unaligned
\pset tuples_only on
\o /dev/null
\setenv PGHOST :HOST
\setenv PGPORT :PORT
\setenv PGDATABASE :DBNAME
\setenv PGUSER :USER
\set pgopt '--search_path=' :s ' -c client_min_messages=warning'
\setenv PGOPTIONS :pgopt
\set tmp `mktemp -d`
\setenv TA_TMP :tmp
SELECT set_config('ta.s', :'s', false);

-- ---- helpers ----------------------------------------------------------------------------------

CREATE FUNCTION pg_temp.check(ok boolean, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION 'expectation failed: %', what;
  END IF;
END $$;

-- 'sqlstate message' of running `stmt`, NULL when it succeeds; undone either way.
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    EXECUTE stmt;
    RAISE EXCEPTION USING ERRCODE = 'ZZ999';
  EXCEPTION WHEN SQLSTATE 'ZZ999' THEN
    RETURN NULL;
  WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
  END;
END $$;

-- A job as enqueue writes it: its spec and its ready row (optionally its unique key).
CREATE FUNCTION pg_temp.job(queue text, max_attempts int DEFAULT 3, unique_key text DEFAULT NULL,
                            kind text DEFAULT 'k') RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_id bigint := nextval(current_setting('ta.s') || '.job_id_seq');
BEGIN
  INSERT INTO specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
  VALUES (v_id, queue, kind, jsonb_build_object('n', v_id), 2, max_attempts, '{"m": 1}', now());
  INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt)
  VALUES (v_id, queue, 2, now(), now(), 0, 0);
  IF unique_key IS NOT NULL THEN
    INSERT INTO key_holders AS h VALUES (job.queue, job.unique_key, v_id)
    ON CONFLICT ON CONSTRAINT key_holders_pkey DO UPDATE SET job_id = excluded.job_id;
    INSERT INTO job_keys VALUES (v_id, job.queue, job.unique_key);
  END IF;
  RETURN v_id;
END $$;

-- A claim of the given ready jobs as the claim writes it: their ready rows deleted, one claims
-- row in the given order (attempt + 1, fresh secrets, carried error and progress), its
-- open_claims entry. Returns the claim id.
CREATE FUNCTION pg_temp.claim(ids bigint[], worker text DEFAULT 'w') RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  cid bigint;
  n int;
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS taken (id bigint, queue text, attempt int, run_at timestamptz,
                                         last_error text, progress jsonb, ord int);
  TRUNCATE taken;
  WITH gone AS (DELETE FROM ready r WHERE r.id = ANY (ids) RETURNING r.*)
  INSERT INTO taken SELECT g.id, g.queue, g.attempt, g.run_at, g.last_error, g.progress, array_position(ids, g.id)
    FROM gone g;
  GET DIAGNOSTICS n = ROW_COUNT;
  PERFORM pg_temp.check(n = cardinality(ids), 'claim: every job was ready');
  cid := nextval(current_setting('ta.s') || '.claim_id_seq');
  INSERT INTO claims (claim_id, queue, worker, claimed_at, deadline_at, lo, hi, job_ids, attempts, secrets,
                      run_ats, last_errors, progress)
  SELECT cid, min(queue), worker, now(), NULL, min(id), max(id), array_agg(id ORDER BY ord),
         array_agg(attempt + 1 ORDER BY ord), array_agg(gen_random_uuid() ORDER BY ord),
         array_agg(run_at ORDER BY ord),
         CASE WHEN count(last_error) > 0 THEN array_agg(last_error ORDER BY ord) END,
         CASE WHEN count(progress) > 0 THEN array_agg(progress ORDER BY ord) END
    FROM taken;
  INSERT INTO open_claims (claim_id, queue) SELECT cid, min(queue) FROM taken;
  RETURN cid;
END $$;

-- The run lease of the job's latest claim item, and its token.
CREATE FUNCTION pg_temp.lease(job bigint) RETURNS bigint LANGUAGE sql AS $$
  SELECT i.run_lease FROM claim_items i WHERE i.job_id = job ORDER BY i.claim_id DESC LIMIT 1
$$;
CREATE FUNCTION pg_temp.token(job bigint) RETURNS text LANGUAGE sql AS $$
  SELECT 'tn2:' || i.job_id || ':' || i.run_lease || ':' || encode(uuid_send(i.secret), 'hex')
    FROM claim_items i WHERE i.job_id = job ORDER BY i.claim_id DESC LIMIT 1
$$;

-- The outcome of the job's latest claim item ('' while open, NULL when it has none).
CREATE FUNCTION pg_temp.last_outcome(job bigint) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce(x.outcome::text, '')
    FROM (SELECT i.claim_id, i.pos FROM claim_items i WHERE i.job_id = job ORDER BY i.claim_id DESC LIMIT 1) i
    LEFT JOIN closures x ON x.claim_id = i.claim_id AND x.pos = i.pos
$$;

CREATE FUNCTION pg_temp.close(job bigint, outcome "char", ago interval DEFAULT '0') RETURNS void LANGUAGE sql AS $$
  INSERT INTO closures (claim_id, pos, outcome, closed_at)
  SELECT i.claim_id, i.pos, outcome, now() - ago
    FROM claim_items i WHERE i.job_id = job ORDER BY i.claim_id DESC LIMIT 1
$$;

CREATE FUNCTION pg_temp.state(job bigint) RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(j.state, ',') FROM jobs j WHERE j.id = job
$$;

-- The claims of the jobs.
CREATE FUNCTION pg_temp.claims_of(ids bigint[]) RETURNS bigint[] LANGUAGE sql AS $$
  SELECT array_agg(DISTINCT i.claim_id) FROM claim_items i WHERE i.job_id = ANY (ids)
$$;

-- A time of the last minute (statements outside a transaction each have their own now()).
CREATE FUNCTION pg_temp.recent(t timestamptz) RETURNS boolean LANGUAGE sql AS $$
  SELECT t > now() - interval '1 minute' AND t <= clock_timestamp()
$$;

CREATE FUNCTION pg_temp.lock_free(job bigint, lease bigint) RETURNS boolean LANGUAGE sql AS $$
  SELECT NOT EXISTS (SELECT FROM pg_locks l
                      WHERE l.locktype = 'advisory' AND l.granted
                        AND l.classid::int = hashtext(current_setting('ta.s') || '.attempt')
                        AND l.objid::int = attempt_lock_key(job, lease))
$$;

-- Waits (up to 10 s) until another session runs a statement containing `marker` and waits on
-- a lock.
CREATE FUNCTION pg_temp.await_lock(marker text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..200 LOOP
    PERFORM pg_stat_clear_snapshot();
    IF EXISTS (SELECT FROM pg_stat_activity a
                WHERE a.pid <> pg_backend_pid() AND a.state = 'active' AND position(marker IN a.query) > 0
                  AND a.wait_event_type = 'Lock') THEN
      RETURN;
    END IF;
    PERFORM pg_sleep(0.05);
  END LOOP;
  RAISE EXCEPTION 'expectation failed: no session waited in %', marker;
END $$;

-- ---- rescue_attempts --------------------------------------------------------------------------

SELECT pg_temp.check(pg_temp.err('SELECT * FROM rescue_attempts(NULL)') LIKE '22023 tenure.rescue_stale: stale_after%'
                     AND pg_temp.err($q$SELECT * FROM rescue_attempts('-1 second')$q$) LIKE '22023 %',
                     'rescue: stale_after must be a non-negative interval');

-- 1. The legacy open attempt of --fill: not stale at 1 hour, rescued at 0 seconds, back in ready
--    with its lease and attempt; its holder is told on the cancel channel.
SELECT pg_temp.check(pg_temp.state(1) = 'running' AND pg_temp.lease(1) = 1, 'fill: job 1 running with lease 1');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM rescue_attempts('1 hour')), 'rescue: nothing stale at 1 hour');
\set listen_sql 'LISTEN ' :s '_cancel'
\set bg `(psql -X -qAt -c :'listen_sql' -c "SELECT pg_sleep(1) /* ta_listen */" -c "SELECT 'DONE'" > "$TA_TMP/listen" 2>&1) >/dev/null 2>&1 & echo started`
DO $$ BEGIN
  FOR i IN 1..200 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN EXISTS (SELECT FROM pg_stat_activity a WHERE a.state = 'active' AND a.query LIKE '%ta_listen%'
                                                        AND a.pid <> pg_backend_pid());
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT pg_temp.check(string_agg(r.job_id || ':' || r.run_lease || ':' || r.queue || ':' || r.new_state, ',') = '1:1:q:available',
                     'rescue: the legacy attempt rescued: ' || coalesce(string_agg(r.job_id || ':' || r.run_lease || ':' || r.new_state, ','), '-'))
  FROM rescue_attempts('0 seconds') r;
SELECT pg_temp.check(r.run_lease = 1 AND r.attempt = 1 AND pg_temp.recent(r.run_at) AND r.last_error = 'rescued: no heartbeat for 00:00:00'
                     AND r.progress IS NULL AND r.resume_payload IS NULL AND r.queue = 'q', 'rescue: the ready row of job 1')
  FROM ready r WHERE r.id = 1;
SELECT pg_temp.check(x.outcome = 'a' AND x.last_error IS NULL AND x.progress IS NULL, 'rescue: closure a')
  FROM closures x JOIN legacy_attempts l USING (claim_id, pos) WHERE l.job_id = 1 AND l.run_lease = 1;
SELECT pg_temp.check(pg_temp.state(1) = 'available' AND (SELECT attempt FROM jobs WHERE id = 1) = 1, 'rescue: job 1 available');
\set got `for i in $(seq 200); do grep -q DONE "$TA_TMP/listen" && break; sleep 0.05; done; grep -o 'with payload "[^"]*"' "$TA_TMP/listen" | tr '\n' ' '`
SELECT pg_temp.check(:'got' = 'with payload "1:1" ', 'rescue: the cancel channel: ' || :'got');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM rescue_attempts('0 seconds')), 'rescue: a second pass finds nothing');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM complete_batch(ARRAY[1]::bigint[], ARRAY[1]::bigint[])), 'rescue: a late completion is stale');

-- 2. A claim of five: one heartbeats, one carries progress, one waits on a callback that has not
--    timed out, one whose callback timed out, one past its hard deadline. Staleness is one hour.
SELECT pg_temp.job('r_q') AS r1, pg_temp.job('r_q') AS r2, pg_temp.job('r_q') AS r3, pg_temp.job('r_q') AS r4,
       pg_temp.job('r_q') AS r5, pg_temp.job('r_q') AS r6 \gset
UPDATE ready SET last_error = 'earlier', progress = '{"step": 1}' WHERE id = :r2;
SELECT pg_temp.claim(ARRAY[:r1, :r2, :r3, :r4, :r5]) AS rc \gset
SELECT pg_temp.claim(ARRAY[:r6]) AS rc6 \gset
UPDATE claims SET claimed_at = now() - interval '2 hours' WHERE claim_id = :rc;
UPDATE claims SET deadline_at = now() - interval '1 second' WHERE claim_id = :rc6;
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES
  (:r1, pg_temp.lease(:r1), now() - interval '10 seconds', NULL),
  (:r2, pg_temp.lease(:r2), now() - interval '3 hours', '{"step": 2}');
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, callback_id, callback_timeout, callback_deadline,
                           waiting_since, waiting) VALUES
  (:r3, pg_temp.lease(:r3), now() - interval '3 hours', gen_random_uuid(), '1 day', now() + interval '1 hour',
   now() - interval '3 hours', true),
  (:r4, pg_temp.lease(:r4), now(), gen_random_uuid(), '1 minute', now() - interval '1 second', now(), true),
  (:r6, pg_temp.lease(:r6), now(), NULL, NULL, NULL, NULL, false);
SELECT pg_temp.check(string_agg(r.job_id || ':' || r.new_state, ',' ORDER BY r.job_id)
                     = format('%s:available,%s:available,%s:available,%s:available', :r2, :r4, :r5, :r6),
                     'rescue: the stale ones of the claim: ' || string_agg(r.job_id || ':' || r.new_state, ',' ORDER BY r.job_id))
  FROM rescue_attempts('1 hour') r;
SELECT pg_temp.check(string_agg(r.id || ' ' || r.last_error, ',' ORDER BY r.id)
                     = format('%s rescued: no heartbeat for 01:00:00,%s rescued: callback timed out,%s rescued: no heartbeat for 01:00:00,%s rescued: hard deadline passed',
                              :r2, :r4, :r5, :r6),
                     'rescue: why, in the ready rows')
  FROM ready r WHERE r.id IN (:r1, :r2, :r3, :r4, :r5, :r6);
SELECT pg_temp.check(r.progress = '{"step": 2}' AND r.attempt = 1 AND r.run_lease = :rc * 65536 + 2,
                     'rescue: the live progress carried, the lease kept') FROM ready r WHERE r.id = :r2;
SELECT pg_temp.check(pg_temp.state(:r1) = 'running' AND pg_temp.state(:r3) = 'waiting_external', 'rescue: the live ones stay');

-- 2b. The hard deadline a resume pushed back (attempt_state.deadline_at) is the attempt's own.
SELECT pg_temp.job('r_dl') AS dl1, pg_temp.job('r_dl') AS dl2 \gset
SELECT pg_temp.claim(ARRAY[:dl1, :dl2]) AS dlc \gset
UPDATE claims SET deadline_at = now() - interval '1 minute' WHERE claim_id = :dlc;
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, deadline_at) VALUES
  (:dl1, pg_temp.lease(:dl1), now(), now() + interval '1 hour'),
  (:dl2, pg_temp.lease(:dl2), now(), now() - interval '1 second');
SELECT pg_temp.check(string_agg(r.job_id::text, ',') = :'dl2', 'rescue: the attempt''s own deadline decides')
  FROM rescue_attempts('1 hour') r;
SELECT pg_temp.check((SELECT last_error FROM ready WHERE id = :dl2) = 'rescued: hard deadline passed'
                     AND pg_temp.state(:dl1) = 'running', 'rescue: past its own deadline');

-- 3. Attempts spent: failed ('f', the error and the attempt's progress in the closure), or
--    dead-lettered ('d', the dead_letter row with the payload) where the queue asks for it.
SELECT configure_queue('r_dlq', '{"dead_letter": true}') IS NULL AS x \gset
SELECT pg_temp.job('r_fail', 1) AS f1, pg_temp.job('r_dlq', 1) AS d1 \gset
UPDATE ready SET progress = '{"carried": true}' WHERE id = :d1;
SELECT pg_temp.claim(ARRAY[:f1]) AS fc, pg_temp.claim(ARRAY[:d1]) AS dc \gset
UPDATE claims SET claimed_at = now() - interval '2 hours' WHERE claim_id IN (:fc, :dc);
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress)
VALUES (:f1, pg_temp.lease(:f1), now() - interval '2 hours', '{"at": 7}');
SELECT pg_temp.check(string_agg(r.job_id || ':' || r.new_state, ',' ORDER BY r.job_id) = format('%s:failed,%s:failed', :f1, :d1),
                     'rescue: spent attempts fail')
  FROM rescue_attempts('1 hour') r;
SELECT pg_temp.check(x.outcome = 'f' AND x.last_error = 'rescued: no heartbeat for 01:00:00' AND x.progress = '{"at": 7}',
                     'rescue: closure f') FROM closures x WHERE x.claim_id = :fc;
SELECT pg_temp.check(j.state = 'failed' AND j.last_error = 'rescued: no heartbeat for 01:00:00' AND j.progress = '{"at": 7}'
                     AND j.attempt = 1 AND NOT j.dead_lettered AND pg_temp.recent(j.finalized_at), 'rescue: the failed job in jobs')
  FROM jobs j WHERE j.id = :f1;
SELECT pg_temp.check(d.state = 'failed', 'rescue: the failed job in done') FROM done d WHERE d.id = :f1;
SELECT pg_temp.check(x.outcome = 'd' AND x.last_error IS NULL, 'rescue: closure d') FROM closures x WHERE x.claim_id = :dc;
SELECT pg_temp.check(d.kind = 'k' AND d.args = jsonb_build_object('n', :d1) AND d.metadata = '{"m": 1}' AND d.attempt = 1
                     AND d.max_attempts = 1 AND d.run_lease = :dc * 65536 + 1 AND d.last_error = 'rescued: no heartbeat for 01:00:00'
                     AND d.progress = '{"carried": true}' AND pg_temp.recent(d.finalized_at), 'rescue: the dead_letter row')
  FROM dead_letter d WHERE d.id = :d1;
SELECT pg_temp.check(string_agg(j.state || ' ' || j.dead_lettered, ',') = 'failed true', 'rescue: dead-lettered in jobs')
  FROM jobs j WHERE j.id = :d1;
SELECT pg_temp.check(rescue_stale('1 hour') = 0, 'rescue_stale: nothing left to rescue');

-- 4. A caller's completion in progress holds the attempt's lock: rescue in another session passes
--    it by at once (and rescues the other stale attempt of the claim); the completion stands.
SELECT pg_temp.job('r_lock') AS l1, pg_temp.job('r_lock') AS l2 \gset
SELECT pg_temp.claim(ARRAY[:l1, :l2]) AS lc \gset
UPDATE claims SET claimed_at = now() - interval '1 hour' WHERE claim_id = :lc;
SELECT pg_temp.token(:l1) AS l1_token \gset
BEGIN;
SELECT pg_temp.check((SELECT count(*) FROM complete_job(:'l1_token')) = 1, 'complete_job left uncommitted');
\set t0 `date +%s%N`
\set got `psql -X -qAt -c "SET lock_timeout = '5s'" -c "SELECT string_agg(job_id::text, ',') FROM rescue_attempts('30 minutes') WHERE queue = 'r_lock'" 2>&1`
\set t1 `date +%s%N`
SELECT pg_temp.check(:'got' = :'l2', 'rescue beside a caller''s completion: only the other attempt, not ' || :'got');
SELECT pg_temp.check((:t1::numeric - :t0::numeric) / 1e9 < 2, 'rescue did not wait');
COMMIT;
SELECT pg_temp.check(pg_temp.state(:l1) = 'completed' AND pg_temp.state(:l2) = 'available', 'the completion stands');

-- 5. Rescue's own locks: held to its commit, a caller's complete_job waits for them and then is
--    refused (TN001); rescue holds no lock of an attempt that was not stale.
SELECT pg_temp.job('r_lock2') AS m1, pg_temp.job('r_lock2') AS m2 \gset
SELECT pg_temp.claim(ARRAY[:m1]) AS mc1, pg_temp.claim(ARRAY[:m2]) AS mc2 \gset
UPDATE claims SET claimed_at = now() - interval '1 hour' WHERE claim_id = :mc1;
SELECT pg_temp.token(:m1) AS m1_token, pg_temp.lease(:m1) AS m1_lease, pg_temp.lease(:m2) AS m2_lease \gset
SELECT format('SELECT * FROM complete_job(%L) /* ta_late */', :'m1_token') AS bg_sql \gset
\setenv TA_SQL :bg_sql
BEGIN;
SELECT pg_temp.check((SELECT string_agg(job_id::text, ',') FROM rescue_attempts('30 minutes') WHERE queue = 'r_lock2') = :'m1',
                     'rescue of the stale one (left uncommitted)');
SELECT pg_temp.check(NOT pg_temp.lock_free(:m1, :m1_lease) AND pg_temp.lock_free(:m2, :m2_lease),
                     'rescue holds the lock of what it rescued only');
\! (psql -X -qAt -c "$TA_SQL" > "$TA_TMP/late" 2>&1; echo DONE >> "$TA_TMP/late") < /dev/null > /dev/null 2>&1 &
SELECT pg_temp.await_lock('ta_late');
COMMIT;
\set got `for i in $(seq 200); do grep -q DONE "$TA_TMP/late" && break; sleep 0.05; done; cat "$TA_TMP/late"`
SELECT pg_temp.check(:'got' LIKE '%stale attempt%', 'the caller''s completion after rescue: TN001, not ' || :'got');
SELECT pg_temp.check(pg_temp.state(:m1) = 'available', 'rescued');

-- ---- cancel_job ---------------------------------------------------------------------------------

-- 1. Available (job 3 of --fill): its terminal record, a one-item claim not in open_claims.
SELECT pg_temp.check(cancel_job(3), 'cancel: available job');
SELECT pg_temp.check(c.worker IS NULL AND c.lo = 3 AND c.hi = 3 AND c.job_ids = '{3}' AND c.attempts = '{0}'
                     AND c.run_leases = '{0}' AND cardinality(c.secrets) = 1 AND c.deadline_at IS NULL
                     AND pg_temp.recent(c.claimed_at) AND x.outcome = 'x' AND pg_temp.recent(x.closed_at)
                     AND NOT EXISTS (SELECT FROM open_claims o WHERE o.claim_id = c.claim_id),
                     'cancel: the terminal record')
  FROM claims c JOIN closures x ON x.claim_id = c.claim_id AND x.pos = 1 WHERE 3 = ANY (c.job_ids);
SELECT pg_temp.check(NOT EXISTS (SELECT FROM ready WHERE id = 3) AND pg_temp.state(3) = 'cancelled'
                     AND (SELECT run_lease FROM jobs WHERE id = 3) = 0, 'cancel: cancelled in jobs');
SELECT pg_temp.check(d.state = 'cancelled' AND d.run_lease = 0, 'cancel: in done') FROM done d WHERE d.id = 3;
SELECT pg_temp.check(r.queue = 'q' AND r.ripe_at = x.closed_at + interval '24 hours' AND r.retired_at IS NULL
                     AND x.closed_at = c.claimed_at, 'cancel: the record settled, ripe at the default 24 hours')
  FROM claims c JOIN closures x ON x.claim_id = c.claim_id JOIN settled_claims r ON r.claim_id = c.claim_id
 WHERE 3 = ANY (c.job_ids);
SELECT pg_temp.check(NOT cancel_job(3), 'cancel: a second cancel');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM attempt_at(3, 0)), 'cancel: the record is no attempt');

-- 2. Scheduled (job 4) and retryable (carried error and progress kept).
SELECT pg_temp.check(cancel_job(4) AND pg_temp.state(4) = 'cancelled', 'cancel: scheduled job');
SELECT configure_queue('c_ret', '{"retain_cancelled": "2h"}') IS NULL AS x \gset
SELECT pg_temp.job('c_ret') AS cq \gset
SELECT pg_temp.check(cancel_job(:cq), 'cancel: a job of a queue with settings');
SELECT pg_temp.check(count(*) = 1 AND bool_and(r.ripe_at = x.closed_at + interval '2 hours' AND r.queue = 'c_ret'),
                     'cancel: the record ripe at the queue''s retain_cancelled')
  FROM settled_claims r JOIN closures x USING (claim_id) WHERE r.claim_id = ANY (pg_temp.claims_of(ARRAY[:cq]));
SELECT pg_temp.job('c_q') AS cr \gset
SELECT pg_temp.claim(ARRAY[:cr]) AS x \gset
SELECT pg_temp.close(:cr, 'r');
INSERT INTO deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt, last_error, progress)
SELECT :cr, 'c_q', 2, now() + interval '1 hour', now(), 'retryable', pg_temp.lease(:cr), 1, 'boom', '{"p": 1}';
SELECT pg_temp.check(cancel_job(:cr), 'cancel: retryable job');
SELECT pg_temp.check(j.state = 'cancelled' AND j.attempt = 1 AND j.last_error = 'boom' AND j.progress = '{"p": 1}'
                     AND j.run_lease = (SELECT run_lease FROM claim_items WHERE job_id = :cr ORDER BY claim_id LIMIT 1),
                     'cancel: the retryable job keeps its lease, error and progress') FROM jobs j WHERE j.id = :cr;
SELECT pg_temp.check((SELECT count(*) FROM claims WHERE :cr = ANY (job_ids)) = 2 AND pg_temp.last_outcome(:cr) = 'x',
                     'cancel: the record is the later claim');

-- 3. Running: closed 'x' by cancel_attempt, the holder told; a late completion is stale.
SELECT pg_temp.job('c_q') AS cx, pg_temp.job('c_q') AS cy \gset
SELECT pg_temp.claim(ARRAY[:cx, :cy]) AS ccl \gset
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES (:cx, pg_temp.lease(:cx), now(), '{"done": 1}');
\set bg `(psql -X -qAt -c :'listen_sql' -c "SELECT pg_sleep(1) /* ta_listen2 */" -c "SELECT 'DONE'" > "$TA_TMP/listen2" 2>&1) >/dev/null 2>&1 & echo started`
DO $$ BEGIN
  FOR i IN 1..200 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN EXISTS (SELECT FROM pg_stat_activity a WHERE a.state = 'active' AND a.query LIKE '%ta_listen2%'
                                                        AND a.pid <> pg_backend_pid());
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT pg_temp.check(cancel_job(:cx), 'cancel: running job');
\set got `for i in $(seq 200); do grep -q DONE "$TA_TMP/listen2" && break; sleep 0.05; done; grep -o 'with payload "[^"]*"' "$TA_TMP/listen2" | tr '\n' ' '`
SELECT pg_temp.check(x.outcome = 'x' AND x.last_error = 'cancelled by admin' AND x.progress = '{"done": 1}',
                     'cancel: closure x') FROM closures x WHERE x.claim_id = :ccl AND x.pos = 1;
SELECT pg_temp.check(j.state = 'cancelled' AND j.last_error = 'cancelled by admin' AND j.progress = '{"done": 1}'
                     AND j.claimed_at IS NULL AND j.worker IS NULL, 'cancel: cancelled in jobs') FROM jobs j WHERE j.id = :cx;
SELECT pg_temp.check(pg_temp.state(:cy) = 'running', 'cancel: the other item of the claim runs on');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM complete_batch(ARRAY[:cx]::bigint[], ARRAY[pg_temp.lease(:cx)])),
                     'cancel: a late completion is stale');
SELECT pg_temp.check(NOT cancel_job(:cx), 'cancel: a second cancel of it');
SELECT pg_temp.check(:'got' = format('with payload "%s:%s" ', :cx, pg_temp.lease(:cx)), 'cancel: the cancel channel: ' || :'got');

-- 4. Finished and unknown jobs.
SELECT pg_temp.check(NOT cancel_job(2), 'cancel: completed job (legacy)');
SELECT pg_temp.check(NOT cancel_job(:d1), 'cancel: dead-lettered job');
SELECT pg_temp.check(NOT cancel_job(:f1), 'cancel: failed job');
SELECT pg_temp.check(pg_temp.err('SELECT cancel_job(999999999)') = 'TN003 job 999999999 not found', 'cancel: unknown job');

-- 5. A caller's completion in progress holds the attempt's lock: cancel in another session waits
--    for it (here until its lock_timeout); once it committed, cancel answers false.
SELECT pg_temp.job('c_lock') AS k1 \gset
SELECT pg_temp.claim(ARRAY[:k1]) AS x \gset
SELECT pg_temp.token(:k1) AS k1_token \gset
BEGIN;
SELECT pg_temp.check((SELECT count(*) FROM complete_job(:'k1_token')) = 1, 'complete_job left uncommitted');
\set t0 `date +%s%N`
\set got `psql -X -qAt -c "SET lock_timeout = '1s'" -c "SELECT cancel_job(:k1)" 2>&1`
\set t1 `date +%s%N`
SELECT pg_temp.check(:'got' LIKE '%lock timeout%', 'cancel beside a caller''s completion waits for it, not ' || :'got');
SELECT pg_temp.check((:t1::numeric - :t0::numeric) / 1e9 >= 0.9, 'cancel waited for the caller''s lock');
COMMIT;
SELECT pg_temp.check(NOT cancel_job(:k1) AND pg_temp.state(:k1) = 'completed', 'cancel after the completion: false');

-- 6. A legacy open attempt (lease below 65536, located through legacy_attempts).
SELECT pg_temp.job('c_leg') AS lg \gset
SELECT nextval(current_setting('ta.s') || '.claim_id_seq') AS lgc \gset
DELETE FROM ready WHERE id = :lg;
INSERT INTO claims (claim_id, queue, worker, claimed_at, lo, hi, job_ids, attempts, secrets, run_ats, run_leases)
VALUES (:lgc, 'c_leg', 'w', now(), :lg, :lg, ARRAY[:lg]::bigint[], '{3}', ARRAY[gen_random_uuid()], ARRAY[now()], '{7}');
INSERT INTO legacy_attempts (job_id, run_lease, claim_id, pos) VALUES (:lg, 7, :lgc, 1);
INSERT INTO open_claims (claim_id, queue) VALUES (:lgc, 'c_leg');
SELECT pg_temp.check(pg_temp.state(:lg) = 'running', 'legacy attempt running');
SELECT pg_temp.check(cancel_job(:lg), 'cancel: a legacy attempt');
SELECT pg_temp.check(pg_temp.state(:lg) = 'cancelled' AND (SELECT run_lease FROM jobs WHERE id = :lg) = 7
                     AND (SELECT outcome FROM closures WHERE claim_id = :lgc) = 'x', 'cancel: the legacy attempt closed');

-- ---- retry_job ----------------------------------------------------------------------------------

-- 1. Completed (job 2 of --fill, a legacy terminal record): ready again with its lease, attempt 0;
--    the completion stays as history, released ('e'); the ready row wins in jobs.
SELECT pg_temp.check(r.ripe_at = x.closed_at + interval '24 hours' AND r.retired_at IS NULL AND r.queue = 'q',
                     'migration: the terminal history settled, ripe at its retention')
  FROM legacy_attempts l JOIN closures x USING (claim_id, pos) JOIN settled_claims r USING (claim_id)
 WHERE l.job_id = 2 AND l.run_lease = 1;
SELECT pg_temp.check(retry_job(2), 'retry: completed job');
SELECT pg_temp.check(r.run_lease = 1 AND r.attempt = 0 AND pg_temp.recent(r.run_at) AND r.queue = 'q' AND r.resume_payload IS NULL,
                     'retry: the ready row') FROM ready r WHERE r.id = 2;
SELECT pg_temp.check(pg_temp.state(2) = 'available' AND pg_temp.last_outcome(2) = 'e', 'retry: available, the closure kept (released)');
SELECT pg_temp.check(NOT retry_job(2), 'retry: a second retry (the job waits)');
SELECT pg_temp.claim(ARRAY[2]) AS rc2 \gset
SELECT pg_temp.check(pg_temp.state(2) = 'running' AND (SELECT attempt FROM jobs WHERE id = 2) = 1
                     AND pg_temp.lease(2) = :rc2 * 65536 + 1, 'retry: claimed again, a new lease');
SELECT pg_temp.check(NOT retry_job(2), 'retry: running job');
SELECT pg_temp.close(2, 'c');
SELECT pg_temp.check(pg_temp.state(2) = 'completed', 'retry: completed again');

-- 2. Cancelled (job 3: its terminal record) and failed (carried error and progress).
SELECT pg_temp.check(retry_job(3), 'retry: cancelled job');
SELECT pg_temp.check(pg_temp.state(3) = 'available' AND (SELECT run_lease FROM ready WHERE id = 3) = 0, 'retry: the cancelled job ready');
SELECT pg_temp.check(retry_job(:f1), 'retry: failed job');
SELECT pg_temp.check(r.last_error = 'rescued: no heartbeat for 01:00:00' AND r.progress = '{"at": 7}' AND r.attempt = 0
                     AND r.run_lease = :fc * 65536 + 1, 'retry: the failed job''s error and progress') FROM ready r WHERE r.id = :f1;

-- 3. Dead-lettered: its dead_letter row goes, the job is ready again (its spec kept).
SELECT pg_temp.check(retry_job(:d1), 'retry: dead-lettered job');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM dead_letter WHERE id = :d1) AND pg_temp.state(:d1) = 'available'
                     AND (SELECT progress FROM ready WHERE id = :d1) = '{"carried": true}'
                     AND (SELECT run_lease FROM ready WHERE id = :d1) = :dc * 65536 + 1, 'retry: the dead-lettered job ready');
-- ... and one dead-lettered before this layout (no spec): its spec comes back from the row.
SELECT nextval(current_setting('ta.s') || '.job_id_seq') AS od \gset
INSERT INTO dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at, finalized_at,
                         last_error, progress, metadata)
VALUES (:od, 'old_q', 'old', '{"o": 1}', 3, 2, 2, 2, now(), now() - interval '1 day', now(), 'gone', NULL, '{"t": 1}');
SELECT pg_temp.check(pg_temp.state(:od) = 'failed', 'an old dead-lettered job');
SELECT pg_temp.check(retry_job(:od), 'retry: an old dead-lettered job');
SELECT pg_temp.check(j.state = 'available' AND j.kind = 'old' AND j.args = '{"o": 1}' AND j.priority = 3 AND j.max_attempts = 2
                     AND j.metadata = '{"t": 1}' AND j.run_lease = 2 AND j.attempt = 0 AND j.last_error = 'gone'
                     AND j.created_at < now() - interval '23 hours', 'retry: the old dead-lettered job ready, its spec back')
  FROM jobs j WHERE j.id = :od;

-- 4. Not finished, unknown.
SELECT pg_temp.check(NOT retry_job(:r1) AND NOT retry_job(:r3) AND NOT retry_job(:r2), 'retry: running, waiting, available');
SELECT pg_temp.check(pg_temp.err('SELECT retry_job(999999999)') LIKE 'TN003 job 999999999 not found', 'retry: unknown job');

-- 5. Unique keys: the key comes back, unless a live job holds it (23505, nothing changed).
SELECT pg_temp.job('u_q', unique_key => 'K') AS u1 \gset
SELECT pg_temp.claim(ARRAY[:u1]) AS x \gset
SELECT pg_temp.close(:u1, 'c');
SELECT pg_temp.job('u_q', unique_key => 'K') AS u2 \gset
SELECT pg_temp.check(pg_temp.err(format('SELECT retry_job(%s)', :u1))
                     = format('23505 job %s cannot be retried: its unique_key K is held by live job %s of queue u_q', :u1, :u2),
                     'retry: the key is held by a live job');
SELECT pg_temp.check(pg_temp.state(:u1) = 'completed', 'retry refused: nothing changed');
SELECT pg_temp.claim(ARRAY[:u2]) AS x \gset
SELECT pg_temp.check(pg_temp.err(format('SELECT retry_job(%s)', :u1)) LIKE '23505 %', 'retry: the key is held by a running job');
SELECT pg_temp.close(:u2, 'f');
SELECT pg_temp.check(retry_job(:u1), 'retry: the key is free');
SELECT pg_temp.check((SELECT job_id FROM key_holders WHERE queue = 'u_q' AND unique_key = 'K') = :u1, 'retry: the key taken back');

-- 6. Two retries of one job: the second waits for the first (the claim row's lock) and answers false.
SELECT pg_temp.job('t_q') AS t1 \gset
SELECT pg_temp.claim(ARRAY[:t1]) AS x \gset
SELECT pg_temp.close(:t1, 'f');
\set bg_sql 'SELECT retry_job(' :t1 ') /* ta_retry2 */'
\setenv TA_SQL :bg_sql
BEGIN;
SELECT pg_temp.check(retry_job(:t1), 'retry (left uncommitted)');
\! (psql -X -qAt -c "$TA_SQL" > "$TA_TMP/retry2" 2>&1; echo DONE >> "$TA_TMP/retry2") < /dev/null > /dev/null 2>&1 &
SELECT pg_temp.await_lock('ta_retry2');
COMMIT;
\set got `for i in $(seq 200); do grep -q DONE "$TA_TMP/retry2" && break; sleep 0.05; done; head -1 "$TA_TMP/retry2"`
SELECT pg_temp.check(:'got' = 'f', 'the second retry: false, not ' || :'got');
SELECT pg_temp.check((SELECT count(*) FROM ready WHERE id = :t1) = 1 AND pg_temp.state(:t1) = 'available', 'retried once');

-- ---- prune_expired --------------------------------------------------------------------------------

SELECT pg_temp.check(pg_temp.err($q$SELECT prune_expired('30 seconds', 7, 0)$q$) LIKE '22023 tenure.prune_expired: max_rows must be >= 0 and batch >= 1'
                     AND pg_temp.err($q$SELECT prune_expired('30 seconds', -1, 1)$q$) LIKE '22023 %'
                     AND pg_temp.err($q$SELECT prune_expired('30 seconds', NULL, 1)$q$) LIKE '22023 %', 'prune: bounds');

-- The time a claim ripens, as the maintenance pass computes it when it settles the claim: the
-- latest of its closures' retention for their outcomes in its queue, at least its last closure
-- plus 5 minutes.
CREATE FUNCTION pg_temp.ripe(cid bigint) RETURNS timestamptz LANGUAGE sql AS $$
  SELECT greatest(max(x.closed_at) + interval '5 minutes',
                  max(x.closed_at + CASE x.outcome WHEN 'c' THEN coalesce(q.retain_completed, '24 hours')
                                                   WHEN 'x' THEN coalesce(q.retain_cancelled, '24 hours')
                                                   WHEN 'f' THEN coalesce(q.retain_failed, '7 days')
                                                   ELSE interval '0' END))
    FROM claims c JOIN closures x ON x.claim_id = c.claim_id LEFT JOIN queues q ON q.name = c.queue
   WHERE c.claim_id = cid
$$;

-- Settles closed claims as the maintenance pass does (the maintain section checks that it does).
CREATE FUNCTION pg_temp.settle(cids bigint[]) RETURNS void LANGUAGE sql AS $$
  DELETE FROM open_claims WHERE claim_id = ANY (cids);
  INSERT INTO settled_claims (claim_id, queue, ripe_at)
  SELECT c.claim_id, c.queue, pg_temp.ripe(c.claim_id) FROM claims c WHERE c.claim_id = ANY (cids);
$$;

-- Time passes for settled claims: their closures and ripe_at move back by `by`.
CREATE FUNCTION pg_temp.age(cids bigint[], by interval) RETURNS void LANGUAGE sql AS $$
  UPDATE closures SET closed_at = closed_at - by WHERE claim_id = ANY (cids);
  UPDATE settled_claims SET ripe_at = ripe_at - by WHERE claim_id = ANY (cids);
$$;

-- Finished jobs of known ages, one claim each unless said: n jobs of `queue`, closed `outcome`
-- `ago`, their claims settled. Returns their ids.
CREATE FUNCTION pg_temp.finished(n int, outcome "char", ago interval, queue text DEFAULT 'p_q', batch boolean DEFAULT false)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  ids bigint[] := ARRAY(SELECT pg_temp.job(queue) FROM generate_series(1, n));
BEGIN
  IF batch THEN
    PERFORM pg_temp.claim(ids);
  ELSE
    PERFORM pg_temp.claim(ARRAY[i]) FROM unnest(ids) i;
  END IF;
  PERFORM pg_temp.close(i, outcome, ago) FROM unnest(ids) i;
  PERFORM pg_temp.settle(pg_temp.claims_of(ids));
  RETURN ids;
END $$;

CREATE FUNCTION pg_temp.alive(ids bigint[]) RETURNS int LANGUAGE sql AS $$
  SELECT count(*)::int FROM specs WHERE id = ANY (ids)
$$;

-- The closures of the claims, and how many of the claims retention has retired (claim row gone,
-- closures kept).
CREATE FUNCTION pg_temp.kept(claim_ids bigint[]) RETURNS int LANGUAGE sql AS $$
  SELECT count(*)::int FROM closures x WHERE x.claim_id = ANY (claim_ids)
$$;
CREATE FUNCTION pg_temp.retired(claim_ids bigint[]) RETURNS int LANGUAGE sql AS $$
  SELECT count(*)::int FROM settled_claims r
   WHERE r.claim_id = ANY (claim_ids) AND r.retired_at IS NOT NULL
     AND NOT EXISTS (SELECT FROM claims c WHERE c.claim_id = r.claim_id)
$$;

-- Every closure has its claim row or its claim is retired; every retired claim has its closures
-- and no claim row; every claim outside open_claims is settled, and no settled claim is open.
CREATE FUNCTION pg_temp.consistent() RETURNS boolean LANGUAGE sql AS $$
  SELECT NOT EXISTS (SELECT FROM closures x
                      WHERE NOT EXISTS (SELECT FROM claims c WHERE c.claim_id = x.claim_id)
                        AND NOT EXISTS (SELECT FROM settled_claims r WHERE r.claim_id = x.claim_id AND r.retired_at IS NOT NULL))
     AND NOT EXISTS (SELECT FROM settled_claims r
                      WHERE r.retired_at IS NOT NULL
                        AND (NOT EXISTS (SELECT FROM closures x WHERE x.claim_id = r.claim_id)
                             OR EXISTS (SELECT FROM claims c WHERE c.claim_id = r.claim_id)))
     AND NOT EXISTS (SELECT FROM claims c
                      WHERE NOT EXISTS (SELECT FROM open_claims o WHERE o.claim_id = c.claim_id)
                        AND NOT EXISTS (SELECT FROM settled_claims r WHERE r.claim_id = c.claim_id AND r.retired_at IS NULL))
     AND NOT EXISTS (SELECT FROM settled_claims r JOIN open_claims o USING (claim_id))
$$;

-- 1. Retention per queue and terminal state, the dead letters, the floor, live jobs untouched.
--    Everything of a pruned job goes: spec, claim row, closures, keys, attempt_state.
SELECT configure_queue('short', '{"retain_completed": "1h", "retain_failed": "2h", "retain_cancelled": "10m", "dead_letter": true}') IS NULL AS x \gset
SELECT pg_temp.finished(3, 'c', '25 hours') AS p_c25, pg_temp.finished(2, 'c', '23 hours') AS p_c23,
       pg_temp.finished(3, 'x', '25 hours') AS p_x25, pg_temp.finished(2, 'f', '6 days') AS p_f6,
       pg_temp.finished(4, 'f', '8 days') AS p_f8,
       pg_temp.finished(5, 'c', '61 minutes', 'short') AS s_c61, pg_temp.finished(1, 'c', '59 minutes', 'short') AS s_c59,
       pg_temp.finished(2, 'x', '11 minutes', 'short') AS s_x11 \gset
INSERT INTO dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at, finalized_at)
SELECT nextval(current_setting('ta.s') || '.job_id_seq'), 'short', 'k', '{}', 2, 1, 1, 1, now(), now(), now() - a
  FROM (VALUES (interval '3 hours'), ('3 hours'), ('3 hours'), ('1 hour')) v(a);
-- a keyed job among the pruned, with attempt_state left of it
INSERT INTO job_keys (job_id, queue, unique_key) VALUES ((:'p_c25'::bigint[])[1], 'p_q', 'PK');
INSERT INTO key_holders (queue, unique_key, job_id) VALUES ('p_q', 'PK', (:'p_c25'::bigint[])[1]);
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at) VALUES ((:'p_c25'::bigint[])[1], pg_temp.lease((:'p_c25'::bigint[])[1]), now());
SELECT pg_temp.job('p_q') AS live1, pg_temp.job('p_live') AS live2 \gset
SELECT pg_temp.claim(ARRAY[:live2]) AS x \gset
UPDATE specs SET created_at = now() - interval '30 days' WHERE id IN (:live1, :live2);
SELECT array_agg(claim_id ORDER BY claim_id) AS p_claims FROM claim_items
 WHERE job_id = ANY (:'p_c25'::bigint[] || :'p_x25'::bigint[] || :'p_f8'::bigint[] || :'s_c61'::bigint[] || :'s_x11'::bigint[]) \gset
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.check(:pruned = 3 + 3 + 4 + 5 + 2 + 3, 'prune: the count of finished jobs removed, not ' || :pruned);
SELECT pg_temp.check(pg_temp.alive(:'p_c25') = 0 AND pg_temp.alive(:'p_c23') = 2 AND pg_temp.alive(:'p_x25') = 0
                     AND pg_temp.alive(:'p_f6') = 2 AND pg_temp.alive(:'p_f8') = 0 AND pg_temp.alive(:'s_c61') = 0
                     AND pg_temp.alive(:'s_c59') = 1 AND pg_temp.alive(:'s_x11') = 0, 'prune: the specs per queue and state');
SELECT pg_temp.check((SELECT count(*) FROM claim_items WHERE job_id = ANY (:'p_c25'::bigint[] || :'p_x25'::bigint[] || :'p_f8'::bigint[]
                                                                      || :'s_c61'::bigint[] || :'s_x11'::bigint[])) = 0
                     AND (SELECT count(*) FROM claim_items WHERE job_id = ANY (:'p_c23'::bigint[] || :'p_f6'::bigint[] || :'s_c59'::bigint[])) = 5,
                     'prune: the claim rows');
-- The removed rows' closures stay for a day, their claims retired; no other closure is without
-- its claim; the kept claims still wait, ripe later.
SELECT pg_temp.check((SELECT count(*) FROM settled_claims r WHERE r.claim_id = ANY (:'p_claims'::bigint[]) AND pg_temp.recent(r.retired_at)) = 17
                     AND pg_temp.retired(:'p_claims') = 17 AND pg_temp.kept(:'p_claims') = 17 AND pg_temp.consistent(),
                     'prune: the closures of the removed rows kept, their claims retired');
SELECT pg_temp.check(count(*) = 5 AND bool_and(r.retired_at IS NULL AND r.ripe_at > now()), 'prune: the others still settled, not ripe')
  FROM settled_claims r WHERE r.claim_id = ANY (pg_temp.claims_of(:'p_c23'::bigint[] || :'p_f6'::bigint[] || :'s_c59'::bigint[]));
SELECT pg_temp.check((SELECT count(*) FROM done WHERE queue = 'p_q') = 4 AND (SELECT count(*) FROM done WHERE queue = 'short') = 1
                     AND (SELECT count(*) FROM dead_letter WHERE queue = 'short') = 1, 'prune: done and dead_letter');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM job_keys WHERE unique_key = 'PK') AND NOT EXISTS (SELECT FROM key_holders WHERE unique_key = 'PK')
                     AND NOT EXISTS (SELECT FROM attempt_state WHERE job_id = (:'p_c25'::bigint[])[1]), 'prune: keys and attempt_state');
SELECT pg_temp.check(pg_temp.state(:live1) = 'available' AND pg_temp.state(:live2) = 'running', 'prune: live jobs untouched');
SELECT pg_temp.check(attempt_evidence((:'p_c25'::bigint[])[1], 1) = 'unknown_job'
                     AND pg_temp.err(format('SELECT retry_job(%s)', (:'p_c25'::bigint[])[1])) LIKE 'TN003 %', 'prune: a pruned job is unknown');
SELECT pg_temp.check(prune_expired() = 0, 'prune: a second pass removes nothing');

-- 2. The floor: never a row closed less than 5 minutes ago (or stale_after when longer), whatever
--    the retention.
SELECT configure_queue('zero', '{"retain_completed": "0s"}') IS NULL AS x \gset
SELECT pg_temp.finished(2, 'c', '4 minutes', 'zero') AS z4, pg_temp.finished(3, 'c', '6 minutes', 'zero') AS z6,
       pg_temp.finished(4, 'c', '8 minutes', 'zero') AS z8 \gset
SELECT array_agg(ripe_at ORDER BY claim_id) AS z_ripe FROM settled_claims WHERE claim_id = ANY (pg_temp.claims_of(:'z6'::bigint[] || :'z8'::bigint[])) \gset
SELECT pg_temp.check((SELECT bool_and(r.ripe_at = x.closed_at + interval '5 minutes' AND r.ripe_at < now())
                        FROM settled_claims r JOIN closures x USING (claim_id)
                       WHERE r.claim_id = ANY (pg_temp.claims_of(:'z6'::bigint[] || :'z8'::bigint[]))),
                     'prune: retention 0 ripens at the floor');
SELECT pg_temp.check(prune_expired('10 minutes') = 0 AND pg_temp.alive(:'z6') = 3, 'prune: the floor follows stale_after');
SELECT pg_temp.check((SELECT array_agg(ripe_at ORDER BY claim_id) FROM settled_claims
                       WHERE claim_id = ANY (pg_temp.claims_of(:'z6'::bigint[] || :'z8'::bigint[]))) = :'z_ripe',
                     'prune: held by the pass''s floor, ripe_at kept');
SELECT pg_temp.check(prune_expired() = 7 AND pg_temp.alive(:'z4') = 2 AND pg_temp.alive(:'z6') = 0, 'prune: past the floor at 0s');

-- 3. Bounds: statements of `batch` items, passes of `max_rows`; a row larger than the batch goes
--    alone; one larger than what is left of the pass waits for the next.
SELECT pg_temp.finished(10, 'c', '2 days', 'b_q') AS b10 \gset
SELECT pg_temp.check(prune_expired('30 seconds', 7, 3) = 7 AND pg_temp.alive(:'b10') = 3, 'prune: 7 of 10 in statements of 3');
SELECT pg_temp.check(prune_expired('30 seconds', 7, 3) = 3, 'prune: the rest');
SELECT pg_temp.finished(5, 'c', '2 days', 'b_q', true) AS b5 \gset
SELECT pg_temp.check(prune_expired('30 seconds', 4, 4) = 0 AND pg_temp.alive(:'b5') = 5, 'prune: a claim of 5 waits for a pass of 5');
SELECT pg_temp.check(prune_expired('30 seconds', 5, 3) = 5 AND pg_temp.alive(:'b5') = 0, 'prune: a claim of 5 alone in a statement of 3');

-- 4. A claim goes only whole: it ripens with its latest closure's retention. An item still open
--    keeps it out of settled_claims (see maintain); a ripe row of one (written by hand) is not
--    removed either.
SELECT pg_temp.job('m_q') AS mo1, pg_temp.job('m_q') AS mo2 \gset
SELECT pg_temp.claim(ARRAY[:mo1, :mo2]) AS moc \gset
SELECT pg_temp.close(:mo1, 'c', '2 days');
DELETE FROM open_claims WHERE claim_id = :moc;
INSERT INTO settled_claims (claim_id, queue, ripe_at) VALUES (:moc, 'm_q', now() - interval '1 day');
SELECT pg_temp.check(prune_expired() = 0 AND pg_temp.alive(ARRAY[:mo1, :mo2]) = 2 AND EXISTS (SELECT FROM claims WHERE claim_id = :moc),
                     'prune: an open item keeps its claim');
DELETE FROM settled_claims WHERE claim_id = :moc;
SELECT pg_temp.close(:mo2, 'f', '1 day');
SELECT pg_temp.settle(ARRAY[:moc]);
SELECT pg_temp.check(r.ripe_at = x.closed_at + interval '7 days', 'prune: it ripens with the failure''s 7 days')
  FROM settled_claims r JOIN closures x ON x.claim_id = r.claim_id AND x.pos = 2 WHERE r.claim_id = :moc;
SELECT pg_temp.check(prune_expired() = 0 AND pg_temp.alive(ARRAY[:mo1, :mo2]) = 2, 'prune: a failure kept 7 days keeps its claim');
SELECT pg_temp.age(ARRAY[:moc], '7 days');
SELECT pg_temp.check(prune_expired() = 2 AND pg_temp.alive(ARRAY[:mo1, :mo2]) = 0, 'prune: then both go');

-- 5. A retried job's old terminal item, released ('e'), is no finished job's record: not counted;
--    the job (its spec, key) stays, and so does a job that went on after a non-terminal closure.
SELECT pg_temp.job('h_q', unique_key => 'HK') AS h1, pg_temp.job('h_q') AS h2 \gset
SELECT pg_temp.claim(ARRAY[:h1, :h2]) AS hc \gset
SELECT pg_temp.close(:h1, 'c', '2 days');
INSERT INTO closures (claim_id, pos, outcome, closed_at) VALUES (:hc, 2, 'r', now() - interval '2 days');
INSERT INTO deferred (id, queue, priority, run_at, created_at, state, run_lease, attempt)
VALUES (:h2, 'h_q', 2, now() + interval '1 hour', now(), 'retryable', :hc * 65536 + 2, 1);
SELECT pg_temp.settle(ARRAY[:hc]);
SELECT pg_temp.check(retry_job(:h1), 'retry of the completed one');
SELECT pg_temp.check((SELECT ripe_at FROM settled_claims WHERE claim_id = :hc) < now(), 'the released claim is ripe');
SELECT pg_temp.check(prune_expired() = 0, 'prune: the released completion not counted');
SELECT pg_temp.check(pg_temp.alive(ARRAY[:h1, :h2]) = 2 AND pg_temp.retired(ARRAY[:hc]) = 1
                     AND pg_temp.state(:h1) = 'available' AND pg_temp.state(:h2) = 'retryable'
                     AND EXISTS (SELECT FROM job_keys WHERE job_id = :h1), 'prune: the claim went, the jobs stay');
SELECT pg_temp.claim(ARRAY[:h1]) AS hc2 \gset
SELECT pg_temp.close(:h1, 'x', '3 days');
SELECT pg_temp.settle(ARRAY[:hc2]);
SELECT pg_temp.check(prune_expired() = 1, 'prune: its last claim');
SELECT pg_temp.check(pg_temp.alive(ARRAY[:h1]) = 0 AND NOT EXISTS (SELECT FROM job_keys WHERE job_id = :h1)
                     AND NOT EXISTS (SELECT FROM key_holders WHERE job_id = :h1), 'prune: its last claim takes it');

-- 6. A claim without a terminal closure ripens at its last closure plus the floor, then goes
--    alone (the jobs went on). A dead-lettered item: its spec stays with the dead_letter row, goes
--    with it.
SELECT pg_temp.job('n_q') AS n1, pg_temp.job('n_q', 1) AS n2 \gset
SELECT pg_temp.claim(ARRAY[:n1, :n2]) AS nc \gset
INSERT INTO closures (claim_id, pos, outcome, closed_at) VALUES (:nc, 1, 'a', now() - interval '1 minute'),
                                                                 (:nc, 2, 'd', now() - interval '1 minute');
INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt) VALUES (:n1, 'n_q', 2, now(), now(), :nc * 65536 + 1, 1);
INSERT INTO dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at, finalized_at)
VALUES (:n2, 'n_q', 'k', '{}', 2, 1, 1, :nc * 65536 + 2, now(), now(), now() - interval '1 minute');
SELECT pg_temp.settle(ARRAY[:nc]);
SELECT pg_temp.check((SELECT ripe_at FROM settled_claims WHERE claim_id = :nc)
                       = (SELECT max(closed_at) + interval '5 minutes' FROM closures WHERE claim_id = :nc), 'prune: ripe after the floor');
SELECT pg_temp.check(prune_expired() = 0, 'prune: inside the floor');
SELECT pg_temp.check(EXISTS (SELECT FROM claims WHERE claim_id = :nc), 'prune: inside the floor, kept');
SELECT pg_temp.age(ARRAY[:nc], '5 minutes');
SELECT pg_temp.check(prune_expired() = 0, 'prune: a claim without history counts 0');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM claims WHERE claim_id = :nc) AND pg_temp.retired(ARRAY[:nc]) = 1
                     AND NOT EXISTS (SELECT FROM open_claims WHERE claim_id = :nc), 'prune: the claim without history went (retired)');
SELECT pg_temp.check(pg_temp.alive(ARRAY[:n1, :n2]) = 2 AND pg_temp.state(:n1) = 'available' AND pg_temp.state(:n2) = 'failed',
                     'prune: its jobs stay');
UPDATE dead_letter SET finalized_at = now() - interval '8 days' WHERE id = :n2;
SELECT pg_temp.check(prune_expired() = 1 AND pg_temp.alive(ARRAY[:n2]) = 0 AND pg_temp.state(:n2) IS NULL, 'prune: the dead letter and its spec');

-- 7. Retry and prune of one job: prune skips the claim a retry holds; a retry behind a prune
--    that removed the job finds it unknown.
SELECT pg_temp.finished(1, 'c', '2 days', 'w_q') AS w1, pg_temp.finished(1, 'c', '2 days', 'w_q') AS w2 \gset
SELECT (:'w1'::bigint[])[1] AS w1, (:'w2'::bigint[])[1] AS w2 \gset
BEGIN;
SELECT pg_temp.check(retry_job(:w1), 'retry (left uncommitted)');
\set got `psql -X -qAt -c "SET lock_timeout = '5s'" -c "SELECT prune_expired()" 2>&1`
SELECT pg_temp.check(:'got' = '1', 'prune beside the retry: the other one only, not ' || :'got');
COMMIT;
SELECT pg_temp.check(pg_temp.state(:w1) = 'available' AND pg_temp.alive(ARRAY[:w1]) = 1 AND pg_temp.alive(ARRAY[:w2]) = 0
                     AND pg_temp.retired(pg_temp.claims_of(ARRAY[:w1])) = 0, 'the retried job stays, its claim passed by');
SELECT pg_temp.finished(1, 'c', '2 days', 'w_q') AS w3 \gset
SELECT (:'w3'::bigint[])[1] AS w3 \gset
\set bg_sql 'SELECT retry_job(' :w3 ') /* ta_retry3 */'
\setenv TA_SQL :bg_sql
BEGIN;
SELECT pg_temp.check(prune_expired() = 1, 'prune (left uncommitted): this one (the retried one''s old completion was released)');
\! (psql -X -qAt -c "$TA_SQL" > "$TA_TMP/retry3" 2>&1; echo DONE >> "$TA_TMP/retry3") < /dev/null > /dev/null 2>&1 &
SELECT pg_temp.await_lock('ta_retry3');
COMMIT;
\set got `for i in $(seq 200); do grep -q DONE "$TA_TMP/retry3" && break; sleep 0.05; done; head -1 "$TA_TMP/retry3"`
SELECT pg_temp.check(:'got' LIKE '%job ' || :w3 || ' not found%', 'the retry behind the prune: not found, not ' || :'got');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM ready WHERE id = :w3), 'no ready row without a spec');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM claim_items WHERE job_id = :w1) AND pg_temp.alive(ARRAY[:w1]) = 1
                     AND pg_temp.state(:w1) = 'available', 'the retried job''s old claim went with that prune, its spec stayed');

-- 8. Late closers of a removed claim. Its closures stay (the claim retired) for a day: a closer
--    that read the claim item before the row went collides with the attempt's closure and changes
--    nothing; one that starts later finds no item. Closers: complete_batch, fail_attempt and
--    snooze_attempt in a REPEATABLE READ transaction whose snapshot predates the prune (a retry
--    or snooze that went in would write a ready or deferred row of a job without a spec), and
--    complete_job at READ COMMITTED, which read the item and then waited for the attempt's lock
--    while the prune committed.
SELECT configure_queue('lc_q', '{}') IS NULL AS x \gset
SELECT prune_expired() AS x \gset
SELECT pg_temp.job('lc_q') AS lc1, pg_temp.job('lc_q') AS lc2, pg_temp.job('lc_q') AS lc3, pg_temp.job('lc_q') AS lc5 \gset
SELECT pg_temp.claim(ARRAY[:lc1, :lc2]) AS lca, pg_temp.claim(ARRAY[:lc3]) AS lcb, pg_temp.claim(ARRAY[:lc5]) AS lcc \gset
SELECT pg_temp.lease(:lc1) AS lc1_lease, pg_temp.lease(:lc2) AS lc2_lease, pg_temp.lease(:lc3) AS lc3_lease,
       pg_temp.lease(:lc5) AS lc5_lease, pg_temp.token(:lc3) AS lc3_token \gset
SELECT pg_temp.close(:lc1, 'c', '2 days'), pg_temp.close(:lc2, 'c', '2 days'), pg_temp.close(:lc3, 'c', '2 days'),
       pg_temp.close(:lc5, 'x', '2 days');
SELECT pg_temp.settle(ARRAY[:lca, :lcb, :lcc]);
CREATE TEMP TABLE lc_before AS SELECT * FROM closures WHERE claim_id IN (:lca, :lcb, :lcc);
SELECT format($f$BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 'snap=' || count(*) FROM claims WHERE claim_id IN (%1$s, %2$s, %3$s);
SELECT pg_advisory_lock(4242) /* ta_rr_late */;
SELECT 'cb=' || count(*) FROM complete_batch(ARRAY[%4$s]::bigint[], ARRAY[%5$s]::bigint[]);
SELECT 'fa=' || coalesce(fail_attempt(%6$s, %7$s, 'late'), 'NULL');
SELECT 'sz=' || snooze_attempt(%8$s, %9$s, '1 hour');
COMMIT;$f$, :lca, :lcb, :lcc, :lc1, :lc1_lease, :lc2, :lc2_lease, :lc5, :lc5_lease) AS rr_sql \gset
\setenv TA_RR :rr_sql
SELECT format('SELECT * FROM complete_job(%L) /* ta_rc_late */', :'lc3_token') AS rc_sql \gset
\setenv TA_RC :rc_sql
SELECT pg_advisory_lock(4242) AS x \gset
SELECT pg_advisory_lock(hashtext(current_setting('ta.s') || '.attempt'), attempt_lock_key(:lc3, :lc3_lease)) AS x \gset
\! (printf '%s\n' "$TA_RR" | psql -X -qAt > "$TA_TMP/rr_late" 2>&1; echo DONE >> "$TA_TMP/rr_late") < /dev/null > /dev/null 2>&1 &
\! (psql -X -qAt -c "$TA_RC" > "$TA_TMP/rc_late" 2>&1; echo DONE >> "$TA_TMP/rc_late") < /dev/null > /dev/null 2>&1 &
SELECT pg_temp.await_lock('ta_rr_late');
SELECT pg_temp.await_lock('ta_rc_late');
SELECT pg_temp.check(prune_expired() = 4, 'late closers: the four finished jobs pruned');
SELECT pg_advisory_unlock(4242) AS x \gset
SELECT pg_advisory_unlock(hashtext(current_setting('ta.s') || '.attempt'), attempt_lock_key(:lc3, :lc3_lease)) AS x \gset
\set got `for i in $(seq 200); do grep -q DONE "$TA_TMP/rr_late" && break; sleep 0.05; done; grep -E '^(snap|cb|fa|sz)=|ERROR' "$TA_TMP/rr_late" | tr '\n' ' '`
SELECT pg_temp.check(:'got' = 'snap=3 cb=0 fa=NULL sz=false ', 'late closers at REPEATABLE READ: nothing closed, not ' || :'got');
\set got `for i in $(seq 200); do grep -q DONE "$TA_TMP/rc_late" && break; sleep 0.05; done; head -1 "$TA_TMP/rc_late"`
SELECT pg_temp.check(:'got' LIKE '%stale attempt: job ' || :lc3 || ' %', 'late complete_job: stale, not ' || :'got');
-- Nothing changed: the closures as they were (only theirs), no job waits again, no spec came back.
SELECT pg_temp.check((SELECT count(*) FROM closures x WHERE x.claim_id IN (:lca, :lcb, :lcc)) = 4
                     AND NOT EXISTS (SELECT FROM closures x FULL JOIN lc_before b USING (claim_id, pos)
                                      WHERE x.claim_id IN (:lca, :lcb, :lcc) OR b.claim_id IS NOT NULL
                                      GROUP BY () HAVING bool_or(x IS DISTINCT FROM b OR x.outcome IS DISTINCT FROM b.outcome
                                                                 OR x.closed_at IS DISTINCT FROM b.closed_at
                                                                 OR x.claim_id IS NULL OR b.claim_id IS NULL)),
                     'late closers: the closures untouched');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM ready WHERE id IN (:lc1, :lc2, :lc3, :lc5))
                     AND NOT EXISTS (SELECT FROM deferred WHERE id IN (:lc1, :lc2, :lc3, :lc5))
                     AND NOT EXISTS (SELECT FROM dead_letter WHERE id IN (:lc1, :lc2, :lc3, :lc5))
                     AND pg_temp.alive(ARRAY[:lc1, :lc2, :lc3, :lc5]) = 0
                     AND NOT EXISTS (SELECT FROM claims WHERE claim_id IN (:lca, :lcb, :lcc))
                     AND pg_temp.retired(ARRAY[:lca, :lcb, :lcc]) = 3,
                     'late closers: no job waits again, the claims retired');
-- Every reader ignores the kept closures: the jobs are unknown, the queue counts nothing.
SELECT pg_temp.check(NOT EXISTS (SELECT FROM jobs WHERE id IN (:lc1, :lc2, :lc3, :lc5))
                     AND NOT EXISTS (SELECT FROM done WHERE id IN (:lc1, :lc2, :lc3, :lc5))
                     AND NOT EXISTS (SELECT FROM claim_items WHERE claim_id IN (:lca, :lcb, :lcc))
                     AND NOT EXISTS (SELECT FROM open_attempts WHERE claim_id IN (:lca, :lcb, :lcc))
                     AND NOT EXISTS (SELECT FROM receipts WHERE job_id IN (:lc1, :lc2, :lc3, :lc5))
                     AND attempt_evidence(:lc1, :lc1_lease) = 'unknown_job' AND attempt_evidence(:lc3, :lc3_lease) = 'unknown_job',
                     'late closers: the kept closures read by no view');
SELECT pg_temp.check(l.counts->>'completed' = '0' AND l.counts->>'cancelled' = '0' AND l.counts->>'running' = '0',
                     'late closers: list_queues counts none of them, not ' || l.counts::text)
  FROM list_queues() l WHERE l.queue = 'lc_q';
SELECT pg_temp.check(d.running = 0 AND d.available = 0, 'late closers: queue_depths') FROM queue_depths() d WHERE d.queue = 'lc_q';
-- A closer that starts now finds no item.
SELECT pg_temp.check((SELECT count(*) FROM complete_batch(ARRAY[:lc1], ARRAY[:lc1_lease])) = 0
                     AND fail_attempt(:lc2, :lc2_lease, 'later') IS NULL AND NOT snooze_attempt(:lc5, :lc5_lease, '1 hour')
                     AND NOT cancel_attempt(:lc2, :lc2_lease)
                     AND pg_temp.err(format('SELECT * FROM complete_job(%L)', :'lc3_token')) LIKE 'TN001 %'
                     AND (SELECT count(*) FROM closures x WHERE x.claim_id IN (:lca, :lcb, :lcc)) = 4
                     AND NOT EXISTS (SELECT FROM deferred WHERE id IN (:lc1, :lc2, :lc3, :lc5))
                     AND NOT EXISTS (SELECT FROM ready WHERE id IN (:lc1, :lc2, :lc3, :lc5)), 'late closers after the prune: stale');

-- 9. The kept closures go a day after their claim was retired, with the settled_claims rows, oldest
--    retirement first, counted against max_rows (a claim's closures together: one of more than the
--    batch alone, one of more than what is left of the pass waits) and not in the result.
--    Forgetting comes first in a pass. (Each prune runs in a statement of its own: a check in the
--    same statement would read the snapshot from before it.)
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.check(:pruned = 0 AND pg_temp.kept(ARRAY[:lca, :lcb, :lcc]) = 4 AND pg_temp.retired(ARRAY[:lca, :lcb, :lcc]) = 3,
                     'forget: not within the day');
UPDATE settled_claims SET retired_at = now() - interval '1 day' + interval '1 minute' WHERE claim_id IN (:lca, :lcb, :lcc);
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.check(:pruned = 0 AND pg_temp.kept(ARRAY[:lca, :lcb, :lcc]) = 4 AND pg_temp.retired(ARRAY[:lca, :lcb, :lcc]) = 3,
                     'forget: not a minute before the day');
UPDATE settled_claims SET retired_at = now() - interval '1 day 2 minutes' WHERE claim_id = :lca;  -- 2 closures, first
UPDATE settled_claims SET retired_at = now() - interval '1 day 1 minute' WHERE claim_id IN (:lcb, :lcc);
SELECT pg_temp.finished(1, 'c', '2 days', 'lc_q') AS lf \gset
SELECT prune_expired('30 seconds', 1, 1) AS pruned \gset
SELECT pg_temp.check(:pruned = 1 AND pg_temp.alive(:'lf') = 0 AND pg_temp.kept(ARRAY[:lca, :lcb, :lcc]) = 4
                     AND pg_temp.retired(ARRAY[:lca, :lcb, :lcc]) = 3,
                     'forget: a retired claim of 2 closures waits for a pass of 2 (the pass goes on with retention)');
SELECT prune_expired('30 seconds', 2, 1) AS pruned \gset
SELECT pg_temp.check(:pruned = 0 AND pg_temp.kept(ARRAY[:lca]) = 0 AND pg_temp.retired(ARRAY[:lca]) = 0
                     AND pg_temp.kept(ARRAY[:lcb, :lcc]) = 2 AND pg_temp.retired(ARRAY[:lcb, :lcc]) = 2,
                     'forget: the claim of 2 alone in a statement of 1, the pass spent');
SELECT pg_temp.finished(1, 'c', '2 days', 'lc_q') AS lg2 \gset
SELECT prune_expired('30 seconds', 2, 5) AS pruned \gset
SELECT pg_temp.check(:pruned = 0 AND pg_temp.alive(:'lg2') = 1 AND pg_temp.kept(ARRAY[:lca, :lcb, :lcc]) = 0
                     AND pg_temp.retired(ARRAY[:lca, :lcb, :lcc]) = 0,
                     'forget: the other two first, then nothing left of the pass for retention');
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.check(:pruned = 1 AND pg_temp.alive(:'lg2') = 0, 'forget: retention on the next pass');
SELECT pg_temp.check(NOT EXISTS (SELECT FROM settled_claims WHERE claim_id IN (:lca, :lcb, :lcc)) AND pg_temp.consistent(),
                     'forget: the settled rows went with the closures; every closure has its claim or retired claim');

-- 10. A retention lengthened after a claim settled is honored: the pass that finds the claim ripe
--     under the old setting moves ripe_at to the new one and keeps the claim.
SELECT configure_queue('len_q', '{"retain_completed": "1h"}') IS NULL AS x \gset
SELECT pg_temp.finished(2, 'c', '2 hours', 'len_q') AS len \gset
SELECT pg_temp.claims_of(:'len') AS len_claims \gset
SELECT pg_temp.check(bool_and(r.ripe_at = x.closed_at + interval '1 hour' AND r.ripe_at < now()), 'lengthened: ripe under 1h')
  FROM settled_claims r JOIN closures x USING (claim_id) WHERE r.claim_id = ANY (:'len_claims');
SELECT configure_queue('len_q', '{"retain_completed": "3h"}') IS NULL AS x \gset
SELECT pg_temp.check(prune_expired() = 0 AND pg_temp.alive(:'len') = 2, 'lengthened: kept');
SELECT pg_temp.check(bool_and(r.ripe_at = x.closed_at + interval '3 hours' AND r.retired_at IS NULL), 'lengthened: ripe_at moved to 3h')
  FROM settled_claims r JOIN closures x USING (claim_id) WHERE r.claim_id = ANY (:'len_claims');
SELECT pg_temp.check(prune_expired() = 0, 'lengthened: not read again before the new ripe_at');
SELECT pg_temp.age(:'len_claims', '1 hour');
SELECT pg_temp.check(prune_expired() = 2 AND pg_temp.alive(:'len') = 0, 'lengthened: pruned at 3h');

-- 11. A retention shortened after a claim settled applies to it at its old ripe_at, not before.
SELECT configure_queue('cut_q', '{"retain_completed": "10h"}') IS NULL AS x \gset
SELECT pg_temp.finished(2, 'c', '2 hours', 'cut_q') AS cut \gset
SELECT pg_temp.claims_of(:'cut') AS cut_claims \gset
SELECT configure_queue('cut_q', '{"retain_completed": "1h"}') IS NULL AS x \gset
SELECT pg_temp.check(prune_expired() = 0 AND pg_temp.alive(:'cut') = 2, 'shortened: kept until the old ripe_at');
SELECT pg_temp.check(bool_and(r.ripe_at = x.closed_at + interval '10 hours'), 'shortened: ripe_at as it settled')
  FROM settled_claims r JOIN closures x USING (claim_id) WHERE r.claim_id = ANY (:'cut_claims');
SELECT pg_temp.age(:'cut_claims', '8 hours');
SELECT pg_temp.check(prune_expired() = 2 AND pg_temp.alive(:'cut') = 0, 'shortened: pruned at the old ripe_at');
-- ... and a claim that settles after the change ripens with the new setting.
SELECT pg_temp.finished(1, 'c', '2 hours', 'cut_q') AS cut2 \gset
SELECT pg_temp.check(prune_expired() = 1 AND pg_temp.alive(:'cut2') = 0, 'shortened: a claim settled later, at 1h');

-- 12. A retried job's spec survives the prune of its old claim, whether the job waits again, runs
--     in a later claim or has finished again there (its later claim holds its last word).
SELECT pg_temp.finished(1, 'c', '2 days', 'rt_q') AS rt1, pg_temp.finished(1, 'f', '8 days', 'rt_q') AS rt2,
       pg_temp.finished(1, 'x', '2 days', 'rt_q') AS rt3 \gset
SELECT (:'rt1'::bigint[])[1] AS rt1, (:'rt2'::bigint[])[1] AS rt2, (:'rt3'::bigint[])[1] AS rt3 \gset
SELECT pg_temp.claims_of(ARRAY[:rt1, :rt2, :rt3]) AS rt_old \gset
SELECT pg_temp.check(retry_job(:rt1) AND retry_job(:rt2) AND retry_job(:rt3), 'retried');
SELECT pg_temp.claim(ARRAY[:rt2]) AS rtb2, pg_temp.claim(ARRAY[:rt3]) AS rtb3 \gset
SELECT pg_temp.token(:rt2) AS rt2_token \gset
SELECT pg_temp.close(:rt3, 'c');
SELECT pg_temp.settle(ARRAY[:rtb3]);
SELECT pg_temp.check(bool_and(r.ripe_at < now() AND r.retired_at IS NULL) AND count(*) = 3, 'retried: the old claims ripe')
  FROM settled_claims r WHERE r.claim_id = ANY (:'rt_old');
SELECT pg_temp.check(prune_expired() = 0, 'retried: the old claims count nothing');
SELECT pg_temp.check(pg_temp.retired(:'rt_old') = 3 AND pg_temp.alive(ARRAY[:rt1, :rt2, :rt3]) = 3
                     AND pg_temp.state(:rt1) = 'available' AND pg_temp.state(:rt2) = 'running' AND pg_temp.state(:rt3) = 'completed',
                     'retried: the old claims went, the specs stayed');
SELECT pg_temp.check((SELECT count(*) FROM complete_job(:'rt2_token')) = 1 AND pg_temp.state(:rt2) = 'completed',
                     'retried: the running one completes');
SELECT pg_temp.claim(ARRAY[:rt1]) AS rtb1 \gset
SELECT pg_temp.close(:rt1, 'c');
SELECT pg_temp.settle(ARRAY[:rtb1, :rtb2]);
SELECT pg_temp.age(ARRAY[:rtb1, :rtb2, :rtb3], '1 day');
SELECT pg_temp.check(prune_expired() = 3 AND pg_temp.alive(ARRAY[:rt1, :rt2, :rt3]) = 0, 'retried: their later claims take them');

-- 13. Two passes at once: the second passes by the settled rows the first holds, without waiting
--     for it, and takes the others.
SELECT pg_temp.finished(3, 'c', '2 days', 'cc_q') AS cc \gset
BEGIN;
SELECT pg_temp.check(prune_expired('30 seconds', 1, 1) = 1 AND pg_temp.alive(:'cc') = 2, 'a pass of one (left uncommitted)');
\set t0 `date +%s%N`
\set got `psql -X -qAt -c "SET lock_timeout = '5s'" -c "SELECT prune_expired()" 2>&1`
\set t1 `date +%s%N`
SELECT pg_temp.check(:'got' = '2', 'the second pass: the other two, not ' || :'got');
SELECT pg_temp.check((:t1::numeric - :t0::numeric) / 1e9 < 2, 'the second pass did not wait');
COMMIT;
SELECT pg_temp.check(pg_temp.alive(:'cc') = 0
                     AND (SELECT count(*) FROM settled_claims r WHERE r.queue = 'cc_q' AND r.retired_at IS NOT NULL) = 3
                     AND pg_temp.consistent(), 'both passes: three retired, once each');

-- 14. A pass reads the ripe rows only: a day of claims retired with their closures kept, and
--     claims held by a retention longer than the shortest (failures of the last days, kept 7),
--     cost it nothing (the old scan of the terminal closures stepped over every one of them, each
--     pass). The blocks a pass reads with N of each and with 2N of each, a few claims ripe each
--     time: a few per ripe claim, none per kept or held one.
CREATE FUNCTION pg_temp.bulk(n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  s text := current_setting('ta.s');
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS bulk_ids (id bigint, cid bigint, t timestamptz, retired boolean);
  TRUNCATE bulk_ids;
  INSERT INTO bulk_ids
  SELECT nextval(s || '.job_id_seq'), nextval(s || '.claim_id_seq'),
         CASE WHEN i % 2 = 0 THEN now() - random() * interval '23 hours'
              ELSE now() - interval '1 day' - random() * interval '5 days' END, i % 2 = 0
    FROM generate_series(1, 2 * n) i;
  -- retired within the day: claim row and spec gone, closure kept
  INSERT INTO closures (claim_id, pos, outcome, closed_at) SELECT cid, 1, 'c', t - interval '1 day' FROM bulk_ids WHERE retired;
  INSERT INTO settled_claims (claim_id, queue, ripe_at, retired_at) SELECT cid, 'bulk_q', t, t FROM bulk_ids WHERE retired;
  -- failed one to six days ago: held by the 7 days failures are kept
  INSERT INTO specs (id, queue, kind, args, priority, max_attempts, metadata, created_at)
  SELECT id, 'bulk_q', 'k', '{}', 2, 3, '{}', t FROM bulk_ids WHERE NOT retired;
  INSERT INTO claims (claim_id, queue, worker, claimed_at, lo, hi, job_ids, attempts, secrets, run_ats)
  SELECT cid, 'bulk_q', 'w', t, id, id, ARRAY[id], '{1}', ARRAY[gen_random_uuid()], ARRAY[t] FROM bulk_ids WHERE NOT retired;
  INSERT INTO closures (claim_id, pos, outcome, closed_at) SELECT cid, 1, 'f', t FROM bulk_ids WHERE NOT retired;
  INSERT INTO settled_claims (claim_id, queue, ripe_at) SELECT cid, 'bulk_q', t + interval '7 days' FROM bulk_ids WHERE NOT retired;
END $$;
-- The blocks this transaction has read so far (from shared buffers or not) of the tables retention
-- reads and their indexes, by relation.
CREATE FUNCTION pg_temp.blocks() RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_object_agg(c.relname, pg_stat_get_xact_blocks_fetched(c.oid))
    FROM pg_class c
   WHERE c.relnamespace = current_setting('ta.s')::regnamespace
     AND c.relname IN ('settled_claims', 'settled_claims_pkey', 'settled_claims_ripe_idx', 'settled_claims_retired_idx',
                       'closures', 'closures_pkey', 'claims', 'claims_pkey', 'claims_jobs_idx')
$$;
CREATE FUNCTION pg_temp.blocks_since(b0 jsonb) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_object_agg(k, v::bigint - (b0->>k)::bigint) FROM jsonb_each_text(pg_temp.blocks()) e(k, v)
$$;
CREATE FUNCTION pg_temp.total(b jsonb) RETURNS bigint LANGUAGE sql AS $$
  SELECT sum(v::bigint)::bigint FROM jsonb_each_text(b) e(k, v)
$$;
\set bulk_n 20000
SELECT pg_temp.bulk(:bulk_n);
ANALYZE settled_claims, closures, claims, specs;
SELECT pg_temp.finished(3, 'c', '2 days', 'bulk_q') AS bk1 \gset
BEGIN;
SELECT pg_temp.blocks() AS b0 \gset
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.blocks_since(:'b0') AS bufs1 \gset
COMMIT;
SELECT pg_temp.check(:pruned = 3 AND pg_temp.alive(:'bk1') = 0, 'a pass among N kept and N held: the ripe ones pruned');
SELECT pg_temp.bulk(:bulk_n);
ANALYZE settled_claims, closures, claims, specs;
SELECT pg_temp.finished(3, 'c', '2 days', 'bulk_q') AS bk2 \gset
BEGIN;
SELECT pg_temp.blocks() AS b0 \gset
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.blocks_since(:'b0') AS bufs2 \gset
COMMIT;
SELECT pg_temp.check(:pruned = 3 AND pg_temp.alive(:'bk2') = 0, 'a pass among 2N kept and 2N held: the ripe ones pruned');
SELECT pg_temp.check(pg_temp.total(:'bufs1') < 200 AND pg_temp.total(:'bufs2') < pg_temp.total(:'bufs1') + 30
                     AND (:'bufs2'::jsonb->>'settled_claims_ripe_idx')::int <= 4,
                     format('a pass reads the ripe rows only: among %s kept and held %s, among %s %s', 2 * :bulk_n, :'bufs1',
                            4 * :bulk_n, :'bufs2'));
SELECT pg_temp.check((SELECT count(*) FROM settled_claims WHERE queue = 'bulk_q' AND retired_at IS NOT NULL
                                                            AND NOT EXISTS (SELECT FROM claims c WHERE c.claim_id = settled_claims.claim_id))
                     = 2 * :bulk_n + 6
                     AND (SELECT count(*) FROM settled_claims WHERE queue = 'bulk_q' AND retired_at IS NULL AND ripe_at > now()) = 2 * :bulk_n
                     AND pg_temp.consistent(), 'the kept and held rows as they were');

-- ---- maintain -------------------------------------------------------------------------------------

SELECT pg_temp.check(pg_temp.err($q$SELECT * FROM maintain('ta-nobody', 1)$q$) LIKE 'TN004 tenure.maintain: ta-nobody does not hold maintenance leadership term 1',
                     'maintain: fenced');
SELECT acquire_leadership('ta-leader', '1 hour') AS term \gset
-- Claims: fully closed with a completion and a failure (settles: ripe with the failure's 7 days),
-- one item open (stays in open_claims), only a non-terminal closure (settles: ripe at the floor),
-- one whose attempt this pass rescues (settles in the same pass); a rescued attempt's state is
-- swept; a stale one is rescued and returned.
SELECT pg_temp.job('mt_q') AS a1, pg_temp.job('mt_q') AS a2, pg_temp.job('mt_q') AS a3, pg_temp.job('mt_q') AS a4,
       pg_temp.job('mt_q') AS a5 \gset
SELECT pg_temp.claim(ARRAY[:a1, :a2]) AS ma, pg_temp.claim(ARRAY[:a3]) AS mb, pg_temp.claim(ARRAY[:a4]) AS mc,
       pg_temp.claim(ARRAY[:a5]) AS md \gset
SELECT pg_temp.close(:a1, 'c'), pg_temp.close(:a2, 'f', '1 minute');
INSERT INTO closures (claim_id, pos, outcome, closed_at) VALUES (:mc, 1, 's', now());
INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt) VALUES (:a4, 'mt_q', 2, now(), now(), :mc::bigint * 65536 + 1, 0);
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at) VALUES (:a1, :ma::bigint * 65536 + 1, now()), (:a3, :mb::bigint * 65536 + 1, now()),
                                                                   (:a5, :md::bigint * 65536 + 1, now() - interval '1 hour');
INSERT INTO attempt_state (job_id, run_lease, heartbeat_at) VALUES (:a5, 12345678, now());  -- names no attempt
-- Claims of a queue with settings: a claim of four items, each outcome with its retention (the
-- completion's 1 hour, 30 minutes ago, is the latest), and a claim of a queue that keeps
-- nothing (the floor).
SELECT configure_queue('mt_set', '{"retain_completed": "1h", "retain_cancelled": "2h", "retain_failed": "3h"}') IS NULL AS x,
       configure_queue('mt_zero', '{"retain_completed": "0s", "retain_failed": "0s"}') IS NULL AS x \gset
SELECT pg_temp.job('mt_set') AS e1, pg_temp.job('mt_set') AS e2, pg_temp.job('mt_set') AS e3, pg_temp.job('mt_set', 1) AS e4,
       pg_temp.job('mt_zero') AS e5 \gset
SELECT pg_temp.claim(ARRAY[:e1, :e2, :e3, :e4]) AS me, pg_temp.claim(ARRAY[:e5]) AS mz \gset
SELECT pg_temp.close(:e1, 'c', '30 minutes'), pg_temp.close(:e2, 'x', '100 minutes'), pg_temp.close(:e3, 'f', '170 minutes'),
       pg_temp.close(:e4, 'd'), pg_temp.close(:e5, 'f', '1 minute');
INSERT INTO dead_letter (id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at, finalized_at)
VALUES (:e4, 'mt_set', 'k', '{}', 2, 1, 1, :me::bigint * 65536 + 4, now(), now(), now());
SELECT pg_temp.check(string_agg(m.job_id || ':' || m.new_state, ',') = :a5 || ':available', 'maintain: the rescued attempts')
  FROM maintain('ta-leader', :term, '5 minutes') m;
SELECT pg_temp.check(string_agg(o.claim_id::text, ',' ORDER BY o.claim_id) = :'mb', 'maintain: open_claims swept')
  FROM open_claims o WHERE o.queue IN ('mt_q', 'mt_set', 'mt_zero');
SELECT pg_temp.check(string_agg(r.claim_id || ' ' || r.queue, ',' ORDER BY r.claim_id)
                       = format('%s mt_q,%s mt_q,%s mt_q,%s mt_set,%s mt_zero', :ma, :mc, :md, :me, :mz)
                     AND bool_and(r.retired_at IS NULL),
                     'maintain: one settled row per claim taken out of open_claims')
  FROM settled_claims r WHERE r.claim_id IN (:ma, :mb, :mc, :md, :me, :mz);
SELECT pg_temp.check(bool_and(r.ripe_at = CASE r.claim_id
                                             WHEN :ma THEN (SELECT x.closed_at + interval '7 days' FROM closures x WHERE x.claim_id = :ma AND x.pos = 2)
                                             WHEN :me THEN (SELECT x.closed_at + interval '1 hour' FROM closures x WHERE x.claim_id = :me AND x.pos = 1)
                                             ELSE (SELECT max(x.closed_at) + interval '5 minutes' FROM closures x WHERE x.claim_id = r.claim_id) END
                              AND r.ripe_at = pg_temp.ripe(r.claim_id)),
                     'maintain: ripe_at: the latest retention of the claim''s closures, at least its last closure plus the floor')
  FROM settled_claims r WHERE r.claim_id IN (:ma, :mc, :md, :me, :mz);
SELECT pg_temp.check((SELECT ripe_at FROM settled_claims WHERE claim_id = :md)
                       = (SELECT closed_at + interval '5 minutes' FROM closures WHERE claim_id = :md AND outcome = 'a'),
                     'maintain: the claim rescued by this pass settled in it');
SELECT pg_temp.check(string_agg(s.job_id::text, ',') = :'a3', 'maintain: attempt_state of open attempts only')
  FROM attempt_state s WHERE s.job_id IN (:a1, :a3, :a5);
SELECT pg_temp.check(pg_temp.state(:a1) = 'completed' AND pg_temp.state(:a2) = 'failed' AND pg_temp.state(:a3) = 'running'
                     AND pg_temp.state(:a5) = 'available', 'maintain: states');
-- the next pass: nothing ripe yet, nothing more to settle
SELECT count(*) AS x FROM maintain('ta-leader', :term, '5 minutes') \gset
SELECT pg_temp.check(string_agg(o.claim_id::text, ',' ORDER BY o.claim_id) = :'mb', 'maintain: the open claim stays')
  FROM open_claims o WHERE o.queue = 'mt_q';
SELECT pg_temp.check(NOT EXISTS (SELECT FROM settled_claims WHERE claim_id IN (:ma, :mc, :md, :me, :mz) AND retired_at IS NOT NULL),
                     'maintain: nothing ripe yet');
SELECT pg_temp.age(ARRAY[:mc, :md, :mz], '6 minutes');
SELECT pg_temp.age(ARRAY[:ma], '8 days');
SELECT count(*) AS x FROM maintain('ta-leader', :term, '5 minutes') \gset
SELECT pg_temp.check(NOT EXISTS (SELECT FROM claims WHERE claim_id IN (:ma, :mc, :md, :mz)) AND pg_temp.alive(ARRAY[:a1, :a2, :e5]) = 0
                     AND pg_temp.retired(ARRAY[:ma, :mc, :md, :mz]) = 4
                     AND pg_temp.state(:a4) = 'available' AND pg_temp.state(:a5) = 'available', 'maintain: pruned');
SELECT pg_temp.age(ARRAY[:me], '31 minutes');
SELECT count(*) AS x FROM maintain('ta-leader', :term, '5 minutes') \gset
SELECT pg_temp.check(pg_temp.retired(ARRAY[:me]) = 1 AND pg_temp.alive(ARRAY[:e1, :e2, :e3]) = 0 AND pg_temp.alive(ARRAY[:e4]) = 1
                     AND pg_temp.state(:e4) = 'failed', 'maintain: the claim of four at its completion''s hour; the dead letter''s spec stays');
SELECT pg_temp.check(pg_temp.consistent(), 'maintain: every claim open or settled, every closure with its claim or retired');
-- A pass reads the open claims only, whatever open_claims' statistics say: taken in the middle of
-- a drain they can count thousands of open claims where one is left, and neither the rescue's scan
-- (open_attempts) nor the settling may then turn into a scan of every claim (here the 2N of the
-- retention section, still in claims) tested item by item against closures.
-- (the planner scales reltuples by the pages the table has now)
UPDATE pg_class SET reltuples = 5000, relpages = greatest(1, pg_relation_size(oid) / current_setting('block_size')::int)
 WHERE oid = 'open_claims'::regclass;
SELECT count(*) AS open_n FROM open_claims \gset
SELECT pg_temp.check(:open_n BETWEEN 1 AND 10 AND (SELECT count(*) FROM claims) > :bulk_n,
                     'maintain: a few open claims among many: ' || :open_n);
BEGIN;
SELECT pg_temp.blocks() AS m0 \gset
SELECT count(*) AS x FROM maintain('ta-leader', :term, '5 minutes') \gset
SELECT pg_temp.blocks_since(:'m0') AS mbufs \gset
COMMIT;
SELECT pg_temp.check((:'mbufs'::jsonb->>'claims')::int < 100 AND (:'mbufs'::jsonb->>'closures_pkey')::int < 500,
                     'maintain: a pass reads the open claims only: ' || :'mbufs');
CREATE FUNCTION pg_temp.plan(q text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  p jsonb;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, FORMAT JSON) ' || q INTO p;
  RETURN p;
END $$;
SELECT pg_temp.plan('SELECT count(*) FROM open_attempts') AS oplan \gset
SELECT pg_temp.check(sum((n->>'Actual Rows')::bigint * (n->>'Actual Loops')::bigint) <= :open_n,
                     'open_attempts: driven by open_claims, one probe of claims each: ' || :'oplan')
  FROM jsonb_path_query(:'oplan'::jsonb, 'strict $.**') n
 WHERE jsonb_typeof(n) = 'object' AND n->>'Relation Name' = 'claims';
ANALYZE open_claims;

-- ---- retention and the trace recorder -----------------------------------------------------------

-- The recorder (tools/trace/recorder.sql, installed last: its triggers stay) records a terminal
-- record's removal when its claims row or its closures go, whichever first, by the other: the
-- claim row goes first and records it; its closures, forgotten a day later, record nothing.
\setenv TA_S :s
\setenv TA_ROOT :root
\set rec `f="$TA_TMP/recorder.sql"; sed "s/@schema@/$TA_S/g" "$TA_ROOT/tools/trace/recorder.sql" > "$f" && echo "$f"`
\i :rec
SELECT pg_temp.job('tr_q') AS tr1, pg_temp.job('tr_q') AS tr2, pg_temp.job('tr_q') AS tr3 \gset
SELECT pg_temp.claim(ARRAY[:tr1, :tr2]) AS tra, pg_temp.claim(ARRAY[:tr3]) AS trb \gset
SELECT pg_temp.close(:tr1, 'c', '2 days'), pg_temp.close(:tr2, 'x', '2 days');
INSERT INTO closures (claim_id, pos, outcome, closed_at) VALUES (:trb, 1, 'a', now() - interval '10 minutes');
INSERT INTO ready (id, queue, priority, run_at, created_at, run_lease, attempt) VALUES (:tr3, 'tr_q', 2, now(), now(), :trb::bigint * 65536 + 1, 1);
SELECT pg_temp.settle(ARRAY[:tra, :trb]);
SELECT coalesce(max(seq), 0) AS tr_seq FROM trace_events \gset
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.check(:pruned = 2 AND pg_temp.retired(ARRAY[:tra, :trb]) = 2 AND pg_temp.kept(ARRAY[:tra, :trb]) = 3, 'trace: pruned');
SELECT pg_temp.check(string_agg(format('%s %s %s %s %s', e.tbl, e.op, e.job_id, e.run_lease, e.state), ', ' ORDER BY e.seq)
                       = format('done D %s %s completed, done D %s %s cancelled', :tr1, :tra::bigint * 65536 + 1, :tr2, :tra::bigint * 65536 + 2)
                     AND bool_and(e.who LIKE '%prune_expired%'),
                     'trace: the removal of the two terminal records, once each, by the claims row''s delete, not '
                     || string_agg(format('%s %s %s %s %s', e.tbl, e.op, e.job_id, e.run_lease, e.state), ', ' ORDER BY e.seq))
  FROM trace_events e WHERE e.seq > :tr_seq AND e.job_id IN (:tr1, :tr2, :tr3);
UPDATE settled_claims SET retired_at = now() - interval '1 day 1 minute' WHERE claim_id IN (:tra, :trb);
SELECT coalesce(max(seq), 0) AS tr_seq FROM trace_events \gset
SELECT prune_expired() AS pruned \gset
SELECT pg_temp.check(:pruned = 0 AND pg_temp.kept(ARRAY[:tra, :trb]) = 0 AND pg_temp.retired(ARRAY[:tra, :trb]) = 0
                     AND NOT EXISTS (SELECT FROM trace_events e WHERE e.seq > :tr_seq),
                     'trace: the forgotten closures record nothing');

\! rm -rf "$TA_TMP"
\o
\echo 50_admin: all expectations held
