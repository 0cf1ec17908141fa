// The storage contract suite. See storage_contract.hpp for how an adapter runs it.
//
// Every test checks outcomes through the port: states, attempt counts and run leases read back
// with read_job, per-item results, error codes. Time moves only through the backend.
#include "contract/storage_contract.hpp"

#include <gmock/gmock.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <source_location>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace tenure::contract {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

/// Longer than any pass_time() of a test: rescue_stale(k_never) only closes attempts whose hard
/// deadline passed.
constexpr std::chrono::microseconds k_never = 24h;

/// Unwraps a result; on error fails the test at the caller's line and aborts it.
template <class T>
T must(result<T> r, std::source_location at = std::source_location::current()) {
  if (!r) {
    ADD_FAILURE_AT(at.file_name(), static_cast<int>(at.line()))
        << "unexpected error: " << r.error().message();
    throw std::runtime_error("unexpected error from the store");
  }
  if constexpr (!std::is_void_v<T>) return std::move(r).value();
}

/// EXPECT_TRUE(fails_with(r, errc::x)): r is an error, and exactly that one.
template <class T>
::testing::AssertionResult fails_with(const result<T>& r, errc expected) {
  const auto want = make_error_code(expected).message();
  if (r) return ::testing::AssertionFailure() << "succeeded; expected: " << want;
  if (r.error() != expected) {
    return ::testing::AssertionFailure() << "failed with: " << r.error().message()
                                         << "; expected: " << want;
  }
  return ::testing::AssertionSuccess();
}

std::vector<attempt_id> attempts_of(const std::vector<claimed_attempt>& claimed) {
  std::vector<attempt_id> out;
  for (const auto& c : claimed) out.push_back(c.attempt);
  return out;
}

json parsed(const std::optional<std::string>& text) {
  return text ? json::parse(*text) : json();
}

}  // namespace

// ---- fixture --------------------------------------------------------------------------------

void storage_contract::SetUp() {
  backend_ = GetParam().make();
  ASSERT_NE(backend_, nullptr);
}

void storage_contract::TearDown() { backend_.reset(); }

new_job storage_contract::make_job(std::string kind, std::string queue) {
  new_job j;
  j.kind = std::move(kind);
  j.queue = std::move(queue);
  return j;
}

std::int64_t storage_contract::add(const new_job& job) { return must(db().enqueue(job)); }

std::int64_t storage_contract::add_at(new_job job, std::chrono::microseconds from_now) {
  job.run_at = be().now() + from_now;
  return add(job);
}

std::vector<claimed_attempt> storage_contract::claim(std::string_view queue, int max_jobs) {
  return must(db().claim(queue, max_jobs, "contract-worker"));
}

claimed_attempt storage_contract::claim_one(std::string_view queue) {
  auto claimed = claim(queue, 1);
  if (claimed.size() != 1) {
    ADD_FAILURE() << "expected to claim one job of queue '" << queue << "', got "
                  << claimed.size();
    throw std::runtime_error("nothing to claim");
  }
  return claimed.front();
}

job_info storage_contract::read(std::int64_t job_id) { return must(db().read_job(job_id)); }

bool storage_contract::complete(attempt_id attempt, std::optional<std::string> progress) {
  const completion item{attempt, std::move(progress)};
  const auto results = must(db().complete(std::span(&item, 1)));
  if (results.size() != 1 || results.front().attempt != attempt) {
    ADD_FAILURE() << "complete() must answer once per item";
    throw std::runtime_error("bad completion answer");
  }
  return results.front().applied;
}

std::vector<rescued_attempt> storage_contract::rescue_all() {
  be().make_attempts_stale();
  return must(db().rescue_stale(be().stale_after()));
}

void storage_contract::configure(std::string_view queue, const queue_settings& settings) {
  must(db().configure_queue(queue, settings));
}

// ---- producers ------------------------------------------------------------------------------

TEST_P(storage_contract, enqueue_stores_the_job_as_given) {
  new_job j = make_job("send_email", "mail");
  j.args = json{{"to", "a@example.com"}, {"n", 3}};
  j.priority = 3;
  j.max_attempts = 7;
  const auto id = add(j);
  const auto info = read(id);
  EXPECT_EQ(info.id, id);
  EXPECT_EQ(info.kind, "send_email");
  EXPECT_EQ(info.queue, "mail");
  EXPECT_EQ(json::parse(info.args), j.args);
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_EQ(info.priority, 3);
  EXPECT_EQ(info.attempt, 0);
  EXPECT_EQ(info.max_attempts, 7);
  EXPECT_EQ(info.run_lease, 0);
  EXPECT_FALSE(info.finalized_at);
  EXPECT_FALSE(info.last_error);
  EXPECT_FALSE(info.progress);
  EXPECT_FALSE(info.dead_lettered);

  new_job null_args = make_job();
  null_args.args = nullptr;  // stored as {}
  const auto other = add(null_args);
  EXPECT_NE(other, id);
  EXPECT_EQ(json::parse(read(other).args), json::object());
}

TEST_P(storage_contract, read_job_of_an_unknown_id_is_job_not_found) {
  EXPECT_TRUE(fails_with(db().read_job(987654321), errc::job_not_found));
}

TEST_P(storage_contract, invalid_job_is_rejected_and_nothing_is_enqueued) {
  std::vector<std::pair<std::string, std::function<void(new_job&)>>> breakers = {
      {"empty kind", [](new_job& j) { j.kind.clear(); }},
      {"long kind", [](new_job& j) { j.kind = std::string(256, 'k'); }},
      {"control in kind", [](new_job& j) { j.kind = "a\tb"; }},
      {"C1 control in kind (U+0085)", [](new_job& j) { j.kind = "a\xC2\x85" "b"; }},
      {"invalid UTF-8 in kind", [](new_job& j) { j.kind = "k\xff"; }},
      {"invalid UTF-8 in queue", [](new_job& j) { j.queue = "q\xC3"; }},
      {"empty queue", [](new_job& j) { j.queue.clear(); }},
      {"long queue", [](new_job& j) { j.queue = std::string(129, 'q'); }},
      {"priority 0", [](new_job& j) { j.priority = 0; }},
      {"priority 5", [](new_job& j) { j.priority = 5; }},
      {"max_attempts 0", [](new_job& j) { j.max_attempts = 0; }},
      {"discarded args", [](new_job& j) { j.args = json::parse("{", nullptr, false); }},
      // args are a JSON object, as on the SQL side: handlers read named fields from them.
      {"array args", [](new_job& j) { j.args = json::array({1, 2}); }},
      {"string args", [](new_job& j) { j.args = "str"; }},
      {"number args", [](new_job& j) { j.args = 7; }},
      {"boolean args", [](new_job& j) { j.args = true; }},
  };
  for (const auto& [what, breaker] : breakers) {
    new_job j = make_job();
    breaker(j);
    EXPECT_TRUE(fails_with(db().enqueue(j), errc::invalid_argument)) << what;
  }
  EXPECT_THAT(claim("default"), IsEmpty());
}

TEST_P(storage_contract, args_that_cannot_be_json_text_are_invalid_argument) {
  new_job j = make_job();
  j.args = json{{"s", std::string("\xff\xfe")}};  // not UTF-8: no JSON text can carry it
  EXPECT_TRUE(fails_with(db().enqueue(j), errc::invalid_argument));
  const std::vector<new_job> batch{make_job(), j};
  EXPECT_TRUE(fails_with(db().enqueue_batch(batch), errc::invalid_argument));
  EXPECT_THAT(claim("default"), IsEmpty());
}

TEST_P(storage_contract, args_with_a_nul_character_are_invalid_argument_on_every_store) {
  // JSON can say "\u0000"; jsonb cannot store it. A fake that took it would let unit tests pass
  // with args production refuses.
  for (const auto& args : {json{{"s", std::string("a\0b", 3)}}, json{{std::string("k\0", 2), 1}}}) {
    new_job j = make_job();
    j.args = args;
    EXPECT_TRUE(fails_with(db().enqueue(j), errc::invalid_argument)) << args.dump();
  }
  EXPECT_THAT(claim("default"), IsEmpty());
}

TEST_P(storage_contract, enqueue_batch_returns_ids_in_input_order) {
  std::vector<new_job> jobs{make_job("a"), make_job("b", "other"), make_job("c")};
  jobs[1].priority = 1;
  jobs[2].run_at = be().now() + 1h;
  const auto ids = must(db().enqueue_batch(jobs));
  ASSERT_THAT(ids, SizeIs(3));
  EXPECT_EQ(std::set<std::int64_t>(ids.begin(), ids.end()).size(), 3u);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const auto info = read(ids[i]);
    EXPECT_EQ(info.kind, jobs[i].kind) << i;
    EXPECT_EQ(info.queue, jobs[i].queue) << i;
    EXPECT_EQ(info.priority, jobs[i].priority) << i;
  }
  EXPECT_EQ(read(ids[0]).state, job_state::available);
  EXPECT_EQ(read(ids[2]).state, job_state::scheduled);
  EXPECT_THAT(must(db().enqueue_batch({})), IsEmpty());
}

TEST_P(storage_contract, enqueue_batch_is_all_or_nothing) {
  std::vector<new_job> jobs{make_job("a"), make_job("b"), make_job("c", "other")};
  jobs[1].priority = 9;
  EXPECT_TRUE(fails_with(db().enqueue_batch(jobs), errc::invalid_argument));
  EXPECT_THAT(claim("default"), IsEmpty());
  EXPECT_THAT(claim("other"), IsEmpty());

  jobs[1].priority = 2;
  const auto ids = must(db().enqueue_batch(jobs));
  ASSERT_THAT(ids, SizeIs(3));
  EXPECT_THAT(claim("default"), SizeIs(2));
  EXPECT_THAT(claim("other"), SizeIs(1));
}

// ---- claim ----------------------------------------------------------------------------------

TEST_P(storage_contract, claim_advances_run_lease_and_attempt_on_every_claim) {
  const auto id = add(make_job());
  std::int64_t last = 0;  // the job's last run lease: every claim gives a greater one
  auto expect_claim = [&](int attempt) {
    const auto c = claim_one();
    EXPECT_EQ(c.attempt.job_id, id);
    EXPECT_GT(c.attempt.run_lease, last);
    last = c.attempt.run_lease;
    EXPECT_EQ(c.attempt_number, attempt);
    const auto info = read(id);
    EXPECT_EQ(info.state, job_state::running);
    EXPECT_EQ(info.run_lease, c.attempt.run_lease);
    EXPECT_EQ(info.attempt, attempt);
    return c;
  };
  const auto first = expect_claim(1);
  EXPECT_EQ(must(db().fail(first.attempt, "boom", fail_disposition::retry, 0us)),
            job_state::retryable);
  const auto second = expect_claim(2);
  must(db().snooze(second.attempt, 0us));  // gives the attempt back
  expect_claim(2);
  ASSERT_THAT(rescue_all(), SizeIs(1));  // the attempt counts
  const auto fourth = expect_claim(3);
  ASSERT_TRUE(complete(fourth.attempt));
  ASSERT_TRUE(must(db().retry_job(id)));
  EXPECT_EQ(read(id).run_lease, fourth.attempt.run_lease);  // admin retry keeps the lease; the next claim advances it
  expect_claim(1);
}

