#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "tenure/token.hpp"

using tenure::attempt_secret;
using tenure::errc;
using tenure::finalization_token;

namespace {

constexpr std::string_view k_hex = "00112233445566778899aabbccddeeff";

attempt_secret secret(std::string_view hex = k_hex) {
  auto s = attempt_secret::parse(hex);
  EXPECT_TRUE(s) << hex;
  return s ? s.value() : attempt_secret{};
}

}  // namespace

TEST(attempt_secret, round_trips_through_32_lowercase_hex_digits) {
  const auto s = secret();
  EXPECT_EQ(s.to_string(), k_hex);
  EXPECT_EQ(s.bytes()[0], 0x00);
  EXPECT_EQ(s.bytes()[15], 0xff);
  EXPECT_EQ(attempt_secret{}.to_string(), std::string(32, '0'));
}

TEST(attempt_secret, rejects_anything_but_32_lowercase_hex_digits) {
  for (const std::string& bad : {std::string{}, std::string(31, 'a'), std::string(33, 'a'), std::string(32, 'g'),
                                 std::string{"00112233445566778899AABBCCDDEEFF"},
                                 std::string{"00112233-4455-6677-8899-aabbccddeeff"},
                                 std::string{"0011223344556677889 aabbccddeeff"}, std::string(32, '\0')}) {
    auto r = attempt_secret::parse(bad);
    ASSERT_FALSE(r) << "accepted: " << bad;
    EXPECT_EQ(r.error(), errc::malformed_token);
  }
}

TEST(attempt_secret, equality_compares_every_byte) {
  const auto s = secret();
  EXPECT_EQ(s, secret());
  for (std::size_t i = 0; i < attempt_secret::size; ++i) {
    auto bytes = s.bytes();
    bytes[i] ^= 0x01;
    EXPECT_NE(s, attempt_secret{bytes}) << "byte " << i;
  }
  EXPECT_NE(s, attempt_secret{});
}

TEST(finalization_token, round_trips_through_text) {
  const finalization_token t{{42, 7}, secret()};
  EXPECT_EQ(t.to_string(), "tn2:42:7:" + std::string{k_hex});
  auto parsed = finalization_token::parse(t.to_string());
  ASSERT_TRUE(parsed) << parsed.error().message();
  EXPECT_EQ(parsed.value(), t);
  EXPECT_EQ(parsed.value().secret(), secret());
}

TEST(finalization_token, round_trips_at_int64_max_within_max_text_size) {
  const auto max = std::numeric_limits<std::int64_t>::max();
  const finalization_token t{{max, max}, secret("ffffffffffffffffffffffffffffffff")};
  EXPECT_LE(t.to_string().size(), finalization_token::max_text_size);
  auto parsed = finalization_token::parse(t.to_string());
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed.value().job_id(), max);
  EXPECT_EQ(parsed.value().run_lease(), max);
  EXPECT_EQ(parsed.value(), t);
}

TEST(finalization_token, tokens_that_differ_only_in_their_secret_differ) {
  const finalization_token a{{42, 7}, secret()}, b{{42, 7}, attempt_secret{}};
  EXPECT_NE(a, b);
  EXPECT_EQ(a.attempt(), b.attempt());
}

TEST(finalization_token, version_1_tokens_without_a_secret_are_malformed) {
  for (const std::string& old : {std::string{"tn1:42:7"}, std::string{"tn1:1:1"}, "tn1:42:7:" + std::string{k_hex}}) {
    auto r = finalization_token::parse(old);
    ASSERT_FALSE(r) << "accepted: " << old;
    EXPECT_EQ(r.error(), errc::malformed_token);
  }
}

TEST(finalization_token, rejects_malformed_text_as_malformed_token) {
  const std::string h{k_hex};
  const std::string bad[] = {
      "", "tn2:", "tn2:1", "tn2:1:", "tn2:1:1", "tn2:1:1:", "tn2::1:" + h, "tn2:1::" + h, "tn2:0:1:" + h,
      "tn2:1:0:" + h, "tn2:01:1:" + h, "tn2:1:01:" + h, "tn2:-1:1:" + h, "tn2:+1:1:" + h, "tn2:1:1:" + h + ":",
      "tn2:1:1:" + h + " ", " tn2:1:1:" + h, "TN2:1:1:" + h, "tn2:1:x:" + h, "tn3:1:1:" + h,
      "tn2:1:1:" + h.substr(1), "tn2:1:1:" + h + "0", "tn2:1:1:00112233445566778899AABBCCDDEEFF",
      "tn2:1:1:00112233-4455-6677-8899-aabbccddeeff", "tn2:1:1:" + h + "\n",
      "tn2:9223372036854775808:1:" + h, "tn2:1:99999999999999999999:" + h, std::string("tn2:1\0:1:", 9) + h,
      std::string(10000, '9'), "tn2:" + std::string(60, '1') + ":1:" + h,
  };
  for (const auto& s : bad) {
    auto r = finalization_token::parse(s);
    ASSERT_FALSE(r) << "accepted: " << s;
    EXPECT_EQ(r.error(), errc::malformed_token) << s;
  }
}
