// Periodic (cron) schedules against the real PostgreSQL: cron parsing (each syntax feature and
// each error), next-slot computation (month ends, leap years, the day-of-month / day-of-week OR
// rule, DST gaps and overlaps) at fixed instants, schedule_upsert / schedule_remove /
// list_schedules, the pass that enqueues due slots (exactly once under concurrent passes, only
// the latest missed slot), the grant-admin slice, and the runtime's maintenance leader enqueueing
// a due slot.
#include <atomic>
#include <barrier>
#include <set>

#include "runtime/runtime_fixture.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure::test {
namespace {

class schedules_pg : public runtime_pg {
 protected:
  /// cron_next(cron, after, tz) as `YYYY-MM-DD HH:MM` UTC, or "none"; the SQLSTATE when refused.
  std::string next(const std::string& cron, const std::string& after, const std::string& tz = "UTC") {
    auto r = db_.query("SELECT coalesce(to_char(" + s("cron_next") +
                           "($1, $2::timestamptz, $3) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'), 'none')",
                       {cron, after, tz});
    return r.ok ? r.at(0, 0) : "error " + r.sqlstate + ": " + r.error;
  }
  /// The next `n` slots after `after`, each from the one before.
  std::vector<std::string> slots(const std::string& cron, std::string after, int n, const std::string& tz = "UTC") {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      after = next(cron, after + (after.size() == 16 ? "Z" : ""), tz);
      out.push_back(after);
    }
    return out;
  }
  /// One field of cron_parse(cron) as text ("{0,15,30,45}").
  std::string field(const std::string& cron, const std::string& name) {
    return db_.scalar("SELECT " + name + "::text FROM " + s("cron_parse") + "($1)", {cron});
  }
  tenure::test::sql_result upsert(const std::string& name, const std::string& cron, const std::string& kind = "tick",
                                  const std::string& args = "{}", const std::string& queue = "default",
                                  const std::string& tz = "UTC") {
    return db_.query("SELECT next_slot, created FROM " + s("schedule_upsert") + "($1, $2, $3, $4::jsonb, $5, $6)",
                     {name, cron, kind, args, queue, tz});
  }
  /// enqueue_due_schedules at the instant `at` (SQL text): how many jobs it enqueued.
  int pass(const std::string& at) {
    return std::stoi(db_.scalar("SELECT " + s("enqueue_due_schedules") + "($1::timestamptz)", {at}));
  }
  /// now() + `later`, as text, fixed once.
  std::string later(const std::string& interval) {
    return db_.scalar("SELECT (now() + $1::interval)::text", {interval});
  }
  std::string schedule_field(const std::string& name, const std::string& expr) {
    return db_.scalar("SELECT " + expr + " FROM " + s("schedules") + " WHERE name = $1", {name});
  }
};

// ---- parsing ------------------------------------------------------------------------------------

TEST_F(schedules_pg, cron_parse_reads_lists_ranges_steps_names_sunday_as_0_or_7_and_macros) {
  EXPECT_EQ(field("*/15 * * * *", "minutes"), "{0,15,30,45}");
  EXPECT_EQ(field("1-30/5 * * * *", "minutes"), "{1,6,11,16,21,26}");
  EXPECT_EQ(field("5,1,3 * * * *", "minutes"), "{1,3,5}");
  EXPECT_EQ(field("50/5 * * * *", "minutes"), "{50,55}") << "N/STEP runs from N to the field's end";
  EXPECT_EQ(field("0 9-17 * * *", "hours"), "{9,10,11,12,13,14,15,16,17}");
  EXPECT_EQ(field("0 0 1,15,31 * *", "doms"), "{1,15,31}");
  EXPECT_EQ(field("0 0 * JAN,jul-Sep *", "months"), "{1,7,8,9}");
  EXPECT_EQ(field("0 0 * */3 *", "months"), "{1,4,7,10}");
  EXPECT_EQ(field("0 0 * * MON-FRI", "dows"), "{1,2,3,4,5}");
  EXPECT_EQ(field("0 0 * * sun", "dows"), "{0}");
  EXPECT_EQ(field("0 0 * * 7", "dows"), "{0}") << "7 is Sunday, as 0";
  EXPECT_EQ(field("0 0 * * 5-7", "dows"), "{0,5,6}");
  EXPECT_EQ(field("0 0 * * *", "dows"), "{0,1,2,3,4,5,6}");
  EXPECT_EQ(field("0 0 */2 * 1", "dom_star"), "true") << "a field starting with * is unrestricted";
  EXPECT_EQ(field("0 0 1 * 1", "dom_star"), "false");
  EXPECT_EQ(field("  0\t12  * * *  ", "hours"), "{12}") << "blanks and tabs separate fields";
  EXPECT_EQ(field("@hourly", "minutes") + field("@hourly", "hours"),
            "{0}{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23}");
  EXPECT_EQ(field("@daily", "hours") + field("@midnight", "hours"), "{0}{0}");
  EXPECT_EQ(field("@weekly", "dows"), "{0}");
  EXPECT_EQ(field("@monthly", "doms") + field("@monthly", "months"), "{1}{1,2,3,4,5,6,7,8,9,10,11,12}");
  EXPECT_EQ(field("@yearly", "months") + field("@annually", "doms"), "{1}{1}");
}

