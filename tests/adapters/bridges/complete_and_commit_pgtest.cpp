// complete_and_commit through the libpq bridge: the completion and the caller's COMMIT in one
// round trip, and the transaction ended whatever the answer.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <sys/socket.h>

#include "adapters/bridges/caller_tx.hpp"
#include "support/fault_proxy.hpp"
#include "support/pg.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/store.hpp"

using namespace std::chrono_literals;
using tenure::errc;
using tenure::finalization_token;
using tenure::finalize_options;
using tenure::test::pg;

namespace {

class complete_and_commit : public tenure::test::claimed_attempts {
 protected:
  complete_and_commit() : claimed_attempts("cac") {}
};

TEST_F(complete_and_commit, commits_the_business_row_and_the_completion_together_and_leaves_the_connection_idle) {
  const auto c = claim_one();
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  caller.exec(insert_order(c));
  auto receipt = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_TRUE(receipt) << receipt.error().message();
  EXPECT_EQ(receipt.value().attempt(), c.attempt);
  EXPECT_EQ(receipt.value().token(), c.token());
  EXPECT_GT(receipt.value().completed_at().time_since_epoch().count(), 0);
  EXPECT_EQ(PQtransactionStatus(caller.native()), PQTRANS_IDLE) << "the call committed the transaction";
  EXPECT_EQ(PQpipelineStatus(caller.native()), PQ_PIPELINE_OFF);
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
  EXPECT_EQ(orders(), 1);
  EXPECT_EQ(store_->reconcile(c.attempt).value(), tenure::attempt_evidence::completed_by_this);
  EXPECT_EQ(caller.scalar("SELECT 41 + 1"), "42") << "the connection is usable afterwards";
}

TEST_F(complete_and_commit, its_receipt_says_the_server_committed_and_complete_in_tx_receipts_do_not) {
  const auto a = claim_one();
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  auto committed = tenure::complete_and_commit(caller.native(), a.token(), opts_);
  ASSERT_TRUE(committed) << committed.error().message();
  EXPECT_TRUE(committed.value().committed());

  const auto b = claim_one();
  caller.exec("BEGIN");
  auto in_tx = tenure::complete_in_tx(caller.native(), b.token(), opts_);
  ASSERT_TRUE(in_tx) << in_tx.error().message();
  EXPECT_FALSE(in_tx.value().committed()) << "the caller has not committed yet";
  caller.exec("ROLLBACK");
  EXPECT_EQ(store_->reconcile(b.attempt).value(), tenure::attempt_evidence::open);
  EXPECT_EQ(store_->reconcile(a.attempt).value(), tenure::attempt_evidence::completed_by_this);
}

// One round trip: the COMMIT leaves the client before the server's first answer is read. The
// client's protocol trace shows every frontend message of the call (complete_job's, the COMMIT's,
// the sync) ahead of the first backend message.
TEST_F(complete_and_commit, sends_the_commit_before_it_reads_the_completions_answer) {
  const auto c = claim_one();
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  caller.exec(insert_order(c));
  std::unique_ptr<FILE, decltype(&std::fclose)> trace{std::tmpfile(), &std::fclose};
  ASSERT_TRUE(trace);
  PQtrace(caller.native(), trace.get());
  PQsetTraceFlags(caller.native(), PQTRACE_SUPPRESS_TIMESTAMPS);
  auto receipt = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  PQuntrace(caller.native());
  ASSERT_TRUE(receipt) << receipt.error().message();
  std::fflush(trace.get());
  std::rewind(trace.get());
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, trace.get())) > 0;) text.append(buf, n);
  // Each line: direction (F or B), length, message type, fields.
  const auto first_backend = text.starts_with("B\t") ? 0 : text.find("\nB\t");
  ASSERT_NE(first_backend, std::string::npos) << text;
  const auto commit = text.find("\"COMMIT\"");
  const auto sync = text.find("\tSync");
  ASSERT_NE(commit, std::string::npos) << text;
  ASSERT_NE(sync, std::string::npos) << text;
  EXPECT_LT(commit, first_backend) << text;
  EXPECT_LT(sync, first_backend) << text;
  EXPECT_LT(text.find("complete_job"), commit) << "complete_job first, then the COMMIT\n" << text;
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
}

TEST_F(complete_and_commit, a_stale_attempt_commits_nothing_and_the_transaction_is_rolled_back) {
  const auto c = claim_one();
  ASSERT_TRUE(store_->rescue_stale(std::chrono::microseconds{0}));  // rescue wins first
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  caller.exec(insert_order(c));
  auto r = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::stale_attempt);
  EXPECT_EQ(PQtransactionStatus(caller.native()), PQTRANS_IDLE) << "rolled back, not left aborted";
  EXPECT_EQ(orders(), 0) << "the business write went down with the completion";
  EXPECT_EQ(job(c.attempt.job_id), "available 1");
  // A wrong secret for a live attempt: the same, and the attempt stays open.
  const auto live = claim_one();
  caller.exec("BEGIN");
  caller.exec(insert_order(live));
  auto forged = tenure::complete_and_commit(caller.native(), finalization_token{live.attempt, {}}, opts_);
  ASSERT_FALSE(forged);
  EXPECT_EQ(forged.error(), errc::stale_attempt);
  EXPECT_EQ(PQtransactionStatus(caller.native()), PQTRANS_IDLE);
  EXPECT_EQ(orders(), 0);
  EXPECT_EQ(store_->reconcile(live.attempt).value(), tenure::attempt_evidence::open);
}

