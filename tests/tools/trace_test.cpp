// The trace checker (tools/trace): a well-formed trace passes, and each corruption of one breaks
// the property of models/caller_finalization.pml it stands for.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trace/trace.hpp"

namespace tenure::trace {
namespace {

/// Builds a trace transition by transition, one transaction each unless `same_tx`.
class builder {
 public:
  builder& step(std::int64_t job, point from, point to, std::string who, bool same_tx = false) {
    if (!same_tx) ++tx_;
    t_.transitions.push_back({tx_, ++seq_, "x" + std::to_string(tx_), job, std::move(from), std::move(to), std::move(who), "app"});
    return *this;
  }
  builder& business(std::int64_t job, std::int64_t lease, bool same_tx = true) {
    if (!same_tx) ++tx_;
    t_.business.push_back({tx_, ++seq_, "x" + std::to_string(tx_), job, lease, "app.orders", "", "app"});
    t_.business_watched = true;
    return *this;
  }
  builder& watch_business() {
    t_.business_watched = true;
    return *this;
  }
  /// Enqueue, claim of lease 1.
  builder& claimed(std::int64_t job) {
    return step(job, {}, {"available", 0}, "enqueue").step(job, {"available", 0}, {"running", 1}, "claim>claim_attempts");
  }
  report checked() const { return check(t_); }
  trace& get() { return t_; }

 private:
  trace t_;
  std::int64_t tx_ = 0;
  std::int64_t seq_ = 0;
};

::testing::AssertionResult breaks(const report& r, int property, const std::string& rule) {
  for (const auto& v : r.violations) {
    if (v.property == property && v.rule == rule) return ::testing::AssertionSuccess();
  }
  auto out = ::testing::AssertionFailure() << "no violation of property " << property << " (" << rule << "); got:";
  for (const auto& v : r.violations) out << "\n  " << v.property << " " << v.rule << ": " << v.message;
  return out;
}

::testing::AssertionResult passes(const report& r) {
  if (r.ok()) return ::testing::AssertionSuccess();
  auto out = ::testing::AssertionFailure() << "violations:";
  for (const auto& v : r.violations) out << "\n  " << v.property << " " << v.rule << ": " << v.message;
  return out;
}

TEST(trace_checker, a_lifecycle_with_rescue_retry_cancel_admin_retry_and_a_continuation_passes) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"available", 1}, "maintain>rescue_attempts")
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts")
      .step(1, {"running", 2}, {"retryable", 2}, "fail_attempt")
      .step(1, {"retryable", 2}, {"available", 2}, "claim_attempts>promote_due")
      .step(1, {"available", 2}, {"running", 3}, "claim_attempts")
      .step(1, {"running", 3}, {"completed", 3}, "complete_batch")
      .step(1, {"completed", 3}, {"available", 3}, "retry_job")
      .step(1, {"available", 3}, {"running", 4}, "claim_attempts")
      .step(1, {"running", 4}, {"cancelled", 4}, "cancel_job>cancel_attempt")
      .step(1, {"cancelled", 4}, {"gone", 4}, "maintain>prune_expired");
  // A parked attempt: waiting, resumed, continued under a new lease, completed.
  b.claimed(2)
      .step(2, {"running", 1}, {"waiting_external", 1}, "park_callback")
      .step(2, {"waiting_external", 1}, {"available", 1, true}, "resume_callback>continue_parked")
      .step(2, {"available", 1, true}, {"running", 65537}, "claim_attempts")
      .step(2, {"running", 65537}, {"completed", 65537}, "complete_batch");
  // A caller-owned completion with its business row, in one transaction.
  b.claimed(3).step(3, {"running", 1}, {"completed", 1}, "complete_job>complete_batch").business(3, 1);
  const auto r = b.checked();
  EXPECT_TRUE(passes(r));
  EXPECT_EQ(r.jobs, 3u);
  EXPECT_EQ(r.by_who.value("rescue", 0), 1);
  EXPECT_EQ(r.by_who.value("caller", 0), 1);
  EXPECT_EQ(r.by_transition.value("running->completed", 0), 3);
}

// ---- property 1: no stale finalization ----------------------------------------------------------

