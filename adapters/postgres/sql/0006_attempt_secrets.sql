-- tenure migration 6: every attempt has a secret, and a finalization token must carry it.
--
-- A version-1 token ('tn1:<job_id>:<run_lease>') named an attempt by numbers anyone can guess:
-- ids and run leases count up. A role granted only complete_job could loop over them, complete
-- every running job with progress of its choosing, and, rolling back, learn which jobs were
-- running. Now each claim draws a secret for the attempt (gen_random_uuid(): 122 random bits
-- from the server's strong random source), keeps it with the receipt, and hands it out in a
-- version-2 token:
--
--   tn2:<job_id>:<run_lease>:<secret>      secret: 32 lowercase hexadecimal digits
--
-- complete_job, fail_job and heartbeat(token) accept a token only if its secret equals the open
-- attempt's, compared in constant time. A wrong secret is answered exactly as a stale attempt is
-- (TN001 from complete_job and fail_job, false from heartbeat), from the same statement, so a
-- probe cannot tell a running attempt from a finished one. Version-1 tokens are malformed (TN002).
-- The guard rule is unchanged: (job_id, run_lease) still decides which attempt a statement
-- touches; the secret only decides whether a token's holder may name it. The worker role's
-- set-based functions (claim_attempts, heartbeat_batch, complete_batch, fail_attempt, ...) stay
-- keyed by (job_id, run_lease): that role drives the whole protocol anyway.
--
-- Attempts open during the upgrade get a fresh secret here that nobody holds, so their tn1 tokens
-- are refused (TN002). The runtime finishes its own attempts through the batch functions and is
-- not affected; a caller-owned finalization or a plain-SQL worker holding a tn1 token is refused,
-- its transaction rolls back, and the attempt is retried (the runtime's ordinary policy) or
-- rescued once its heartbeats stop, then runs again with a tn2 token.

ALTER TABLE @schema@.receipts ADD COLUMN secret uuid NOT NULL DEFAULT gen_random_uuid();

-- ---- helpers ----------------------------------------------------------------------------------

-- true when `given` equals `stored`. Constant time: all 16 bytes are compared whatever the first
-- difference (no early exit), and a missing attempt (stored NULL) is compared against zeros the
-- same way before it answers false.
CREATE FUNCTION @schema@.secret_matches(stored uuid, given uuid) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  zero bytea := pg_catalog.decode(pg_catalog.repeat('00', 16), 'hex');
  a    bytea := coalesce(pg_catalog.uuid_send(stored), zero);
  b    bytea := coalesce(pg_catalog.uuid_send(given), zero);
  diff int := 0;
BEGIN
  FOR i IN 0..15 LOOP
    diff := diff | (pg_catalog.get_byte(a, i) # pg_catalog.get_byte(b, i));
  END LOOP;
  RETURN diff = 0 AND stored IS NOT NULL AND given IS NOT NULL;
END $$;

-- Parses a version-2 finalization token 'tn2:<job_id>:<run_lease>:<secret>'. Raises TN002 for
-- anything else, version-1 tokens included.
DROP FUNCTION @schema@.parse_token(text);
CREATE FUNCTION @schema@.parse_token(token text, OUT job_id bigint, OUT run_lease bigint, OUT secret uuid)
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  m text[];
BEGIN
  IF token IS NULL THEN
    RAISE EXCEPTION 'malformed finalization token: NULL' USING ERRCODE = 'TN002';
  END IF;
  IF octet_length(token) > 80 THEN
    RAISE EXCEPTION 'malformed finalization token: % bytes (at most 80)', octet_length(token)
      USING ERRCODE = 'TN002';
  END IF;
  m := regexp_match(token, '^tn2:([1-9][0-9]{0,18}):([1-9][0-9]{0,18}):([0-9a-f]{32})$');
  IF m IS NULL THEN
    IF token ~ '^tn1:' THEN
      RAISE EXCEPTION 'malformed finalization token: version tn1 is no longer accepted' USING ERRCODE = 'TN002',
        HINT = 'tn1 tokens carry no attempt secret; this server understands tokens of version tn2 '
               '(tn2:<job_id>:<run_lease>:<secret>), as claim returns them';
    END IF;
    IF token ~ '^tn[0-9]+:' AND token !~ '^tn2:' THEN
      RAISE EXCEPTION 'malformed finalization token: unknown version' USING ERRCODE = 'TN002',
        HINT = 'this server understands tokens of version tn2';
    END IF;
    RAISE EXCEPTION 'malformed finalization token' USING ERRCODE = 'TN002',
      HINT = 'expected tn2:<job_id>:<run_lease>:<secret> (secret: 32 lowercase hexadecimal digits)';
  END IF;
  IF m[1]::numeric > 9223372036854775807 OR m[2]::numeric > 9223372036854775807 THEN
    RAISE EXCEPTION 'malformed finalization token: number out of range' USING ERRCODE = 'TN002';
  END IF;
  job_id := m[1]::bigint;
  run_lease := m[2]::bigint;
  secret := m[3]::uuid;
END $$;

DROP FUNCTION @schema@.make_token(bigint, bigint);
CREATE FUNCTION @schema@.make_token(job_id bigint, run_lease bigint, secret uuid) RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT 'tn2:' || $1 || ':' || $2 || ':' || pg_catalog.encode(pg_catalog.uuid_send($3), 'hex')
$$;

-- The attempt a token names, and whether the token may act on it: live is true only when the
-- attempt is open and the token's secret is its secret. Raises TN002 for a malformed token. Reads
-- the receipt by its key and takes no lock, so a probe never waits for (or delays) the attempt's
-- own worker.
CREATE FUNCTION @schema@.token_attempt(token text, OUT job_id bigint, OUT run_lease bigint, OUT live boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  t      record;
  stored uuid;
BEGIN
  SELECT * INTO t FROM @schema@.parse_token(token_attempt.token);
  SELECT r.secret INTO stored FROM @schema@.receipts r
   WHERE r.job_id = t.job_id AND r.run_lease = t.run_lease;
  job_id := t.job_id;
  run_lease := t.run_lease;
  live := @schema@.secret_matches(stored, t.secret);
END $$;

-- ---- the claim: the secret comes back with each attempt ---------------------------------------

-- DROP takes a function's grants with it: remember the roles that may run claim_attempts (those
-- `tenure grant-worker` gave it to) and give it back to them once it is created again.
SELECT pg_catalog.set_config('tenure.migrate_claim_grantees',
                             coalesce(pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', '), ''),
                             true)
  FROM pg_catalog.pg_proc p
 CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
  JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
 WHERE p.oid = '@schema@.claim_attempts(text, int, text, text)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

-- As in migration 3, plus the attempt's secret, drawn in the same statement (one more column per
-- claimed row, no extra round trip).
DROP FUNCTION @schema@.claim_attempts(text, int, text, text);
CREATE FUNCTION @schema@.claim_attempts(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL,
                                        idle_mode text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, max_attempts int,
              deadline_at timestamptz, secret uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  n int;
BEGIN
  IF claim_attempts.queue IS NULL THEN
    RAISE EXCEPTION 'tenure.claim: queue must not be NULL' USING ERRCODE = '22023';
  END IF;
  IF claim_attempts.max_jobs IS NULL OR claim_attempts.max_jobs < 1 OR claim_attempts.max_jobs > 10000 THEN
    RAISE EXCEPTION 'tenure.claim: max_jobs must be between 1 and 10000 (got %)', claim_attempts.max_jobs
      USING ERRCODE = '22023';
  END IF;
  -- Promotion is a write statement; a probe of the due index is enough when nothing is due.
  IF EXISTS (SELECT 1 FROM @schema@.deferred d
              WHERE d.queue = claim_attempts.queue AND d.run_at <= now()) THEN
    PERFORM @schema@.promote_due(claim_attempts.queue, 1000);
  END IF;
  RETURN QUERY
  WITH moved AS (
    DELETE FROM @schema@.ready r
     WHERE r.id = ANY (ARRAY(SELECT p.id FROM @schema@.ready p
                              WHERE p.queue = claim_attempts.queue
                              ORDER BY p.priority, p.id
                              LIMIT claim_attempts.max_jobs
                              FOR UPDATE SKIP LOCKED))
    RETURNING r.*
  ), opened AS (
    INSERT INTO @schema@.receipts (job_id, run_lease, queue, kind, args, priority, attempt,
                                   max_attempts, run_at, created_at, claimed_at, deadline_at,
                                   worker, last_error, progress, secret)
    SELECT m.id, m.run_lease + 1, m.queue, m.kind, m.args, m.priority, m.attempt + 1,
           m.max_attempts, m.run_at, m.created_at, now(),
           now() + (SELECT q.hard_deadline FROM @schema@.queues q WHERE q.name = claim_attempts.queue),
           claim_attempts.worker, m.last_error, m.progress, gen_random_uuid()
      FROM moved m
    RETURNING job_id, run_lease, kind, args, attempt, max_attempts, deadline_at, secret, priority
  )
  SELECT o.job_id, o.run_lease, o.kind, o.args, o.attempt, o.max_attempts, o.deadline_at, o.secret
    FROM opened o ORDER BY o.priority, o.job_id;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF claim_attempts.idle_mode IS NOT NULL AND claim_attempts.worker IS NOT NULL THEN
    IF n = 0 AND claim_attempts.idle_mode = 'sleep' THEN
      INSERT INTO @schema@.waiters AS w (queue, worker) VALUES (claim_attempts.queue, claim_attempts.worker)
      ON CONFLICT (queue, worker) DO UPDATE SET since = now() WHERE w.since < now() - interval '1 minute';
    ELSIF n > 0 AND EXISTS (SELECT 1 FROM @schema@.waiters w
                             WHERE w.queue = claim_attempts.queue AND w.worker = claim_attempts.worker) THEN
      DELETE FROM @schema@.waiters w WHERE w.queue = claim_attempts.queue AND w.worker = claim_attempts.worker;
    END IF;
  END IF;
END $$;

DO $$
BEGIN
  IF pg_catalog.current_setting('tenure.migrate_claim_grantees') <> '' THEN
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.claim_attempts(text, int, text, text) TO '
            || pg_catalog.current_setting('tenure.migrate_claim_grantees');
  END IF;
END $$;

CREATE OR REPLACE FUNCTION @schema@.claim(queue text, max_jobs int DEFAULT 1, worker text DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, kind text, args jsonb, attempt int, token text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT c.job_id, c.run_lease, c.kind, c.args, c.attempt, @schema@.make_token(c.job_id, c.run_lease, c.secret)
    FROM @schema@.claim_attempts($1, $2, $3, NULL) c
$$;

-- ---- the functions that take a token ----------------------------------------------------------
-- Each answers a wrong secret from the same place, with the same words, as a stale attempt.

CREATE OR REPLACE FUNCTION @schema@.heartbeat(token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
BEGIN
  SELECT * INTO t FROM @schema@.token_attempt(token);
  IF NOT t.live THEN
    RETURN false;
  END IF;
  RETURN EXISTS (SELECT 1 FROM @schema@.heartbeat_batch(ARRAY[t.job_id], ARRAY[t.run_lease]));
END $$;

CREATE OR REPLACE FUNCTION @schema@.complete_job(token text, progress jsonb DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  t record;
BEGIN
  SELECT * INTO t FROM @schema@.token_attempt(token);
  IF t.live THEN
    RETURN QUERY SELECT c.job_id, c.run_lease, c.completed_at
      FROM @schema@.complete_batch(ARRAY[t.job_id], ARRAY[t.run_lease], ARRAY[complete_job.progress]) c;
    IF FOUND THEN
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', t.job_id, t.run_lease
    USING ERRCODE = 'TN001',
          HINT = 'the attempt was rescued, cancelled, re-claimed or already finished; this transaction must roll back';
END $$;

CREATE OR REPLACE FUNCTION @schema@.fail_job(token text, error text, retry boolean DEFAULT true)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
  s text;
BEGIN
  SELECT * INTO t FROM @schema@.token_attempt(token);
  IF t.live THEN
    s := @schema@.fail_attempt(t.job_id, t.run_lease, error, NOT coalesce(retry, true));
    IF s IS NOT NULL THEN
      RETURN s;
    END IF;
  END IF;
  RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', t.job_id, t.run_lease
    USING ERRCODE = 'TN001';
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