TEST_F(schedules_pg, an_invalid_cron_expression_raises_22023_naming_the_field_and_token) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {"* * * *", "expected 5 fields (minute hour day-of-month month day-of-week), got 4"},
      {"* * * * * *", "got 6"},
      {"60 * * * *", "minute field, token \"60\": 60 is out of range 0-59"},
      {"* 24 * * *", "hour field, token \"24\": 24 is out of range 0-23"},
      {"0 0 0 * *", "day-of-month field, token \"0\": 0 is out of range 1-31"},
      {"0 0 32 * *", "day-of-month field, token \"32\": 32 is out of range 1-31"},
      {"0 0 * 13 *", "month field, token \"13\": 13 is out of range 1-12"},
      {"0 0 * * 8", "day-of-week field, token \"8\": 8 is out of range 0-7"},
      {"x * * * *", "minute field, token \"x\": \"x\" is not a number"},
      {"0 0 * FOO *", "month field, token \"FOO\": \"FOO\" is not a month number or name (JAN-DEC)"},
      {"0 0 * * MONDAY", "day-of-week field, token \"MONDAY\": \"MONDAY\" is not a day number (0-7) or name"},
      {"0 MON * * *", "hour field, token \"MON\": \"MON\" is not a number"},
      {"*/0 * * * *", "minute field, token \"*/0\": the step \"0\" must be a positive number"},
      {"*/x * * * *", "minute field, token \"*/x\": the step \"x\" must be a positive number"},
      {"*/ * * * *", "minute field, token \"*/\": the step \"\" must be a positive number"},
      {"30-5 * * * *", "minute field, token \"30-5\": the range starts after it ends"},
      {"0 0 * * FRI-MON", "day-of-week field, token \"FRI-MON\": the range starts after it ends"},
      {"1-2-3 * * * *", "minute field, token \"1-2-3\": expected *, a value or a range A-B"},
      {"-5 * * * *", "minute field, token \"-5\": expected *, a value or a range A-B"},
      {"1,,2 * * * *", "minute field \"1,,2\" has an empty list element"},
      {"0 0 30 2 *", "the day-of-month field \"30\" never occurs in the month field \"2\""},
      {"0 0 31 4,6,9,11 *", "never occurs"},
      {"@every", "unknown macro"},
  };
  for (const auto& [cron, words] : cases) {
    auto r = db_.query("SELECT " + s("cron_parse") + "($1)", {cron});
    EXPECT_EQ(r.sqlstate, "22023") << cron;
    EXPECT_NE(r.error.find(words), std::string::npos) << "\"" << cron << "\": " << r.error;
  }
  auto r = db_.query("SELECT " + s("cron_parse") + "($1)", {std::string(201, '*')});
  EXPECT_EQ(r.sqlstate, "22023");
  // 31 in a field that also lists a 31-day month, and 29 February, are valid.
  EXPECT_TRUE(db_.query("SELECT " + s("cron_parse") + "('0 0 31 2,3 *')").ok);
  EXPECT_TRUE(db_.query("SELECT " + s("cron_parse") + "('0 0 29 2 *')").ok);
}

