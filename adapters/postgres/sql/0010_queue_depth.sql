-- tenure migration 10: what the runtime's metrics read from the database.
--
-- queue_depths() counts every queue's unfinished jobs per state (available, scheduled,
--   retryable, running, waiting_external) and the age of its oldest available job, in one
--   statement; the maintenance leader reads it once per pass for its gauges. The same roles may
--   run it as claim_attempts (`tenure grant-worker` gives it too).

SELECT pg_catalog.set_config('tenure.migrate_claim_grantees',
                             coalesce(pg_catalog.string_agg(DISTINCT pg_catalog.quote_ident(r.rolname), ', '), ''),
                             true)
  FROM pg_catalog.pg_proc p
 CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
  JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
 WHERE p.oid = '@schema@.claim_attempts(text, int, text, text)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

-- Every queue with an unfinished job or stored settings; a state with no job counts 0, and
-- oldest_available is 0 when nothing is available. Reads the unfinished tables once each.
CREATE FUNCTION @schema@.queue_depths()
RETURNS TABLE(queue text, available bigint, scheduled bigint, retryable bigint, running bigint,
              waiting_external bigint, oldest_available interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH c AS (
    SELECT r.queue, count(*) AS available, 0::bigint AS scheduled, 0::bigint AS retryable,
           0::bigint AS running, 0::bigint AS waiting, min(greatest(r.run_at, r.created_at)) AS since
      FROM @schema@.ready r GROUP BY r.queue
    UNION ALL
    SELECT d.queue, 0, count(*) FILTER (WHERE d.state = 'scheduled'), count(*) FILTER (WHERE d.state = 'retryable'),
           0, 0, NULL
      FROM @schema@.deferred d GROUP BY d.queue
    UNION ALL
    SELECT r.queue, 0, 0, 0, count(*) FILTER (WHERE s.waiting IS NOT TRUE), count(*) FILTER (WHERE s.waiting), NULL
      FROM @schema@.receipts r
      LEFT JOIN @schema@.attempt_state s ON s.job_id = r.job_id AND s.run_lease = r.run_lease
     GROUP BY r.queue
    UNION ALL
    SELECT q.name, 0, 0, 0, 0, 0, NULL FROM @schema@.queues q
  )
  SELECT c.queue, sum(c.available)::bigint, sum(c.scheduled)::bigint, sum(c.retryable)::bigint,
         sum(c.running)::bigint, sum(c.waiting)::bigint,
         coalesce(greatest(clock_timestamp() - min(c.since), '0'::interval), '0'::interval)
    FROM c GROUP BY c.queue ORDER BY c.queue
$$;


DO $$
BEGIN
  IF pg_catalog.current_setting('tenure.migrate_claim_grantees') <> '' THEN
    EXECUTE 'GRANT EXECUTE ON FUNCTION @schema@.queue_depths() TO '
            || pg_catalog.current_setting('tenure.migrate_claim_grantees');
  END IF;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
