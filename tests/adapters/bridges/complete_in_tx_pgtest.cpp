// complete_in_tx through each bridge (libpq, SOCI, libpqxx), inside the caller's own transaction:
// the business row exists if and only if the job completed with that run lease.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <optional>

#include <sys/socket.h>

#include <soci/postgresql/soci-postgresql.h>

#include "adapters/bridges/caller_tx.hpp"
#include "support/pg.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/store.hpp"
#include "tenure/pqxx.hpp"
#include "tenure/soci.hpp"

using namespace std::chrono_literals;
using tenure::errc;
using tenure::finalization_receipt;
using tenure::finalization_token;
using tenure::finalize_options;
using tenure::result;
using tenure::test::bridge;
using tenure::test::caller_tx;
using tenure::test::pg;
using tenure::test::scoped_schema;

namespace {

class complete_in_tx : public tenure::test::claimed_attempts, public ::testing::WithParamInterface<bridge> {
 protected:
  complete_in_tx() : claimed_attempts("cit") {}
  std::unique_ptr<caller_tx> open_tx() { return open_tx(schema_.dsn()); }
  /// `dsn` may be a pooler's: the caller's connection then sets nothing on its server session.
  std::unique_ptr<caller_tx> open_tx(const std::string& dsn) {
    return tenure::test::open_caller_tx(GetParam(), dsn, dsn == schema_.dsn());
  }
  /// A business write then complete_in_tx on a stale attempt: TN001 aborts the caller's
  /// transaction, so the write can never commit.
  void expect_stale_rolls_back_the_business_write(const tenure::claimed_attempt& c) {
    auto tx = open_tx();
    tx->begin();
    tx->exec(insert_order(c));
    auto r = tx->complete(c.token(), opts_);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::stale_attempt);
    EXPECT_FALSE(tx->commit()) << "the aborted transaction cannot commit";
    EXPECT_EQ(orders(), 0);
  }
  /// A business write, then `break_it` takes the caller's connection away, then complete_in_tx:
  /// database_unavailable, and neither the completion nor the business row exists once the
  /// server has ended the orphaned transaction.
  template <class BreakIt>
  void expect_a_lost_connection_is_unavailable(BreakIt&& break_it) {
    const auto c = claim_one();
    auto tx = open_tx();
    tx->begin();
    tx->exec(insert_order(c));
    const std::string pid = std::to_string(tx->backend_pid());
    break_it(*tx);
    auto r = tx->complete(c.token(), opts_);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::database_unavailable) << r.error().message();
    for (int i = 0; i < 200 && check_.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", {pid}) != "0";
         ++i) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(job(c.attempt.job_id), "running 1") << "the attempt stays open for a retry or for rescue";
    EXPECT_EQ(orders(), 0);
  }
};

TEST_P(complete_in_tx, commit_makes_the_business_row_and_the_completion_exist_together) {
  const auto c = claim_one();
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order(c));
  auto receipt = tx->complete(c.token(), opts_);
  ASSERT_TRUE(receipt) << receipt.error().message();
  EXPECT_EQ(receipt.value().attempt(), c.attempt);
  EXPECT_EQ(receipt.value().token(), c.token()) << "the receipt names the token that completed it, secret included";
  EXPECT_GT(receipt.value().completed_at().time_since_epoch().count(), 0);
  EXPECT_EQ(job(c.attempt.job_id), "running 1") << "invisible to others before the caller commits";
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
  EXPECT_EQ(orders(), 1);
  auto ev = store_->reconcile(c.attempt);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev.value(), tenure::attempt_evidence::completed_by_this);
}