TEST_F(schedules_pg, an_unknown_time_zone_raises_22023) {
  for (const std::string tz : {"Mars/Olympus", "", "Europe/Berlin\n"}) {
    auto r = db_.query("SELECT " + s("cron_next") + "('* * * * *', now(), $1)", {tz});
    EXPECT_EQ(r.sqlstate, "22023") << tz;
    EXPECT_NE(r.error.find("time zone"), std::string::npos) << r.error;
  }
  EXPECT_EQ(upsert("s", "* * * * *", "tick", "{}", "default", "Mars/Olympus").sqlstate, "22023");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("schedules")), "0");
}

// ---- next slots -----------------------------------------------------------------------------------

TEST_F(schedules_pg, next_slot_is_strictly_after_the_given_instant_and_follows_steps_and_lists) {
  EXPECT_EQ(next("*/15 * * * *", "2024-01-01 10:07:00Z"), "2024-01-01 10:15");
  EXPECT_EQ(next("*/15 * * * *", "2024-01-01 10:15:00Z"), "2024-01-01 10:30") << "strictly after";
  EXPECT_EQ(next("*/15 * * * *", "2024-01-01 10:14:59.999Z"), "2024-01-01 10:15");
  EXPECT_EQ(next("*/15 * * * *", "2024-01-01 23:50:00Z"), "2024-01-02 00:00");
  EXPECT_EQ(slots("1-30/10 9 * * *", "2024-01-01 00:00", 4),
            (std::vector<std::string>{"2024-01-01 09:01", "2024-01-01 09:11", "2024-01-01 09:21", "2024-01-02 09:01"}));
  EXPECT_EQ(next("59 23 31 12 *", "2024-06-01 00:00Z"), "2024-12-31 23:59");
  EXPECT_EQ(next("59 23 31 12 *", "2024-12-31 23:59Z"), "2025-12-31 23:59") << "over the year's end";
  EXPECT_EQ(next("0 9 * * MON-FRI", "2024-01-05 10:00Z"), "2024-01-08 09:00") << "Friday after 9 -> Monday";
  EXPECT_EQ(next("0 0 1 JAN,jul *", "2024-02-01 00:00Z"), "2024-07-01 00:00");
}

TEST_F(schedules_pg, next_slot_skips_months_without_the_day_and_finds_29_february_in_leap_years_only) {
  EXPECT_EQ(slots("0 0 31 * *", "2024-01-31 00:00", 4),
            (std::vector<std::string>{"2024-03-31 00:00", "2024-05-31 00:00", "2024-07-31 00:00", "2024-08-31 00:00"}));
  EXPECT_EQ(next("0 0 30 * *", "2024-01-30 00:00Z"), "2024-03-30 00:00") << "February has no 30th";
  EXPECT_EQ(slots("0 0 29 2 *", "2023-01-01 00:00", 3),
            (std::vector<std::string>{"2024-02-29 00:00", "2028-02-29 00:00", "2032-02-29 00:00"}));
  EXPECT_EQ(next("0 0 29 2 *", "2096-03-01 00:00Z"), "2104-02-29 00:00") << "2100 is not a leap year";
  EXPECT_EQ(next("0 12 28-31 2 *", "2023-02-28 12:00Z"), "2024-02-28 12:00");
  EXPECT_EQ(next("0 12 28-31 2 *", "2024-02-28 12:00Z"), "2024-02-29 12:00");
  EXPECT_EQ(next("0 0 1 * *", "2024-02-29 00:00Z"), "2024-03-01 00:00");
}

TEST_F(schedules_pg, a_day_matches_when_either_restricted_day_field_matches_and_a_star_field_restricts_nothing) {
  // Friday the 13th style: every 13th OR every Friday (September 2024: Fridays 6, 13, 20, 27).
  EXPECT_EQ(slots("0 0 13 * FRI", "2024-09-01 00:00", 5),
            (std::vector<std::string>{"2024-09-06 00:00", "2024-09-13 00:00", "2024-09-20 00:00", "2024-09-27 00:00",
                                      "2024-10-04 00:00"}));
  EXPECT_EQ(slots("0 0 1,15 * 3", "2024-05-01 00:00", 4),
            (std::vector<std::string>{"2024-05-08 00:00", "2024-05-15 00:00", "2024-05-22 00:00", "2024-05-29 00:00"}));
  // Day of week alone; day of month alone.
  EXPECT_EQ(next("0 0 * * 0", "2024-09-01 00:00Z"), "2024-09-08 00:00");
  EXPECT_EQ(next("0 0 * * 7", "2024-09-01 00:00Z"), "2024-09-08 00:00");
  EXPECT_EQ(next("0 0 10 * *", "2024-09-01 00:00Z"), "2024-09-10 00:00");
  // A day-of-month field starting with * does not restrict: both must match (odd days that are Mondays).
  EXPECT_EQ(slots("0 0 */2 * MON", "2024-09-01 00:00", 3),
            (std::vector<std::string>{"2024-09-09 00:00", "2024-09-23 00:00", "2024-10-07 00:00"}));
}

