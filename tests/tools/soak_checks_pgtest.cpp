// The soak's end-of-run checks (tools/soak/checks.cpp) count what they must, against hand-made
// table states: a clean state passes; a lost job, a double finalization, a business row without
// its completion, a caller-owned completion without its business row, a rolled-back job that
// ran and a stuck attempt are each counted and fail the run.
#include <gtest/gtest.h>

#include <string>

#include "cli/pg_session.hpp"
#include "soak/soak.hpp"
#include "support/pg.hpp"

namespace tenure::test {
namespace {

class soak_checks_pg : public ::testing::Test {
 protected:
  scoped_schema schema_{"soakchk"};
  soak::names n_ = soak::names_for(schema_.name());
  cli::pg_session session_{schema_.dsn()};
  pg db_{schema_.dsn()};

  void SetUp() override { soak::create_records(session_, n_); }
  void TearDown() override { db_.exec("DROP SCHEMA IF EXISTS " + n_.rec + " CASCADE"); }

  nlohmann::json figures(const soak::check_limits& limits = {}) { return soak::check(session_, n_, limits); }
  std::string enqueue(const std::string& kind) {
    return db_.scalar("SELECT " + n_.tenure + ".enqueue($1, '{}', 'soak')", {kind});
  }
  /// Claims the queue's next job; returns its token.
  std::string claim() { return db_.exec("SELECT token FROM " + n_.tenure + ".claim('soak', 1, 'w')").at(0, 0); }
  void order(const std::string& job_id, const std::string& kind, bool caller_owned) {
    db_.exec("INSERT INTO " + n_.rec + ".orders (job_id, kind, caller_owned) VALUES ($1, $2, $3)",
             {job_id, kind, caller_owned ? "true" : "false"});
  }
  void business(const std::string& job_id, const std::string& run_lease) {
    db_.exec("INSERT INTO " + n_.rec + ".business (job_id, run_lease, worker) VALUES ($1, $2, 'w')",
             {job_id, run_lease});
  }
};

TEST_F(soak_checks_pg, a_clean_run_passes_and_terminal_transitions_are_recorded_once) {
  const auto id = enqueue("caller_owned");
  order(id, "caller_owned", true);
  const auto token = claim();
  const auto lease = token.substr(token.find(':', 4) + 1, token.rfind(':') - token.find(':', 4) - 1);  // tn2:job:lease:secret
  db_.exec("BEGIN");
  business(id, lease);
  db_.exec("SELECT * FROM " + n_.tenure + ".complete_job($1)", {token});
  db_.exec("COMMIT");
  const auto failed = enqueue("fail");
  order(failed, "fail", false);
  db_.exec("SELECT " + n_.tenure + ".fail_job($1, 'designed', false)", {claim()});

  const auto f = figures();
  EXPECT_TRUE(soak::passed(f)) << f.dump();
  EXPECT_EQ(f["jobs_enqueued"], 2);
  EXPECT_EQ(f["completed"], 1);
  EXPECT_EQ(f["failed_as_designed"], 1);
  EXPECT_EQ(f["caller_owned_completions"], 1);
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + n_.rec + ".finals"), "2");
}

TEST_F(soak_checks_pg, counts_a_committed_job_tenure_does_not_know_as_lost) {
  order("987654321", "complete", false);
  const auto f = figures();
  EXPECT_EQ(f["lost"], 1);
  EXPECT_FALSE(soak::passed(f));
}

TEST_F(soak_checks_pg, counts_a_job_left_available_past_the_slack_as_lost) {
  order(enqueue("complete"), "complete", false);
  EXPECT_EQ(figures()["lost"], 0);  // within the slack: legitimately pending
  db_.exec("SELECT pg_sleep(0.05)");
  const auto f = figures({.attempt_limit = std::chrono::seconds{60}, .slack = std::chrono::seconds{0}});
  EXPECT_EQ(f["lost"], 1);
  EXPECT_EQ(f["pending_at_end"], 1);
}

TEST_F(soak_checks_pg, counts_two_terminal_transitions_or_two_committed_completions_as_finalized_twice) {
  db_.exec("INSERT INTO " + n_.rec + ".finals (job_id, run_lease, state) VALUES (42, 1, 'completed'), (42, 2, 'completed')");
  EXPECT_EQ(figures()["finalized_twice"], 1);
  const auto id = enqueue("caller_owned");
  business(id, "1");
  business(id, "1");
  const auto f = figures();
  EXPECT_EQ(f["finalized_twice"], 2);
  EXPECT_FALSE(soak::passed(f));
}

TEST_F(soak_checks_pg, counts_a_business_row_whose_attempt_did_not_complete_the_job) {
  const auto id = enqueue("caller_owned");
  order(id, "caller_owned", true);
  business(id, "1");  // the job is still available: nothing completed it
  auto f = figures();
  EXPECT_EQ(f["business_without_completion"], 1);
  EXPECT_FALSE(soak::passed(f));
}

TEST_F(soak_checks_pg, counts_a_caller_owned_completion_without_its_business_row) {
  const auto id = enqueue("caller_owned");
  order(id, "caller_owned", true);
  db_.exec("SELECT * FROM " + n_.tenure + ".complete_job($1)", {claim()});
  auto f = figures();
  EXPECT_EQ(f["completion_without_business"], 1);
  EXPECT_FALSE(soak::passed(f));
  business(id, "7");  // another attempt's row does not count
  f = figures();
  EXPECT_EQ(f["completion_without_business"], 1);
  EXPECT_EQ(f["business_without_completion"], 1);
}

TEST_F(soak_checks_pg, counts_a_rolled_back_job_that_ran) {
  db_.exec("BEGIN");
  const auto id = enqueue("complete");
  db_.exec("ROLLBACK");
  db_.exec("INSERT INTO " + n_.rec + ".rolled_back VALUES ($1)", {id});
  EXPECT_EQ(figures()["rolled_back_ran"], 0);
  db_.exec("INSERT INTO " + n_.rec + ".executions (job_id, run_lease, worker, outcome) VALUES ($1, 1, 'w', 'completed')",
           {id});
  auto f = figures();
  EXPECT_EQ(f["rolled_back_ran"], 1);
  EXPECT_FALSE(soak::passed(f));
}

TEST_F(soak_checks_pg, counts_an_attempt_open_past_its_limit_as_stuck) {
  order(enqueue("complete"), "complete", false);
  claim();
  EXPECT_EQ(figures()["stuck_attempts"], 0);
  db_.exec("SELECT pg_sleep(0.05)");
  auto f = figures({.attempt_limit = std::chrono::seconds{0}, .slack = std::chrono::seconds{0}});
  EXPECT_EQ(f["stuck_attempts"], 1);
  EXPECT_FALSE(soak::passed(f));
}

}  // namespace
}  // namespace tenure::test