TEST_P(complete_in_tx, through_transaction_pooling_the_business_row_and_the_completion_commit_together) {
  // A finalizer's connection through a PgBouncer in transaction mode with default settings: one
  // connection for several transactions in a row, then a fresh one per transaction.
  const std::string pooled = tenure::test::pooler_dsn();
  auto kept = open_tx(pooled);
  for (int round = 0; round < 6; ++round) {
    const auto c = claim_one();
    auto fresh = round % 2 ? open_tx(pooled) : nullptr;
    caller_tx& tx = fresh ? *fresh : *kept;
    tx.begin();
    tx.exec(insert_order(c));
    auto receipt = tx.complete(c.token(), opts_);
    ASSERT_TRUE(receipt) << "round " << round << ": " << receipt.error().message();
    EXPECT_EQ(receipt.value().attempt(), c.attempt);
    ASSERT_TRUE(tx.commit());
    EXPECT_EQ(job(c.attempt.job_id), "completed 1");
  }
  EXPECT_EQ(orders(), 6);
  // A stale attempt still aborts the caller's writes through the pooler.
  const auto c = claim_one();
  ASSERT_TRUE(store_->cancel_job(c.attempt.job_id));
  kept->begin();
  kept->exec(insert_order(c));
  auto stale = kept->complete(c.token(), opts_);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error(), errc::stale_attempt);
  EXPECT_FALSE(kept->commit());
  EXPECT_EQ(orders(), 6);
}

TEST_P(complete_in_tx, rollback_leaves_the_attempt_open_and_no_business_row) {
  const auto c = claim_one();
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order(c));
  ASSERT_TRUE(tx->complete(c.token(), opts_));
  tx->rollback();
  EXPECT_EQ(job(c.attempt.job_id), "running 1");
  EXPECT_EQ(orders(), 0);
  EXPECT_EQ(store_->reconcile(c.attempt).value(), tenure::attempt_evidence::open);
}

TEST_P(complete_in_tx, stale_after_rescue_aborts_the_callers_business_writes) {
  const auto c = claim_one();
  // Rescue wins first: the attempt is closed and the job available again.
  ASSERT_TRUE(store_->rescue_stale(std::chrono::microseconds{0}));
  expect_stale_rolls_back_the_business_write(c);
  EXPECT_EQ(job(c.attempt.job_id), "available 1");
  // The next claim opens a new lease; the stale token can never finalize it.
  auto again = store_->claim("q", 1, "test");
  ASSERT_TRUE(again && again.value().size() == 1);
  EXPECT_GT(again.value()[0].attempt.run_lease, c.attempt.run_lease);
  auto tx2 = open_tx();
  tx2->begin();
  auto late = tx2->complete(c.token(), opts_);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error(), errc::stale_attempt);
  tx2->rollback();
  EXPECT_EQ(job(c.attempt.job_id), "running 2");
}

// The bridge sends the secret the claim drew: the same attempt with any other secret finalizes
// nothing, and the caller's business write goes down with it.
TEST_P(complete_in_tx, a_token_without_the_attempts_secret_is_stale_and_rolls_back_the_business_write) {
  const auto c = claim_one();
  for (const auto& forged : {finalization_token{c.attempt, {}},
                             finalization_token{c.attempt, claim_one().secret}}) {
    auto tx = open_tx();
    tx->begin();
    tx->exec(insert_order(c));
    auto r = tx->complete(forged, opts_);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::stale_attempt);
    EXPECT_FALSE(tx->commit());
    EXPECT_EQ(orders(), 0);
    EXPECT_EQ(job(c.attempt.job_id), "running 1");
  }
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order(c));
  ASSERT_TRUE(tx->complete(c.token(), opts_));
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
}

TEST_P(complete_in_tx, stale_after_cancel_aborts_the_callers_business_writes) {
  const auto c = claim_one();
  auto cancelled = store_->cancel_job(c.attempt.job_id);
  ASSERT_TRUE(cancelled && cancelled.value());
  expect_stale_rolls_back_the_business_write(c);
  EXPECT_EQ(job(c.attempt.job_id), "cancelled 1");
}

