#include <gtest/gtest.h>

#include <string>

#include "tenure/job.hpp"
#include "tenure/schema_name.hpp"

using tenure::errc;
using tenure::new_job;

TEST(job_validation, accepts_a_plain_job) {
  new_job j{.kind = "send_email"};
  EXPECT_TRUE(tenure::validate(j));
}

TEST(job_validation, rejects_out_of_range_fields) {
  auto bad = [](auto mutate) {
    new_job j{.kind = "k"};
    mutate(j);
    auto r = tenure::validate(j);
    return !r && r.error() == errc::invalid_argument;
  };
  EXPECT_TRUE(bad([](new_job& j) { j.kind.clear(); }));
  EXPECT_TRUE(bad([](new_job& j) { j.kind = std::string(256, 'k'); }));
  EXPECT_TRUE(bad([](new_job& j) { j.kind = "bad\nkind"; }));
  EXPECT_TRUE(bad([](new_job& j) { j.queue.clear(); }));
  EXPECT_TRUE(bad([](new_job& j) { j.priority = 0; }));
  EXPECT_TRUE(bad([](new_job& j) { j.priority = 5; }));
  EXPECT_TRUE(bad([](new_job& j) { j.max_attempts = 0; }));
  EXPECT_TRUE(bad([](new_job& j) { j.args = nlohmann::json::parse("{", nullptr, false); }));
}

TEST(job_validation, an_invalid_job_is_refused_with_the_offending_field_named) {
  auto why = [](auto mutate) {
    new_job j{.kind = "k"};
    mutate(j);
    auto r = tenure::validate(j);
    EXPECT_FALSE(r);
    return r ? std::string{} : r.error().detail();
  };
  EXPECT_EQ(why([](new_job& j) { j.priority = 7; }), "priority 7 outside 1..4");
  EXPECT_EQ(why([](new_job& j) { j.max_attempts = 0; }), "max_attempts 0 is less than 1");
  EXPECT_EQ(why([](new_job& j) { j.kind.clear(); }), "kind is empty");
  EXPECT_EQ(why([](new_job& j) { j.queue = "a\tb"; }), "queue contains a control character");
  EXPECT_EQ(why([](new_job& j) { j.kind = std::string(256, 'k'); }), "kind has 256 characters, more than 255");
  EXPECT_EQ(why([](new_job& j) { j.args = nlohmann::json::array(); }), "args must be a JSON object, not array");
  EXPECT_NE(why([](new_job& j) { j.args = {{"a", std::string("x\0y", 3)}}; }).find("NUL character"), std::string::npos);
  // The message a log line or a CLI shows: the code's text, then the field.
  auto r = tenure::validate(new_job{.kind = "k", .priority = 7});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "invalid argument: priority 7 outside 1..4");
}

TEST(job_validation, args_are_a_json_object_or_null) {
  for (const auto& args : {nlohmann::json::array({1, 2}), nlohmann::json("str"), nlohmann::json(7),
                           nlohmann::json(true), nlohmann::json::array()}) {
    new_job j{.kind = "k", .args = args};
    auto r = tenure::validate(j);
    EXPECT_TRUE(!r && r.error() == errc::invalid_argument) << args.dump();
  }
  EXPECT_TRUE(tenure::validate(new_job{.kind = "k", .args = nullptr})) << "null args are stored as {}";
  EXPECT_TRUE(tenure::validate(new_job{.kind = "k", .args = {{"a", 1}}}));
}

TEST(job_state, names_round_trip) {
  using tenure::job_state;
  for (auto s : {job_state::scheduled, job_state::available, job_state::running,
                 job_state::waiting_external, job_state::retryable, job_state::completed,
                 job_state::failed, job_state::cancelled}) {
    auto parsed = tenure::parse_job_state(tenure::to_string(s));
    ASSERT_TRUE(parsed);
    EXPECT_EQ(parsed.value(), s);
  }
  EXPECT_FALSE(tenure::parse_job_state("nope"));
}

TEST(schema_name, one_rule_of_at_most_54_lower_case_identifier_characters) {
  EXPECT_TRUE(tenure::valid_schema_name("tenure"));
  EXPECT_TRUE(tenure::valid_schema_name("_t2"));
  EXPECT_TRUE(tenure::valid_schema_name(std::string(54, 'a')));
  EXPECT_FALSE(tenure::valid_schema_name(std::string(55, 'a')));  // <schema>_callback would pass 63 bytes
  EXPECT_FALSE(tenure::valid_schema_name(""));
  EXPECT_FALSE(tenure::valid_schema_name("2t"));
  EXPECT_FALSE(tenure::valid_schema_name("Tenure"));
  EXPECT_FALSE(tenure::valid_schema_name("te-nure"));
  EXPECT_FALSE(tenure::valid_schema_name("t\xc3\xa9"));
}