TEST_F(schedules_pg, a_wall_clock_time_the_spring_forward_gap_skips_runs_once_at_the_end_of_the_gap) {
  // Europe/Berlin, 31 March 2024: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
  EXPECT_EQ(slots("30 2 * * *", "2024-03-29 12:00", 4, "Europe/Berlin"),
            (std::vector<std::string>{"2024-03-30 01:30",    // 02:30 CET
                                      "2024-03-31 01:00",    // 02:30 does not exist: 03:00 CEST
                                      "2024-04-01 00:30",    // 02:30 CEST
                                      "2024-04-02 00:30"}));
  // Every half hour through the gap: 02:00 and 02:30 fall on 03:00, which runs once.
  EXPECT_EQ(slots("*/30 * * * *", "2024-03-31 00:00", 4, "Europe/Berlin"),
            (std::vector<std::string>{"2024-03-31 00:30", "2024-03-31 01:00", "2024-03-31 01:30", "2024-03-31 02:00"}));
  // America/New_York, 10 March 2024: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
  EXPECT_EQ(next("15 2 * * *", "2024-03-10 00:00Z", "America/New_York"), "2024-03-10 07:00");
  EXPECT_EQ(next("15 2 * * *", "2024-03-10 07:00Z", "America/New_York"), "2024-03-11 06:15");
}

TEST_F(schedules_pg, a_wall_clock_time_the_fall_back_overlap_repeats_runs_once_unless_the_hour_field_is_star) {
  // Europe/Berlin, 27 October 2024: 03:00 CEST falls back to 02:00 CET (01:00 UTC); 02:00-02:59 happens twice.
  EXPECT_EQ(slots("30 2 * * *", "2024-10-26 12:00", 3, "Europe/Berlin"),
            (std::vector<std::string>{"2024-10-27 00:30",    // 02:30 CEST, the first time
                                      "2024-10-28 01:30",    // not 02:30 CET the same night
                                      "2024-10-29 01:30"}));
  EXPECT_EQ(next("30 2 * * *", "2024-10-27 00:45Z", "Europe/Berlin"), "2024-10-28 01:30")
      << "after its first occurrence the repeated time does not run again";
  // With the hour field *, the schedule follows real time through the repeated hour.
  EXPECT_EQ(slots("*/30 * * * *", "2024-10-26 23:45", 6, "Europe/Berlin"),
            (std::vector<std::string>{"2024-10-27 00:00", "2024-10-27 00:30", "2024-10-27 01:00", "2024-10-27 01:30",
                                      "2024-10-27 02:00", "2024-10-27 02:30"}));
  // A fixed hour list: 01:30 and 02:30 run once each.
  EXPECT_EQ(slots("30 1,2,3 * * *", "2024-10-26 22:00", 3, "Europe/Berlin"),
            (std::vector<std::string>{"2024-10-26 23:30", "2024-10-27 00:30", "2024-10-27 02:30"}));
  // America/New_York, 3 November 2024: 01:30 happens at 05:30 and 06:30 UTC; a daily 01:30 job runs once.
  EXPECT_EQ(slots("30 1 * * *", "2024-11-02 12:00", 2, "America/New_York"),
            (std::vector<std::string>{"2024-11-03 05:30", "2024-11-04 06:30"}));
}

// ---- schedules ----------------------------------------------------------------------------------