TEST_P(storage_contract, claim_orders_by_priority_then_fifo) {
  auto with_priority = [&](int p) {
    new_job j = make_job();
    j.priority = p;
    return add(j);
  };
  const auto a = with_priority(3), b = with_priority(1), c = with_priority(2),
             d = with_priority(1), e = with_priority(4), f = with_priority(2);
  const auto batch = claim("default", 4);
  ASSERT_THAT(batch, SizeIs(4));
  EXPECT_EQ(batch[0].attempt.job_id, b);
  EXPECT_EQ(batch[1].attempt.job_id, d);
  EXPECT_EQ(batch[2].attempt.job_id, c);
  EXPECT_EQ(batch[3].attempt.job_id, f);
  EXPECT_EQ(claim_one().attempt.job_id, a);
  EXPECT_EQ(claim_one().attempt.job_id, e);
  EXPECT_THAT(claim("default"), IsEmpty());
}

TEST_P(storage_contract, claim_takes_only_its_own_queue) {
  const auto mail = add(make_job("k", "mail"));
  add(make_job("k", "billing"));
  const auto claimed = claim("mail");
  ASSERT_THAT(claimed, SizeIs(1));
  EXPECT_EQ(claimed[0].attempt.job_id, mail);
  EXPECT_EQ(claimed[0].queue, "mail");
  EXPECT_THAT(claim("nobody"), IsEmpty());
  EXPECT_THAT(claim("billing"), SizeIs(1));
}

TEST_P(storage_contract, claim_skips_future_run_at_until_it_is_due) {
  const auto later = add_at(make_job("later"), 1h);
  const auto past = add_at(make_job("past"), -1min);  // a past run_at is available at once
  EXPECT_EQ(read(later).state, job_state::scheduled);
  EXPECT_EQ(read(past).state, job_state::available);
  const auto now_claimable = claim();
  ASSERT_THAT(now_claimable, SizeIs(1));
  EXPECT_EQ(now_claimable[0].attempt.job_id, past);
  EXPECT_EQ(must(db().promote_due()), 0);
  EXPECT_EQ(read(later).state, job_state::scheduled);

  be().pass_time(1h);
  const auto c = claim_one();  // claim promotes due jobs of its queue first
  EXPECT_EQ(c.attempt.job_id, later);
  EXPECT_EQ(c.attempt_number, 1);
}

TEST_P(storage_contract, claim_never_exceeds_max_jobs) {
  EXPECT_THAT(claim("default", 5), IsEmpty());  // empty queue
  for (int i = 0; i < 10; ++i) add(make_job());
  EXPECT_THAT(claim("default", 3), SizeIs(3));
  EXPECT_THAT(claim("default", 1), SizeIs(1));
  EXPECT_THAT(claim("default", 100), SizeIs(6));
  EXPECT_THAT(claim("default", 100), IsEmpty());
}

TEST_P(storage_contract, claim_rejects_max_jobs_out_of_range) {
  add(make_job());
  EXPECT_TRUE(fails_with(db().claim("default", 0, "w"), errc::invalid_argument));
  EXPECT_TRUE(fails_with(db().claim("default", -1, "w"), errc::invalid_argument));
  EXPECT_TRUE(fails_with(db().claim("default", 10001, "w"), errc::invalid_argument));
  EXPECT_EQ(claim_one().attempt_number, 1);  // the refused claims took nothing
}

TEST_P(storage_contract, claimed_attempt_carries_the_job) {
  new_job j = make_job("resize", "images");
  j.args = json{{"w", 640}, {"tags", {"a", "b"}}};
  j.max_attempts = 4;
  const auto id = add(j);
  const auto c = claim_one("images");
  EXPECT_EQ(c.attempt.job_id, id);
  EXPECT_GT(c.attempt.run_lease, 0);
  EXPECT_EQ(c.queue, "images");
  EXPECT_EQ(c.kind, "resize");
  EXPECT_EQ(json::parse(c.args), j.args);
  EXPECT_EQ(c.attempt_number, 1);
  EXPECT_EQ(c.max_attempts, 4);
  EXPECT_FALSE(c.deadline);  // the queue has no hard deadline
  EXPECT_EQ(c.token(), (finalization_token{c.attempt, c.secret}));
  EXPECT_THAT(c.token().to_string(),
              StartsWith("tn2:" + std::to_string(id) + ":" + std::to_string(c.attempt.run_lease) + ":"));
  EXPECT_EQ(must(finalization_token::parse(c.token().to_string())), c.token());
}

// The secret is what makes a token unguessable: the store draws a fresh one for every attempt,
// never zero, never shared between attempts of one job or between jobs.
TEST_P(storage_contract, every_claim_draws_its_own_attempt_secret) {
  const auto a = add(make_job()), b = add(make_job());
  std::vector<claimed_attempt> attempts = claim("default", 2);
  ASSERT_THAT(attempts, SizeIs(2));
  must(db().snooze(attempts[0].attempt, 0us));  // job a again: a second attempt of the same job
  ASSERT_EQ(must(db().fail(attempts[1].attempt, "x", fail_disposition::retry, 0us)), job_state::retryable);
  for (const auto& c : claim("default", 2)) attempts.push_back(c);
  ASSERT_THAT(attempts, SizeIs(4));
  std::set<std::string> secrets;
  for (const auto& c : attempts) {
    EXPECT_TRUE(c.attempt.job_id == a || c.attempt.job_id == b);
    EXPECT_NE(c.secret, attempt_secret{}) << "job " << c.attempt.job_id << " lease " << c.attempt.run_lease;
    // A version-4 UUID, as gen_random_uuid() draws it: the rest of its 128 bits are random.
    EXPECT_EQ(c.secret.bytes()[6] >> 4, 4);
    EXPECT_EQ(c.secret.bytes()[8] >> 6, 2);
    secrets.insert(c.secret.to_string());
  }
  EXPECT_EQ(secrets.size(), attempts.size()) << "a secret was drawn twice";
}

// ---- heartbeat ------------------------------------------------------------------------------

TEST_P(storage_contract, heartbeat_returns_live_attempts_only) {
  for (int i = 0; i < 3; ++i) add(make_job());
  const auto claimed = claim();
  ASSERT_THAT(claimed, SizeIs(3));
  const auto done = claimed[0].attempt, cancelled = claimed[1].attempt, live = claimed[2].attempt;
  ASSERT_TRUE(complete(done));
  ASSERT_TRUE(must(db().cancel_job(cancelled.job_id)));
  const std::vector<attempt_id> asked{done, cancelled, live, {live.job_id, live.run_lease + 1},
                                      {987654321, 1}, live};
  EXPECT_THAT(must(db().heartbeat(asked)), UnorderedElementsAre(live));
  EXPECT_THAT(must(db().heartbeat({})), IsEmpty());
  EXPECT_EQ(read(live.job_id).state, job_state::running);
  EXPECT_EQ(read(done.job_id).state, job_state::completed);
}

TEST_P(storage_contract, heartbeat_rejects_progress_of_another_length) {
  add(make_job());
  const auto c = claim_one();
  const std::vector<attempt_id> attempts{c.attempt};
  const std::vector<std::optional<std::string>> progress{R"({"a":1})", R"({"b":2})"};
  EXPECT_TRUE(fails_with(db().heartbeat(attempts, progress), errc::invalid_argument));
  EXPECT_FALSE(read(c.attempt.job_id).progress);
}

TEST_P(storage_contract, heartbeat_progress_is_kept_until_replaced) {
  add(make_job());
  const auto c = claim_one();
  const std::vector<attempt_id> attempts{c.attempt};
  const std::vector<std::optional<std::string>> step1{R"({"step": 1})"}, none{std::nullopt},
      step2{R"({"step": 2})"};
  EXPECT_THAT(must(db().heartbeat(attempts, step1)), ElementsAre(c.attempt));
  EXPECT_EQ(parsed(read(c.attempt.job_id).progress), json({{"step", 1}}));
  EXPECT_THAT(must(db().heartbeat(attempts, none)), ElementsAre(c.attempt));
  EXPECT_THAT(must(db().heartbeat(attempts)), ElementsAre(c.attempt));
  EXPECT_EQ(parsed(read(c.attempt.job_id).progress), json({{"step", 1}}));
  EXPECT_THAT(must(db().heartbeat(attempts, step2)), ElementsAre(c.attempt));
  EXPECT_EQ(parsed(read(c.attempt.job_id).progress), json({{"step", 2}}));
}

TEST_P(storage_contract, invalid_progress_json_is_rejected_without_effect) {
  add(make_job());
  const auto c = claim_one();
  const std::vector<attempt_id> attempts{c.attempt};
  const std::vector<std::optional<std::string>> bad{"{not json"};
  EXPECT_TRUE(fails_with(db().heartbeat(attempts, bad), errc::invalid_argument));
  const completion item{c.attempt, "{nope"};
  EXPECT_TRUE(fails_with(db().complete(std::span(&item, 1)), errc::invalid_argument));
  const auto info = read(c.attempt.job_id);
  EXPECT_EQ(info.state, job_state::running);
  EXPECT_FALSE(info.progress);
  EXPECT_TRUE(complete(c.attempt, R"({"ok": true})"));
}

TEST_P(storage_contract, progress_with_a_nul_escape_is_rejected_without_effect) {
  add(make_job());
  const auto c = claim_one();
  const std::vector<attempt_id> attempts{c.attempt};
  const std::vector<std::optional<std::string>> bad{R"({"p": "x\u0000y"})"};
  EXPECT_TRUE(fails_with(db().heartbeat(attempts, bad), errc::invalid_argument));
  const completion item{c.attempt, R"({"p": "x\u0000y"})"};
  EXPECT_TRUE(fails_with(db().complete(std::span(&item, 1)), errc::invalid_argument));
  const auto info = read(c.attempt.job_id);
  EXPECT_EQ(info.state, job_state::running);
  EXPECT_FALSE(info.progress);
}

