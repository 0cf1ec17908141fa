-- Tests of part 30 (closing an attempt): complete_batch, complete_job, token_attempt,
-- lock_token_attempt, heartbeat(token), fail_attempt, fail_job, snooze_attempt, cancel_attempt,
-- attempt_evidence(_batch).
--
--   psql -v ON_ERROR_STOP=1 -v s=SCHEMA -f tests/sql/ledger/30_close.sql, on a schema made as ledger_scenarios_pgtest.cpp makes it
--
-- Needs the state of --fill (job 1 open with the legacy run lease 1, job 2 completed with lease 1).
-- Claims are written directly (one claims row, its open_claims row), so the tests depend on the
-- claim function of no other part. The concurrency cases run a second session with psql in the
-- background (\!), found through pg_stat_activity by its application_name.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;
SET search_path = :"s";
\pset format unaligned
\pset tuples_only on

-- ---- helpers ----------------------------------------------------------------------------------

CREATE FUNCTION pg_temp.check(ok boolean, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION 'expectation failed: %', what;
  END IF;
END $$;

-- sqlstate, message and hint of running `stmt` ('00000' when it succeeds; rolled back either way
-- when it fails, as a savepoint would).
CREATE FUNCTION pg_temp.error_of(stmt text, OUT state text, OUT message text, OUT hint text)
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  state := '00000';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
END $$;

CREATE FUNCTION pg_temp.token(job_id bigint, run_lease bigint, secret uuid) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT 'tn2:' || job_id || ':' || run_lease || ':' || encode(uuid_send(secret), 'hex')
$$;

-- n new jobs of `queue`, claimed by one claim statement as attempt `attempt`, carrying last_error
-- and progress from earlier attempts when given.
CREATE FUNCTION pg_temp.claim_new(n int, queue text DEFAULT 'tc', max_attempts int DEFAULT 3,
                                  attempt int DEFAULT 1, last_error text DEFAULT NULL,
                                  progress jsonb DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, secret uuid, token text)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
  ids  bigint[];
  secs uuid[];
  cid  bigint;
BEGIN
  WITH j AS (INSERT INTO specs (queue, kind, args, max_attempts, metadata)
             SELECT queue, 'k', jsonb_build_object('i', g), max_attempts, '{"m":1}' FROM generate_series(1, n) g
             RETURNING id)
  SELECT array_agg(j.id ORDER BY j.id) INTO ids FROM j;
  secs := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, n));
  cid := nextval('claim_id_seq');
  INSERT INTO claims (claim_id, queue, worker, claimed_at, deadline_at, lo, hi, job_ids, attempts, secrets,
                      run_ats, last_errors, progress, run_leases)
  VALUES (cid, queue, 'test', now(), NULL, ids[1], ids[n], ids, array_fill(attempt, ARRAY[n]), secs,
          array_fill(now() - interval '1 minute', ARRAY[n]),
          CASE WHEN last_error IS NOT NULL THEN array_fill(last_error, ARRAY[n]) END,
          CASE WHEN progress IS NOT NULL THEN array_fill(progress, ARRAY[n]) END, NULL);
  INSERT INTO open_claims (claim_id, queue) VALUES (cid, queue);
  RETURN QUERY SELECT ids[p], cid * 65536 + p, secs[p], pg_temp.token(ids[p], cid * 65536 + p, secs[p])
                 FROM generate_series(1, n) p;
END $$;

-- One job whose open attempt came from schema 23 with run lease `lease`, as the migration makes it.
CREATE FUNCTION pg_temp.claim_legacy(lease bigint, queue text DEFAULT 'tc', max_attempts int DEFAULT 3,
                                     attempt int DEFAULT 1)
RETURNS TABLE(job_id bigint, run_lease bigint, secret uuid, token text)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
  id  bigint;
  sec uuid := gen_random_uuid();
  cid bigint := nextval('claim_id_seq');
BEGIN
  INSERT INTO specs (queue, kind, args, max_attempts) VALUES (queue, 'k', '{}', max_attempts) RETURNING specs.id INTO id;
  INSERT INTO claims (claim_id, queue, worker, claimed_at, lo, hi, job_ids, attempts, secrets, run_ats, run_leases)
  VALUES (cid, queue, 'test', now(), id, id, ARRAY[id], ARRAY[attempt], ARRAY[sec], ARRAY[now()], ARRAY[lease]);
  INSERT INTO legacy_attempts (job_id, run_lease, claim_id, pos) VALUES (id, lease, cid, 1);
  INSERT INTO open_claims (claim_id, queue) VALUES (cid, queue);
  RETURN QUERY SELECT id, lease, sec, pg_temp.token(id, lease, sec);
END $$;

-- Whether the attempt is open: its item has no closure.
CREATE FUNCTION pg_temp.is_open(job_id bigint, run_lease bigint) RETURNS boolean
LANGUAGE sql AS $$
  SELECT EXISTS (SELECT 1 FROM attempt_at(job_id, run_lease) a
                  WHERE NOT EXISTS (SELECT 1 FROM closures x WHERE x.claim_id = a.claim_id AND x.pos = a.pos))
$$;

CREATE FUNCTION pg_temp.closure_of(job_id bigint, run_lease bigint) RETURNS closures
LANGUAGE sql AS $$
  SELECT x.* FROM attempt_at(job_id, run_lease) a JOIN closures x ON x.claim_id = a.claim_id AND x.pos = a.pos
$$;

-- Everything a close may write, as one text: a stale or second close must leave it as it was.
CREATE FUNCTION pg_temp.fingerprint() RETURNS text LANGUAGE sql AS $$
  SELECT md5(concat_ws('|',
    (SELECT string_agg(x::text, ',' ORDER BY x.claim_id, x.pos) FROM closures x),
    (SELECT string_agg(r::text, ',' ORDER BY r.id) FROM ready r),
    (SELECT string_agg(d::text, ',' ORDER BY d.id) FROM deferred d),
    (SELECT string_agg(d::text, ',' ORDER BY d.id) FROM dead_letter d),
    (SELECT string_agg(a::text, ',' ORDER BY a.job_id, a.run_lease) FROM attempt_state a)))
$$;

-- The advisory lock key of an attempt, as pg_locks shows it.
CREATE FUNCTION pg_temp.holds_attempt_lock(job_id bigint, run_lease bigint) RETURNS boolean
LANGUAGE sql AS $$
  SELECT EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
                    AND l.classid = hashtext(current_schema() || '.attempt')::oid
                    AND l.objid = attempt_lock_key(job_id, run_lease)::oid AND l.objsubid = 2)
