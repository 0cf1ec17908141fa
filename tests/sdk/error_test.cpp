#include <gtest/gtest.h>

#include "tenure/error.hpp"

using tenure::condition;
using tenure::errc;

TEST(error_codes, map_to_conditions_that_say_what_to_do) {
  EXPECT_EQ(std::error_code(errc::stale_attempt), condition::permanent);
  EXPECT_EQ(std::error_code(errc::database_unavailable), condition::retryable);
  EXPECT_EQ(std::error_code(errc::transient_conflict), condition::retryable);
  EXPECT_EQ(std::error_code(errc::commit_in_doubt), condition::in_doubt);
  EXPECT_EQ(std::error_code(errc::malformed_token), condition::usage_error);
  EXPECT_EQ(std::error_code(errc::invalid_argument), condition::usage_error);
  EXPECT_NE(std::error_code(errc::commit_in_doubt), condition::retryable);
}

TEST(error_codes, have_readable_messages_and_category) {
  const std::error_code ec = errc::stale_attempt;
  EXPECT_STREQ(ec.category().name(), "tenure");
  EXPECT_NE(ec.message().find("stale attempt"), std::string::npos);
  EXPECT_NE(std::error_code(errc::commit_in_doubt).message().find("unknown"), std::string::npos);
}