TEST(trace_checker, a_completion_of_an_older_lease_after_a_newer_claim_breaks_property_1) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"available", 1}, "maintain>rescue_attempts")
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts")
      .step(1, {"running", 1}, {"completed", 1}, "complete_batch");  // lease 1 is no longer live
  EXPECT_TRUE(breaks(b.checked(), 1, "stale_finalization"));
}

TEST(trace_checker, the_live_attempt_closed_with_another_leases_outcome_breaks_property_1) {
  // What a complete_job without its guard would leave: the live receipt (lease 2) closed, the
  // completion recorded for the token's lease 1.
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"available", 1}, "maintain>rescue_attempts")
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts")
      .step(1, {"running", 2}, {"completed", 1}, "complete_job>complete_batch");
  EXPECT_TRUE(breaks(b.checked(), 1, "stale_finalization"));
}

TEST(trace_checker, a_completion_with_no_live_attempt_breaks_property_1) {
  builder b;
  b.step(1, {}, {"available", 0}, "enqueue").step(1, {"available", 0}, {"completed", 0}, "");
  EXPECT_TRUE(breaks(b.checked(), 1, "stale_finalization"));
}

TEST(trace_checker, a_completion_of_an_attempt_waiting_for_its_callback_breaks_property_1) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"waiting_external", 1}, "park_callback")
      .step(1, {"waiting_external", 1}, {"completed", 1}, "complete_batch");
  EXPECT_TRUE(breaks(b.checked(), 1, "completion_while_waiting"));
  builder callback;  // complete_callback resolves the wait, then completes
  callback.claimed(1)
      .step(1, {"running", 1}, {"waiting_external", 1}, "park_callback")
      .step(1, {"waiting_external", 1}, {"running", 1}, "complete_callback")
      .step(1, {"running", 1}, {"completed", 1}, "complete_callback>complete_batch", /*same_tx=*/true);
  EXPECT_TRUE(passes(callback.checked()));
}

// ---- property 2: one terminal outcome -------------------------------------------------------------

TEST(trace_checker, two_terminal_outcomes_of_one_job_break_property_2) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"completed", 1}, "complete_batch")
      .step(1, {"completed", 1}, {"failed", 1}, "maintain>rescue_attempts");
  EXPECT_TRUE(breaks(b.checked(), 2, "second_terminal_outcome"));
}

TEST(trace_checker, a_finished_job_running_again_without_an_admin_retry_breaks_property_2) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"cancelled", 1}, "cancel_job>cancel_attempt")
      .step(1, {"cancelled", 1}, {"available", 1}, "")  // by hand, not retry_job
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts");
  EXPECT_TRUE(breaks(b.checked(), 2, "reopened_without_retry"));
}

TEST(trace_checker, an_admin_retry_reopens_a_finished_job_for_one_more_outcome) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"failed", 1}, "fail_attempt")
      .step(1, {"failed", 1}, {"available", 1}, "retry_job")
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts")
      .step(1, {"running", 2}, {"completed", 2}, "complete_batch");
  EXPECT_TRUE(passes(b.checked()));
}

TEST(trace_checker, a_job_committed_in_two_tables_breaks_property_2) {
  // Row events: the claim moved the job to receipts; a stale completion inserted a done row
  // without closing the live receipt.
  std::vector<event> ev = {
      {1, 1, "a", "ready", 'I', 7, 0, "available", false, "enqueue", "p"},
      {2, 2, "b", "ready", 'D', 7, 0, "available", false, "claim_attempts", "w"},
      {2, 3, "b", "receipts", 'I', 7, 1, "running", false, "claim_attempts", "w"},
      {3, 4, "c", "done", 'I', 7, 1, "completed", false, "", "psql"},
  };
  EXPECT_TRUE(breaks(check(derive(ev)), 2, "one_location"));
}

// ---- property 3: run leases only grow -----------------------------------------------------------

TEST(trace_checker, a_lease_going_down_breaks_property_3) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"available", 1}, "maintain>rescue_attempts")
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts")
      .step(1, {"running", 2}, {"available", 2}, "maintain>rescue_attempts")
      .step(1, {"available", 2}, {"available", 0}, "");
  EXPECT_TRUE(breaks(b.checked(), 3, "lease_went_down"));
}

