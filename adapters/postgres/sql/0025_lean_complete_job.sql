-- tenure migration 25: complete_job in fewer steps.
--
-- complete_job runs once per job inside the caller's transaction, so its own cost is paid per
-- caller-owned job. Same checks, same answers and errors as migration 24, with less work per call:
--   - the token's fields go into scalar variables by plpgsql assignments (no SELECT ... INTO a
--     record for the fast path);
--   - the item is looked up by one of two statements, chosen by the run lease (this layout's
--     lease names its claim and place; an older one is found through legacy_attempts), instead
--     of one UNION ALL that plans and starts both branches on every call;
--   - the closure's INSERT answers its time INTO a variable and the row goes out by RETURN NEXT,
--     not through a data-modifying CTE read by RETURN QUERY.
-- The order is unchanged: the secret is checked before the attempt's advisory lock is taken (a
-- wrong secret is answered without taking or waiting for it), and the closure is written by a
-- statement of its own after the lock, so at READ COMMITTED it sees what a closer it waited for
-- committed (a parked attempt is refused).
CREATE OR REPLACE FUNCTION @schema@.complete_job(token text, progress jsonb DEFAULT NULL)
RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  p        text[] := pg_catalog.string_to_array(token, ':');
  v_job    bigint;
  v_lease  bigint;
  v_secret uuid;
  v_claim  bigint;
  v_pos    int;
  v_at     timestamptz;
BEGIN
  -- parse_token's fast path inline (numbers of at most 18 digits fit bigint); any other text,
  -- malformed or not, goes through parse_token, which raises TN002 or parses it.
  IF pg_catalog.cardinality(p) = 4 AND p[1] = 'tn2'
     AND octet_length(p[2]) BETWEEN 1 AND 18 AND pg_catalog.left(p[2], 1) <> '0'
     AND pg_catalog.translate(p[2], '0123456789', '') = ''
     AND octet_length(p[3]) BETWEEN 1 AND 18 AND pg_catalog.left(p[3], 1) <> '0'
     AND pg_catalog.translate(p[3], '0123456789', '') = ''
     AND octet_length(p[4]) = 32 AND pg_catalog.translate(p[4], '0123456789abcdef', '') = '' THEN
    v_job := p[2]::bigint;
    v_lease := p[3]::bigint;
    v_secret := p[4]::uuid;
  ELSE
    SELECT t.job_id, t.run_lease, t.secret INTO v_job, v_lease, v_secret FROM @schema@.parse_token(token) t;
  END IF;
  -- The item and its secret (secret_matches inline: digests compared, so the comparison's time
  -- says nothing of the secret).
  IF v_lease >= 65536 THEN
    v_claim := v_lease >> 16;
    v_pos := (v_lease & 65535)::int;
    PERFORM FROM @schema@.claims c
     WHERE c.claim_id = v_claim AND c.job_ids[v_pos] = v_job AND c.run_leases IS NULL
       AND pg_catalog.sha256(pg_catalog.uuid_send(c.secrets[v_pos]))
           = pg_catalog.sha256(pg_catalog.uuid_send(v_secret));
  ELSE
    SELECT l.claim_id, l.pos INTO v_claim, v_pos
      FROM @schema@.legacy_attempts l JOIN @schema@.claims c ON c.claim_id = l.claim_id
     WHERE l.job_id = v_job AND l.run_lease = v_lease
       AND pg_catalog.sha256(pg_catalog.uuid_send(c.secrets[l.pos]))
           = pg_catalog.sha256(pg_catalog.uuid_send(v_secret));
  END IF;
  IF FOUND THEN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('@schema@.attempt'),
                                             pg_catalog.hashint8(v_job # (v_lease << 24)));
    INSERT INTO @schema@.closures AS x (claim_id, pos, outcome, closed_at, progress)
    SELECT v_claim, v_pos, 'c', now(), coalesce(complete_job.progress, s.progress)
      FROM (SELECT) one
      LEFT JOIN @schema@.attempt_state s ON s.job_id = v_job AND s.run_lease = v_lease
     WHERE s.waiting IS NOT TRUE
    ON CONFLICT (claim_id, pos) DO NOTHING
    RETURNING x.closed_at INTO v_at;
    IF FOUND THEN
      job_id := v_job;
      run_lease := v_lease;
      completed_at := v_at;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  RAISE EXCEPTION 'stale attempt: job % run lease % is no longer running', v_job, v_lease
    USING ERRCODE = 'TN001',
          HINT = 'the attempt was rescued, cancelled, re-claimed or already finished; this transaction must roll back';
END $$;
