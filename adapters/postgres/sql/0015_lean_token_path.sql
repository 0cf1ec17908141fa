-- tenure migration 15: the token path of a caller-owned finalization, made cheap.
--
-- complete_job(token) runs once per job inside the caller's own transaction, so its server work
-- is paid per business commit. Counted with bench/sql_cost, most of it was parsing the token: the
-- bounded repetitions of the token's regular expression ({0,18}, {32}) cost ~600,000 instructions
-- per call, and the constant-time secret comparison looped 16 times in plpgsql. The language a
-- token must match, the errors a malformed one raises, and the guard of every write are unchanged.

-- Parses a version-2 finalization token 'tn2:<job_id>:<run_lease>:<secret>'. Raises TN002 for
-- anything else, version-1 tokens included. A well-formed token is recognized without a regular
-- expression (split on ':', digits checked with translate); anything else takes the diagnosing
-- path of migration 6, which names what is wrong.
CREATE OR REPLACE FUNCTION @schema@.parse_token(token text, OUT job_id bigint, OUT run_lease bigint, OUT secret uuid)
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  p text[];
  m text[];
BEGIN
  IF token IS NULL THEN
    RAISE EXCEPTION 'malformed finalization token: NULL' USING ERRCODE = 'TN002';
  END IF;
  IF octet_length(token) > 80 THEN
    RAISE EXCEPTION 'malformed finalization token: % bytes (at most 80)', octet_length(token)
      USING ERRCODE = 'TN002';
  END IF;
  -- The fast path accepts exactly ^tn2:([1-9][0-9]{0,18}):([1-9][0-9]{0,18}):([0-9a-f]{32})$ :
  -- four ':'-separated fields, numbers of 1-19 ASCII digits without a leading zero, a secret of
  -- 32 lowercase hexadecimal digits. translate() leaves '' only when every character is listed.
  p := pg_catalog.string_to_array(token, ':');
  IF pg_catalog.cardinality(p) = 4 AND p[1] = 'tn2'
     AND octet_length(p[2]) BETWEEN 1 AND 19 AND pg_catalog.left(p[2], 1) <> '0'
     AND pg_catalog.translate(p[2], '0123456789', '') = ''
     AND octet_length(p[3]) BETWEEN 1 AND 19 AND pg_catalog.left(p[3], 1) <> '0'
     AND pg_catalog.translate(p[3], '0123456789', '') = ''
     AND octet_length(p[4]) = 32 AND pg_catalog.translate(p[4], '0123456789abcdef', '') = '' THEN
    m := ARRAY[p[2], p[3], p[4]];
  ELSE
    m := regexp_match(token, '^tn2:([1-9][0-9]{0,18}):([1-9][0-9]{0,18}):([0-9a-f]{32})$');
  END IF;
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
  -- Only a 19-digit number can exceed bigint.
  IF (octet_length(m[1]) = 19 AND m[1]::numeric > 9223372036854775807)
     OR (octet_length(m[2]) = 19 AND m[2]::numeric > 9223372036854775807) THEN
    RAISE EXCEPTION 'malformed finalization token: number out of range' USING ERRCODE = 'TN002';
  END IF;
  job_id := m[1]::bigint;
  run_lease := m[2]::bigint;
  secret := m[3]::uuid;
END $$;

-- Whether a token's secret is the attempt's, in time that does not depend on where they differ:
-- the SHA-256 digests are compared, so an early exit of the comparison tells a timing observer
-- only about digests, from which no byte of the secret follows. NULL on either side: false.
CREATE OR REPLACE FUNCTION @schema@.secret_matches(stored uuid, given uuid) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN coalesce(stored IS NOT NULL AND given IS NOT NULL
                  AND pg_catalog.sha256(pg_catalog.uuid_send(stored)) = pg_catalog.sha256(pg_catalog.uuid_send(given)),
                  false);
END $$;

-- As in migration 6 (token_attempt, then complete_batch of one attempt), in one guarded
-- statement: the receipt is deleted only when (job_id, run_lease) is open, the token's secret is
-- its secret and the attempt is not waiting on a callback; its terminal row carries the given
-- progress, else the attempt's, else the progress carried from earlier attempts. Anything else
-- raises TN001, which aborts the caller's transaction.
CREATE OR REPLACE FUNCTION @schema@.complete_job(token text, progress jsonb DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  t record;
  p text[] := pg_catalog.string_to_array(token, ':');
BEGIN
  -- parse_token's fast path inline (numbers of at most 18 digits fit bigint); any other text,
  -- malformed or not, goes through parse_token, which raises TN002 or parses it.
  IF pg_catalog.cardinality(p) = 4 AND p[1] = 'tn2'
     AND octet_length(p[2]) BETWEEN 1 AND 18 AND pg_catalog.left(p[2], 1) <> '0'
     AND pg_catalog.translate(p[2], '0123456789', '') = ''
     AND octet_length(p[3]) BETWEEN 1 AND 18 AND pg_catalog.left(p[3], 1) <> '0'
     AND pg_catalog.translate(p[3], '0123456789', '') = ''
     AND octet_length(p[4]) = 32 AND pg_catalog.translate(p[4], '0123456789abcdef', '') = '' THEN
    SELECT p[2]::bigint AS job_id, p[3]::bigint AS run_lease, p[4]::uuid AS secret INTO t;
  ELSE
    SELECT * INTO t FROM @schema@.parse_token(token);
  END IF;
  RETURN QUERY
  WITH closed AS (
    DELETE FROM @schema@.receipts r
     WHERE r.job_id = t.job_id AND r.run_lease = t.run_lease
       -- secret_matches inline: digests compared, so the comparison's time says nothing of the secret
       AND pg_catalog.sha256(pg_catalog.uuid_send(r.secret)) = pg_catalog.sha256(pg_catalog.uuid_send(t.secret))
       AND NOT EXISTS (SELECT 1 FROM @schema@.attempt_state s
                        WHERE s.job_id = r.job_id AND s.run_lease = r.run_lease AND s.waiting)
    RETURNING r.*
  )
  INSERT INTO @schema@.done AS d (id, queue, kind, args, state, priority, attempt, max_attempts,
                                  run_lease, run_at, created_at, finalized_at, last_error, progress, metadata)
  SELECT c.job_id, c.queue, c.kind, c.args, 'completed', c.priority, c.attempt, c.max_attempts,
         c.run_lease, c.run_at, c.created_at, now(), c.last_error,
         coalesce(complete_job.progress,
                  (SELECT s.progress FROM @schema@.attempt_state s
                    WHERE s.job_id = c.job_id AND s.run_lease = c.run_lease),
                  c.progress),
         c.metadata
    FROM closed c
  RETURNING d.id, d.run_lease, d.finalized_at;
  IF FOUND THEN
    RETURN;
  END IF;
  RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', t.job_id, t.run_lease
    USING ERRCODE = 'TN001',
          HINT = 'the attempt was rescued, cancelled, re-claimed or already finished; this transaction must roll back';
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