TEST(trace_checker, a_claim_that_does_not_advance_the_lease_breaks_property_3) {
  builder same, kept, skip;
  same.claimed(1)
      .step(1, {"running", 1}, {"available", 1}, "maintain>rescue_attempts")
      .step(1, {"available", 1}, {"running", 1}, "claim_attempts");
  EXPECT_TRUE(breaks(same.checked(), 3, "claim_lease"));
  kept.claimed(1)  // a continuation is a claim too: it must not keep the parked attempt's lease
      .step(1, {"running", 1}, {"waiting_external", 1}, "park_callback")
      .step(1, {"waiting_external", 1}, {"available", 1, true}, "resume_callback>continue_parked")
      .step(1, {"available", 1, true}, {"running", 1}, "claim_attempts");
  EXPECT_TRUE(breaks(kept.checked(), 3, "claim_lease"));
  skip.step(1, {}, {"available", 0}, "enqueue").step(1, {"available", 0}, {"running", 131073}, "claim_attempts");
  EXPECT_TRUE(passes(skip.checked())) << "a lease need not be the previous one plus one";
}

// ---- property 4: no business write without its attempt's completion ------------------------------

TEST(trace_checker, a_business_row_whose_attempt_did_not_complete_breaks_property_4) {
  builder b;
  b.claimed(1)
      .business(1, 1, /*same_tx=*/false)  // committed alone: the completion never came
      .step(1, {"running", 1}, {"available", 1}, "maintain>rescue_attempts")
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts")
      .step(1, {"running", 2}, {"completed", 2}, "complete_job>complete_batch")
      .business(1, 2);
  EXPECT_TRUE(breaks(b.checked(), 4, "business_without_completion"));
}

TEST(trace_checker, a_business_row_of_another_attempt_breaks_property_4) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"available", 1}, "maintain>rescue_attempts")
      .step(1, {"available", 1}, {"running", 2}, "claim_attempts")
      .step(1, {"running", 2}, {"completed", 2}, "complete_job>complete_batch")
      .business(1, 1);  // the stale attempt's write committed with the new attempt's completion
  const auto r = b.checked();
  EXPECT_TRUE(breaks(r, 4, "business_without_completion"));
  EXPECT_TRUE(breaks(r, 4, "completion_without_business"));
}

TEST(trace_checker, a_callers_completion_without_its_business_row_breaks_property_4) {
  builder b;
  b.watch_business().claimed(1).step(1, {"running", 1}, {"completed", 1}, "complete_job>complete_batch");
  EXPECT_TRUE(breaks(b.checked(), 4, "completion_without_business"));
  // A batch completion (no caller transaction) needs no business row.
  builder plain;
  plain.watch_business().claimed(1).step(1, {"running", 1}, {"completed", 1}, "complete_batch");
  EXPECT_TRUE(passes(plain.checked()));
}

// ---- deriving transitions from row events -------------------------------------------------------

TEST(trace_derive, row_events_in_either_order_within_a_transaction_make_one_transition) {
  std::vector<event> ev = {
      {1, 1, "a", "ready", 'I', 7, 0, "available", false, "enqueue", "p"},
      {2, 2, "b", "ready", 'D', 7, 0, "available", false, "claim_attempts", "w"},
      {2, 3, "b", "receipts", 'I', 7, 1, "running", false, "claim_attempts", "w"},
      // rescue: the insert's trigger fires before the delete's (a FOR loop over a deleting CTE)
      {3, 4, "c", "ready", 'I', 7, 1, "available", false, "maintain>rescue_attempts", "w"},
      {3, 5, "c", "receipts", 'D', 7, 1, "running", false, "maintain>rescue_attempts", "w"},
      {4, 6, "d", "ready", 'D', 7, 1, "available", false, "claim_attempts", "w"},
      {4, 7, "d", "receipts", 'I', 7, 2, "running", false, "claim_attempts", "w"},
      {5, 8, "e", "attempt_state", 'W', 7, 2, "waiting_external", false, "park_callback", "w"},
      {6, 9, "f", "receipts", 'D', 7, 2, "running", false, "resume_callback>continue_parked", "api"},
      {6, 10, "f", "ready", 'I', 7, 2, "available", true, "resume_callback>continue_parked", "api"},
      {7, 11, "g", "ready", 'D', 7, 2, "available", true, "claim_attempts", "w"},
      {7, 12, "g", "receipts", 'I', 7, 3, "running", false, "claim_attempts", "w"},  // the continuation: a new lease
      {8, 13, "h", "receipts", 'D', 7, 3, "running", false, "complete_job>complete_batch", "app"},
      {8, 14, "h", "done", 'I', 7, 3, "completed", false, "complete_job>complete_batch", "app"},
      {8, 15, "h", "business", 'I', 7, 3, "app.orders", false, "", "app"},
      {9, 16, "i", "done", 'D', 7, 3, "completed", false, "maintain>prune_expired", "w"},
  };
  const auto t = derive(ev, true);
  std::vector<std::string> got;
  for (const auto& tr : t.transitions) {
    got.push_back(tr.from.state + std::to_string(tr.from.lease) + (tr.from.continuation ? "c" : "") + ">" +
                  tr.to.state + std::to_string(tr.to.lease) + (tr.to.continuation ? "c" : ""));
  }
  EXPECT_EQ(got, (std::vector<std::string>{"none0>available0", "available0>running1", "running1>available1",
                                           "available1>running2", "running2>waiting_external2",
                                           "waiting_external2>available2c", "available2c>running3",
                                           "running3>completed3", "completed3>gone3"}));
  EXPECT_EQ(t.transactions, 9u);
  EXPECT_EQ(t.business.size(), 1u);
  EXPECT_TRUE(passes(check(t)));
}