$$;

INSERT INTO queues (name, dead_letter) VALUES ('tc_dlq', true) ON CONFLICT (name) DO UPDATE SET dead_letter = true;

SELECT pg_temp.check(pg_temp.is_open(1, 1) AND (pg_temp.closure_of(2, 1)).outcome = 'c',
                     'the state of the scenario install: job 1 open with lease 1, job 2 completed with lease 1');

-- ---- complete_batch ---------------------------------------------------------------------------

CREATE TEMPORARY TABLE a AS SELECT * FROM pg_temp.claim_new(4, progress => '{"carried":1}');
DO $$
DECLARE
  j bigint[] := ARRAY(SELECT job_id FROM a ORDER BY job_id);
  l bigint[] := ARRAY(SELECT run_lease FROM a ORDER BY job_id);
  s uuid[]   := ARRAY(SELECT secret FROM a ORDER BY job_id);
  fp text;
  n int;
BEGIN
  -- job 2 has the attempt's own progress, job 3 is waiting on a callback
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES (j[2], l[2], now(), '{"live":2}');
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, waiting) VALUES (j[3], l[3], now(), true);

  -- duplicates are one item; the one with progress is kept
  PERFORM pg_temp.check((SELECT count(*) FROM complete_batch(ARRAY[j[1], j[1], j[2], j[3]],
                                                             ARRAY[l[1], l[1], l[2], l[3]],
                                                             ARRAY[NULL, '{"given":1}', NULL, NULL]::jsonb[])) = 2,
                        'complete_batch: two applied, the waiting one refused');
  PERFORM pg_temp.check((pg_temp.closure_of(j[1], l[1])).progress = '{"given":1}', 'given progress kept');
  PERFORM pg_temp.check((pg_temp.closure_of(j[2], l[2])).progress = '{"live":2}', 'attempt progress kept');
  PERFORM pg_temp.check((pg_temp.closure_of(j[1], l[1])).outcome = 'c', 'outcome c');
  PERFORM pg_temp.check(pg_temp.is_open(j[3], l[3]), 'waiting attempt still open');
  PERFORM pg_temp.check((SELECT state FROM jobs WHERE id = j[1]) = 'completed', 'jobs: completed');
  PERFORM pg_temp.check((SELECT progress FROM done WHERE id = j[1]) = '{"given":1}', 'done: final progress');

  -- a second close of the same attempts changes nothing
  fp := pg_temp.fingerprint();
  PERFORM pg_temp.check((SELECT count(*) FROM complete_batch(ARRAY[j[1], j[2]], ARRAY[l[1], l[2]])) = 0,
                        'second complete_batch applies nothing');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'second complete_batch changes nothing');

  -- stale leases: one more, one less, another job's lease, a lease of no claim, lease 0, a legacy
  -- lease that is not the job's, a legacy lease already closed (job 2 of --fill), and a lease of
  -- this layout that decodes to the place of job 1's legacy attempt (claim 1, item 1)
  PERFORM pg_temp.check((SELECT count(*) FROM complete_batch(
                           ARRAY[j[4], j[4], j[4], j[4], j[4], j[4], 2, 1],
                           ARRAY[l[4] + 1, l[4] - 1, l[1], (((l[4] >> 16) + 1000) << 16) | 1, 0, 7, 1,
                                 (SELECT claim_id * 65536 + pos FROM legacy_attempts WHERE job_id = 1 AND run_lease = 1)])) = 0,
                        'stale leases apply nothing');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'stale complete_batch changes nothing');

  -- secrets: a wrong one is stale, the right one applies, NULL matches by the pair alone
  PERFORM pg_temp.check((SELECT count(*) FROM complete_batch(ARRAY[j[4]], ARRAY[l[4]], NULL,
                                                             ARRAY[gen_random_uuid()])) = 0,
                        'wrong secret applies nothing');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'wrong secret changes nothing');
  PERFORM pg_temp.check((SELECT count(*) FROM complete_batch(ARRAY[j[4], j[3]], ARRAY[l[4], l[3]], NULL,
                                                             ARRAY[s[4], NULL])) = 1,
                        'right secret applies');
  PERFORM pg_temp.check((pg_temp.closure_of(j[4], l[4])).progress IS NULL, 'no final progress: NULL in the closure');
  PERFORM pg_temp.check((SELECT progress FROM done WHERE id = j[4]) = '{"carried":1}', 'done falls back to carried progress');

  -- the waiting attempt completes once resumed
  UPDATE attempt_state SET waiting = false WHERE job_id = j[3];
  PERFORM pg_temp.check((SELECT array_agg(c.job_id || ':' || c.run_lease) FROM complete_batch(ARRAY[j[3]], ARRAY[l[3]]) c)
                        = ARRAY[j[3] || ':' || l[3]], 'resumed attempt completes, its pair returned');

  -- result: the applied pairs, with the statement's time
  SELECT count(*) INTO n FROM complete_batch(ARRAY[j[1]], ARRAY[l[1]]);
  PERFORM pg_temp.check(n = 0, 'still stale');
  PERFORM pg_temp.check((pg_temp.error_of('SELECT complete_batch(''{1,2}'', ''{1}'')')).state = '22023', 'lengths: 22023');
  PERFORM pg_temp.check((pg_temp.error_of('SELECT complete_batch(''{1}'', ''{1}'', NULL, ''{}'')')).state = '22023',
                        'secret lengths: 22023');
  PERFORM pg_temp.check((SELECT count(*) FROM complete_batch('{}', '{}')) = 0, 'empty batch');
END $$;

-- a batch over several claims, a legacy attempt among them; returned pairs are the inputs
CREATE TEMPORARY TABLE b AS SELECT * FROM pg_temp.claim_new(3) UNION ALL SELECT * FROM pg_temp.claim_new(2)
                            UNION ALL SELECT * FROM pg_temp.claim_legacy(5);
DO $$
BEGIN
  PERFORM pg_temp.check((SELECT array_agg(c.job_id || ':' || c.run_lease || ':' || (c.completed_at = now()) ORDER BY c.job_id)
                           FROM complete_batch(ARRAY(SELECT job_id FROM b), ARRAY(SELECT run_lease FROM b), NULL,
                                               ARRAY(SELECT secret FROM b)) c)
                        = (SELECT array_agg(job_id || ':' || run_lease || ':true' ORDER BY job_id) FROM b),
                        'batch over claims: every pair returned');
  PERFORM pg_temp.check(NOT EXISTS (SELECT 1 FROM b WHERE pg_temp.is_open(b.job_id, b.run_lease)), 'all closed');