TEST_P(storage_contract, a_message_with_a_nul_or_invalid_utf8_is_refused_never_truncated) {
  add(make_job());
  add(make_job());
  const auto claimed = claim("default", 2);
  ASSERT_THAT(claimed, SizeIs(2));
  EXPECT_TRUE(fails_with(db().fail(claimed[0].attempt, std::string("before\0after", 12), fail_disposition::permanent),
                         errc::invalid_argument));
  EXPECT_TRUE(fails_with(db().fail(claimed[0].attempt, "bad \xff\xfe bytes", fail_disposition::permanent),
                         errc::invalid_argument));
  EXPECT_TRUE(fails_with(db().cancel_attempt(claimed[1].attempt, std::string("x\0y", 3)), errc::invalid_argument));
  EXPECT_EQ(read(claimed[0].attempt.job_id).state, job_state::running) << "nothing was written";
  EXPECT_EQ(read(claimed[1].attempt.job_id).state, job_state::running);
  EXPECT_EQ(must(db().fail(claimed[0].attempt, "plain words", fail_disposition::permanent)), job_state::failed);
  EXPECT_EQ(read(claimed[0].attempt.job_id).last_error, "plain words");
}

// ---- completion -----------------------------------------------------------------------------

TEST_P(storage_contract, complete_closes_the_attempt_as_completed) {
  const auto id = add(make_job());
  const auto c = claim_one();
  const completion item{c.attempt, R"({"done": true})"};
  const auto results = must(db().complete(std::span(&item, 1)));
  ASSERT_THAT(results, SizeIs(1));
  EXPECT_EQ(results[0].attempt, c.attempt);
  EXPECT_TRUE(results[0].applied);
  EXPECT_TRUE(results[0].completed_at);
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::completed);
  EXPECT_TRUE(info.finalized_at);
  EXPECT_EQ(parsed(info.progress), json({{"done", true}}));
  EXPECT_EQ(must(db().reconcile(c.attempt)), attempt_evidence::completed_by_this);

  const auto again = must(db().complete(std::span(&item, 1)));
  ASSERT_THAT(again, SizeIs(1));
  EXPECT_FALSE(again[0].applied);
  EXPECT_FALSE(again[0].completed_at);
  EXPECT_THAT(must(db().complete({})), IsEmpty());
}

TEST_P(storage_contract, batch_completion_reports_each_item_in_input_order) {
  for (int i = 0; i < 3; ++i) add(make_job());
  const auto claimed = claim();
  ASSERT_THAT(claimed, SizeIs(3));
  const auto a = claimed[0].attempt, b = claimed[1].attempt, c = claimed[2].attempt;
  ASSERT_TRUE(must(db().cancel_job(b.job_id)));  // b's attempt is now stale
  const std::vector<completion> batch{{c, std::nullopt}, {b, std::nullopt}, {a, std::nullopt}};
  const auto results = must(db().complete(batch));
  ASSERT_THAT(results, SizeIs(3));
  EXPECT_EQ(results[0].attempt, c);
  EXPECT_EQ(results[1].attempt, b);
  EXPECT_EQ(results[2].attempt, a);
  EXPECT_TRUE(results[0].applied);
  EXPECT_FALSE(results[1].applied);
  EXPECT_TRUE(results[2].applied);
  EXPECT_TRUE(results[0].completed_at);
  EXPECT_FALSE(results[1].completed_at);
  EXPECT_TRUE(results[2].completed_at);
  EXPECT_EQ(read(a.job_id).state, job_state::completed);
  EXPECT_EQ(read(b.job_id).state, job_state::cancelled);
  EXPECT_EQ(read(c.job_id).state, job_state::completed);
}

TEST_P(storage_contract, an_attempt_named_twice_in_one_batch_is_applied_once) {
  const auto id = add(make_job());
  const auto c = claim_one();
  const std::vector<completion> batch{{c.attempt, std::nullopt}, {c.attempt, std::nullopt}};
  const auto results = must(db().complete(batch));
  ASSERT_THAT(results, SizeIs(2));
  EXPECT_TRUE(results[0].applied);  // the first copy reports the completion
  EXPECT_FALSE(results[1].applied);  // the repeat is stale
  EXPECT_EQ(read(id).state, job_state::completed);
}

TEST_P(storage_contract, completion_keeps_heartbeat_progress_unless_given_its_own) {
  add(make_job());
  add(make_job());
  const auto claimed = claim();
  ASSERT_THAT(claimed, SizeIs(2));
  const std::vector<attempt_id> attempts{claimed[0].attempt, claimed[1].attempt};
  const std::vector<std::optional<std::string>> progress{R"({"p": 1})", R"({"p": 2})"};
  EXPECT_THAT(must(db().heartbeat(attempts, progress)), UnorderedElementsAreArray(attempts));
  ASSERT_TRUE(complete(attempts[0]));
  ASSERT_TRUE(complete(attempts[1], R"({"final": true})"));
  EXPECT_EQ(parsed(read(attempts[0].job_id).progress), json({{"p", 1}}));
  EXPECT_EQ(parsed(read(attempts[1].job_id).progress), json({{"final", true}}));
}

TEST_P(storage_contract, stale_completion_after_rescue) {
  const auto id = add(make_job());
  const auto c = claim_one();
  const auto rescued = rescue_all();
  ASSERT_THAT(rescued, SizeIs(1));
  EXPECT_EQ(rescued[0].attempt, c.attempt);
  EXPECT_FALSE(complete(c.attempt));
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_EQ(info.run_lease, c.attempt.run_lease);
  EXPECT_EQ(must(db().reconcile(c.attempt)), attempt_evidence::closed_by_other);
}

TEST_P(storage_contract, stale_completion_after_admin_cancel) {
  const auto id = add(make_job());
  const auto c = claim_one();
  ASSERT_TRUE(must(db().cancel_job(id)));
  EXPECT_FALSE(complete(c.attempt));
  EXPECT_EQ(read(id).state, job_state::cancelled);
}

TEST_P(storage_contract, stale_fail_snooze_and_cancel_attempt_after_rescue) {
  const auto id = add(make_job());
  const auto c = claim_one();
  ASSERT_THAT(rescue_all(), SizeIs(1));
  EXPECT_TRUE(fails_with(db().fail(c.attempt, "late", fail_disposition::retry),
                         errc::stale_attempt));
  EXPECT_TRUE(fails_with(db().fail(c.attempt, "late", fail_disposition::permanent),
                         errc::stale_attempt));
  EXPECT_TRUE(fails_with(db().snooze(c.attempt, 0us), errc::stale_attempt));
  EXPECT_TRUE(fails_with(db().cancel_attempt(c.attempt, "late"), errc::stale_attempt));
  const std::vector<attempt_id> attempts{c.attempt};
  EXPECT_THAT(must(db().heartbeat(attempts)), IsEmpty());
  const auto info = read(id);  // none of them touched the job
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_EQ(info.attempt, 1);
  EXPECT_EQ(info.run_lease, c.attempt.run_lease);
  EXPECT_THAT(info.last_error.value_or(""), StartsWith("rescued"));
}

TEST_P(storage_contract, aba_snoozed_then_reclaimed_job_refuses_the_old_token) {
  const auto id = add(make_job());
  const auto old = claim_one();
  must(db().snooze(old.attempt, 0us));
  const auto fresh = claim_one();
  ASSERT_EQ(fresh.attempt.job_id, id);
  EXPECT_EQ(fresh.attempt_number, old.attempt_number);  // same attempt number...
  EXPECT_NE(fresh.attempt.run_lease, old.attempt.run_lease);  // ...another attempt
  EXPECT_FALSE(complete(old.attempt));
  EXPECT_TRUE(fails_with(db().fail(old.attempt, "old", fail_disposition::permanent),
                         errc::stale_attempt));
  EXPECT_EQ(must(db().reconcile(old.attempt)), attempt_evidence::closed_by_other);
  EXPECT_EQ(read(id).state, job_state::running);
  EXPECT_TRUE(complete(fresh.attempt));
}

TEST_P(storage_contract, aba_admin_retry_after_completion_refuses_the_old_token) {
  const auto id = add(make_job());
  const auto old = claim_one();
  ASSERT_TRUE(complete(old.attempt));
  ASSERT_TRUE(must(db().retry_job(id)));
  const auto fresh = claim_one();
  EXPECT_EQ(fresh.attempt_number, 1);
  EXPECT_GT(fresh.attempt.run_lease, old.attempt.run_lease);
  EXPECT_FALSE(complete(old.attempt));
  const std::vector<attempt_id> old_only{old.attempt};
  EXPECT_THAT(must(db().heartbeat(old_only)), IsEmpty());
  EXPECT_EQ(must(db().reconcile(old.attempt)), attempt_evidence::closed_by_other);
  EXPECT_EQ(must(db().reconcile(fresh.attempt)), attempt_evidence::open);
  EXPECT_TRUE(complete(fresh.attempt));
  EXPECT_EQ(must(db().reconcile(fresh.attempt)), attempt_evidence::completed_by_this);
}

// ---- rescue ---------------------------------------------------------------------------------

TEST_P(storage_contract, rescue_makes_the_job_available_with_the_attempt_counted) {
  new_job j = make_job("k", "work");
  j.max_attempts = 3;
  const auto id = add(j);
  const auto c = claim_one("work");
  const auto rescued = rescue_all();
  ASSERT_THAT(rescued, SizeIs(1));
  EXPECT_EQ(rescued[0].attempt, c.attempt);
  EXPECT_EQ(rescued[0].queue, "work");
  EXPECT_EQ(rescued[0].new_state, job_state::available);
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::available);  // at once: no backoff
  EXPECT_EQ(info.attempt, 1);
  EXPECT_FALSE(info.finalized_at);
  EXPECT_THAT(info.last_error.value_or(""), StartsWith("rescued"));
  const auto again = claim_one("work");
  EXPECT_EQ(again.attempt.job_id, id);
  EXPECT_GT(again.attempt.run_lease, rescued[0].attempt.run_lease);
  EXPECT_EQ(again.attempt_number, 2);
}

TEST_P(storage_contract, rescue_fails_the_job_when_attempts_are_spent) {
  new_job j = make_job();
  j.max_attempts = 1;
  const auto id = add(j);
  claim_one();
  const auto rescued = rescue_all();
  ASSERT_THAT(rescued, SizeIs(1));
  EXPECT_EQ(rescued[0].new_state, job_state::failed);
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::failed);
  EXPECT_TRUE(info.finalized_at);
  EXPECT_FALSE(info.dead_lettered);
  EXPECT_THAT(info.last_error.value_or(""), StartsWith("rescued"));
  EXPECT_THAT(claim(), IsEmpty());
}

TEST_P(storage_contract, rescue_dead_letters_spent_jobs_when_the_queue_asks) {
  configure("dlq", {.dead_letter = true});
  new_job j = make_job("k", "dlq");
  j.max_attempts = 1;
  const auto id = add(j);
  claim_one("dlq");
  const auto rescued = rescue_all();
  ASSERT_THAT(rescued, SizeIs(1));
  EXPECT_EQ(rescued[0].new_state, job_state::failed);
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::failed);
  EXPECT_TRUE(info.dead_lettered);
}

