// The COPY text of a bulk enqueue, written piece by piece (write_copy_rows): whole rows per piece,
// pieces of about 64 KiB (plus the row that crosses it), handed over in chunks of at most 1 MiB,
// and together exactly the batch's text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tenure/postgres/sql_text.hpp"

using tenure::new_job;
namespace pg = tenure::postgres;

namespace {

std::vector<new_job> batch(int n) {
  std::vector<new_job> jobs;
  for (int i = 0; i < n; ++i) {
    jobs.push_back({.kind = i % 3 ? "k" : "k\\slash",
                    .args = {{"i", i}, {"text", std::string(static_cast<std::size_t>(i % 200), 'x') + "\ttab\nline"}},
                    .queue = i % 2 ? "odd" : "even",
                    .priority = 1 + i % 4,
                    .max_attempts = 1 + i % 7});
  }
  return jobs;
}

/// What write_copy_rows() hands to its sender, chunk by chunk.
std::vector<std::string> chunks(const std::vector<new_job>& jobs, bool stage) {
  std::vector<std::string> out;
  const auto sent = pg::write_copy_rows(jobs, stage, [&](std::string_view c) {
    out.emplace_back(c);
    return true;
  });
  EXPECT_TRUE(sent && sent.value());
  return out;
}

TEST(copy_text, a_batchs_text_is_written_in_pieces_of_whole_rows_that_together_are_the_whole_text) {
  const auto jobs = batch(5'000);
  for (const bool stage : {false, true}) {
    const auto whole = stage ? pg::enqueue_copy_rows(jobs) : pg::enqueue_copy_ready_rows(jobs);
    ASSERT_TRUE(whole) << whole.error().message();
    const auto parts = chunks(jobs, stage);
    ASSERT_GT(parts.size(), 4u) << "a batch of this size takes several pieces";
    std::string joined;
    for (const auto& p : parts) {
      ASSERT_FALSE(p.empty());
      EXPECT_EQ(p.back(), '\n') << "a piece ends with a whole row";
      EXPECT_LT(p.size(), 64 * 1024 + 512) << "a piece holds at most one row past 64 KiB";
      joined += p;
    }
    EXPECT_EQ(joined, whole.value()) << (stage ? "stage" : "specs") << ": the stage's ord runs on across pieces";
  }
}

TEST(copy_text, a_row_longer_than_a_mebibyte_goes_to_the_sender_in_chunks_of_at_most_one_mebibyte) {
  auto jobs = batch(3);
  jobs[1].args = {{"big", std::string(3'000'000, 'y')}};
  const auto whole = pg::enqueue_copy_ready_rows(jobs);
  ASSERT_TRUE(whole);
  const auto parts = chunks(jobs, false);
  std::string joined;
  for (const auto& p : parts) {
    EXPECT_LE(p.size(), std::size_t{1} << 20);
    joined += p;
  }
  EXPECT_GE(parts.size(), 3u);
  EXPECT_EQ(joined, whole.value());
}

TEST(copy_text, a_sender_that_fails_stops_the_writing) {
  const auto jobs = batch(5'000);
  int calls = 0;
  const auto sent = pg::write_copy_rows(jobs, false, [&](std::string_view) { return ++calls < 2; });
  ASSERT_TRUE(sent);
  EXPECT_FALSE(sent.value());
  EXPECT_EQ(calls, 2) << "nothing handed over after the failed chunk";
}

TEST(copy_text, the_checks_of_a_copy_batch_refuse_what_its_target_refuses_before_any_text_is_written) {
  auto jobs = batch(10);
  EXPECT_TRUE(pg::check_copy_rows(jobs, false));
  jobs[4].run_at = tenure::clock_type::now();
  EXPECT_EQ(pg::check_copy_rows(jobs, false).error().code(), tenure::errc::invalid_argument) << "no run_at into specs";
  EXPECT_TRUE(pg::check_copy_rows(jobs, true)) << "the stage takes scheduled jobs";
  jobs[6].unique_key = "key";
  EXPECT_EQ(pg::check_copy_rows(jobs, true).error().code(), tenure::errc::invalid_argument) << "keys go over arrays";
  jobs[6].unique_key.reset();
  jobs[2].queue = "bad\nqueue";
  const auto refused = pg::check_copy_rows(jobs, true);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("queue"), std::string::npos) << refused.error().message();
}

}  // namespace