END $$;

-- ---- complete_job -----------------------------------------------------------------------------

CREATE TEMPORARY TABLE c AS SELECT * FROM pg_temp.claim_new(3);
DO $$
DECLARE
  r  record;
  e  record;
  fp text;
  t  text[] := ARRAY(SELECT token FROM c ORDER BY job_id);
  j  bigint[] := ARRAY(SELECT job_id FROM c ORDER BY job_id);
  l  bigint[] := ARRAY(SELECT run_lease FROM c ORDER BY job_id);
BEGIN
  SELECT * INTO r FROM complete_job(t[1], '{"p":1}');
  PERFORM pg_temp.check(r.job_id = j[1] AND r.run_lease = l[1] AND r.completed_at = now(), 'complete_job returns its pair');
  PERFORM pg_temp.check((pg_temp.closure_of(j[1], l[1])).progress = '{"p":1}', 'complete_job: progress');
  PERFORM pg_temp.check(pg_temp.holds_attempt_lock(j[1], l[1]), 'complete_job holds the attempt''s advisory lock');

  -- second completion: TN001, exactly as before, and nothing changes
  fp := pg_temp.fingerprint();
  e := pg_temp.error_of(format('SELECT complete_job(%L)', t[1]));
  PERFORM pg_temp.check(e.state = 'TN001', 'second complete_job: TN001');
  PERFORM pg_temp.check(e.message = format('stale attempt: job %s run lease %s is no longer running', j[1], l[1]),
                        'TN001 message: ' || e.message);
  PERFORM pg_temp.check(e.hint = 'the attempt was rescued, cancelled, re-claimed or already finished; this transaction must roll back',
                        'TN001 hint');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'second complete_job changes nothing');

  -- wrong secret: TN001 with the same words; the attempt stays open
  e := pg_temp.error_of(format('SELECT complete_job(%L)', pg_temp.token(j[2], l[2], gen_random_uuid())));
  PERFORM pg_temp.check(e.state = 'TN001' AND e.message = format('stale attempt: job %s run lease %s is no longer running', j[2], l[2])
                        AND e.hint LIKE 'the attempt was rescued%', 'wrong secret: TN001');
  PERFORM pg_temp.check(pg_temp.is_open(j[2], l[2]), 'wrong secret: still open');
  -- another attempt's secret
  e := pg_temp.error_of(format('SELECT complete_job(%L)', pg_temp.token(j[2], l[2], (SELECT secret FROM c WHERE job_id = j[3]))));
  PERFORM pg_temp.check(e.state = 'TN001', 'another attempt''s secret: TN001');
  -- stale lease with the right secret
  e := pg_temp.error_of(format('SELECT complete_job(%L)', pg_temp.token(j[2], l[2] + 1, (SELECT secret FROM c WHERE job_id = j[2]))));
  PERFORM pg_temp.check(e.state = 'TN001', 'stale lease: TN001');
  -- malformed
  PERFORM pg_temp.check((pg_temp.error_of('SELECT complete_job(''tn2:1:2:zz'')')).state = 'TN002', 'malformed: TN002');
  PERFORM pg_temp.check((pg_temp.error_of('SELECT complete_job(''tn1:1:2'')')).state = 'TN002', 'tn1: TN002');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'refused complete_job changes nothing');
  -- 19-digit numbers take parse_token's path
  e := pg_temp.error_of(format('SELECT complete_job(%L)', pg_temp.token(1000000000000000000, 1000000000000000000, gen_random_uuid())));
  PERFORM pg_temp.check(e.state = 'TN001', 'long numbers: TN001');

  -- waiting on a callback: TN001; once resumed, completes
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress, waiting) VALUES (j[2], l[2], now(), '{"live":1}', true);
  PERFORM pg_temp.check((pg_temp.error_of(format('SELECT complete_job(%L)', t[2]))).state = 'TN001', 'waiting: TN001');
  UPDATE attempt_state SET waiting = false WHERE job_id = j[2];
  PERFORM complete_job(t[2]);
  PERFORM pg_temp.check((pg_temp.closure_of(j[2], l[2])).progress = '{"live":1}', 'complete_job: attempt progress');
END $$;

-- the legacy attempt of --fill (job 1, lease 1), by its token
SELECT pg_temp.token(1, 1, secrets[1]) AS legacy_token FROM claims c JOIN legacy_attempts l USING (claim_id)
 WHERE l.job_id = 1 AND l.run_lease = 1 \gset
DO $$
BEGIN
  PERFORM pg_temp.check(attempt_evidence(1, 1) = 'open', 'legacy: open');
  PERFORM pg_temp.check(attempt_evidence(1, 65537) = 'closed_by_other', 'legacy place by a new lease: not that attempt');
  PERFORM pg_temp.check(NOT cancel_attempt(1, 65537) AND NOT snooze_attempt(1, 65537, NULL)
                        AND fail_attempt(1, 65537, 'x') IS NULL, 'legacy place by a new lease: stale');
  PERFORM pg_temp.check((token_attempt(pg_temp.token(1, 1, gen_random_uuid()))).live IS FALSE, 'legacy: wrong secret not live');
  PERFORM pg_temp.check((pg_temp.error_of(format('SELECT complete_job(%L)', pg_temp.token(1, 1, gen_random_uuid())))).state = 'TN001',
                        'legacy: wrong secret TN001');
  PERFORM pg_temp.check((pg_temp.error_of(format('SELECT complete_job(%L)', pg_temp.token(1, 2, gen_random_uuid())))).state = 'TN001',
                        'legacy: lease 2 TN001');
END $$;
SELECT pg_temp.check((token_attempt(:'legacy_token')).live, 'legacy: token live');
SELECT pg_temp.check((SELECT job_id = 1 AND run_lease = 1 FROM complete_job(:'legacy_token')), 'legacy: complete_job');
SELECT pg_temp.check((SELECT state FROM jobs WHERE id = 1) = 'completed' AND attempt_evidence(1, 1) = 'completed',
                     'legacy: completed');
SELECT pg_temp.check((pg_temp.error_of(format('SELECT complete_job(%L)', :'legacy_token'))).state = 'TN001', 'legacy: second TN001');
SELECT pg_temp.check((SELECT count(*) FROM complete_batch('{1}', '{1}')) = 0, 'legacy: complete_batch stale');