TEST_P(storage_contract, rescue_leaves_fresh_attempts_alone) {
  const auto id = add(make_job());
  const auto c = claim_one();
  EXPECT_THAT(must(db().rescue_stale(k_never)), IsEmpty());
  EXPECT_EQ(read(id).state, job_state::running);
  EXPECT_TRUE(complete(c.attempt));
  EXPECT_TRUE(fails_with(db().rescue_stale(-1us), errc::invalid_argument));
}

TEST_P(storage_contract, hard_deadline_rescues_an_attempt_even_while_it_heartbeats) {
  configure("timed", {.hard_deadline = 1min});
  const auto timed_id = add(make_job("k", "timed"));
  add(make_job("k", "default"));
  const auto timed = claim_one("timed");
  const auto plain = claim_one("default");
  EXPECT_TRUE(timed.deadline);
  EXPECT_FALSE(plain.deadline);
  const std::vector<attempt_id> both{timed.attempt, plain.attempt};
  EXPECT_THAT(must(db().heartbeat(both)), UnorderedElementsAreArray(both));
  EXPECT_THAT(must(db().rescue_stale(k_never)), IsEmpty());

  be().pass_time(1min);
  EXPECT_THAT(must(db().heartbeat(both)), UnorderedElementsAreArray(both));  // alive, but late
  const auto rescued = must(db().rescue_stale(k_never));
  ASSERT_THAT(rescued, SizeIs(1));
  EXPECT_EQ(rescued[0].attempt, timed.attempt);
  EXPECT_EQ(rescued[0].new_state, job_state::available);
  const auto info = read(timed_id);
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_THAT(info.last_error.value_or(""), StartsWith("rescued"));
  EXPECT_FALSE(complete(timed.attempt));
  EXPECT_TRUE(complete(plain.attempt));
}

// ---- fail -----------------------------------------------------------------------------------

TEST_P(storage_contract, fail_retries_until_max_attempts_then_fails) {
  new_job j = make_job();
  j.max_attempts = 3;
  const auto id = add(j);
  int executions = 0;
  for (int guard = 0; guard < 10; ++guard) {
    const auto claimed = claim();
    if (claimed.empty()) break;
    ASSERT_THAT(claimed, SizeIs(1));
    ++executions;
    EXPECT_EQ(claimed[0].attempt_number, executions);
    const auto state = must(db().fail(claimed[0].attempt, "boom " + std::to_string(executions),
                                      fail_disposition::retry, 0us));
    EXPECT_EQ(state, executions < 3 ? job_state::retryable : job_state::failed) << executions;
    if (state == job_state::retryable) {
      EXPECT_EQ(read(id).state, job_state::retryable);
    }
  }
  EXPECT_EQ(executions, 3);
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::failed);
  EXPECT_EQ(info.attempt, 3);
  EXPECT_EQ(info.last_error, "boom 3");
  EXPECT_TRUE(info.finalized_at);
  EXPECT_FALSE(info.dead_lettered);
}

TEST_P(storage_contract, retryable_failure_waits_for_the_queue_backoff) {
  configure("slow", {.backoff_base = 1min, .backoff_cap = 10min});
  const auto id = add(make_job("k", "slow"));
  const auto c = claim_one("slow");
  EXPECT_EQ(must(db().fail(c.attempt, "boom", fail_disposition::retry)), job_state::retryable);
  EXPECT_EQ(read(id).state, job_state::retryable);
  EXPECT_THAT(claim("slow"), IsEmpty());  // the first backoff is 30..60 seconds
  EXPECT_EQ(must(db().promote_due()), 0);
  be().pass_time(10min);
  const auto again = claim_one("slow");
  EXPECT_EQ(again.attempt.job_id, id);
  EXPECT_GT(again.attempt.run_lease, c.attempt.run_lease);
  EXPECT_EQ(again.attempt_number, 2);
}

TEST_P(storage_contract, retry_after_overrides_the_backoff) {
  const auto id = add(make_job());
  const auto c = claim_one();
  EXPECT_EQ(must(db().fail(c.attempt, "later", fail_disposition::retry, 2h)),
            job_state::retryable);
  be().pass_time(30min);  // past any default backoff of a first failure (at most 1 s)
  EXPECT_THAT(claim(), IsEmpty());
  be().pass_time(90min);
  EXPECT_EQ(must(db().promote_due()), 1);
  EXPECT_EQ(read(id).state, job_state::available);
  EXPECT_EQ(claim_one().attempt_number, 2);
}

TEST_P(storage_contract, permanent_failure_fails_at_once) {
  const auto id = add(make_job());  // 25 attempts
  const auto c = claim_one();
  EXPECT_EQ(must(db().fail(c.attempt, "bad input", fail_disposition::permanent)),
            job_state::failed);
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::failed);
  EXPECT_EQ(info.attempt, 1);
  EXPECT_EQ(info.last_error, "bad input");
  EXPECT_THAT(claim(), IsEmpty());
  EXPECT_EQ(must(db().reconcile(c.attempt)), attempt_evidence::closed_by_other);
}

TEST_P(storage_contract, failed_jobs_of_a_dead_letter_queue_are_dead_lettered) {
  configure("dlq", {.dead_letter = true});
  new_job once = make_job("k", "dlq");
  once.max_attempts = 1;
  const auto permanent = add(make_job("k", "dlq"));
  const auto spent = add(once);
  const auto claimed = claim("dlq");
  ASSERT_THAT(claimed, SizeIs(2));
  const auto& p = claimed[0].attempt.job_id == permanent ? claimed[0] : claimed[1];
  const auto& s = claimed[0].attempt.job_id == permanent ? claimed[1] : claimed[0];
  EXPECT_EQ(must(db().fail(p.attempt, "no", fail_disposition::permanent)), job_state::failed);
  EXPECT_EQ(must(db().fail(s.attempt, "no", fail_disposition::retry, 0us)), job_state::failed);
  for (auto id : {permanent, spent}) {
    const auto info = read(id);
    EXPECT_EQ(info.state, job_state::failed) << id;
    EXPECT_TRUE(info.dead_lettered) << id;
    EXPECT_TRUE(info.finalized_at) << id;
    EXPECT_EQ(info.last_error, "no") << id;
  }
  EXPECT_FALSE(must(db().cancel_job(permanent)));  // finished
  ASSERT_TRUE(must(db().retry_job(permanent)));    // out of the dead-letter table, runnable
  const auto info = read(permanent);
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_FALSE(info.dead_lettered);
  EXPECT_EQ(info.attempt, 0);
  EXPECT_EQ(info.run_lease, p.attempt.run_lease);
  const auto again = claim_one("dlq");
  EXPECT_EQ(again.attempt.job_id, permanent);
  EXPECT_GT(again.attempt.run_lease, p.attempt.run_lease);
}

TEST_P(storage_contract, failed_jobs_of_other_queues_are_not_dead_lettered) {
  configure("dlq", {.dead_letter = true});
  const auto id = add(make_job("k", "plain"));
  const auto c = claim_one("plain");
  EXPECT_EQ(must(db().fail(c.attempt, "no", fail_disposition::permanent)), job_state::failed);
  EXPECT_FALSE(read(id).dead_lettered);
}

// ---- snooze ---------------------------------------------------------------------------------

TEST_P(storage_contract, snooze_does_not_consume_an_attempt) {
  new_job j = make_job();
  j.max_attempts = 1;
  const auto id = add(j);
  const auto first = claim_one();
  must(db().snooze(first.attempt, 0us));
  auto info = read(id);
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_EQ(info.attempt, 0);
  EXPECT_EQ(info.run_lease, first.attempt.run_lease);

  const auto second = claim_one();
  EXPECT_EQ(second.attempt.job_id, id);
  EXPECT_GT(second.attempt.run_lease, first.attempt.run_lease);
  EXPECT_EQ(second.attempt_number, 1);
  must(db().snooze(second.attempt, 1h));
  info = read(id);
  EXPECT_EQ(info.state, job_state::scheduled);
  EXPECT_EQ(info.attempt, 0);
  EXPECT_THAT(claim(), IsEmpty());

  be().pass_time(1h);
  const auto third = claim_one();
  EXPECT_EQ(third.attempt.job_id, id);
  EXPECT_GT(third.attempt.run_lease, second.attempt.run_lease);
  EXPECT_EQ(third.attempt_number, 1);
  // Three executions, one attempt consumed: the budget of one is now spent.
  EXPECT_EQ(must(db().fail(third.attempt, "boom", fail_disposition::retry, 0us)),
            job_state::failed);
}

// ---- administration -------------------------------------------------------------------------

TEST_P(storage_contract, cancel_job_cancels_every_unfinished_state) {
  const auto available = add(make_job());
  const auto scheduled = add_at(make_job(), 2h);
  const auto running = add(make_job("k", "run"));
  const auto retryable = add(make_job("k", "retry"));
  const auto attempt = claim_one("run").attempt;
  const auto retried = claim_one("retry").attempt;
  ASSERT_EQ(must(db().fail(retried, "boom", fail_disposition::retry, 1h)), job_state::retryable);
  ASSERT_EQ(read(scheduled).state, job_state::scheduled);
  ASSERT_EQ(read(retryable).state, job_state::retryable);

  for (auto id : {available, scheduled, running, retryable}) {
    EXPECT_TRUE(must(db().cancel_job(id))) << id;
    const auto info = read(id);
    EXPECT_EQ(info.state, job_state::cancelled) << id;
    EXPECT_TRUE(info.finalized_at) << id;
  }
  EXPECT_FALSE(complete(attempt));  // the running attempt was closed
  EXPECT_EQ(must(db().reconcile(attempt)), attempt_evidence::closed_by_other);
  be().pass_time(3h);
  EXPECT_THAT(claim("default"), IsEmpty());
  EXPECT_THAT(claim("retry"), IsEmpty());
}

TEST_P(storage_contract, cancel_job_of_a_finished_or_unknown_job) {
  const auto completed = add(make_job());
  ASSERT_TRUE(complete(claim_one().attempt));
  EXPECT_FALSE(must(db().cancel_job(completed)));
  EXPECT_EQ(read(completed).state, job_state::completed);

  const auto failed = add(make_job());
  ASSERT_EQ(must(db().fail(claim_one().attempt, "x", fail_disposition::permanent)),
            job_state::failed);
  EXPECT_FALSE(must(db().cancel_job(failed)));
  EXPECT_EQ(read(failed).state, job_state::failed);

  const auto cancelled = add(make_job());
  ASSERT_TRUE(must(db().cancel_job(cancelled)));
  EXPECT_FALSE(must(db().cancel_job(cancelled)));

  EXPECT_TRUE(fails_with(db().cancel_job(987654321), errc::job_not_found));
}

