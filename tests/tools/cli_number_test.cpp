#include <gtest/gtest.h>

#include "cli/number_text.hpp"

using tenure::cli::check_job_id;
using tenure::cli::check_json_integers;
using tenure::cli::check_seconds;

namespace {

TEST(cli_numbers, seconds_are_plain_finite_decimals_within_range) {
  for (const char* ok : {"0", "30", "0.5", "1e3", "3600.25"}) EXPECT_EQ(check_seconds(ok, 1e9), "") << ok;
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "0x10", "", " 5", "5 ", "1,5", "abc", "1e"}) {
    EXPECT_NE(check_seconds(bad, 1e9).find("is not a number of seconds"), std::string::npos) << bad;
  }
  EXPECT_NE(check_seconds("-1", 1e9).find("out of range"), std::string::npos);
  EXPECT_NE(check_seconds("2e9", 1e9).find("out of range"), std::string::npos);
}

TEST(cli_numbers, job_ids_are_positive_base_ten_int64_never_clamped) {
  for (const char* ok : {"1", "42", "9223372036854775807"}) EXPECT_EQ(check_job_id(ok), "") << ok;
  for (const char* bad : {"0", "-1", "9223372036854775808", "99999999999999999999999999", "0x10", " 5", "5 ", "+5",
                          "abc", "", "1e3"}) {
    EXPECT_NE(check_job_id(bad).find("is not a job id"), std::string::npos) << bad;
  }
}

TEST(cli_numbers, json_integers_beyond_64_bits_are_refused_not_rounded) {
  EXPECT_EQ(check_json_integers(R"({"a": 1, "b": -9223372036854775808, "c": 18446744073709551615, "d": 1.5e300})"), "");
  EXPECT_EQ(check_json_integers("[0.1, 1e-5, 2E10]"), "") << "fractions and exponents are doubles, as JSON says";
  EXPECT_NE(check_json_integers(R"({"a": {"b": [12345678901234567890123]}})").find("12345678901234567890123"),
            std::string::npos);
  EXPECT_NE(check_json_integers("18446744073709551616").find("does not fit in 64 bits"), std::string::npos);
  EXPECT_NE(check_json_integers("-9223372036854775809").find("does not fit in 64 bits"), std::string::npos);
  EXPECT_EQ(check_json_integers("{not json"), "") << "malformed text is the parser's to report";
}

}  // namespace