-- ---- token_attempt, lock_token_attempt, heartbeat(token), fail_job ----------------------------

CREATE TEMPORARY TABLE d AS SELECT * FROM pg_temp.claim_new(3, max_attempts => 2);
DO $$
DECLARE
  t  text[] := ARRAY(SELECT token FROM d ORDER BY job_id);
  j  bigint[] := ARRAY(SELECT job_id FROM d ORDER BY job_id);
  l  bigint[] := ARRAY(SELECT run_lease FROM d ORDER BY job_id);
  bad text;
  r  record;
  e  record;
  fp text;
BEGIN
  bad := pg_temp.token(j[1], l[1], gen_random_uuid());
  r := token_attempt(t[1]);
  PERFORM pg_temp.check(r.job_id = j[1] AND r.run_lease = l[1] AND r.live, 'token_attempt: live');
  r := token_attempt(bad);
  PERFORM pg_temp.check(r.job_id = j[1] AND r.run_lease = l[1] AND NOT r.live, 'token_attempt: wrong secret');
  PERFORM pg_temp.check(NOT pg_temp.holds_attempt_lock(j[1], l[1]), 'token_attempt takes no lock');
  r := lock_token_attempt(bad);
  PERFORM pg_temp.check(NOT r.live AND NOT pg_temp.holds_attempt_lock(j[1], l[1]), 'lock_token_attempt: wrong secret, no lock');
  r := lock_token_attempt(t[1]);
  PERFORM pg_temp.check(r.live AND pg_temp.holds_attempt_lock(j[1], l[1]), 'lock_token_attempt: live, locked');

  PERFORM pg_temp.check(heartbeat(t[1]), 'heartbeat(token): live');
  PERFORM pg_temp.check(EXISTS (SELECT 1 FROM attempt_state WHERE job_id = j[1] AND run_lease = l[1]), 'heartbeat wrote');
  PERFORM pg_temp.check(NOT heartbeat(bad), 'heartbeat(token): wrong secret');
  PERFORM pg_temp.check((pg_temp.error_of('SELECT heartbeat(''x'')')).state = 'TN002', 'heartbeat: malformed');

  -- fail_job: retryable (attempt 1 of 2), then TN001
  PERFORM pg_temp.check(fail_job(t[1], 'boom') = 'retryable', 'fail_job: retryable');
  PERFORM pg_temp.check(NOT (token_attempt(t[1])).live AND NOT heartbeat(t[1]), 'closed: not live, no heartbeat');
  fp := pg_temp.fingerprint();
  e := pg_temp.error_of(format('SELECT fail_job(%L, ''again'')', t[1]));
  PERFORM pg_temp.check(e.state = 'TN001' AND e.message = format('stale attempt: job %s run lease %s is no longer running', j[1], l[1])
                        AND e.hint = '', 'fail_job: second TN001, no hint');
  PERFORM pg_temp.check((pg_temp.error_of(format('SELECT fail_job(%L, ''x'')', pg_temp.token(j[2], l[2], gen_random_uuid())))).state = 'TN001',
                        'fail_job: wrong secret TN001');
  PERFORM pg_temp.check((pg_temp.error_of(format('SELECT complete_job(%L)', t[1]))).state = 'TN001', 'complete after fail: TN001');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'refused fail_job changes nothing');
  -- retry = false: failed for good
  PERFORM pg_temp.check(fail_job(t[2], 'fatal', false) = 'failed', 'fail_job(retry false): failed');
  PERFORM pg_temp.check((SELECT state || ':' || last_error FROM jobs WHERE id = j[2]) = 'failed:fatal', 'jobs: failed');
END $$;

-- ---- fail_attempt -----------------------------------------------------------------------------

CREATE TEMPORARY TABLE f AS SELECT * FROM pg_temp.claim_new(4, max_attempts => 2, last_error => 'earlier', progress => '{"carried":1}');
CREATE TEMPORARY TABLE f2 AS SELECT * FROM pg_temp.claim_new(2, max_attempts => 2, attempt => 2);
CREATE TEMPORARY TABLE fd AS SELECT * FROM pg_temp.claim_new(2, queue => 'tc_dlq', max_attempts => 1, progress => '{"carried":2}');
CREATE TEMPORARY TABLE fl AS SELECT * FROM pg_temp.claim_legacy(3, max_attempts => 5, attempt => 3);
DO $$
DECLARE
  j  bigint[] := ARRAY(SELECT job_id FROM f ORDER BY job_id);
  l  bigint[] := ARRAY(SELECT run_lease FROM f ORDER BY job_id);
  j2 bigint[] := ARRAY(SELECT job_id FROM f2 ORDER BY job_id);
  l2 bigint[] := ARRAY(SELECT run_lease FROM f2 ORDER BY job_id);
  jd bigint[] := ARRAY(SELECT job_id FROM fd ORDER BY job_id);
  ld bigint[] := ARRAY(SELECT run_lease FROM fd ORDER BY job_id);
  r  record;
  x  closures;
  fp text;