TEST(trace_derive, a_job_first_seen_mid_life_starts_its_history_there) {
  std::vector<event> ev = {
      {1, 1, "a", "receipts", 'D', 9, 4, "running", false, "complete_batch", "w"},
      {1, 2, "a", "done", 'I', 9, 4, "completed", false, "complete_batch", "w"},
  };
  const auto t = derive(ev);
  ASSERT_EQ(t.transitions.size(), 1u);
  EXPECT_EQ(t.transitions[0].from, (point{"running", 4}));
  EXPECT_TRUE(passes(check(t)));
}

TEST(trace_derive, a_job_from_before_the_recorder_rescued_with_its_insert_recorded_first_starts_from_its_receipt) {
  std::vector<event> ev = {
      {1, 1, "a", "ready", 'I', 9, 3, "available", false, "maintain>rescue_attempts", "w"},
      {1, 2, "a", "receipts", 'D', 9, 3, "running", false, "maintain>rescue_attempts", "w"},
      {2, 3, "b", "ready", 'D', 9, 3, "available", false, "claim_attempts", "w"},
      {2, 4, "b", "receipts", 'I', 9, 4, "running", false, "claim_attempts", "w"},
  };
  const auto t = derive(ev);
  ASSERT_EQ(t.transitions.size(), 2u);
  EXPECT_EQ(t.transitions[0].from, (point{"running", 3}));
  EXPECT_EQ(t.transitions[0].to, (point{"available", 3}));
  EXPECT_TRUE(passes(check(t)));
}

TEST(trace_report, the_summary_names_the_first_violating_transitions) {
  builder b;
  b.claimed(1)
      .step(1, {"running", 1}, {"completed", 1}, "complete_batch")
      .step(1, {"completed", 1}, {"failed", 1}, "maintain>rescue_attempts");
  const auto j = to_json(b.checked());
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["violation_count"], 1);
  const auto& v = j["violations"][0];
  EXPECT_EQ(v["property"], 2);
  ASSERT_EQ(v["transitions"].size(), 2u) << "the job's previous transition, then the violating one";
  EXPECT_EQ(v["transitions"][1]["to"]["state"], "failed");
  EXPECT_EQ(v["transitions"][1]["category"], "rescue");
}

TEST(trace_report, who_categories_follow_the_outermost_meaningful_function) {
  EXPECT_EQ(who_category(""), "direct");
  EXPECT_EQ(who_category("complete_job>complete_batch"), "caller");
  EXPECT_EQ(who_category("complete_callback>complete_batch"), "callback");
  EXPECT_EQ(who_category("maintain>rescue_attempts"), "rescue");
  EXPECT_EQ(who_category("claim>claim_attempts>promote_due"), "promote");
  EXPECT_EQ(who_category("claim>claim_attempts"), "claim");
  EXPECT_EQ(who_category("cancel_job>cancel_attempt"), "cancel");
  EXPECT_EQ(who_category("fail_job>fail_attempt"), "worker");
  EXPECT_EQ(who_category("enqueue_batch>enqueue_one"), "enqueue");
  EXPECT_EQ(who_category("retry_job"), "admin_retry");
}

}  // namespace
}  // namespace tenure::trace
