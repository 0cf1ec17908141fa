-- tenure migration 12: periodic (cron) schedules.
--
-- A schedule is a row: a name, a standard 5-field cron expression read in a time zone, and the job
-- (kind, args, queue) each of its slots enqueues. The database parses the expression and computes
-- the slots, so every worker agrees on them; the maintenance leader's fenced pass, maintain(),
-- enqueues the due slots (enqueue_due_schedules below) once per maintenance interval.
--   - Exactly once: a slot's job is enqueued in the same transaction as the update that moves the
--     schedule's last_slot past it, guarded by `last_slot < slot` under the row lock; a second pass
--     running at the same time (a leader that lost its lease, an operator's `tenure maintain`)
--     skips the locked row, or finds the slot taken once the first commits.
--   - Missed slots: a pass enqueues only the most recent due slot; the slots before it are
--     skipped. A new schedule runs no slot from before its creation; changing its expression or
--     time zone computes the next slot afresh from the time of the change.
--   - Time zones and DST: slots are wall-clock times in the schedule's time zone (PostgreSQL's
--     time zone data). A wall-clock time that does not exist (the hour skipped when clocks move
--     forward) runs once at the first instant after the gap (03:00 for a 02:30 job in
--     Europe/Berlin). A wall-clock time that happens twice (clocks moving back) runs once, at its
--     first occurrence, unless the hour field is `*` (all hours): then it runs at both, so
--     `*/15 * * * *` keeps running every 15 minutes of real time through the repeated hour.

CREATE TABLE @schema@.schedules (
  name             text PRIMARY KEY,
  cron             text NOT NULL,
  kind             text NOT NULL,
  args             jsonb NOT NULL DEFAULT '{}',
  queue            text NOT NULL DEFAULT 'default',
  timezone         text NOT NULL DEFAULT 'UTC',
  created_at       timestamptz NOT NULL,
  updated_at       timestamptz NOT NULL,
  next_slot        timestamptz,  -- the next slot to enqueue; NULL: none (the expression never matches again)
  last_slot        timestamptz,  -- the last slot enqueued (or skipped after a failed enqueue)
  last_enqueued_at timestamptz,  -- when the pass enqueued it
  last_job_id      bigint,
  last_error       text          -- why the last slot's enqueue failed; NULL once one succeeds
);
CREATE INDEX schedules_next_slot ON @schema@.schedules (next_slot);
REVOKE ALL ON @schema@.schedules FROM PUBLIC;

-- ---- cron expressions ---------------------------------------------------------------------------

-- One value of a cron field: a number, or for month and day-of-week a three-letter name
-- (case-insensitive). Raises 22023 naming the field and token when it is neither or out of range.
CREATE FUNCTION @schema@.cron_value(cron text, field int, token text, part text)
RETURNS int LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  label  text := (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field];
  lo     int := (ARRAY[0, 0, 1, 1, 0])[field];
  hi     int := (ARRAY[59, 23, 31, 12, 7])[field];
  names  text[] := CASE field WHEN 4 THEN ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP',
                                                'OCT', 'NOV', 'DEC']
                              WHEN 5 THEN ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'] END;
  v      int;
BEGIN
  IF part ~ '^[0-9]{1,4}$' THEN
    v := part::int;
  ELSIF names IS NOT NULL AND upper(part) = ANY (names) THEN
    v := array_position(names, upper(part)) - 1 + lo;
  ELSE
    RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": % field, token "%": "%" is not a %',
      cron, label, token, part,
      CASE field WHEN 4 THEN 'month number or name (JAN-DEC)' WHEN 5 THEN 'day number (0-7) or name (SUN-SAT)'
                 ELSE 'number' END
      USING ERRCODE = '22023';
  END IF;
  IF v < lo OR v > hi THEN
    RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": % field, token "%": % is out of range %-%',
      cron, label, token, v, lo, hi USING ERRCODE = '22023';
  END IF;
  RETURN v;
END $$;