BEGIN
  -- retryable with backoff: a narrow deferred row with the lease and attempt, error and progress
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES (j[1], l[1], now(), '{"live":1}');
  PERFORM pg_temp.check(fail_attempt(j[1], l[1], 'e1') = 'retryable', 'fail_attempt: retryable');
  x := pg_temp.closure_of(j[1], l[1]);
  PERFORM pg_temp.check(x.outcome = 'r' AND x.last_error IS NULL AND x.progress IS NULL, 'closure r, no detail');
  SELECT * INTO r FROM deferred WHERE id = j[1];
  PERFORM pg_temp.check(r.state = 'retryable' AND r.run_lease = l[1] AND r.attempt = 1 AND r.last_error = 'e1'
                        AND r.progress = '{"live":1}' AND r.queue = 'tc' AND r.priority = 2
                        AND r.run_at >= now() + interval '0.5 second' AND r.run_at <= now() + interval '1 second'
                        AND r.created_at = (SELECT created_at FROM specs WHERE id = j[1]), 'deferred row: ' || r::text);
  PERFORM pg_temp.check((SELECT state || ':' || attempt || ':' || run_lease FROM jobs WHERE id = j[1]) = 'retryable:1:' || l[1], 'jobs: retryable');
  -- retry_after; progress carried from earlier attempts when the attempt has none
  PERFORM pg_temp.check(fail_attempt(j[2], l[2], 'e2', false, interval '1 hour') = 'retryable', 'retry_after: retryable');
  SELECT * INTO r FROM deferred WHERE id = j[2];
  PERFORM pg_temp.check(r.run_at = now() + interval '1 hour' AND r.progress = '{"carried":1}' AND r.last_error = 'e2', 'retry_after row');
  PERFORM pg_temp.check(fail_attempt(j[4], l[4], 'e4', false, interval '-1 hour') = 'retryable', 'negative retry_after');
  PERFORM pg_temp.check((SELECT run_at FROM deferred WHERE id = j[4]) = now(), 'negative retry_after: now');

  -- second and stale: NULL, nothing changes
  fp := pg_temp.fingerprint();
  PERFORM pg_temp.check(fail_attempt(j[1], l[1], 'again') IS NULL, 'second fail_attempt: NULL');
  PERFORM pg_temp.check(fail_attempt(j[3], l[3] + 1, 'x') IS NULL, 'stale lease: NULL');
  PERFORM pg_temp.check(fail_attempt(j[3], l[1], 'x') IS NULL, 'another job''s lease: NULL');
  PERFORM pg_temp.check((SELECT count(*) FROM complete_batch(ARRAY[j[1]], ARRAY[l[1]])) = 0, 'complete after fail: stale');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'stale fail_attempt changes nothing');

  -- permanent: 'f', the error and the attempt's progress in the closure
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES (j[3], l[3], now(), '{"live":3}');
  PERFORM pg_temp.check(fail_attempt(j[3], l[3], 'fatal', true) = 'failed', 'permanent: failed');
  x := pg_temp.closure_of(j[3], l[3]);
  PERFORM pg_temp.check(x.outcome = 'f' AND x.last_error = 'fatal' AND x.progress = '{"live":3}', 'closure f');
  PERFORM pg_temp.check(NOT EXISTS (SELECT 1 FROM deferred WHERE id = j[3]), 'permanent: no deferred row');
  PERFORM pg_temp.check((SELECT state || ':' || last_error || ':' || progress::text FROM done WHERE id = j[3]) = 'failed:fatal:{"live": 3}',
                        'done: failed');

  -- attempts spent: failed; the carried progress in the done view
  PERFORM pg_temp.check(fail_attempt(j2[1], l2[1], 'spent') = 'failed', 'spent: failed');
  PERFORM pg_temp.check((SELECT state FROM jobs WHERE id = j2[1]) = 'failed', 'jobs: spent failed');
  PERFORM pg_temp.check(fail_attempt(j2[2], l2[2], repeat('x', 70000)) = 'failed', 'long error: failed');
  PERFORM pg_temp.check((pg_temp.closure_of(j2[2], l2[2])).last_error LIKE '%[truncated 4464 characters]', 'error bounded');

  -- a dead-lettering queue: 'd' and the full dead_letter row
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES (jd[2], ld[2], now(), '{"live":4}');
  PERFORM pg_temp.check(fail_attempt(jd[1], ld[1], 'dead') = 'failed', 'dlq: failed');
  PERFORM pg_temp.check(fail_attempt(jd[2], ld[2], 'dead2', true) = 'failed', 'dlq permanent: failed');
  x := pg_temp.closure_of(jd[1], ld[1]);
  PERFORM pg_temp.check(x.outcome = 'd' AND x.last_error IS NULL, 'closure d');
  SELECT * INTO r FROM dead_letter WHERE id = jd[1];
  PERFORM pg_temp.check(r.queue = 'tc_dlq' AND r.kind = 'k' AND r.args = (SELECT args FROM specs WHERE id = jd[1])
                        AND r.priority = 2 AND r.attempt = 1 AND r.max_attempts = 1 AND r.run_lease = ld[1]
                        AND r.run_at = (SELECT i.run_at FROM claim_items i WHERE i.job_id = jd[1]) AND r.finalized_at = now() AND r.last_error = 'dead'
                        AND r.progress = '{"carried":2}' AND r.metadata = '{"m":1}', 'dead_letter row: ' || r::text);
  PERFORM pg_temp.check((SELECT progress FROM dead_letter WHERE id = jd[2]) = '{"live":4}', 'dead_letter: live progress');
  PERFORM pg_temp.check((SELECT count(*) FROM jobs WHERE id = jd[1]) = 1
                        AND (SELECT state || ':' || dead_lettered FROM jobs WHERE id = jd[1]) = 'failed:true', 'jobs: dead-lettered');
  PERFORM pg_temp.check(fail_attempt(jd[1], ld[1], 'again') IS NULL, 'dlq second: NULL');
  PERFORM pg_temp.check((SELECT count(*) FROM dead_letter WHERE id = jd[1]) = 1, 'one dead_letter row');
END $$;
-- a legacy attempt fails into deferred with its old lease
SELECT pg_temp.check(fail_attempt(job_id, run_lease, 'legacy') = 'retryable', 'legacy fail_attempt') FROM fl;
SELECT pg_temp.check((SELECT run_lease = 3 AND attempt = 3 FROM deferred WHERE id = fl.job_id), 'legacy deferred row') FROM fl;
SELECT pg_temp.check(fail_attempt(job_id, run_lease, 'legacy') IS NULL, 'legacy second fail_attempt') FROM fl;

-- ---- snooze_attempt ---------------------------------------------------------------------------

CREATE TEMPORARY TABLE sn AS SELECT * FROM pg_temp.claim_new(3, attempt => 2, last_error => 'before', progress => '{"carried":1}');
CREATE TEMPORARY TABLE snl AS SELECT * FROM pg_temp.claim_legacy(4, attempt => 2);
DO $$
DECLARE
  j  bigint[] := ARRAY(SELECT job_id FROM sn ORDER BY job_id);
  l  bigint[] := ARRAY(SELECT run_lease FROM sn ORDER BY job_id);
  r  record;
  fp text;