TEST_F(schedules_pg, upsert_creates_then_replaces_keeping_the_next_slot_unless_the_expression_changes) {
  auto created = upsert("nightly", "0 3 * * *", "report", "{\"n\": 1}", "reports", "Europe/Berlin");
  ASSERT_TRUE(created.ok) << created.error;
  EXPECT_EQ(created.at(0, 1), "t");
  EXPECT_EQ(db_.scalar("SELECT next_slot = " + s("cron_next") + "('0 3 * * *', created_at, 'Europe/Berlin') FROM " +
                       s("schedules")),
            "t")
      << "the first slot after its creation";
  const auto first_next = created.at(0, 0);

  auto replaced = upsert("nightly", "0 3 * * *", "report2", "{\"n\": 2}", "other", "Europe/Berlin");
  ASSERT_TRUE(replaced.ok) << replaced.error;
  EXPECT_EQ(replaced.at(0, 1), "f");
  EXPECT_EQ(replaced.at(0, 0), first_next) << "same expression and zone: same next slot";
  EXPECT_EQ(schedule_field("nightly", "kind || ' ' || queue || ' ' || args::text"), "report2 other {\"n\": 2}");

  auto changed = upsert("nightly", "* * * * *", "report2");
  ASSERT_TRUE(changed.ok) << changed.error;
  EXPECT_EQ(schedule_field("nightly", "next_slot = date_trunc('minute', updated_at) + interval '1 minute'"), "t")
      << "a new expression's next slot is computed afresh";
  EXPECT_EQ(schedule_field("nightly", "timezone"), "UTC");

  // list_schedules shows them; remove removes once.
  upsert("a-second", "@hourly", "tick");
  EXPECT_EQ(db_.scalar("SELECT string_agg(name || ' ' || cron, ', ') FROM " + s("list_schedules") + "()"),
            "a-second @hourly, nightly * * * * *");
  EXPECT_EQ(db_.scalar("SELECT " + s("schedule_remove") + "('nightly')"), "t");
  EXPECT_EQ(db_.scalar("SELECT " + s("schedule_remove") + "('nightly')"), "f");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("list_schedules") + "()"), "1");
}

TEST_F(schedules_pg, upsert_refuses_bad_values_with_22023_and_stores_nothing) {
  const std::vector<std::vector<std::string>> bad = {
      {"", "* * * * *", "k", "{}", "default", "UTC"},
      {std::string(201, 'n'), "* * * * *", "k", "{}", "default", "UTC"},
      {"line\nbreak", "* * * * *", "k", "{}", "default", "UTC"},
      {"s", "61 * * * *", "k", "{}", "default", "UTC"},
      {"s", "* * * * *", "", "{}", "default", "UTC"},
      {"s", "* * * * *", "k", "[1]", "default", "UTC"},
      {"s", "* * * * *", "k", "{}", "", "UTC"},
      {"s", "* * * * *", "k", "{}", "default", "Nowhere/Special"},
  };
  for (const auto& b : bad) {
    auto r = upsert(b[0], b[1], b[2], b[3], b[4], b[5]);
    EXPECT_EQ(r.sqlstate, "22023") << b[0] << " | " << b[1] << " | " << b[2] << " | " << b[3] << " | " << b[4]
                                   << " | " << b[5] << ": " << r.error;
  }
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("schedules")), "0");
}

TEST_F(schedules_pg, a_new_schedule_runs_no_slot_from_before_its_creation) {
  ASSERT_TRUE(upsert("m", "* * * * *").ok);
  EXPECT_EQ(pass(later("0 seconds")), 0);
  EXPECT_EQ(count("true"), 0);
  EXPECT_EQ(schedule_field("m", "last_slot IS NULL AND next_slot > created_at"), "t");
}

TEST_F(schedules_pg, a_due_slot_enqueues_one_job_with_metadata_naming_the_schedule_and_slot) {
  ASSERT_TRUE(upsert("m", "* * * * *", "tick", "{\"to\": \"ops\"}", "mail").ok);
  const auto slot = schedule_field("m", "to_char(next_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')");
  const auto at = schedule_field("m", "next_slot::text");
  EXPECT_EQ(pass(at), 1);
  EXPECT_EQ(pass(at), 0) << "the same slot again: nothing";
  EXPECT_EQ(db_.scalar("SELECT kind || ' ' || queue || ' ' || args::text || ' ' || metadata::text FROM " + s("jobs")),
            "tick mail {\"to\": \"ops\"} {\"slot\": \"" + slot + "\", \"schedule\": \"m\"}");
  EXPECT_EQ(schedule_field("m", "last_job_id = (SELECT id FROM " + s("jobs") + ") AND last_error IS NULL"), "t");
  EXPECT_EQ(schedule_field("m", "next_slot - last_slot"), "00:01:00");
}

