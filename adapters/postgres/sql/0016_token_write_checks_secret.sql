-- tenure migration 16: a token's write acts only on the receipt whose secret it checked.
--
-- complete_job, fail_job and heartbeat(token) compared the token's secret with the receipt's in
-- one statement (token_attempt, which takes no lock) and wrote in the next, keyed by
-- (job_id, run_lease) alone. Between the two, a receipt of the same (job_id, run_lease) with
-- another secret can take the place of the one checked: a parked attempt that is resumed is
-- continued by a new claim with the same run lease and a fresh secret (migration 14). A holder of
-- the token from before the park whose call ran beside the resume and the claim then completed
-- or failed the continuation, whose own token was refused afterwards (models/token_secret.pml,
-- mutant split_check).
--
-- complete_job is closed by migration 15: its one guarded DELETE compares the secret of the very
-- row it deletes. fail_job and heartbeat(token) now lock the receipt once token_attempt has found
-- the secret right and compare it again (lock_token_attempt); the write that follows, in the same transaction, finds
-- that row or nothing: it is locked, and no other receipt of the same (job_id, run_lease) can be
-- inserted beside it. A wrong secret is still answered from token_attempt alone: it never takes
-- or waits for a lock, so a probe neither delays an attempt nor learns that it runs.

-- The attempt a token names, and whether the token may write to it now: as token_attempt, and
-- when live, the attempt's receipt is locked (FOR UPDATE, to the end of the transaction) with
-- its secret compared again under the lock. live is false when the receipt closed or was replaced
-- in between. Internal.
CREATE FUNCTION @schema@.lock_token_attempt(token text, OUT job_id bigint, OUT run_lease bigint, OUT live boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  t record;
  given uuid;
BEGIN
  SELECT * INTO t FROM @schema@.token_attempt(lock_token_attempt.token);
  job_id := t.job_id;
  run_lease := t.run_lease;
  live := false;
  IF t.live THEN
    given := (SELECT p.secret FROM @schema@.parse_token(lock_token_attempt.token) p);
    PERFORM 1 FROM @schema@.receipts r
     WHERE r.job_id = t.job_id AND r.run_lease = t.run_lease
       AND @schema@.secret_matches(r.secret, given)
       FOR UPDATE;
    live := FOUND;
  END IF;
END $$;

-- As in migration 6, through lock_token_attempt.
CREATE OR REPLACE FUNCTION @schema@.heartbeat(token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
BEGIN
  SELECT * INTO t FROM @schema@.lock_token_attempt(token);
  IF NOT t.live THEN
    RETURN false;
  END IF;
  RETURN EXISTS (SELECT 1 FROM @schema@.heartbeat_batch(ARRAY[t.job_id], ARRAY[t.run_lease]));
END $$;

-- As in migration 6, through lock_token_attempt.
CREATE OR REPLACE FUNCTION @schema@.fail_job(token text, error text, retry boolean DEFAULT true)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
  s text;
BEGIN
  SELECT * INTO t FROM @schema@.lock_token_attempt(token);
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
