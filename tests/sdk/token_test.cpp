#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "tenure/token.hpp"

using tenure::errc;
using tenure::finalization_token;

TEST(finalization_token, round_trips_through_text) {
  const finalization_token t{{42, 7}};
  EXPECT_EQ(t.to_string(), "tn1:42:7");
  auto parsed = finalization_token::parse(t.to_string());
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed.value(), t);
}

TEST(finalization_token, round_trips_at_int64_max) {
  const auto max = std::numeric_limits<std::int64_t>::max();
  const finalization_token t{{max, max}};
  auto parsed = finalization_token::parse(t.to_string());
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed.value().job_id(), max);
  EXPECT_EQ(parsed.value().run_lease(), max);
}

TEST(finalization_token, rejects_malformed_text_as_malformed_token) {
  const std::string bad[] = {
      "", "tn1:", "tn1:1", "tn1:1:", "tn1::1", "tn1:0:1", "tn1:1:0", "tn1:01:1", "tn1:1:01",
      "tn1:-1:1", "tn1:+1:1", "tn1:1:1:", "tn1:1:1 ", " tn1:1:1", "tn2:1:1", "TN1:1:1", "tn1:1:x",
      "tn1:9223372036854775808:1", "tn1:1:99999999999999999999", "tn1:1:1\n", std::string("tn1:1\0:1", 8),
      std::string(10000, '9'), "tn1:" + std::string(60, '1') + ":1",
  };
  for (const auto& s : bad) {
    auto r = finalization_token::parse(s);
    ASSERT_FALSE(r) << "accepted: " << s;
    EXPECT_EQ(r.error(), errc::malformed_token) << s;
  }
}
