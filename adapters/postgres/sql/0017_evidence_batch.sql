-- tenure migration 17: the durable evidence of many attempts in one call.
--
-- After a caller-owned handler exits, the runtime reads the evidence of the attempts waiting for
-- it in one statement; that statement called attempt_evidence once per attempt, a plpgsql call
-- of its own each (~140,000 server instructions per attempt). attempt_evidence_batch answers the
-- same question for a whole batch in one call, with the same four answers in input order.

-- For each (job_ids[i], run_leases[i]): 'open', 'completed' (by this run lease),
-- 'closed_by_other' or 'unknown_job', exactly as attempt_evidence answers it; ord is i (1-based).
CREATE FUNCTION @schema@.attempt_evidence_batch(job_ids bigint[], run_leases bigint[])
RETURNS TABLE(ord bigint, evidence text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(job_ids) IS DISTINCT FROM cardinality(run_leases) THEN
    RAISE EXCEPTION 'tenure.attempt_evidence_batch: arrays must have the same length' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  SELECT a.ord,
         CASE WHEN EXISTS (SELECT 1 FROM @schema@.receipts r
                            WHERE r.job_id = a.job_id AND r.run_lease = a.run_lease) THEN 'open'
              WHEN EXISTS (SELECT 1 FROM @schema@.done d
                            WHERE d.id = a.job_id AND d.run_lease = a.run_lease AND d.state = 'completed')
                THEN 'completed'
              WHEN EXISTS (SELECT 1 FROM @schema@.jobs j WHERE j.id = a.job_id) THEN 'closed_by_other'
              ELSE 'unknown_job' END
    FROM unnest(job_ids, run_leases) WITH ORDINALITY AS a(job_id, run_lease, ord)
   ORDER BY a.ord;
END $$;

REVOKE ALL ON FUNCTION @schema@.attempt_evidence_batch(bigint[], bigint[]) FROM PUBLIC;

-- The roles `tenure grant-worker` gave attempt_evidence to get the batch form too.
DO $$
DECLARE
  grantees text;
BEGIN
  SELECT pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', ') INTO grantees
    FROM pg_catalog.pg_proc p
   CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
    JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
   WHERE p.oid = '@schema@.attempt_evidence(bigint, bigint)'::pg_catalog.regprocedure
     AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;
  IF grantees IS NOT NULL THEN
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.attempt_evidence_batch(bigint[], bigint[]) TO ' || grantees;
  END IF;
END $$;