// The completion was accepted, then the server refused the COMMIT itself (a deferred constraint
// of the caller's): nothing of the transaction committed, the attempt stays open.
TEST_F(complete_and_commit, a_commit_the_server_refuses_commits_neither_the_completion_nor_the_business_row) {
  check_.exec("ALTER TABLE " + s("orders") + " ADD CONSTRAINT one_per_job UNIQUE (job_id) DEFERRABLE INITIALLY DEFERRED");
  const auto c = claim_one();
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  caller.exec(insert_order(c));
  caller.exec(insert_order(c));  // a duplicate, found only at COMMIT
  auto r = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().sqlstate(), "23505") << r.error().message();
  EXPECT_NE(r.error().detail().find("one_per_job"), std::string::npos) << r.error().detail();
  EXPECT_EQ(PQtransactionStatus(caller.native()), PQTRANS_IDLE);
  EXPECT_EQ(orders(), 0);
  EXPECT_EQ(job(c.attempt.job_id), "running 1");
  EXPECT_EQ(store_->reconcile(c.attempt).value(), tenure::attempt_evidence::open);
}

TEST_F(complete_and_commit, outside_a_transaction_or_in_an_aborted_one_nothing_is_sent) {
  const auto c = claim_one();
  pg caller{schema_.dsn()};
  auto idle = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_FALSE(idle);
  EXPECT_EQ(idle.error(), errc::protocol_error);
  caller.exec("BEGIN");
  caller.query("SELECT 1/0");
  auto aborted = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_FALSE(aborted);
  EXPECT_EQ(aborted.error(), errc::protocol_error);
  EXPECT_EQ(PQtransactionStatus(caller.native()), PQTRANS_INERROR) << "the caller's transaction is left to the caller";
  caller.exec("ROLLBACK");
  auto bad_schema = tenure::complete_and_commit(caller.native(), c.token(), {.schema = "no such schema"});
  ASSERT_FALSE(bad_schema);
  EXPECT_EQ(bad_schema.error(), errc::invalid_argument);
  EXPECT_EQ(job(c.attempt.job_id), "running 1");
}

TEST_F(complete_and_commit, a_backend_terminated_before_the_call_is_unavailable_and_commits_nothing) {
  const auto c = claim_one();
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  caller.exec(insert_order(c));
  const std::string pid = std::to_string(PQbackendPID(caller.native()));
  ASSERT_EQ(check_.scalar("SELECT pg_terminate_backend($1)", {pid}), "t");
  for (int i = 0; i < 200 && check_.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", {pid}) != "0"; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  auto r = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error() == errc::database_unavailable || r.error() == errc::commit_in_doubt) << r.error().message();
  EXPECT_EQ(orders(), 0);
  EXPECT_EQ(job(c.attempt.job_id), "running 1");
}

// The server commits, and the connection breaks before its answer reaches the client: in doubt,
// never a success the client did not see nor a failure that did not happen. The job is completed
// with its business row, as the durable evidence then says.
TEST_F(complete_and_commit, a_commit_whose_answer_is_lost_is_in_doubt_and_the_evidence_says_completed) {
  tenure::test::fault_proxy proxy{schema_.dsn()};
  const auto c = claim_one();
  pg caller{proxy.dsn(schema_.dsn())};
  caller.exec("BEGIN");
  caller.exec(insert_order(c));
  proxy.arm_drop_commit_reply();
  auto r = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::commit_in_doubt) << r.error().message();
  EXPECT_EQ(proxy.fired(), 1);
  EXPECT_EQ(orders(), 1);
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
  EXPECT_EQ(store_->reconcile(c.attempt).value(), tenure::attempt_evidence::completed_by_this);
}

// The socket breaks without a word from the server, before the call: the statements cannot all be
// known unsent, so the answer is in doubt, and the evidence shows nothing committed.
TEST_F(complete_and_commit, a_socket_broken_before_the_call_is_in_doubt_and_the_evidence_says_open) {
  const auto c = claim_one();
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  caller.exec(insert_order(c));
  const std::string pid = std::to_string(PQbackendPID(caller.native()));
  ASSERT_EQ(::shutdown(PQsocket(caller.native()), SHUT_RDWR), 0);
  auto r = tenure::complete_and_commit(caller.native(), c.token(), opts_);
  ASSERT_FALSE(r);
  EXPECT_TRUE(r.error() == errc::commit_in_doubt || r.error() == errc::database_unavailable) << r.error().message();
  for (int i = 0; i < 200 && check_.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", {pid}) != "0"; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(orders(), 0);
  EXPECT_EQ(store_->reconcile(c.attempt).value(), tenure::attempt_evidence::open);
}

TEST_F(complete_and_commit, final_progress_is_stored_with_the_completion) {
  const auto c = claim_one();
  pg caller{schema_.dsn()};
  caller.exec("BEGIN");
  auto receipt = tenure::complete_and_commit(caller.native(), c.token(),
                                             {.schema = schema_.name(), .progress = nlohmann::json{{"step", 3}}});
  ASSERT_TRUE(receipt) << receipt.error().message();
  EXPECT_EQ(check_.scalar("SELECT progress::text FROM " + s("jobs") + " WHERE id = $1", {std::to_string(c.attempt.job_id)}),
            "{\"step\": 3}");
}

}  // namespace
