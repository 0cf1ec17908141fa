#include <gtest/gtest.h>

#include <chrono>

#include "cli/time_text.hpp"

using tenure::cli::format_iso8601;
using tenure::cli::parse_iso8601;
using namespace std::chrono;

namespace {

tenure::time_point utc(int y, unsigned mo, unsigned d, int h = 0, int mi = 0, int s = 0, int us = 0) {
  return tenure::time_point{
      duration_cast<tenure::clock_type::duration>(sys_days{year{y} / month{mo} / day{d}}.time_since_epoch() +
                                                  hours{h} + minutes{mi} + seconds{s} + microseconds{us})};
}

}  // namespace

TEST(cli_time, parses_the_common_forms) {
  EXPECT_EQ(parse_iso8601("2030-01-31"), utc(2030, 1, 31));
  EXPECT_EQ(parse_iso8601("2030-01-31T08:15"), utc(2030, 1, 31, 8, 15));
  EXPECT_EQ(parse_iso8601("2030-01-31T08:15:30Z"), utc(2030, 1, 31, 8, 15, 30));
  EXPECT_EQ(parse_iso8601("2030-01-31 08:15:30"), utc(2030, 1, 31, 8, 15, 30));
  EXPECT_EQ(parse_iso8601("2030-01-31T08:15:30.25Z"), utc(2030, 1, 31, 8, 15, 30, 250000));
  EXPECT_EQ(parse_iso8601("2030-01-31T08:15:30.1234567Z"), utc(2030, 1, 31, 8, 15, 30, 123456));
}

TEST(cli_time, applies_offsets) {
  EXPECT_EQ(parse_iso8601("2030-01-31T09:15:30+01:00"), utc(2030, 1, 31, 8, 15, 30));
  EXPECT_EQ(parse_iso8601("2030-01-31T09:15:30+0100"), utc(2030, 1, 31, 8, 15, 30));
  EXPECT_EQ(parse_iso8601("2030-01-31T03:15:30-05"), utc(2030, 1, 31, 8, 15, 30));
  EXPECT_EQ(parse_iso8601("2030-01-01T00:30:00+01:00"), utc(2029, 12, 31, 23, 30));
}

TEST(cli_time, rejects_malformed_or_out_of_range_text) {
  for (const char* bad :
       {"", "2030", "2030-1-31", "2030-01-31T", "2030-01-31T8:15", "2030-13-01", "2030-02-30",
        "2030-01-31T24:00", "2030-01-31T08:60", "2030-01-31T08:15:61", "2030-01-31T08:15:30.",
        "2030-01-31T08:15:30+1", "2030-01-31T08:15:30 Z", "2030-01-31T08:15:30Zjunk", "tomorrow",
        "2030-01-31T08:15:30+25:00", "2999-01-01T00:00:00Z", "1500-01-01"}) {
    EXPECT_FALSE(parse_iso8601(bad)) << bad;
  }
}

TEST(cli_time, formats_utc_and_round_trips) {
  EXPECT_EQ(format_iso8601(utc(2030, 1, 31, 8, 15, 30)), "2030-01-31T08:15:30Z");
  EXPECT_EQ(format_iso8601(utc(2030, 1, 31, 8, 15, 30, 42)), "2030-01-31T08:15:30.000042Z");
  EXPECT_EQ(format_iso8601(utc(1970, 1, 1)), "1970-01-01T00:00:00Z");
  const auto t = utc(2024, 2, 29, 23, 59, 59, 999999);
  EXPECT_EQ(parse_iso8601(format_iso8601(t)), t);
}