BEGIN
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES (j[1], l[1], now(), '{"live":1}');
  PERFORM pg_temp.check(snooze_attempt(j[1], l[1], NULL), 'snooze now');
  SELECT * INTO r FROM ready WHERE id = j[1];
  PERFORM pg_temp.check(r.run_lease = l[1] AND r.attempt = 1 AND r.run_at = now() AND r.last_error = 'before'
                        AND r.progress = '{"live":1}' AND r.resume_payload IS NULL AND r.queue = 'tc', 'ready row: ' || r::text);
  PERFORM pg_temp.check((pg_temp.closure_of(j[1], l[1])).outcome = 's', 'closure s');
  PERFORM pg_temp.check(snooze_attempt(j[2], l[2], interval '0'), 'snooze zero: ready');
  PERFORM pg_temp.check(EXISTS (SELECT 1 FROM ready WHERE id = j[2] AND progress = '{"carried":1}'), 'zero delay: ready, carried progress');
  PERFORM pg_temp.check(snooze_attempt(j[3], l[3], interval '1 hour'), 'snooze later');
  SELECT * INTO r FROM deferred WHERE id = j[3];
  PERFORM pg_temp.check(r.state = 'scheduled' AND r.run_at = now() + interval '1 hour' AND r.attempt = 1 AND r.run_lease = l[3],
                        'deferred row: ' || r::text);
  PERFORM pg_temp.check((SELECT state FROM jobs WHERE id = j[3]) = 'scheduled', 'jobs: scheduled');
  fp := pg_temp.fingerprint();
  PERFORM pg_temp.check(NOT snooze_attempt(j[1], l[1], NULL), 'second snooze: false');
  PERFORM pg_temp.check(NOT snooze_attempt(j[3], l[3], interval '1 hour'), 'second snooze later: false');
  PERFORM pg_temp.check(NOT snooze_attempt(j[2], l[2] + 7, NULL), 'stale snooze: false');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'stale snooze changes nothing');
END $$;
SELECT pg_temp.check(snooze_attempt(job_id, run_lease, NULL), 'legacy snooze') FROM snl;
SELECT pg_temp.check((SELECT run_lease = 4 AND attempt = 1 FROM ready WHERE id = snl.job_id), 'legacy ready row') FROM snl;

-- ---- cancel_attempt ---------------------------------------------------------------------------

CREATE TEMPORARY TABLE ca AS SELECT * FROM pg_temp.claim_new(2, last_error => 'before', progress => '{"carried":1}');
CREATE TEMPORARY TABLE cal AS SELECT * FROM pg_temp.claim_legacy(9);
DO $$
DECLARE
  j  bigint[] := ARRAY(SELECT job_id FROM ca ORDER BY job_id);
  l  bigint[] := ARRAY(SELECT run_lease FROM ca ORDER BY job_id);
  x  closures;
  fp text;
BEGIN
  INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress) VALUES (j[1], l[1], now(), '{"live":1}');
  PERFORM pg_temp.check(cancel_attempt(j[1], l[1], 'stop'), 'cancel_attempt');
  x := pg_temp.closure_of(j[1], l[1]);
  PERFORM pg_temp.check(x.outcome = 'x' AND x.last_error = 'stop' AND x.progress = '{"live":1}', 'closure x');
  PERFORM pg_temp.check((SELECT state || ':' || last_error || ':' || progress::text FROM jobs WHERE id = j[1]) = 'cancelled:stop:{"live": 1}',
                        'jobs: cancelled');
  PERFORM pg_temp.check(cancel_attempt(j[2], l[2]), 'cancel without reason');
  PERFORM pg_temp.check((SELECT last_error || ':' || progress::text FROM done WHERE id = j[2]) = 'before:{"carried": 1}',
                        'done: carried error and progress');
  fp := pg_temp.fingerprint();
  PERFORM pg_temp.check(NOT cancel_attempt(j[1], l[1], 'again'), 'second cancel: false');
  PERFORM pg_temp.check(NOT cancel_attempt(j[1], l[1] + 1), 'stale cancel: false');
  PERFORM pg_temp.check(NOT cancel_attempt(j[1], 0), 'lease 0: false');
  PERFORM pg_temp.check(pg_temp.fingerprint() = fp, 'stale cancel changes nothing');
END $$;
SELECT pg_temp.check(cancel_attempt(job_id, run_lease), 'legacy cancel') FROM cal;
SELECT pg_temp.check(NOT cancel_attempt(job_id, run_lease), 'legacy second cancel') FROM cal;

-- ---- attempt_evidence(_batch) -----------------------------------------------------------------

CREATE TEMPORARY TABLE ev AS SELECT * FROM pg_temp.claim_new(4);
DO $$
DECLARE
  j  bigint[] := ARRAY(SELECT job_id FROM ev ORDER BY job_id);
  l  bigint[] := ARRAY(SELECT run_lease FROM ev ORDER BY job_id);
  jd bigint := (SELECT job_id FROM fd ORDER BY job_id LIMIT 1);
  ld bigint := (SELECT run_lease FROM fd ORDER BY job_id LIMIT 1);
  asked_j bigint[];
  asked_l bigint[];
  want text[];
  got text[];
  one text[];
BEGIN
  PERFORM complete_batch(ARRAY[j[2]], ARRAY[l[2]]);
  PERFORM cancel_attempt(j[3], l[3]);
  PERFORM fail_attempt(j[4], l[4], 'x');
  -- ready job 3 and deferred job 4 of --fill never ran (lease 0); 987654321 never existed
  asked_j := ARRAY[j[1], j[2], j[3], j[4], j[2], 987654321, 3, 4, 2, 2, jd, j[1], j[1], j[1], NULL];
  asked_l := ARRAY[l[1], l[2], l[3], l[4], l[2] + 1, 1, 0, 0, 1, 2, ld, l[2], l[1], -5, 1];
  want := ARRAY['open', 'completed', 'closed_by_other', 'closed_by_other', 'closed_by_other', 'unknown_job',
                'closed_by_other', 'closed_by_other', 'completed', 'closed_by_other', 'closed_by_other',
                'closed_by_other', 'open', 'closed_by_other', 'unknown_job'];
  got := ARRAY(SELECT b.evidence FROM attempt_evidence_batch(asked_j, asked_l) b ORDER BY b.ord);
  PERFORM pg_temp.check(got = want, 'evidence batch: ' || got::text);
  PERFORM pg_temp.check((SELECT array_agg(b.ord ORDER BY b.ord) FROM attempt_evidence_batch(asked_j, asked_l) b)
                        = ARRAY(SELECT generate_series(1, 15)::bigint), 'evidence batch: ords');
  one := ARRAY(SELECT attempt_evidence(asked_j[i], asked_l[i]) FROM generate_series(1, 15) i ORDER BY i);
  PERFORM pg_temp.check(one = want, 'evidence one by one: ' || one::text);
  PERFORM pg_temp.check((pg_temp.error_of('SELECT attempt_evidence_batch(''{1,2}'', ''{1}'')')).state = '22023', 'evidence: 22023');
  PERFORM pg_temp.check((SELECT count(*) FROM attempt_evidence_batch('{}', '{}')) = 0, 'evidence: empty');
  -- a dead-lettered job whose spec is gone is still known (undone by the TC999 it raises)
  BEGIN
    DELETE FROM specs WHERE id = jd;
    PERFORM pg_temp.check(attempt_evidence(jd, ld + 1) = 'closed_by_other', 'dead_letter only: closed_by_other');
    PERFORM pg_temp.check(attempt_evidence(jd + 1000000, ld + 1) = 'unknown_job', 'neither: unknown_job');
    RAISE EXCEPTION 'undo' USING ERRCODE = 'TC999';
  EXCEPTION WHEN SQLSTATE 'TC999' THEN
    NULL;
  END;
  PERFORM pg_temp.check(EXISTS (SELECT 1 FROM specs WHERE id = jd), 'spec back');