TEST_P(storage_contract, cancel_attempt_closes_the_attempt_as_cancelled) {
  const auto id = add(make_job());
  const auto c = claim_one();
  must(db().cancel_attempt(c.attempt, "not wanted"));
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::cancelled);
  EXPECT_EQ(info.last_error, "not wanted");
  EXPECT_TRUE(info.finalized_at);
  EXPECT_TRUE(fails_with(db().cancel_attempt(c.attempt, "again"), errc::stale_attempt));
  EXPECT_EQ(must(db().reconcile(c.attempt)), attempt_evidence::closed_by_other);
}

TEST_P(storage_contract, retry_job_makes_a_finished_job_runnable_again) {
  const auto completed = add(make_job("k", "c"));
  const auto c = claim_one("c");
  ASSERT_TRUE(complete(c.attempt, R"({"kept": true})"));
  ASSERT_TRUE(must(db().retry_job(completed)));
  auto info = read(completed);
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_EQ(info.attempt, 0);
  EXPECT_EQ(info.run_lease, c.attempt.run_lease);
  EXPECT_FALSE(info.finalized_at);
  EXPECT_EQ(parsed(info.progress), json({{"kept", true}}));
  const auto again = claim_one("c");
  EXPECT_EQ(again.attempt.job_id, completed);
  EXPECT_GT(again.attempt.run_lease, c.attempt.run_lease);

  new_job once = make_job("k", "f");
  once.max_attempts = 1;
  const auto failed = add(once);
  const auto only = claim_one("f");
  ASSERT_EQ(must(db().fail(only.attempt, "x", fail_disposition::retry, 0us)), job_state::failed);
  ASSERT_TRUE(must(db().retry_job(failed)));
  info = read(failed);
  EXPECT_EQ(info.state, job_state::available);
  EXPECT_EQ(info.attempt, 0);  // a fresh budget: it may run once more
  const auto rerun = claim_one("f");
  EXPECT_EQ(rerun.attempt_number, 1);
  EXPECT_GT(rerun.attempt.run_lease, only.attempt.run_lease);

  const auto cancelled = add(make_job("k", "x"));
  ASSERT_TRUE(must(db().cancel_job(cancelled)));
  ASSERT_TRUE(must(db().retry_job(cancelled)));
  EXPECT_EQ(read(cancelled).state, job_state::available);
  EXPECT_EQ(claim_one("x").attempt.job_id, cancelled);
}

TEST_P(storage_contract, retry_job_of_an_unfinished_or_unknown_job) {
  const auto available = add(make_job());
  const auto scheduled = add_at(make_job(), 2h);
  const auto running = add(make_job("k", "run"));
  const auto c = claim_one("run");
  EXPECT_FALSE(must(db().retry_job(available)));
  EXPECT_FALSE(must(db().retry_job(scheduled)));
  EXPECT_FALSE(must(db().retry_job(running)));
  EXPECT_EQ(read(available).state, job_state::available);
  EXPECT_EQ(read(scheduled).state, job_state::scheduled);
  EXPECT_EQ(read(running).state, job_state::running);
  EXPECT_EQ(read(running).run_lease, c.attempt.run_lease);
  EXPECT_TRUE(complete(c.attempt));  // the attempt is untouched
  EXPECT_TRUE(fails_with(db().retry_job(987654321), errc::job_not_found));
}

TEST_P(storage_contract, promote_due_moves_only_due_jobs) {
  const auto a = add_at(make_job("k", "q1"), 1min);
  const auto b = add_at(make_job("k", "q2"), 2min);
  const auto c = add_at(make_job("k", "q1"), 2h);
  EXPECT_EQ(must(db().promote_due()), 0);
  be().pass_time(2min);
  EXPECT_EQ(must(db().promote_due()), 2);
  EXPECT_EQ(read(a).state, job_state::available);
  EXPECT_EQ(read(b).state, job_state::available);
  EXPECT_EQ(read(c).state, job_state::scheduled);
  EXPECT_EQ(must(db().promote_due()), 0);
}

TEST_P(storage_contract, configure_queue_rejects_bad_settings_and_replaces_good_ones) {
  const std::vector<queue_settings> bad{{.hard_deadline = 0us},
                                             {.hard_deadline = -1s},
                                             {.backoff_base = -1s},
                                             {.backoff_base = 2h, .backoff_cap = 1h}};
  for (std::size_t i = 0; i < bad.size(); ++i) {
    EXPECT_TRUE(fails_with(db().configure_queue("q", bad[i]), errc::invalid_argument)) << i;
  }
  configure("q", {.dead_letter = true, .hard_deadline = 1min});
  configure("q", {});  // replaces the row: no deadline, no dead-lettering
  const auto id = add(make_job("k", "q"));
  const auto c = claim_one("q");
  EXPECT_FALSE(c.deadline);
  ASSERT_EQ(must(db().fail(c.attempt, "x", fail_disposition::permanent)), job_state::failed);
  EXPECT_FALSE(read(id).dead_lettered);
}

// ---- reconciliation and progress ------------------------------------------------------------

TEST_P(storage_contract, reconcile_of_a_batch_answers_each_attempt_in_input_order) {
  for (int i = 0; i < 3; ++i) add(make_job());
  const auto claimed = claim();
  ASSERT_THAT(claimed, SizeIs(3));
  ASSERT_TRUE(complete(claimed[1].attempt));
  ASSERT_TRUE(must(db().cancel_job(claimed[2].attempt.job_id)));
  const std::vector<attempt_id> asked{claimed[2].attempt, {987654321, 1}, claimed[0].attempt, claimed[1].attempt,
                                      claimed[0].attempt};
  EXPECT_THAT(must(db().reconcile(std::span<const attempt_id>{asked})),
              ElementsAre(attempt_evidence::closed_by_other, attempt_evidence::unknown_job, attempt_evidence::open,
                          attempt_evidence::completed_by_this, attempt_evidence::open));
  EXPECT_THAT(must(db().reconcile(std::span<const attempt_id>{})), IsEmpty());
}

TEST_P(storage_contract, reconcile_reports_durable_evidence) {
  for (int i = 0; i < 4; ++i) add(make_job());
  const auto claimed = claim();
  ASSERT_THAT(claimed, SizeIs(4));
  const auto completed = claimed[0].attempt, cancelled = claimed[1].attempt,
             failed = claimed[2].attempt, rescued = claimed[3].attempt;
  for (const auto& a : attempts_of(claimed)) {
    EXPECT_EQ(must(db().reconcile(a)), attempt_evidence::open);
  }
  const auto before = read(rescued.job_id);
  EXPECT_EQ(must(db().reconcile(rescued)), attempt_evidence::open);
  const auto after = read(rescued.job_id);  // reconcile never writes
  EXPECT_EQ(after.state, before.state);
  EXPECT_EQ(after.run_lease, before.run_lease);
  EXPECT_EQ(after.attempt, before.attempt);

  ASSERT_TRUE(complete(completed));
  ASSERT_TRUE(must(db().cancel_job(cancelled.job_id)));
  ASSERT_EQ(must(db().fail(failed, "x", fail_disposition::permanent)), job_state::failed);
  ASSERT_THAT(rescue_all(), SizeIs(1));

  EXPECT_EQ(must(db().reconcile(completed)), attempt_evidence::completed_by_this);
  EXPECT_EQ(must(db().reconcile(cancelled)), attempt_evidence::closed_by_other);
  EXPECT_EQ(must(db().reconcile(failed)), attempt_evidence::closed_by_other);
  EXPECT_EQ(must(db().reconcile(rescued)), attempt_evidence::closed_by_other);
  // A lease the job never had, and a job that never existed.
  EXPECT_EQ(must(db().reconcile({completed.job_id, completed.run_lease + 1})),
            attempt_evidence::closed_by_other);
  EXPECT_EQ(must(db().reconcile({987654321, 1})), attempt_evidence::unknown_job);

  const auto reclaimed = claim_one();
  EXPECT_EQ(reclaimed.attempt.job_id, rescued.job_id);
  EXPECT_GT(reclaimed.attempt.run_lease, rescued.run_lease);
  EXPECT_EQ(must(db().reconcile(reclaimed.attempt)), attempt_evidence::open);
  EXPECT_EQ(must(db().reconcile(rescued)), attempt_evidence::closed_by_other);
}

TEST_P(storage_contract, progress_survives_retry_snooze_and_rescue) {
  const auto id = add(make_job());
  auto beat = [&](attempt_id a, const char* progress) {
    const std::vector<attempt_id> attempts{a};
    const std::vector<std::optional<std::string>> p{progress};
    EXPECT_THAT(must(db().heartbeat(attempts, p)), ElementsAre(a));
  };
  const auto first = claim_one();
  beat(first.attempt, R"({"step": 1})");
  ASSERT_EQ(must(db().fail(first.attempt, "boom", fail_disposition::retry, 0us)),
            job_state::retryable);
  EXPECT_EQ(parsed(read(id).progress), json({{"step", 1}}));

  const auto second = claim_one();
  EXPECT_EQ(parsed(read(id).progress), json({{"step", 1}}));  // carried into the new attempt
  must(db().snooze(second.attempt, 0us));
  EXPECT_EQ(parsed(read(id).progress), json({{"step", 1}}));

  const auto third = claim_one();
  beat(third.attempt, R"({"step": 2})");
  ASSERT_THAT(rescue_all(), SizeIs(1));
  EXPECT_EQ(parsed(read(id).progress), json({{"step", 2}}));

  const auto fourth = claim_one();
  ASSERT_TRUE(complete(fourth.attempt));
  const auto info = read(id);
  EXPECT_EQ(info.state, job_state::completed);
  EXPECT_EQ(parsed(info.progress), json({{"step", 2}}));
}

// ---- concurrency ----------------------------------------------------------------------------

/// Retries a call while the store reports a transient conflict (the port allows it: the whole
/// call may be retried); any other error is returned.
template <class Call>
auto retry_transient(Call&& call) {
  for (int i = 0;; ++i) {
    auto r = call();
    if (r || r.error() != errc::transient_conflict || i >= 1000) return r;
  }
}