TEST_F(schedules_pg, a_slot_job_carries_a_unique_key_so_a_replayed_slot_finds_the_live_job) {
  ASSERT_TRUE(upsert("k", "* * * * *", "tick", "{}", "default").ok);
  const auto slot = schedule_field("k", "to_char(next_slot AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')");
  const auto at = schedule_field("k", "next_slot::text");
  EXPECT_EQ(pass(at), 1);
  EXPECT_EQ(db_.scalar("SELECT unique_key FROM " + s("jobs")), "schedule:" + slot + ":k");
  // A leader whose view of the schedule row is behind (as after a failover to a standby that
  // missed the last update) replays the slot: the key returns the live job, nothing is added.
  db_.exec("UPDATE " + s("schedules") + " SET last_slot = NULL, next_slot = '" + at + "' WHERE name = 'k'");
  pass(at);
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "1");
}

TEST_F(schedules_pg, after_downtime_only_the_most_recent_missed_slot_runs) {
  ASSERT_TRUE(upsert("hourly", "0 * * * *").ok);
  ASSERT_TRUE(upsert("minutely", "* * * * *").ok);
  ASSERT_TRUE(upsert("yearly", "@yearly").ok);
  // Three days later: one job each for hourly and minutely, for the latest slot before then.
  const auto at = later("3 days 30 seconds");
  EXPECT_EQ(pass(at), 2);
  EXPECT_EQ(count("true"), 2);
  EXPECT_EQ(schedule_field("hourly", "last_slot = date_trunc('hour', '" + at + "'::timestamptz AT TIME ZONE 'UTC') "
                                     "AT TIME ZONE 'UTC'"),
            "t");
  EXPECT_EQ(schedule_field("minutely", "last_slot = date_trunc('minute', '" + at + "'::timestamptz)"), "t");
  EXPECT_EQ(schedule_field("minutely", "next_slot - last_slot"), "00:01:00");
  // Two years later: the yearly one runs once, for the last 1 January.
  const auto at2 = later("800 days");
  EXPECT_EQ(pass(at2), 3);
  EXPECT_EQ(count("true"), 5);
  EXPECT_EQ(schedule_field("yearly", "last_slot = date_trunc('year', '" + at2 + "'::timestamptz AT TIME ZONE 'UTC') "
                                     "AT TIME ZONE 'UTC'"),
            "t");
}