TEST_P(complete_in_tx, cancel_waiting_on_the_open_transaction_loses_once_the_caller_commits) {
  // The caller's transaction holds the attempt's row lock from complete_job to COMMIT: a cancel
  // racing it waits, then finds the job finished. Exactly one terminal outcome.
  const auto c = claim_one();
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order(c));
  ASSERT_TRUE(tx->complete(c.token(), opts_));
  std::atomic<bool> answered{false};
  std::optional<result<bool>> cancel_result;
  const std::string app = "canceller_" + schema_.name();
  auto other = tenure::postgres::store::open(
      {.dsn = schema_.dsn(), .schema = schema_.name(), .pool_size = 1, .application_name = app,
       .lock_timeout = std::chrono::milliseconds{0}});
  ASSERT_TRUE(other) << other.error().message();
  std::thread canceller([&] {
    cancel_result = other.value()->cancel_job(c.attempt.job_id);
    answered = true;
  });
  // The cancel is blocked on the row lock while the caller's transaction is open.
  const bool waiting = [&] {
    for (int i = 0; i < 2000; ++i) {
      if (check_.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                        "application_name = $1",
                        {app}) != "0") {
        return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }();
  EXPECT_TRUE(waiting) << "the cancel never waited on the caller's row lock";
  EXPECT_FALSE(answered.load()) << "the cancel answered while the caller's transaction held the attempt";
  ASSERT_TRUE(tx->commit());
  canceller.join();
  ASSERT_TRUE(cancel_result && *cancel_result) << "cancel_job errored";
  EXPECT_FALSE(cancel_result->value()) << "the job was already finished";
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
  EXPECT_EQ(orders(), 1);
}

TEST_P(complete_in_tx, a_connection_lost_inside_the_callers_transaction_is_unavailable_not_a_permanent_error) {
  // The caller's backend is terminated between its business write and complete_in_tx: the
  // transaction is gone with it. That is database_unavailable (retry the whole transaction on a
  // new connection), never database_error, which reads as permanent.
  expect_a_lost_connection_is_unavailable([this](caller_tx& tx) {
    const std::string pid = std::to_string(tx.backend_pid());
    ASSERT_EQ(check_.scalar("SELECT pg_terminate_backend($1)", {pid}), "t");
  });
}

TEST_P(complete_in_tx, a_connection_that_breaks_without_a_word_from_the_server_is_unavailable_too) {
  // No FATAL message this time: the caller's socket itself breaks (as when a network path or a
  // pooler drops it), so the client library sees no SQLSTATE at all.
  expect_a_lost_connection_is_unavailable([](caller_tx& tx) { ASSERT_EQ(::shutdown(tx.socket(), SHUT_RDWR), 0); });
}

TEST_P(complete_in_tx, heartbeated_attempt_with_flushed_progress_completes_like_a_receipt_only_one) {
  const auto c = claim_one();
  const std::optional<std::string> progress[1] = {std::string{R"({"percent": 40})"}};
  auto live = store_->heartbeat(std::span{&c.attempt, 1}, progress);
  ASSERT_TRUE(live && live.value().size() == 1) << "the lease is now materialized";
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order(c));
  ASSERT_TRUE(tx->complete(c.token(), opts_));
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
  EXPECT_EQ(check_.scalar("SELECT progress->>'percent' FROM " + s("jobs") + " WHERE id = $1",
                          {std::to_string(c.attempt.job_id)}),
            "40")
      << "the last flushed progress is kept";
  EXPECT_EQ(orders(), 1);
}

TEST_P(complete_in_tx, attempt_that_waited_on_a_resumed_callback_completes_under_the_same_lease) {
  const auto c = claim_one();
  auto cb = store_->register_callback(c.attempt, std::chrono::seconds{60});
  ASSERT_TRUE(cb);
  auto parked = store_->await_callback(c.attempt, cb.value());
  ASSERT_TRUE(parked && !parked.value().resumed);
  EXPECT_EQ(job(c.attempt.job_id), "waiting_external 1");
  ASSERT_TRUE(store_->resume_callback(cb.value(), R"({"ok": true})").value());
  auto resumed = store_->await_callback(c.attempt, cb.value());
  ASSERT_TRUE(resumed && resumed.value().resumed);
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order(c));
  ASSERT_TRUE(tx->complete(c.token(), opts_));
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(job(c.attempt.job_id), "completed 1");
  EXPECT_EQ(orders(), 1);
}

TEST_P(complete_in_tx, final_progress_is_stored_with_the_completion) {
  const auto c = claim_one();
  auto tx = open_tx();
  tx->begin();
  auto o = opts_;
  o.progress = nlohmann::json{{"percent", 100}, {"message", "charged"}};
  ASSERT_TRUE(tx->complete(c.token(), o));
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(check_.scalar("SELECT progress->>'message' FROM " + s("jobs") + " WHERE id = $1",
                          {std::to_string(c.attempt.job_id)}),
            "charged");
}

