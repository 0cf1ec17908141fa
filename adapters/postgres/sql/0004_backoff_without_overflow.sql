-- tenure migration 4: the retry backoff no longer overflows.
--
-- backoff() multiplied the base interval by 2^(attempt - 1) before capping it. interval
-- arithmetic overflows past ~292,000 years of microseconds, so with a base of one hour the
-- product raised 22008 ("interval out of range") from the 33rd attempt on (the 39th for one
-- minute), and every failure of such a job was refused instead of recorded. The delay is now
-- computed in seconds (double precision) and capped before it becomes an interval again. Same
-- results otherwise: d = min(cap, base x 2^(attempt-1)), then a random delay in [d/2, d].

CREATE OR REPLACE FUNCTION @schema@.backoff(queue text, attempt int) RETURNS interval
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  base interval := '1 second';
  cap  interval := '1 hour';
  d    double precision;
BEGIN
  SELECT q.backoff_base, q.backoff_cap INTO base, cap FROM @schema@.queues q WHERE q.name = backoff.queue;
  IF NOT FOUND THEN base := '1 second'; cap := '1 hour'; END IF;
  d := least(extract(epoch FROM cap)::double precision,
             extract(epoch FROM base)::double precision * power(2::double precision,
                                                                 least(greatest(attempt, 1) - 1, 200)));
  RETURN make_interval(secs => d / 2 + d / 2 * random());
END $$;

REVOKE ALL ON FUNCTION @schema@.backoff(text, int) FROM PUBLIC;