TEST_F(schedules_pg, concurrent_passes_enqueue_each_slot_exactly_once) {
  constexpr int k_threads = 4;
  constexpr int k_minutes = 40;
  const std::vector<std::string> names = {"a", "b", "c"};
  for (const auto& n : names) ASSERT_TRUE(upsert(n, "* * * * *").ok);
  const auto base = db_.scalar("SELECT date_trunc('minute', now())::text");
  std::barrier sync(k_threads);
  std::atomic<int> enqueued{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < k_threads; ++t) {
    threads.emplace_back([&] {
      pg session{schema_.dsn()};
      for (int m = 1; m <= k_minutes; ++m) {
        sync.arrive_and_wait();  // every "leader" runs the pass for the same minute at once
        enqueued += std::stoi(session.scalar("SELECT " + s("enqueue_due_schedules") +
                                             "($1::timestamptz + $2::int * interval '1 minute' + interval '1 second')",
                                             {base, std::to_string(m)}));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(enqueued.load(), k_minutes * static_cast<int>(names.size()));
  EXPECT_EQ(count("true"), k_minutes * static_cast<long>(names.size()));
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM (SELECT metadata FROM " + s("jobs") +
                       " GROUP BY metadata HAVING count(*) > 1) dup"),
            "0")
      << "no slot was enqueued twice";
}

TEST_F(schedules_pg, a_schedule_whose_enqueue_or_time_zone_fails_records_the_error_and_the_pass_goes_on) {
  ASSERT_TRUE(upsert("broken", "* * * * *").ok);
  ASSERT_TRUE(upsert("fine", "* * * * *").ok);
  ASSERT_TRUE(upsert("zone-gone", "* * * * *").ok);
  // Only the owner can store what schedule_upsert refuses (or a zone the time zone data no longer has).
  db_.exec("UPDATE " + s("schedules") + " SET args = '[1]' WHERE name = 'broken'");
  db_.exec("UPDATE " + s("schedules") + " SET timezone = 'Gone/Zone' WHERE name = 'zone-gone'");
  const auto term = db_.scalar("SELECT " + s("acquire_leadership") + "('leader', '1 hour')");
  db_.exec("UPDATE " + s("schedules") + " SET next_slot = next_slot - interval '1 minute'");
  auto r = db_.query("SELECT * FROM " + s("maintain") + "('leader', $1::bigint)", {term});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(count("true"), 1);
  EXPECT_EQ(schedule_field("broken", "last_error LIKE '%args must be a JSON object%' AND last_job_id IS NULL "
                                     "AND next_slot > last_slot"),
            "t");
  EXPECT_EQ(schedule_field("fine", "last_error IS NULL AND last_job_id IS NOT NULL"), "t");
  EXPECT_EQ(schedule_field("zone-gone", "last_error LIKE '%time zone \"Gone/Zone\" not recognized%' "
                                        "AND next_slot IS NULL"),
            "t")
      << "it stops until it is replaced with a zone that exists";
}

// ---- roles --------------------------------------------------------------------------------------

TEST_F(schedules_pg, only_a_role_given_grant_admin_may_upsert_remove_or_list_schedules) {
  pg owner{test_dsn()};
  std::vector<std::string> roles;
  auto make_role = [&](std::optional<postgres::grant_kind> kind) {
    const std::string role = "sched_role_" + random_suffix();
    owner.exec("CREATE ROLE " + role + " LOGIN");
    roles.push_back(role);
    if (kind) {
      auto g = postgres::grant(schema_.dsn(), *kind, role, schema_.name());
      EXPECT_TRUE(g) << g.error().message();
    }
    return role;
  };
  const auto admin = make_role(postgres::grant_kind::admin);
  const std::vector<std::string> calls = {"SELECT * FROM " + s("schedule_upsert") + "('r', '* * * * *', 'k')",
                                          "SELECT * FROM " + s("list_schedules") + "()",
                                          "SELECT " + s("schedule_remove") + "('r')",
                                          "SELECT " + s("cron_next") + "('* * * * *', now())"};
  for (const auto& role : {make_role(postgres::grant_kind::worker), make_role(postgres::grant_kind::producer),
                           make_role(postgres::grant_kind::finalizer), make_role(std::nullopt)}) {
    pg as{dsn_with_user(schema_.dsn(), role)};
    for (const auto& call : calls) EXPECT_EQ(as.query(call).sqlstate, "42501") << role << ": " << call;
  }
  {
    pg as{dsn_with_user(schema_.dsn(), admin)};
    for (const auto& call : calls) EXPECT_EQ(as.query(call).sqlstate, "") << call;
    EXPECT_EQ(as.query("SELECT * FROM " + s("schedules")).sqlstate, "42501");
    EXPECT_EQ(as.query("SELECT " + s("enqueue_due_schedules") + "()").sqlstate, "42501");
  }
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("schedules")), "0");
  for (const auto& role : roles) {
    owner.query("DROP OWNED BY " + role + " CASCADE");
    owner.query("DROP ROLE IF EXISTS " + role);
  }
}

// ---- the runtime --------------------------------------------------------------------------------

TEST_F(schedules_pg, the_runtimes_maintenance_leader_enqueues_a_due_slot_within_a_pass) {
  auto cfg = fast_config();
  cfg.maintenance_interval = 1s;  // the default
  auto rt = make(cfg);
  std::atomic<int> ran{0};
  rt->handle("tick", [&](job_context&) {
    ++ran;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(upsert("every-minute", "* * * * *").ok);
  // Make the slot of the current minute due now (instead of waiting for the next minute).
  db_.exec("UPDATE " + s("schedules") + " SET next_slot = date_trunc('minute', clock_timestamp())");
  const auto due = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return ran.load() >= 1; }, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - due, 2500ms) << "within a maintenance pass or two";
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs") +
                       " WHERE metadata->>'schedule' = 'every-minute' AND (metadata->>'slot')::timestamptz = "
                       "(SELECT last_slot FROM " + s("schedules") + ")"),
            "1");
  rt->stop();
}

}  // namespace
}  // namespace tenure::test
