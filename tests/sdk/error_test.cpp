#include <gtest/gtest.h>

#include "tenure/error.hpp"
#include "tenure/result.hpp"

#include <stdexcept>
#include <string>

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
  EXPECT_EQ(std::error_code(errc::unsupported), condition::usage_error);
}

TEST(error_codes, unsupported_is_a_code_of_its_own_not_a_bad_argument) {
  const tenure::error e{errc::unsupported, "this store has no external callbacks"};
  EXPECT_EQ(e, errc::unsupported);
  EXPECT_NE(e, errc::invalid_argument);
  EXPECT_EQ(e.message(), "not supported by this store: this store has no external callbacks");
}

TEST(errors, carry_their_detail_and_sqlstate_beside_the_code) {
  const tenure::error e{errc::invalid_argument, "value too long for type character varying(3)", "22001"};
  EXPECT_EQ(e, errc::invalid_argument);
  EXPECT_EQ(e, condition::usage_error);
  EXPECT_EQ(e.code(), std::error_code(errc::invalid_argument));
  EXPECT_EQ(e.detail(), "value too long for type character varying(3)");
  EXPECT_EQ(e.sqlstate(), "22001");
  EXPECT_EQ(e.message(), "invalid argument: value too long for type character varying(3) [SQLSTATE 22001]");
  const tenure::error copy = e;  // copies keep the detail
  EXPECT_EQ(copy.detail(), e.detail());
  // A bare code has no detail; its message is the code's.
  const tenure::error bare = errc::stale_attempt;
  EXPECT_TRUE(bare.detail().empty());
  EXPECT_TRUE(bare.sqlstate().empty());
  EXPECT_EQ(bare.message(), std::error_code(errc::stale_attempt).message());
  // Codes of other categories pass through.
  const tenure::error io = std::make_error_code(std::errc::io_error);
  EXPECT_EQ(io, std::errc::io_error);
}

TEST(errors, travel_through_results_and_throw_with_their_detail_when_read_as_a_value) {
  auto failing = []() -> tenure::result<int> { return tenure::error{errc::job_not_found, "job 42"}; };
  auto forwarding = [&]() -> tenure::result<std::string> {
    TENURE_TRY(auto n, failing());
    return std::to_string(n);
  };
  auto r = forwarding();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::job_not_found);
  EXPECT_EQ(r.error().detail(), "job 42");
  try {
    (void)r.value();
    ADD_FAILURE() << "value() of a failed result must throw";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::error_code(errc::job_not_found));
    EXPECT_NE(std::string{e.what()}.find("job 42"), std::string::npos) << e.what();
  }
}

TEST(error_codes, have_readable_messages_and_category) {
  const std::error_code ec = errc::stale_attempt;
  EXPECT_STREQ(ec.category().name(), "tenure");
  EXPECT_NE(ec.message().find("stale attempt"), std::string::npos);
  EXPECT_NE(std::error_code(errc::commit_in_doubt).message().find("unknown"), std::string::npos);
}