TEST_P(complete_in_tx, unknown_job_token_is_stale_and_a_bad_schema_is_refused_before_sending) {
  auto tx = open_tx();
  tx->begin();
  auto r = tx->complete(finalization_token{{.job_id = 987654, .run_lease = 1}, {}}, opts_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::stale_attempt);
  tx->rollback();
  tx->begin();
  auto bad = opts_;
  bad.schema = "x; DROP TABLE y";
  auto refused = tx->complete(finalization_token{{.job_id = 1, .run_lease = 1}, {}}, bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), errc::invalid_argument);
  tx->exec("SELECT 1");  // nothing was sent: the transaction is still usable
  tx->rollback();
}

INSTANTIATE_TEST_SUITE_P(bridges, complete_in_tx, ::testing::Values(bridge::libpq, bridge::soci, bridge::pqxx),
                         tenure::test::bridge_name);

// Without an open transaction, a completion would commit apart from the business writes.
TEST(complete_in_tx_guard, libpq_refuses_a_connection_outside_begin) {
  scoped_schema schema{"cit"};
  pg db{schema.dsn()};
  auto r = tenure::complete_in_tx(db.native(), finalization_token{{.job_id = 1, .run_lease = 1}, {}},
                                  {.schema = schema.name()});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_error);
}

/// complete_in_tx on the pqxx transaction `open` makes is refused and completes nothing.
template <class Open>
void expect_pqxx_refuses_and_completes_nothing(Open&& open) {
  scoped_schema schema{"cit"};
  auto st = tenure::postgres::store::open({.dsn = schema.dsn(), .schema = schema.name()});
  ASSERT_TRUE(st) << st.error().message();
  ASSERT_TRUE(st.value()->enqueue({.kind = "charge", .queue = "q"}));
  auto claimed = st.value()->claim("q", 1, "test");
  ASSERT_TRUE(claimed && claimed.value().size() == 1);
  const auto c = claimed.value()[0];
  pqxx::connection conn{schema.dsn()};
  std::unique_ptr<pqxx::transaction_base> tx = open(conn);
  auto r = tenure::complete_in_tx(*tx, c.token(), {.schema = schema.name()});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_error);
  pg check{schema.dsn()};
  EXPECT_EQ(check.scalar("SELECT state FROM " + schema.name() + ".jobs WHERE id = $1",
                         {std::to_string(c.attempt.job_id)}),
            "running")
      << "nothing was completed outside the caller's transaction";
}

TEST(complete_in_tx_guard, pqxx_refuses_a_nontransaction) {
  expect_pqxx_refuses_and_completes_nothing(
      [](pqxx::connection& conn) { return std::make_unique<pqxx::nontransaction>(conn); });
}

// pqxx rolls a transaction back when a statement in it fails; a completion sent after that would
// run outside any transaction and commit on its own.
TEST(complete_in_tx_guard, pqxx_refuses_a_transaction_a_failed_statement_rolled_back) {
  expect_pqxx_refuses_and_completes_nothing([](pqxx::connection& conn) {
    auto tx = std::make_unique<pqxx::work>(conn);
    EXPECT_ANY_THROW(tx->exec("SELECT 1/0"));
    return tx;
  });
}

TEST(complete_in_tx_guard, soci_refuses_a_session_outside_a_transaction) {
  scoped_schema schema{"cit"};
  soci::session session(soci::postgresql, tenure::test::keyword_dsn(schema.dsn()));
  auto r = tenure::complete_in_tx(session, finalization_token{{.job_id = 1, .run_lease = 1}, {}},
                                  {.schema = schema.name()});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_error);
}

TEST(complete_in_tx_guard, libpq_refuses_an_aborted_transaction) {
  scoped_schema schema{"cit"};
  pg db{schema.dsn()};
  db.exec("BEGIN");
  db.query("SELECT 1/0");
  auto r = tenure::complete_in_tx(db.native(), finalization_token{{.job_id = 1, .run_lease = 1}, {}},
                                  {.schema = schema.name()});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::protocol_error);
}

}  // namespace