END $$;

-- ---- two sessions -----------------------------------------------------------------------------
-- The second session: psql in the background with the same connection settings, its output in a
-- file; the first waits for it through pg_stat_activity (application_name tc_bg_<schema>).

\setenv PGHOST :HOST
\setenv PGPORT :PORT
\setenv PGUSER :USER
\setenv PGDATABASE :DBNAME
\setenv PGAPPNAME tc_bg_:s
\setenv PGOPTIONS '-c client_min_messages=warning'
\setenv TC_OUT /tmp/tenure_test_30_:s.out
\setenv TC_DONE /tmp/tenure_test_30_:s.done

CREATE FUNCTION pg_temp.await_bg(wait_event_type text, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..400 LOOP
    PERFORM pg_stat_clear_snapshot();
    IF EXISTS (SELECT 1 FROM pg_stat_activity a
                WHERE a.application_name = 'tc_bg_' || current_schema()
                  AND a.wait_event_type = await_bg.wait_event_type) THEN
      RETURN;
    END IF;
    PERFORM pg_sleep(0.025);
  END LOOP;
  RAISE EXCEPTION 'expectation failed: the second session never waited (%): %', wait_event_type, what;
END $$;

-- 1. complete_job left uncommitted; the runtime's complete_batch of the same attempt waits for it
--    and finds it stale once it commits. Meanwhile a wrong-secret complete_job is refused at once
--    (no wait on the lock), rescue's try of the attempt's lock fails, and the evidence is 'open'.
SELECT job_id AS c1_job, run_lease AS c1_lease, token AS c1_token FROM pg_temp.claim_new(1) \gset
SELECT format('SELECT count(*) FROM %I.complete_batch(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[])', :'s', :c1_job, :c1_lease) AS bg_sql \gset
\setenv TC_SQL :bg_sql
\! rm -f "$TC_OUT" "$TC_DONE"
BEGIN;
SELECT pg_temp.check((SELECT count(*) FROM complete_job(:'c1_token')) = 1, 'complete_job (left uncommitted)');
\! (psql -X -At -v ON_ERROR_STOP=1 -c "$TC_SQL" > "$TC_OUT" 2>&1; echo $? > "$TC_DONE") < /dev/null &
SELECT pg_temp.await_bg('Lock', 'complete_batch behind an uncommitted complete_job');
SELECT format('SET lock_timeout = ''5s''; DO $d$ BEGIN PERFORM * FROM %I.complete_job(%L); RAISE WARNING ''no error''; '
              'EXCEPTION WHEN OTHERS THEN RAISE WARNING ''%%'', SQLSTATE; END $d$',
              :'s', pg_temp.token(:c1_job, :c1_lease, gen_random_uuid())) AS probe_sql \gset
\setenv TC_SQL2 :probe_sql
\set probe `PGAPPNAME=tc_probe psql -X -At -c "$TC_SQL2" 2>&1`
SELECT pg_temp.check(:'probe' LIKE '%TN001%', 'a wrong-secret complete_job beside it: TN001 at once, not ' || :'probe');
SELECT format('SELECT pg_try_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))::text || '':'' || %I.attempt_evidence(%s, %s)',
              :'s' || '.attempt', :'s', :c1_job, :c1_lease, :'s', :c1_job, :c1_lease) AS probe_sql \gset
\setenv TC_SQL2 :probe_sql
\set probe `PGAPPNAME=tc_probe psql -X -At -c "$TC_SQL2" 2>&1`
SELECT pg_temp.check(:'probe' = 'false:open', 'beside it: the lock is held, the evidence open, not ' || :'probe');
COMMIT;
\! i=0; while [ ! -s "$TC_DONE" ] && [ $i -lt 400 ]; do sleep 0.025; i=$((i+1)); done
\set bg_out `cat "$TC_OUT"`
\set bg_rc `cat "$TC_DONE"`
SELECT pg_temp.check(:'bg_rc' = '0' AND :'bg_out' = '0', 'the waiting complete_batch found it stale, not ' || :'bg_out');
SELECT pg_temp.check((SELECT count(*) FROM closures x JOIN attempt_at(:c1_job, :c1_lease) a USING (claim_id, pos)) = 1
                     AND attempt_evidence(:c1_job, :c1_lease) = 'completed', 'one closure, completed');

-- 2. A caller's fail_job holds the attempt's lock to its commit: complete_job in another session
--    waits for it (advisory lock), then finds the attempt closed: TN001.
SELECT job_id AS c2_job, run_lease AS c2_lease, token AS c2_token FROM pg_temp.claim_new(1) \gset
SELECT format('SELECT * FROM %I.complete_job(%L)', :'s', :'c2_token') AS bg_sql \gset
\setenv TC_SQL :bg_sql
\! rm -f "$TC_OUT" "$TC_DONE"
BEGIN;
SELECT pg_temp.check(fail_job(:'c2_token', 'caller failed') = 'retryable', 'fail_job (left uncommitted)');
SELECT pg_temp.check(pg_temp.holds_attempt_lock(:c2_job, :c2_lease), 'fail_job holds the lock');
\! (psql -X -At -v ON_ERROR_STOP=1 -c "$TC_SQL" > "$TC_OUT" 2>&1; echo $? > "$TC_DONE") < /dev/null &
SELECT pg_temp.await_bg('Lock', 'complete_job behind fail_job');
SELECT pg_stat_clear_snapshot();
SELECT pg_temp.check(EXISTS (SELECT 1 FROM pg_stat_activity a
                              WHERE a.application_name = 'tc_bg_' || current_schema() AND a.wait_event = 'advisory'),
                     'complete_job waits on the advisory lock');
COMMIT;
\! i=0; while [ ! -s "$TC_DONE" ] && [ $i -lt 400 ]; do sleep 0.025; i=$((i+1)); done
\set bg_out `cat "$TC_OUT"`
\set bg_rc `cat "$TC_DONE"`
SELECT pg_temp.check(:'bg_rc' <> '0' AND :'bg_out' LIKE '%stale attempt: job ' || :c2_job || ' run lease ' || :c2_lease || ' is no longer running%',
                     'complete_job after the fail_job committed: TN001, not ' || :'bg_out');
SELECT pg_temp.check((SELECT state FROM jobs WHERE id = :c2_job) = 'retryable', 'the fail_job stands');

-- 3. heartbeat(token) in a caller's transaction holds the lock too (rescue passes the attempt by).
SELECT job_id AS c3_job, run_lease AS c3_lease, token AS c3_token FROM pg_temp.claim_new(1) \gset
SELECT format('SELECT pg_try_advisory_xact_lock(hashtext(%L), %I.attempt_lock_key(%s, %s))',
              :'s' || '.attempt', :'s', :c3_job, :c3_lease) AS probe_sql \gset
\setenv TC_SQL2 :probe_sql
BEGIN;
SELECT pg_temp.check(heartbeat(:'c3_token'), 'heartbeat(token)');
\set probe `PGAPPNAME=tc_probe psql -X -At -c "$TC_SQL2" 2>&1`
SELECT pg_temp.check(:'probe' = 'f', 'heartbeat(token) holds the lock, not ' || :'probe');
COMMIT;
\set probe `PGAPPNAME=tc_probe psql -X -At -c "$TC_SQL2" 2>&1`
SELECT pg_temp.check(:'probe' = 't', 'released at commit, not ' || :'probe');

-- 4. lock_token_attempt behind an uncommitted complete_job: it waits for the lock, then looks
--    again and finds the attempt closed (token_attempt, before the lock, still saw it open).
SELECT job_id AS c4_job, run_lease AS c4_lease, token AS c4_token FROM pg_temp.claim_new(1) \gset
SELECT format('SELECT live FROM %I.lock_token_attempt(%L)', :'s', :'c4_token') AS bg_sql \gset
\setenv TC_SQL :bg_sql
\! rm -f "$TC_OUT" "$TC_DONE"
BEGIN;
SELECT pg_temp.check((SELECT count(*) FROM complete_job(:'c4_token')) = 1, 'complete_job (left uncommitted)');
\! (psql -X -At -v ON_ERROR_STOP=1 -c "$TC_SQL" > "$TC_OUT" 2>&1; echo $? > "$TC_DONE") < /dev/null &
SELECT pg_temp.await_bg('Lock', 'lock_token_attempt behind complete_job');
COMMIT;
\! i=0; while [ ! -s "$TC_DONE" ] && [ $i -lt 400 ]; do sleep 0.025; i=$((i+1)); done
\set bg_out `cat "$TC_OUT"`
SELECT pg_temp.check(:'bg_out' = 'f', 'lock_token_attempt after the completion committed: not live, not ' || :'bg_out');

-- 5. At REPEATABLE READ the check reads the transaction's snapshot; the closure key still sees a
--    completion committed after it: complete_job fails with 40001, as the DELETE of a receipt
--    deleted under it did, and nothing is written twice.
SELECT job_id AS c5_job, run_lease AS c5_lease, token AS c5_token FROM pg_temp.claim_new(1) \gset
SELECT format('SELECT count(*) FROM %I.complete_batch(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[])', :'s', :c5_job, :c5_lease) AS probe_sql \gset
\setenv TC_SQL2 :probe_sql
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.check(pg_temp.is_open(:c5_job, :c5_lease), 'open in the snapshot');
\set probe `PGAPPNAME=tc_probe psql -X -At -c "$TC_SQL2" 2>&1`
SELECT pg_temp.check(:'probe' = '1', 'the other session completed it, not ' || :'probe');
SELECT pg_temp.check((pg_temp.error_of(format('SELECT complete_job(%L)', :'c5_token'))).state = '40001',
                     'complete_job at REPEATABLE READ after a newer completion: 40001');
ROLLBACK;
SELECT pg_temp.check((SELECT count(*) FROM closures x JOIN attempt_at(:c5_job, :c5_lease) a USING (claim_id, pos)) = 1,
                     'one closure');
--    heartbeat(token) and fail_job likewise (lock_token_attempt asks the closure key), and at
--    REPEATABLE READ an attempt still open is live and writes as at READ COMMITTED.
SELECT job_id AS c6_job, run_lease AS c6_lease, token AS c6_token FROM pg_temp.claim_new(1) \gset
SELECT job_id AS c7_job, run_lease AS c7_lease, token AS c7_token FROM pg_temp.claim_new(1) \gset
SELECT format('SELECT count(*) FROM %I.complete_batch(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[])', :'s', :c6_job, :c6_lease) AS probe_sql \gset
\setenv TC_SQL2 :probe_sql
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.check(pg_temp.is_open(:c6_job, :c6_lease), 'open in the snapshot');
\set probe `PGAPPNAME=tc_probe psql -X -At -c "$TC_SQL2" 2>&1`
SELECT pg_temp.check(:'probe' = '1', 'the other session completed it, not ' || :'probe');
SELECT pg_temp.check((pg_temp.error_of(format('SELECT heartbeat(%L)', :'c6_token'))).state = '40001',
                     'heartbeat(token) at REPEATABLE READ after a newer completion: 40001');
SELECT pg_temp.check((pg_temp.error_of(format('SELECT fail_job(%L, ''x'')', :'c6_token'))).state = '40001',
                     'fail_job at REPEATABLE READ after a newer completion: 40001');
SELECT pg_temp.check(heartbeat(:'c7_token'), 'heartbeat(token) at REPEATABLE READ: live');
SELECT pg_temp.check(fail_job(:'c7_token', 'rr') = 'retryable', 'fail_job at REPEATABLE READ');
SELECT pg_temp.check((pg_temp.closure_of(:c7_job, :c7_lease)).outcome = 'r', 'its closure, not the probe''s');
COMMIT;
SELECT pg_temp.check((SELECT state FROM jobs WHERE id = :c7_job) = 'retryable', 'fail_job at REPEATABLE READ committed');

\! rm -f "$TC_OUT" "$TC_DONE"
\echo 30_close: all expectations held