TEST_P(storage_contract, concurrent_claimers_never_share_a_job) {
  constexpr int k_jobs = 500, k_threads = 4, k_batch = 7;
  const std::vector<new_job> jobs(k_jobs, make_job());
  const auto ids = must(db().enqueue_batch(jobs));
  ASSERT_THAT(ids, SizeIs(k_jobs));

  std::vector<std::unique_ptr<storage_port>> connections;
  for (int t = 0; t < k_threads; ++t) connections.push_back(be().another_connection());
  std::mutex mu;
  std::vector<attempt_id> claimed;
  std::vector<std::string> errors;
  std::atomic<int> oversized{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < k_threads; ++t) {
    threads.emplace_back([&, t] {
      auto& conn = *connections[static_cast<std::size_t>(t)];
      for (;;) {
        auto r = retry_transient([&] { return conn.claim("default", k_batch, "racer"); });
        std::lock_guard lock(mu);
        if (!r) {
          errors.push_back(r.error().message());
          return;
        }
        if (r.value().empty()) return;
        if (r.value().size() > static_cast<std::size_t>(k_batch)) ++oversized;
        for (const auto& c : r.value()) claimed.push_back(c.attempt);
      }
    });
  }
  for (auto& th : threads) th.join();
  connections.clear();

  EXPECT_THAT(errors, IsEmpty());
  EXPECT_EQ(oversized.load(), 0);
  EXPECT_EQ(claimed.size(), static_cast<std::size_t>(k_jobs));  // nobody got a job twice
  std::set<std::int64_t> claimed_ids;
  for (const auto& a : claimed) {
    claimed_ids.insert(a.job_id);
    EXPECT_GT(a.run_lease, 0);
  }
  EXPECT_EQ(claimed_ids, std::set<std::int64_t>(ids.begin(), ids.end()));
  EXPECT_THAT(claim(), IsEmpty());
}

TEST_P(storage_contract, completion_and_rescue_of_one_attempt_never_both_win) {
  constexpr int k_jobs = 60;
  for (int i = 0; i < k_jobs; ++i) add(make_job());
  const auto attempts = attempts_of(claim("default", k_jobs));
  ASSERT_THAT(attempts, SizeIs(k_jobs));
  be().make_attempts_stale();

  auto completer = be().another_connection();
  auto rescuer = be().another_connection();
  std::set<attempt_id> applied, rescued;
  std::vector<std::string> errors;
  std::atomic<bool> completing{true};
  std::thread complete_thread([&] {
    for (const auto& a : attempts) {  // one call each, so the two threads interleave
      const completion item{a, std::nullopt};
      auto r = retry_transient([&] { return completer->complete(std::span(&item, 1)); });
      if (!r) {
        errors.push_back(r.error().message());
      } else if (r.value().at(0).applied) {
        applied.insert(a);
      }
    }
    completing = false;
  });
  std::vector<std::string> rescue_errors;
  for (bool last = false; !last;) {
    last = !completing.load();
    auto r = retry_transient([&] { return rescuer->rescue_stale(be().stale_after()); });
    if (!r) {
      rescue_errors.push_back(r.error().message());
      break;
    }
    for (const auto& x : r.value()) rescued.insert(x.attempt);
  }
  complete_thread.join();
  completer.reset();
  rescuer.reset();

  EXPECT_THAT(errors, IsEmpty());
  EXPECT_THAT(rescue_errors, IsEmpty());
  for (const auto& a : attempts) {
    const bool won_by_completion = applied.contains(a), won_by_rescue = rescued.contains(a);
    EXPECT_NE(won_by_completion, won_by_rescue) << "job " << a.job_id;  // exactly one wins
    EXPECT_EQ(read(a.job_id).state,
              won_by_completion ? job_state::completed : job_state::available);
  }
}

