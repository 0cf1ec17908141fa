-- tenure migration 2: progress checkpoints of long attempts (issue 4).
--
-- Same conventions as 0001: placeholders @schema@, @wake_channel@, @cancel_channel@; every
-- function SECURITY DEFINER with search_path = pg_catalog, pg_temp, schema-qualified names,
-- EXECUTE revoked from PUBLIC at the end.
--
-- Progress: a handler's progress lives in the attempt's materialized lease (attempt_state,
-- created by its first heartbeat or progress flush through heartbeat_batch) and is carried with
-- the job when the attempt retries, snoozes or is rescued (receipts.progress of the next attempt).

-- The progress an attempt carried in from earlier attempts (its checkpoint), guarded by
-- (job_id, run_lease): one row (progress may be NULL: no checkpoint) while the attempt is open,
-- no row when it is stale. Read-only.
CREATE FUNCTION @schema@.attempt_checkpoint(job_id bigint, run_lease bigint)
RETURNS TABLE(progress jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT r.progress FROM @schema@.receipts r WHERE r.job_id = $1 AND r.run_lease = $2
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