-- The sorted values one field of `cron` matches (field 1..5: minute, hour, day of month, month,
-- day of week). A field is a comma-separated list of `*`, N, N-M, each optionally /STEP (N/STEP
-- means N to the field's end). Day of week 7 is Sunday, as 0. Raises 22023 naming the field and
-- token when something is wrong.
CREATE FUNCTION @schema@.cron_field(cron text, field int, spec text)
RETURNS int[] LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  label  text := (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field];
  lo     int := (ARRAY[0, 0, 1, 1, 0])[field];
  hi     int := (ARRAY[59, 23, 31, 12, 7])[field];
  item   text;
  m      text[];
  a      int;
  b      int;
  step   int;
  v      int;
  vals   int[] := '{}';
BEGIN
  FOREACH item IN ARRAY string_to_array(spec, ',') LOOP
    IF item = '' THEN
      RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": % field "%" has an empty list element',
        cron, label, spec USING ERRCODE = '22023';
    END IF;
    m := regexp_match(item, '^([^/]*)(/(.*))?$');
    step := CASE WHEN m[2] IS NULL THEN 1 WHEN m[3] ~ '^[0-9]{1,4}$' THEN m[3]::int ELSE 0 END;
    IF step < 1 THEN
      RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": % field, token "%": the step "%" must be a positive number',
        cron, label, item, m[3] USING ERRCODE = '22023';
    END IF;
    IF m[1] = '*' THEN
      a := lo;
      b := CASE field WHEN 5 THEN 6 ELSE hi END;
    ELSIF m[1] ~ '^[^-]+-[^-]+$' THEN
      a := @schema@.cron_value(cron, field, item, split_part(m[1], '-', 1));
      b := @schema@.cron_value(cron, field, item, split_part(m[1], '-', 2));
      IF a > b THEN
        RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": % field, token "%": the range starts after it ends',
          cron, label, item USING ERRCODE = '22023';
      END IF;
    ELSIF m[1] = '' OR m[1] LIKE '%-%' THEN
      RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": % field, token "%": expected *, a value or a range A-B',
        cron, label, item USING ERRCODE = '22023';
    ELSE
      a := @schema@.cron_value(cron, field, item, m[1]);
      b := CASE WHEN m[2] IS NULL THEN a ELSE CASE field WHEN 5 THEN 6 ELSE hi END END;
      b := greatest(a, b);
    END IF;
    v := a;
    WHILE v <= b LOOP
      vals := vals || CASE WHEN field = 5 AND v = 7 THEN 0 ELSE v END;
      v := v + step;
    END LOOP;
  END LOOP;
  RETURN (SELECT array_agg(DISTINCT x ORDER BY x) FROM unnest(vals) x);
END $$;

-- Parses a cron expression: five fields (minute hour day-of-month month day-of-week) separated by
-- blanks, or one of @yearly (@annually), @monthly, @weekly, @daily (@midnight), @hourly. dom_star
-- and dow_star say whether the day-of-month and day-of-week fields start with `*`: when neither
-- does, a day matches if either field matches; otherwise it must match both. Raises 22023 saying what is wrong, including an
-- expression whose days never exist (30 February).
CREATE FUNCTION @schema@.cron_parse(cron text, OUT minutes int[], OUT hours int[], OUT doms int[],
                                    OUT months int[], OUT dows int[], OUT dom_star boolean, OUT dow_star boolean)
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  e  text := btrim(cron, E' \t\n\r');
  f  text[];
BEGIN
  IF cron IS NULL OR e = '' THEN
    RAISE EXCEPTION 'tenure.schedule: the cron expression is empty' USING ERRCODE = '22023';
  END IF;
  IF length(cron) > 200 THEN
    RAISE EXCEPTION 'tenure.schedule: the cron expression must be at most 200 characters (got %)', length(cron)
      USING ERRCODE = '22023';
  END IF;
  IF left(e, 1) = '@' THEN
    e := CASE lower(e) WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *'
                       WHEN '@monthly' THEN '0 0 1 * *' WHEN '@weekly' THEN '0 0 * * 0'
                       WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
                       WHEN '@hourly' THEN '0 * * * *' END;
    IF e IS NULL THEN
      RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": unknown macro (use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)',
        cron USING ERRCODE = '22023';
    END IF;
  END IF;
  f := regexp_split_to_array(e, '[[:space:]]+');
  IF cardinality(f) <> 5 THEN
    RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": expected 5 fields (minute hour day-of-month month day-of-week), got %',
      cron, cardinality(f) USING ERRCODE = '22023';
  END IF;
  minutes := @schema@.cron_field(cron, 1, f[1]);
  hours := @schema@.cron_field(cron, 2, f[2]);
  doms := @schema@.cron_field(cron, 3, f[3]);
  months := @schema@.cron_field(cron, 4, f[4]);
  dows := @schema@.cron_field(cron, 5, f[5]);
  dom_star := left(f[3], 1) = '*';
  dow_star := left(f[5], 1) = '*';
  -- Some listed month must have one of the listed days of month unless the day-of-week field
  -- alone can make a day match (29 February counts: it comes at least every 8 years).
  IF (dom_star OR dow_star) AND NOT EXISTS (
       SELECT 1 FROM unnest(months) mo
        WHERE doms[1] <= (ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[mo]) THEN
    RAISE EXCEPTION 'tenure.schedule: invalid cron expression "%": the day-of-month field "%" never occurs in the month field "%"',
      cron, f[3], f[4] USING ERRCODE = '22023';
  END IF;
END $$;

-- Raises 22023 unless PostgreSQL knows the time zone `timezone` (an IANA name such as
-- Europe/Berlin, or UTC).
CREATE FUNCTION @schema@.check_time_zone(timezone text)
RETURNS void LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF timezone IS NULL OR timezone = '' OR length(timezone) > 64 OR timezone ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION 'tenure.schedule: the time zone must be 1..64 printable characters' USING ERRCODE = '22023';
  END IF;
  BEGIN
    PERFORM now() AT TIME ZONE timezone;
  EXCEPTION WHEN invalid_parameter_value OR feature_not_supported THEN
    RAISE EXCEPTION 'tenure.schedule: unknown time zone "%" (use a name such as UTC or Europe/Berlin)', timezone
      USING ERRCODE = '22023';
  END;
END $$;

-- The instants at which the wall-clock time `l` of time zone `tz` happens, on a day whose UTC
-- offset changes from o1 to o2: its first occurrence, and with `both_passes` also the second one when
-- the clocks moved back over it. A time in the gap the clocks skipped maps to the first instant
-- after the gap.
CREATE FUNCTION @schema@.cron_local_instants(l timestamp, tz text, o1 interval, o2 interval, both_passes boolean)
RETURNS timestamptz[] LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  c1 timestamptz := (l - o1) AT TIME ZONE 'UTC';
  c2 timestamptz := (l - o2) AT TIME ZONE 'UTC';
  ok1 boolean := (c1 AT TIME ZONE tz) = l;
  ok2 boolean := (c2 AT TIME ZONE tz) = l;
  lo bigint;
  hi bigint;
  mid bigint;
BEGIN
  IF ok1 AND ok2 AND c1 <> c2 THEN
    RETURN CASE WHEN both_passes THEN ARRAY[least(c1, c2), greatest(c1, c2)] ELSE ARRAY[least(c1, c2)] END;
  ELSIF ok1 THEN
    RETURN ARRAY[c1];
  ELSIF ok2 THEN
    RETURN ARRAY[c2];
  END IF;
  -- In the gap: the transition lies between c2 (still the old offset) and c1 (the new one).
  lo := floor(extract(epoch FROM least(c1, c2)))::bigint;
  hi := ceil(extract(epoch FROM greatest(c1, c2)))::bigint;
  WHILE hi - lo > 1 LOOP
    mid := (lo + hi) / 2;
    IF (to_timestamp(mid) AT TIME ZONE tz) - (to_timestamp(mid) AT TIME ZONE 'UTC') = o1 THEN
      lo := mid;
    ELSE
      hi := mid;
    END IF;
  END LOOP;
  RETURN ARRAY[to_timestamp(hi)];
END $$;

-- The first slot of `cron` in time zone `timezone` strictly after `after`, or NULL when there is
-- none within 50 years. Raises 22023 for an invalid expression or time zone. Slots are
-- wall-clock times; see the top of this file for the hours DST skips or repeats.
CREATE FUNCTION @schema@.cron_next(cron text, after timestamptz, timezone text DEFAULT 'UTC')
RETURNS timestamptz LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  f          record;
  tz         text := cron_next.timezone;
  after_l    timestamp;
  d          date;
  last_d     date;
  o1         interval;
  o2         interval;
  h          int;
  mi         int;
  l          timestamp;
  t          timestamptz;
  ts         timestamptz[];
  best       timestamptz;
  hour_star  boolean;
  day_ok     boolean;
BEGIN
  SELECT * INTO f FROM @schema@.cron_parse(cron);
  -- An unknown zone makes the first AT TIME ZONE below raise 22023 (`time zone "..." not
  -- recognized`); check_time_zone's friendlier wording needs a subtransaction, which the
  -- maintenance pass should not pay on every call.
  IF tz IS NULL OR tz = '' OR length(tz) > 64 OR tz ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION 'tenure.schedule: the time zone must be 1..64 printable characters' USING ERRCODE = '22023';
  END IF;
  IF after IS NULL OR NOT isfinite(after) THEN
    RAISE EXCEPTION 'tenure.cron_next: after must be a finite time' USING ERRCODE = '22023';
  END IF;
  hour_star := cardinality(f.hours) = 24;
  after_l := after AT TIME ZONE tz;
  d := after_l::date - 1;
  last_d := d + 50 * 366;
  <<days>>
  WHILE d <= last_d LOOP
    IF NOT (extract(month FROM d)::int = ANY (f.months)) THEN
      d := (date_trunc('month', d) + interval '1 month')::date;
      CONTINUE;
    END IF;
    -- Both day fields restricted (neither starts with *): either matching is enough; else both
    -- must match (a * field matches every day).
    day_ok := CASE WHEN f.dom_star OR f.dow_star
                   THEN extract(dow FROM d)::int = ANY (f.dows) AND extract(day FROM d)::int = ANY (f.doms)
                   ELSE extract(dow FROM d)::int = ANY (f.dows) OR extract(day FROM d)::int = ANY (f.doms) END;
    -- Only wall-clock times within 3 hours before `after` (or later) can fall after it.
    IF day_ok AND d + 1 > after_l - interval '3 hours' THEN
      -- The UTC offsets around the day: equal unless a transition falls within it.
      t := (d::timestamp AT TIME ZONE 'UTC') - interval '15 hours';
      o1 := (t AT TIME ZONE tz) - (t AT TIME ZONE 'UTC');
      t := ((d + 1)::timestamp AT TIME ZONE 'UTC') + interval '15 hours';
      o2 := (t AT TIME ZONE tz) - (t AT TIME ZONE 'UTC');
      FOREACH h IN ARRAY f.hours LOOP
        CONTINUE WHEN d + make_time(h, 59, 0) < after_l - interval '3 hours';
        FOREACH mi IN ARRAY f.minutes LOOP
          l := d + make_time(h, mi, 0);
          CONTINUE WHEN l < after_l - interval '3 hours';
          IF o1 = o2 THEN
            ts := ARRAY[(l - o1) AT TIME ZONE 'UTC'];
          ELSE
            ts := @schema@.cron_local_instants(l, tz, o1, o2, hour_star);
          END IF;
          -- The first occurrence of a wall-clock time only grows with it: once it is past the
          -- best slot found, no later wall-clock time can beat that slot.
          EXIT days WHEN best IS NOT NULL AND ts[1] >= best;
          FOREACH t IN ARRAY ts LOOP
            IF t > after AND (best IS NULL OR t < best) THEN
              best := t;
            END IF;
          END LOOP;
        END LOOP;
      END LOOP;
    END IF;
    d := d + 1;
  END LOOP;
  RETURN best;
END $$;

-- ---- the schedules ------------------------------------------------------------------------------

-- Creates or replaces the schedule `name`: every slot of `cron` (read in `timezone`) enqueues a
-- job of `kind` with `args` on `queue`. Validates everything first (22023, saying what is wrong).
-- A new schedule's first slot is the first after now. Replacing keeps the next slot unless the
-- expression or time zone changed; then it is the first slot after now (and after the last slot
-- enqueued). Returns the next slot and whether the schedule was created.
CREATE FUNCTION @schema@.schedule_upsert(name text, cron text, kind text, args jsonb DEFAULT '{}',
                                         queue text DEFAULT 'default', timezone text DEFAULT 'UTC')
RETURNS TABLE(next_slot timestamptz, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_now  timestamptz := clock_timestamp();
  v_args jsonb := coalesce(schedule_upsert.args, '{}');
BEGIN
  IF schedule_upsert.name IS NULL OR schedule_upsert.name = '' OR length(schedule_upsert.name) > 200
     OR schedule_upsert.name ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION 'tenure.schedule_upsert: name must be 1..200 printable characters' USING ERRCODE = '22023';
  END IF;
  PERFORM @schema@.cron_parse(schedule_upsert.cron);
  PERFORM @schema@.check_time_zone(schedule_upsert.timezone);
  PERFORM @schema@.check_job(schedule_upsert.kind, schedule_upsert.queue, 2, 25, 'tenure.schedule_upsert');
  PERFORM @schema@.check_job_input(v_args, NULL, 'tenure.schedule_upsert');
  IF @schema@.cron_next(schedule_upsert.cron, v_now, schedule_upsert.timezone) IS NULL THEN
    RAISE EXCEPTION 'tenure.schedule_upsert: the cron expression "%" matches no time in the next 50 years',
      schedule_upsert.cron USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
  INSERT INTO @schema@.schedules AS s (name, cron, kind, args, queue, timezone, created_at, updated_at, next_slot)
  VALUES (schedule_upsert.name, schedule_upsert.cron, schedule_upsert.kind, v_args, schedule_upsert.queue,
          schedule_upsert.timezone, v_now, v_now,
          @schema@.cron_next(schedule_upsert.cron, v_now, schedule_upsert.timezone))
  ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
     SET cron = EXCLUDED.cron, kind = EXCLUDED.kind, args = EXCLUDED.args, queue = EXCLUDED.queue,
         timezone = EXCLUDED.timezone, updated_at = v_now,
         next_slot = CASE WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone AND s.next_slot IS NOT NULL
                          THEN s.next_slot
                          ELSE @schema@.cron_next(EXCLUDED.cron, greatest(v_now, coalesce(s.last_slot, v_now)),
                                                  EXCLUDED.timezone) END
  RETURNING s.next_slot, s.created_at = v_now;
END $$;

-- Removes the schedule `name`; true when there was one. Jobs it enqueued stay.
CREATE FUNCTION @schema@.schedule_remove(name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  DELETE FROM @schema@.schedules s WHERE s.name = schedule_remove.name;
  RETURN FOUND;
END $$;

-- Every schedule, by name, with its next slot and its last one.
CREATE FUNCTION @schema@.list_schedules()
RETURNS TABLE(name text, cron text, kind text, args jsonb, queue text, timezone text, next_slot timestamptz,
              last_slot timestamptz, last_enqueued_at timestamptz, last_job_id bigint, last_error text,
              created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT s.name, s.cron, s.kind, s.args, s.queue, s.timezone, s.next_slot, s.last_slot, s.last_enqueued_at,
         s.last_job_id, s.last_error, s.created_at, s.updated_at
    FROM @schema@.schedules s ORDER BY s.name
$$;

-- Enqueues the due slot of every schedule whose next slot is at or before `at` (default: now), at
-- most `max_schedules` schedules per call, and returns how many jobs it enqueued. Of several
-- missed slots only the most recent runs. Each job is enqueued in the same transaction as the
-- guarded update that records its slot (see the top of this file), so a slot is enqueued once
-- however many passes run at the same time. A schedule whose enqueue fails records the error in
-- last_error and moves on to its next slot; it never fails the pass. Only the schema's owner runs
-- it (maintain() calls it inside the leader's fenced pass); `at` lets tests pick the time.
CREATE FUNCTION @schema@.enqueue_due_schedules(at timestamptz DEFAULT NULL, max_schedules int DEFAULT 1000)
RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_at   timestamptz := coalesce(enqueue_due_schedules.at, clock_timestamp());
  s      record;
  slot   timestamptz;
  nxt    timestamptz;
  hi     timestamptz;
  mid    timestamptz;
  c      timestamptz;
  v_job  bigint;
  n      int := 0;
BEGIN
  FOR s IN SELECT sc.name, sc.cron, sc.kind, sc.args, sc.queue, sc.timezone, sc.next_slot
             FROM @schema@.schedules sc
            WHERE sc.next_slot <= v_at
            ORDER BY sc.next_slot
            LIMIT enqueue_due_schedules.max_schedules
              FOR UPDATE SKIP LOCKED LOOP
    slot := s.next_slot;
    nxt := NULL;
    BEGIN
      nxt := @schema@.cron_next(s.cron, slot, s.timezone);
      IF nxt <= v_at THEN
        -- Several slots were missed: find the latest one at or before v_at by bisection (slot is
        -- always a slot <= v_at; no slot lies in (hi, v_at]).
        slot := nxt;
        hi := v_at;
        WHILE hi - slot > interval '1 second' LOOP
          mid := slot + (hi - slot) / 2;
          c := @schema@.cron_next(s.cron, mid, s.timezone);
          IF c <= v_at THEN
            slot := c;
          ELSE
            hi := mid;
          END IF;
        END LOOP;
        LOOP
          nxt := @schema@.cron_next(s.cron, slot, s.timezone);
          EXIT WHEN nxt IS NULL OR nxt > v_at;
          slot := nxt;
        END LOOP;
      END IF;
      UPDATE @schema@.schedules sc
         SET last_slot = slot, next_slot = nxt, last_enqueued_at = clock_timestamp(), last_error = NULL
       WHERE sc.name = s.name AND (sc.last_slot IS NULL OR sc.last_slot < slot);
      IF FOUND THEN
        -- >>> The one place a schedule slot becomes a job. <<<
        -- The slot's unique key (schedule:<slot>:<name>, the name hashed when the key would pass
        -- 255 bytes) makes a second enqueue of the slot return the first job while it is live.
        v_job := @schema@.enqueue(s.kind, s.args, s.queue, 2, NULL, 25,
                                  jsonb_build_object('schedule', s.name,
                                                     'slot', to_char(slot AT TIME ZONE 'UTC',
                                                                     'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
                                  CASE WHEN octet_length(s.name) <= 200
                                       THEN 'schedule:' || to_char(slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                                            || ':' || s.name
                                       ELSE 'schedule:' || to_char(slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                                            || ':md5:' || md5(s.name) END);
        UPDATE @schema@.schedules sc SET last_job_id = v_job WHERE sc.name = s.name;
        n := n + 1;
      END IF;
    EXCEPTION WHEN OTHERS THEN
      -- Undone: the slot's update and job. Skip the slot, say why, and go on.
      UPDATE @schema@.schedules sc
         SET last_slot = slot, next_slot = CASE WHEN nxt > v_at THEN nxt END,
             last_error = @schema@.bound_error(SQLERRM)
       WHERE sc.name = s.name AND (sc.last_slot IS NULL OR sc.last_slot < slot);
    END;
  END LOOP;
  RETURN n;
END $$;

-- As in migration 8, plus the due schedule slots (enqueue_due_schedules) after promotion, all in
-- the fenced transaction.
CREATE OR REPLACE FUNCTION @schema@.maintain(holder text, term bigint, stale_after interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, run_lease bigint, queue text, new_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM 1 FROM @schema@.leadership l
   WHERE l.name = 'maintenance' AND l.holder = maintain.holder AND l.term = maintain.term
     AND l.expires_at > clock_timestamp()
     FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tenure.maintain: % does not hold maintenance leadership term %', maintain.holder, maintain.term
      USING ERRCODE = 'TN004';
  END IF;
  PERFORM @schema@.promote_due(NULL, 10000);
  PERFORM @schema@.enqueue_due_schedules(NULL);
  RETURN QUERY SELECT r.job_id, r.run_lease, r.queue, r.new_state FROM @schema@.rescue_attempts(stale_after) r;
  PERFORM @schema@.prune_expired(stale_after);
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA @schema@ FROM PUBLIC;