TEST_P(storage_contract, concurrent_completions_of_one_attempt_apply_once) {
  constexpr int k_jobs = 50;
  for (int i = 0; i < k_jobs; ++i) add(make_job());
  const auto attempts = attempts_of(claim("default", k_jobs));
  ASSERT_THAT(attempts, SizeIs(k_jobs));
  std::mutex mu;
  std::map<attempt_id, int> applied;
  std::vector<std::string> errors;
  std::vector<std::unique_ptr<storage_port>> connections;
  for (int t = 0; t < 2; ++t) connections.push_back(be().another_connection());
  std::vector<std::thread> threads;
  for (auto& conn : connections) {
    threads.emplace_back([&, c = conn.get()] {
      for (const auto& a : attempts) {
        const completion item{a, std::nullopt};
        auto r = retry_transient([&] { return c->complete(std::span(&item, 1)); });
        std::lock_guard lock(mu);
        if (!r) {
          errors.push_back(r.error().message());
        } else if (r.value().at(0).applied) {
          ++applied[a];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  connections.clear();
  EXPECT_THAT(errors, IsEmpty());
  for (const auto& a : attempts) EXPECT_EQ(applied[a], 1) << "job " << a.job_id;
}

// ---- metadata ---------------------------------------------------------------------------------

namespace {
/// Claimed metadata as JSON (empty text means `{}`).
json metadata_of(const claimed_attempt& c) { return c.metadata.empty() ? json::object() : json::parse(c.metadata); }
}  // namespace

TEST_P(storage_contract, metadata_round_trips_through_enqueue_claim_and_read_job) {
  new_job traced = make_job();
  traced.metadata = json{{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                         {"tenant", {{"id", 42}, {"name", "Ünïcode \"quoted\""}}}};
  const auto id = add(traced);
  new_job plain = make_job();
  plain.metadata = nullptr;  // stored as {}
  const auto plain_id = add(plain);
  const auto untouched_id = add(make_job());
  EXPECT_EQ(json::parse(read(id).metadata), traced.metadata);
  EXPECT_EQ(json::parse(read(plain_id).metadata), json::object());
  EXPECT_EQ(json::parse(read(untouched_id).metadata), json::object());

  std::map<std::int64_t, json> claimed;
  for (const auto& c : claim()) claimed[c.attempt.job_id] = metadata_of(c);
  EXPECT_EQ(claimed.at(id), traced.metadata);
  EXPECT_EQ(claimed.at(plain_id), json::object());
  EXPECT_EQ(claimed.at(untouched_id), json::object());
  EXPECT_EQ(json::parse(read(id).metadata), traced.metadata) << "a running job shows it too";
}

TEST_P(storage_contract, enqueue_batch_stores_each_jobs_metadata) {
  std::vector<new_job> jobs{make_job("a"), make_job("b"), make_job("c")};
  jobs[0].metadata = json{{"traceparent", "00-a-b-01"}};
  jobs[2].metadata = json{{"n", 3}};
  jobs[2].run_at = be().now() + 1h;
  const auto ids = must(db().enqueue_batch(jobs));
  ASSERT_THAT(ids, SizeIs(3));
  for (std::size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(json::parse(read(ids[i]).metadata), jobs[i].metadata) << i;
  EXPECT_EQ(read(ids[2]).state, job_state::scheduled);
}

TEST_P(storage_contract, metadata_travels_with_the_job_through_every_move) {
  configure("dlq", {.dead_letter = true});
  const json m{{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
  new_job j = make_job("k", "dlq");
  j.metadata = m;
  j.max_attempts = 3;
  const auto id = add_at(j, 1min);  // scheduled, then promoted by the claim
  auto expect_kept = [&](const std::string& where) { EXPECT_EQ(json::parse(read(id).metadata), m) << where; };
  expect_kept("scheduled");
  be().pass_time(2min);

  auto c = claim_one("dlq");  // promoted and claimed: attempt 1
  EXPECT_EQ(metadata_of(c), m);
  EXPECT_EQ(must(db().fail(c.attempt, "boom", fail_disposition::retry, 0us)), job_state::retryable);
  expect_kept("retryable");
  be().pass_time(1s);
  c = claim_one("dlq");  // attempt 2
  EXPECT_EQ(metadata_of(c), m) << "after a retry";
  must(db().snooze(c.attempt, 0us));
  expect_kept("snoozed");
  c = claim_one("dlq");  // attempt 2 again
  EXPECT_EQ(metadata_of(c), m) << "after a snooze";
  ASSERT_THAT(rescue_all(), SizeIs(1));
  expect_kept("rescued");
  c = claim_one("dlq");  // attempt 3, the last
  EXPECT_EQ(metadata_of(c), m) << "after a rescue";
  EXPECT_EQ(must(db().fail(c.attempt, "spent", fail_disposition::retry, 0us)), job_state::failed);
  EXPECT_TRUE(read(id).dead_lettered);
  expect_kept("dead-lettered");

  ASSERT_TRUE(must(db().retry_job(id)));  // out of the dead-letter table
  expect_kept("retried by an admin");
  c = claim_one("dlq");
  EXPECT_EQ(metadata_of(c), m) << "after an admin retry";
  ASSERT_TRUE(complete(c.attempt));
  expect_kept("completed");
  ASSERT_TRUE(must(db().retry_job(id)));  // out of the terminal table
  EXPECT_TRUE(must(db().cancel_job(id)));
  expect_kept("cancelled while available");
  ASSERT_TRUE(must(db().retry_job(id)));
  c = claim_one("dlq");
  must(db().cancel_attempt(c.attempt, "not wanted"));
  expect_kept("cancelled by its handler");
}

TEST_P(storage_contract, invalid_metadata_is_refused_naming_the_field_and_nothing_is_enqueued) {
  std::vector<std::pair<std::string, json>> bad = {
      {"array", json::array({1, 2})},
      {"string", "00-a-b-01"},
      {"number", 7},
      {"boolean", true},
      {"NUL character", json{{"s", std::string("a\0b", 3)}}},
      {"invalid UTF-8", json{{"s", std::string("\xff")}}},
      // {"k": "..."} is printed by PostgreSQL as 9 bytes plus the string.
      {"one byte too long", json{{"k", std::string(k_max_metadata_size - 9 + 1, 'x')}}},
      {"far too long", json{{"k", std::string(100'000, 'x')}}},
  };
  for (const auto& [what, metadata] : bad) {
    new_job j = make_job();
    j.metadata = metadata;
    auto single = db().enqueue(j);
    EXPECT_TRUE(fails_with(single, errc::invalid_argument)) << what;
    if (!single) {
      EXPECT_THAT(single.error().detail(), StartsWith("metadata")) << what;
    }
    const std::vector<new_job> batch{make_job(), j};
    EXPECT_TRUE(fails_with(db().enqueue_batch(batch), errc::invalid_argument)) << what;
  }
  EXPECT_THAT(claim("default"), IsEmpty());

  // The limit counts the text as PostgreSQL prints it: a space after each ':' and ','.
  new_job at_limit = make_job();
  at_limit.metadata = json{{"k", std::string(k_max_metadata_size - 9, 'x')}};
  const auto id = add(at_limit);
  EXPECT_EQ(json::parse(read(id).metadata), at_limit.metadata);
  new_job spaced = make_job();
  spaced.metadata = json{{"a", 1}, {"b", std::string(k_max_metadata_size - 17, 'x')}};  // {"a": 1, "b": "..."}
  EXPECT_TRUE(must(db().enqueue(spaced)) > 0);
  spaced.metadata["b"] = std::string(k_max_metadata_size - 16, 'x');
  EXPECT_TRUE(fails_with(db().enqueue(spaced), errc::invalid_argument));
}

}  // namespace tenure::contract

// ---- metrics reads ------------------------------------------------------------------------

namespace tenure::contract {

TEST_P(storage_contract, claim_says_when_the_job_became_available) {
  const auto before = be().now();
  add_at(make_job("late", "avail"), -1min);  // run_at in the past: available since it was enqueued
  const auto c = claim_one("avail");
  ASSERT_TRUE(c.available_at.has_value());
  EXPECT_GE(*c.available_at, before - std::chrono::seconds{5});
  EXPECT_LE(*c.available_at, be().now() + std::chrono::seconds{5});
}

TEST_P(storage_contract, queue_depths_count_each_unfinished_state_per_queue) {
  add(make_job("a", "qa"));
  add(make_job("a", "qa"));
  add(make_job("a", "qa"));
  add(make_job("a", "qa"));
  add_at(make_job("later", "qa"), std::chrono::hours{1});
  add(make_job("b", "qb"));
  add(make_job("c", "qc"));
  const auto running = claim("qa", 2);
  ASSERT_EQ(running.size(), 2u);
  ASSERT_TRUE(db().fail(running[1].attempt, "again later", fail_disposition::retry, std::chrono::hours{1}));
  ASSERT_TRUE(complete(claim_one("qc").attempt));
  const auto depths = must(db().queue_depths());
  auto find = [&](std::string_view q) -> const queue_depth* {
    for (const auto& d : depths) {
      if (d.queue == q) return &d;
    }
    return nullptr;
  };
  const auto* qa = find("qa");
  const auto* qb = find("qb");
  ASSERT_NE(qa, nullptr);
  ASSERT_NE(qb, nullptr);
  EXPECT_EQ(qa->available, 2);
  EXPECT_EQ(qa->scheduled, 1);
  EXPECT_EQ(qa->retryable, 1);
  EXPECT_EQ(qa->running, 1);
  EXPECT_EQ(qa->waiting_external, 0);
  EXPECT_GE(qa->oldest_available.count(), 0);
  EXPECT_EQ(qb->available, 1);
  EXPECT_EQ(qb->running, 0);
  if (const auto* qc = find("qc")) {  // only finished jobs left: absent, or all zero
    EXPECT_EQ(qc->available + qc->scheduled + qc->retryable + qc->running + qc->waiting_external, 0);
    EXPECT_EQ(qc->oldest_available.count(), 0);
  }
  EXPECT_TRUE(std::is_sorted(depths.begin(), depths.end(),
                             [](const queue_depth& x, const queue_depth& y) { return x.queue < y.queue; }));
}

// ---- unique keys --------------------------------------------------------------------------------

namespace {
new_job keyed(std::string key, std::string queue = "default") {
  new_job j;
  j.kind = "k";
  j.queue = std::move(queue);
  j.unique_key = std::move(key);
  return j;
}
}  // namespace

TEST_P(storage_contract, a_live_job_holds_its_unique_key_and_enqueue_answers_it_without_inserting) {
  const auto first = must(db().try_enqueue(keyed("order-1")));
  EXPECT_TRUE(first.inserted);
  EXPECT_EQ(must(db().try_enqueue(keyed("order-1"))), (enqueue_result{first.id, false}));
  EXPECT_EQ(must(db().enqueue(keyed("order-1"))), first.id) << "enqueue answers the holder's id too";
  const auto other_queue = must(db().try_enqueue(keyed("order-1", "other")));
  EXPECT_TRUE(other_queue.inserted) << "keys are per queue";
  EXPECT_NE(other_queue.id, first.id);
  const auto keyless = must(db().try_enqueue(make_job()));
  EXPECT_TRUE(keyless.inserted);
  EXPECT_EQ(read(first.id).unique_key, std::optional<std::string>{"order-1"});
  EXPECT_EQ(read(keyless.id).unique_key, std::nullopt);
}

TEST_P(storage_contract, a_scheduled_running_or_retryable_job_holds_its_key_and_a_finished_one_frees_it) {
  new_job later = keyed("s");
  later.run_at = be().now() + 1h;
  const auto scheduled = must(db().try_enqueue(later));
  EXPECT_EQ(read(scheduled.id).state, job_state::scheduled);
  EXPECT_FALSE(must(db().try_enqueue(keyed("s"))).inserted);

  const auto job = must(db().try_enqueue(keyed("r", "q")));
  auto c = claim_one("q");
  EXPECT_EQ(must(db().try_enqueue(keyed("r", "q"))), (enqueue_result{job.id, false})) << "running";
  ASSERT_EQ(must(db().fail(c.attempt, "boom", fail_disposition::retry, std::chrono::hours{1})), job_state::retryable);
  EXPECT_EQ(must(db().try_enqueue(keyed("r", "q"))), (enqueue_result{job.id, false})) << "retryable";
  ASSERT_TRUE(must(db().cancel_job(job.id)));
  const auto after_cancel = must(db().try_enqueue(keyed("r", "q")));
  EXPECT_TRUE(after_cancel.inserted) << "cancelled";

  c = claim_one("q");
  ASSERT_EQ(c.attempt.job_id, after_cancel.id);
  ASSERT_TRUE(complete(c.attempt));
  const auto after_complete = must(db().try_enqueue(keyed("r", "q")));
  EXPECT_TRUE(after_complete.inserted) << "completed";

  c = claim_one("q");
  ASSERT_EQ(must(db().fail(c.attempt, "no", fail_disposition::permanent)), job_state::failed);
  EXPECT_TRUE(must(db().try_enqueue(keyed("r", "q"))).inserted) << "failed";
}

TEST_P(storage_contract, a_batch_answers_held_keys_with_their_holders_and_a_repeated_key_with_its_first_job) {
  const auto held = must(db().try_enqueue(keyed("a")));
  const std::vector<new_job> jobs{keyed("a"), keyed("b"), make_job(), keyed("b"), keyed("b", "other")};
  const auto out = must(db().try_enqueue_batch(jobs));
  ASSERT_THAT(out, SizeIs(5));
  EXPECT_EQ(out[0], (enqueue_result{held.id, false}));
  EXPECT_TRUE(out[1].inserted);
  EXPECT_TRUE(out[2].inserted);
  EXPECT_EQ(out[3], (enqueue_result{out[1].id, false}));
  EXPECT_TRUE(out[4].inserted);
  EXPECT_EQ(std::set<std::int64_t>({held.id, out[1].id, out[2].id, out[4].id}).size(), 4u);
  EXPECT_EQ(must(db().enqueue_batch(std::vector{keyed("a"), keyed("b")})), (std::vector<std::int64_t>{held.id, out[1].id}))
      << "enqueue_batch answers the holders' ids";
}

TEST_P(storage_contract, a_unique_key_that_is_empty_too_long_or_has_control_characters_is_refused) {
  for (const std::string& key : {std::string{}, std::string(k_max_unique_key_size + 1, 'x'), std::string{"a\tb"},
                                 std::string{"\xff"}}) {
    const auto one = db().try_enqueue(keyed(key));
    EXPECT_TRUE(fails_with(one, errc::invalid_argument)) << key.size();
    if (!one) {
      EXPECT_THAT(one.error().detail(), StartsWith("unique_key"));
    }
    EXPECT_TRUE(fails_with(db().try_enqueue_batch(std::vector{keyed("fine"), keyed(key)}), errc::invalid_argument));
  }
  EXPECT_TRUE(must(db().try_enqueue(keyed(std::string(k_max_unique_key_size, 'x')))).inserted);
  EXPECT_TRUE(must(db().try_enqueue(keyed("fine"))).inserted) << "the refused batches wrote nothing";
}

TEST_P(storage_contract, retry_job_of_a_finished_keyed_job_is_refused_while_another_live_job_holds_its_key) {
  const auto first = must(db().try_enqueue(keyed("again")));
  ASSERT_TRUE(must(db().cancel_job(first.id)));
  EXPECT_TRUE(must(db().retry_job(first.id)));
  EXPECT_EQ(must(db().try_enqueue(keyed("again"))), (enqueue_result{first.id, false})) << "holds it again";
  ASSERT_TRUE(must(db().cancel_job(first.id)));
  const auto second = must(db().try_enqueue(keyed("again")));
  ASSERT_TRUE(second.inserted);
  EXPECT_TRUE(fails_with(db().retry_job(first.id), errc::invalid_argument));
  EXPECT_EQ(read(first.id).state, job_state::cancelled);
}

TEST_P(storage_contract, concurrent_producers_of_one_key_get_one_job) {
  constexpr int k_threads = 6;
  std::vector<std::unique_ptr<storage_port>> connections;
  for (int t = 0; t < k_threads; ++t) connections.push_back(be().another_connection());
  std::mutex mu;
  std::vector<enqueue_result> got;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < k_threads; ++t) {
    threads.emplace_back([&, t] {
      auto r = retry_transient([&] { return connections[static_cast<std::size_t>(t)]->try_enqueue(keyed("race")); });
      std::lock_guard lock(mu);
      if (r) {
        got.push_back(r.value());
      } else {
        errors.push_back(r.error().message());
      }
    });
  }
  for (auto& th : threads) th.join();
  connections.clear();
  EXPECT_THAT(errors, IsEmpty());
  ASSERT_THAT(got, SizeIs(k_threads));
  EXPECT_EQ(std::count_if(got.begin(), got.end(), [](const enqueue_result& r) { return r.inserted; }), 1);
  for (const auto& r : got) EXPECT_EQ(r.id, got.front().id);
  EXPECT_THAT(claim(), SizeIs(1));
}

// ---- external callbacks: blocking waits and parked attempts ---------------------------------

TEST_P(storage_contract, a_blocking_wait_parks_on_the_first_poll_and_sees_the_resume) {
  const auto id = add(make_job());
  const auto c = claim_one();
  const auto cb = must(db().register_callback(c.attempt, 1h));
  EXPECT_FALSE(must(db().await_callback(c.attempt, cb)).resumed);
  EXPECT_EQ(read(id).state, job_state::waiting_external);
  EXPECT_FALSE(complete(c.attempt)) << "a waiting attempt is owned by its callback";
  EXPECT_TRUE(must(db().resume_callback(cb, R"({"ok": true})")));
  const auto poll = must(db().await_callback(c.attempt, cb));
  EXPECT_TRUE(poll.resumed);
  EXPECT_EQ(json::parse(poll.payload), json({{"ok", true}}));
  EXPECT_EQ(read(id).state, job_state::running) << "a blocking waiter is resumed in place";
  EXPECT_TRUE(complete(c.attempt));
}

TEST_P(storage_contract, a_parked_attempt_is_continued_by_a_new_run_lease_with_its_attempt_and_the_resume_payload) {
  const auto id = add(make_job());
  const auto c = claim_one();
  const auto cb = must(db().register_callback(c.attempt, 1h));
  EXPECT_EQ(must(db().park_callback(c.attempt, cb)), park_result::parked);
  EXPECT_EQ(read(id).state, job_state::waiting_external);
  EXPECT_FALSE(complete(c.attempt)) << "a parked attempt is owned by its callback";
  EXPECT_THAT(rescue_all(), IsEmpty()) << "nothing heartbeats a parked attempt; it is not stale";
  EXPECT_TRUE(must(db().resume_callback(cb, R"({"approved": "yes"})")));
  EXPECT_FALSE(must(db().resume_callback(cb, "{}"))) << "one resume wins";
  const auto ready = read(id);
  EXPECT_EQ(ready.state, job_state::available);
  EXPECT_EQ(ready.run_lease, c.attempt.run_lease);
  EXPECT_EQ(ready.attempt, 1);
  const auto next = claim_one();
  EXPECT_EQ(next.attempt.job_id, id);
  EXPECT_GT(next.attempt.run_lease, c.attempt.run_lease) << "a continuation is a claim: a new run lease";
  EXPECT_EQ(next.attempt_number, 1) << "no attempt consumed";
  EXPECT_FALSE(complete(c.attempt)) << "the parked attempt's lease is closed";
  ASSERT_TRUE(next.resumed_with);
  EXPECT_EQ(json::parse(*next.resumed_with), json({{"approved", "yes"}}));
  EXPECT_FALSE(next.secret == c.secret) << "the continuation draws a new secret";
  // It may park again, on a new callback; the old one stays resolved.
  const auto cb2 = must(db().register_callback(next.attempt, 1h));
  EXPECT_NE(cb2, cb);
  EXPECT_EQ(must(db().park_callback(next.attempt, cb2)), park_result::parked);
  EXPECT_FALSE(must(db().resume_callback(cb, "{}")));
  EXPECT_TRUE(must(db().resume_callback(cb2, R"({"round": 2})")));
  const auto third = claim_one();
  EXPECT_EQ(third.attempt.job_id, id);
  EXPECT_GT(third.attempt.run_lease, next.attempt.run_lease);
  EXPECT_EQ(third.attempt_number, 1);
  EXPECT_EQ(json::parse(third.resumed_with.value_or("null")), json({{"round", 2}}));
  EXPECT_TRUE(complete(third.attempt));
  EXPECT_EQ(read(id).state, job_state::completed);
}

TEST_P(storage_contract, a_heartbeat_after_the_park_does_not_answer_the_parked_attempt_live_and_keeps_its_progress) {
  // A runtime's heartbeat collected while the handler was parking can arrive after the park.
  const auto id = add(make_job());
  const auto c = claim_one();
  const std::vector<attempt_id> attempts{c.attempt};
  const auto cb = must(db().register_callback(c.attempt, 1h));
  EXPECT_THAT(must(db().heartbeat(attempts)), ElementsAre(c.attempt)) << "held by its handler";
  ASSERT_EQ(must(db().park_callback(c.attempt, cb)), park_result::parked);
  const std::vector<std::optional<std::string>> last{R"({"last": 7})"};
  EXPECT_THAT(must(db().heartbeat(attempts, last)), IsEmpty()) << "no handler holds a parked attempt";
  EXPECT_EQ(read(id).state, job_state::waiting_external);
  EXPECT_EQ(parsed(read(id).progress), json({{"last", 7}})) << "the progress it carried is kept";
  EXPECT_THAT(rescue_all(), IsEmpty());
  ASSERT_TRUE(must(db().resume_callback(cb, "{}")));
  const auto next = claim_one();
  EXPECT_THAT(must(db().heartbeat(std::vector<attempt_id>{next.attempt})), ElementsAre(next.attempt))
      << "the continuation is held by its handler again";
}

TEST_P(storage_contract, a_continuation_given_back_rescued_or_retried_stays_a_continuation_with_its_payload) {
  new_job j = make_job();
  j.max_attempts = 3;
  const auto id = add(j);
  const auto c = claim_one();
  const auto cb = must(db().register_callback(c.attempt, 1h));
  ASSERT_EQ(must(db().park_callback(c.attempt, cb)), park_result::parked);
  ASSERT_TRUE(must(db().resume_callback(cb, R"({"approved": "yes"})")));
  const json payload = {{"approved", "yes"}};

  // Given back by a stopping runtime: the same attempt, the same payload.
  const auto first = claim_one();
  ASSERT_EQ(first.attempt_number, 1);
  must(db().snooze(first.attempt, 0us));
  EXPECT_EQ(read(id).attempt, 1);
  const auto second = claim_one();
  EXPECT_EQ(second.attempt.job_id, id);
  EXPECT_EQ(second.attempt_number, 1) << "a give-back spends no attempt";
  EXPECT_EQ(json::parse(second.resumed_with.value_or("null")), payload);

  // Its worker died: rescued, and continued again as the next attempt.
  ASSERT_THAT(rescue_all(), SizeIs(1));
  EXPECT_EQ(read(id).state, job_state::available);
  const auto third = claim_one();
  EXPECT_EQ(third.attempt_number, 2) << "the rescued attempt counts";
  EXPECT_EQ(json::parse(third.resumed_with.value_or("null")), payload) << "the callback's answer survives the rescue";

  // It failed: retried as the same continuation, as the next attempt.
  ASSERT_EQ(must(db().fail(third.attempt, "boom", fail_disposition::retry, 0us)), job_state::retryable);
  const auto fourth = claim_one();
  EXPECT_EQ(fourth.attempt_number, 3);
  EXPECT_EQ(json::parse(fourth.resumed_with.value_or("null")), payload) << "the callback's answer survives the retry";

  // Out of attempts, the job fails and the payload ends with it.
  ASSERT_EQ(must(db().fail(fourth.attempt, "boom", fail_disposition::retry, 0us)), job_state::failed);
  EXPECT_EQ(read(id).state, job_state::failed);
  EXPECT_THAT(claim(), IsEmpty());
}

TEST_P(storage_contract, an_ordinary_claim_has_no_resume_payload) {
  add(make_job());
  EXPECT_FALSE(claim_one().resumed_with);
}

TEST_P(storage_contract, parking_after_an_early_resume_makes_the_attempt_claimable_at_once) {
  const auto id = add(make_job());
  const auto c = claim_one();
  const auto cb = must(db().register_callback(c.attempt, 1h));
  EXPECT_TRUE(must(db().resume_callback(cb, R"({"early": 1})")));
  EXPECT_EQ(read(id).state, job_state::running);
  EXPECT_EQ(must(db().park_callback(c.attempt, cb)), park_result::resumed);
  const auto next = claim_one();
  EXPECT_EQ(next.attempt.job_id, id);
  EXPECT_GT(next.attempt.run_lease, c.attempt.run_lease) << "the continuation is a new attempt of the same number";
  EXPECT_EQ(json::parse(next.resumed_with.value_or("null")), json({{"early", 1}}));
}

TEST_P(storage_contract, complete_and_fail_callback_close_a_parked_attempt) {
  add(make_job());
  add(make_job());
  const auto a = claim_one();
  const auto b = claim_one();
  const auto cb_a = must(db().register_callback(a.attempt, 1h));
  const auto cb_b = must(db().register_callback(b.attempt, 1h));
  ASSERT_EQ(must(db().park_callback(a.attempt, cb_a)), park_result::parked);
  ASSERT_EQ(must(db().park_callback(b.attempt, cb_b)), park_result::parked);
  EXPECT_TRUE(must(db().complete_callback(cb_a, R"({"by": "outside"})")));
  EXPECT_TRUE(must(db().fail_callback(cb_b, "refused", false)));
  const auto d = read(a.attempt.job_id);
  EXPECT_EQ(d.state, job_state::completed);
  EXPECT_EQ(json::parse(d.progress.value_or("null")), json({{"by", "outside"}}));
  const auto f = read(b.attempt.job_id);
  EXPECT_EQ(f.state, job_state::failed);
  EXPECT_EQ(f.last_error.value_or(""), "refused");
  EXPECT_FALSE(must(db().resume_callback(cb_a, "{}")));
  EXPECT_FALSE(must(db().resume_callback(cb_b, "{}")));
  EXPECT_THAT(claim(), IsEmpty());
}

TEST_P(storage_contract, the_callback_timeout_rescues_a_parked_attempt) {
  new_job j = make_job();
  j.max_attempts = 3;
  const auto id = add(j);
  const auto c = claim_one();
  const auto cb = must(db().register_callback(c.attempt, 1s));
  ASSERT_EQ(must(db().park_callback(c.attempt, cb)), park_result::parked);
  EXPECT_THAT(must(db().rescue_stale(k_never)), IsEmpty());
  be().pass_time(2s);
  const auto rescued = must(db().rescue_stale(k_never));
  ASSERT_THAT(rescued, SizeIs(1));
  EXPECT_EQ(rescued[0].attempt, c.attempt);
  EXPECT_EQ(rescued[0].new_state, job_state::available);
  EXPECT_EQ(read(id).last_error.value_or(""), "rescued: callback timed out");
  EXPECT_FALSE(must(db().resume_callback(cb, "{}"))) << "too late: the attempt was rescued";
  const auto next = claim_one();
  EXPECT_GT(next.attempt.run_lease, c.attempt.run_lease) << "retried as a new attempt";
  EXPECT_FALSE(next.resumed_with);
}

TEST_P(storage_contract, cancel_job_of_a_parked_attempt_cancels_it_and_its_callback) {
  const auto id = add(make_job());
  const auto c = claim_one();
  const auto cb = must(db().register_callback(c.attempt, 1h));
  ASSERT_EQ(must(db().park_callback(c.attempt, cb)), park_result::parked);
  EXPECT_TRUE(must(db().cancel_job(id)));
  EXPECT_EQ(read(id).state, job_state::cancelled);
  EXPECT_FALSE(must(db().resume_callback(cb, "{}")));
  EXPECT_TRUE(fails_with(db().park_callback(c.attempt, cb), errc::stale_attempt));
}

TEST_P(storage_contract, park_callback_names_the_live_attempt_and_its_current_callback) {
  add(make_job());
  const auto c = claim_one();
  const auto first = must(db().register_callback(c.attempt, 1h));
  const auto second = must(db().register_callback(c.attempt, 1h));
  EXPECT_TRUE(fails_with(db().park_callback(c.attempt, first), errc::stale_attempt)) << "rotated";
  EXPECT_TRUE(fails_with(db().park_callback({c.attempt.job_id, c.attempt.run_lease + 1}, second),
                         errc::stale_attempt));
  EXPECT_TRUE(fails_with(db().park_callback(c.attempt, "00000000-0000-4000-8000-000000000000"),
                         errc::stale_attempt));
  EXPECT_EQ(must(db().park_callback(c.attempt, second)), park_result::parked);
}

}  // namespace tenure::contract
