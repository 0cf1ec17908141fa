// Transactional enqueue through each bridge (libpq, SOCI, libpqxx), on the caller's own
// connection: the job exists if and only if the caller's transaction commits.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "adapters/bridges/caller_tx.hpp"
#include "support/pg.hpp"
#include "tenure/postgres/sql_text.hpp"
#include "tenure/postgres/store.hpp"

using namespace std::chrono_literals;
using namespace tenure::test;  // bridge, caller_tx, pg, scoped_schema
using tenure::errc;
using tenure::new_job;

namespace {

class bridge_enqueue : public ::testing::TestWithParam<bridge> {
 protected:
  void SetUp() override {
    check_.exec("CREATE TABLE " + s("orders") + " (id serial PRIMARY KEY, note text)");
    opts_.schema = schema_.name();
  }
  std::unique_ptr<caller_tx> open_tx() { return open_caller_tx(GetParam(), schema_.dsn()); }
  std::string s(const std::string& n) const { return schema_.name() + "." + n; }
  long count(const std::string& table) { return std::stol(check_.scalar("SELECT count(*) FROM " + s(table))); }
  std::string insert_order() const { return "INSERT INTO " + s("orders") + " (note) VALUES ('paid')"; }
  void expect_copied_in_input_order(const std::vector<new_job>& jobs, const std::string& paths);
  std::vector<std::int64_t> committed_through(const std::vector<std::string>& setup, const std::vector<new_job>& jobs,
                                              const std::string& paths);
  std::vector<std::string> woken_by(const std::vector<new_job>& jobs, const std::vector<std::string>& idle,
                                    const std::string& paths);
  std::vector<tenure::claimed_attempt> claim(int n) {
    auto st = tenure::postgres::store::open({.dsn = schema_.dsn(), .schema = schema_.name()});
    EXPECT_TRUE(st) << st.error().message();
    auto got = st.value()->claim("default", n, "test");
    EXPECT_TRUE(got) << got.error().message();
    return got.value();
  }
  /// A metadata object within the limit as this process measures it, over it as PostgreSQL
  /// prints it: 1e100 is 6 bytes here and 101 there.
  static nlohmann::json metadata_only_the_server_measures_over_the_limit() {
    nlohmann::json m{{"n", 1e100}};
    m["pad"] = std::string(tenure::k_max_metadata_size - 40, 'x');
    return m;
  }
  /// The caller's connection taken away by the server (its backend terminated) before `call`.
  template <class Call>
  auto after_the_backend_is_terminated(caller_tx& tx, Call&& call) {
    const std::string pid = std::to_string(tx.backend_pid());
    EXPECT_EQ(check_.scalar("SELECT pg_terminate_backend($1)", {pid}), "t");
    for (int i = 0; i < 200 && check_.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", {pid}) != "0";
         ++i) {
      std::this_thread::sleep_for(10ms);
    }
    return call();
  }

  scoped_schema schema_{"benq"};
  pg check_{schema_.dsn()};
  tenure::sql_options opts_;
};

TEST_P(bridge_enqueue, commit_makes_the_business_row_and_the_job_exist_and_a_claim_sees_it) {
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order());
  auto id = tx->enqueue({.kind = "charge", .args = {{"order", 1}}}, opts_);
  ASSERT_TRUE(id) << id.error().message();
  EXPECT_EQ(count("jobs"), 0) << "invisible before the caller commits";
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(count("orders"), 1);
  const auto claimed = claim(10);
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_EQ(claimed[0].attempt.job_id, id.value());
  EXPECT_EQ(claimed[0].kind, "charge");
  EXPECT_EQ(nlohmann::json::parse(claimed[0].args), (nlohmann::json{{"order", 1}}));
}

TEST_P(bridge_enqueue, rollback_leaves_neither_the_business_row_nor_the_job) {
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order());
  ASSERT_TRUE(tx->enqueue({.kind = "charge"}, opts_));
  const std::vector<new_job> two{{.kind = "a"}, {.kind = "b"}};
  ASSERT_TRUE(tx->enqueue_batch(two, opts_));
  tx->rollback();
  EXPECT_EQ(count("jobs"), 0);
  EXPECT_EQ(count("orders"), 0);
  EXPECT_TRUE(claim(10).empty());
}

TEST_P(bridge_enqueue, batch_is_one_statement_with_ids_in_input_order) {
  std::vector<new_job> jobs;
  for (int i = 0; i < 500; ++i) {
    jobs.push_back({.kind = "k", .args = {{"i", i}, {"quote", "a\"b\\c'd{,}"}}, .queue = i % 2 ? "odd" : "even"});
  }
  jobs[7].run_at = tenure::clock_type::now() + 1h;
  auto tx = open_tx();
  tx->begin();
  tx->exec("SET LOCAL track_functions = 'pl'");
  auto ids = tx->enqueue_batch(jobs, opts_);
  ASSERT_TRUE(ids) << ids.error().message();
  ASSERT_EQ(ids.value().size(), jobs.size());
  // Counted by the server inside this transaction: one call of enqueue_batch, none of enqueue.
  EXPECT_EQ(tx->scalar("SELECT coalesce(pg_stat_get_xact_function_calls('" + s("enqueue_batch") + "'::regproc), 0)"),
            "1");
  EXPECT_EQ(tx->scalar("SELECT coalesce(pg_stat_get_xact_function_calls('" + s("enqueue") +
                       "(text,jsonb,text,int,timestamptz,int,jsonb,text)'::regprocedure), 0)"),
            "0");
  ASSERT_TRUE(tx->commit());
  for (std::size_t i = 0; i < jobs.size(); i += 61) {
    EXPECT_EQ(check_.scalar("SELECT (args->>'i') || queue || (args->>'quote') FROM " + s("jobs") + " WHERE id = $1",
                            {std::to_string(ids.value()[i])}),
              std::to_string(i) + (i % 2 ? "odd" : "even") + "a\"b\\c'd{,}");
  }
  EXPECT_EQ(check_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {std::to_string(ids.value()[7])}),
            "scheduled");
  EXPECT_TRUE(std::is_sorted(ids.value().begin(), ids.value().end()));
}

TEST_P(bridge_enqueue, invalid_job_is_refused_before_anything_is_sent_and_the_transaction_stays_usable) {
  auto tx = open_tx();
  tx->begin();
  auto one = tx->enqueue({.kind = "k", .priority = 9}, opts_);
  ASSERT_FALSE(one);
  EXPECT_EQ(one.error(), errc::invalid_argument);
  EXPECT_EQ(one.error().detail(), "priority 9 outside 1..4");
  auto meta = tx->enqueue({.kind = "k", .metadata = nlohmann::json::array({1})}, opts_);
  ASSERT_FALSE(meta);
  EXPECT_EQ(meta.error().detail(), "metadata must be a JSON object, not array");
  std::vector<new_job> batch(10, new_job{.kind = "k"});
  batch[5].metadata = {{"k", std::string(10'000, 'x')}};
  auto many = tx->enqueue_batch(batch, opts_);
  ASSERT_FALSE(many);
  EXPECT_EQ(many.error(), errc::invalid_argument);
  EXPECT_EQ(many.error().detail(), "metadata is 10009 bytes as JSON text, more than 8192");
  auto schema = tx->enqueue({.kind = "k"}, {.schema = "Bad-Name"});
  ASSERT_FALSE(schema);
  EXPECT_EQ(schema.error(), errc::invalid_argument);
  // Nothing was sent: the caller's transaction goes on and commits its own write.
  tx->exec(insert_order());
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(count("orders"), 1);
  EXPECT_EQ(count("jobs"), 0);
}

TEST_P(bridge_enqueue, a_job_the_server_refuses_is_invalid_argument_with_its_message_and_aborts_the_transaction) {
  const new_job job{.kind = "k", .metadata = metadata_only_the_server_measures_over_the_limit()};
  ASSERT_TRUE(tenure::validate(job)) << "the client's measure lets it through";
  for (const bool batch : {false, true}) {
    SCOPED_TRACE(batch ? "enqueue_batch" : "enqueue");
    auto tx = open_tx();
    tx->begin();
    tx->exec(insert_order());
    tenure::error e;
    if (batch) {
      const std::vector<new_job> jobs{{.kind = "k"}, job};
      auto r = tx->enqueue_batch(jobs, opts_);
      ASSERT_FALSE(r);
      e = r.error();
    } else {
      auto r = tx->enqueue(job, opts_);
      ASSERT_FALSE(r);
      e = r.error();
    }
    EXPECT_EQ(e, errc::invalid_argument) << e.message();
    EXPECT_EQ(e.sqlstate(), "22023");
    EXPECT_TRUE(e.detail().starts_with(batch ? "tenure.enqueue_batch" : "tenure.enqueue")) << e.detail();
    EXPECT_NE(e.detail().find("metadata must be at most 8192 bytes as JSON text"), std::string::npos) << e.detail();
    EXPECT_EQ(e.detail().find('\n'), std::string::npos) << "one line";
    EXPECT_TRUE(e.detail().ends_with("(the caller's transaction is aborted: roll it back)")) << e.detail();
    EXPECT_FALSE(tx->commit()) << "the refused statement aborted the caller's transaction";
  }
  EXPECT_EQ(count("orders"), 0);
  EXPECT_EQ(count("jobs"), 0);
}

TEST_P(bridge_enqueue, a_schema_without_tenure_is_schema_mismatch_with_the_servers_message) {
  auto tx = open_tx();
  tx->begin();
  auto r = tx->enqueue({.kind = "k"}, {.schema = "no_tenure_here"});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::schema_mismatch) << r.error().message();
  EXPECT_EQ(r.error().sqlstate(), "3F000");
  EXPECT_EQ(r.error().detail(),
            "schema \"no_tenure_here\" does not exist (the caller's transaction is aborted: roll it back)");
  tx->rollback();
}

// Never a job committed on its own while the caller believes it is in a transaction.
TEST_P(bridge_enqueue, in_an_aborted_transaction_enqueue_is_a_protocol_error_and_writes_nothing) {
  auto tx = open_tx();
  tx->begin();
  EXPECT_ANY_THROW(tx->exec("SELECT 1/0"));
  auto one = tx->enqueue({.kind = "k"}, opts_);
  ASSERT_FALSE(one);
  EXPECT_EQ(one.error(), errc::protocol_error) << one.error().message();
  // libpq and SOCI see the aborted transaction on the connection; pqxx rolled it back already.
  EXPECT_TRUE(one.error().detail().starts_with("enqueue")) << one.error().detail();
  const std::vector<new_job> two{{.kind = "a"}, {.kind = "b"}};
  auto many = tx->enqueue_batch(two, opts_);
  ASSERT_FALSE(many);
  EXPECT_EQ(many.error(), errc::protocol_error) << many.error().message();
  tx->rollback();
  EXPECT_EQ(count("jobs"), 0);
}

TEST_P(bridge_enqueue, outside_a_transaction_the_job_commits_on_its_own) {
  auto tx = open_tx();
  tx->begin_autocommit();
  auto id = tx->enqueue({.kind = "charge"}, opts_);
  ASSERT_TRUE(id) << id.error().message();
  EXPECT_EQ(check_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {std::to_string(id.value())}),
            "available")
      << "visible at once: no transaction held it";
}

TEST_P(bridge_enqueue, metadata_reaches_the_claim) {
  const nlohmann::json m{{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
  auto tx = open_tx();
  tx->begin();
  auto one = tx->enqueue({.kind = "charge", .metadata = m}, opts_);
  ASSERT_TRUE(one) << one.error().message();
  const std::vector<new_job> jobs{{.kind = "charge", .metadata = m}, {.kind = "charge"}};
  auto many = tx->enqueue_batch(jobs, opts_);
  ASSERT_TRUE(many) << many.error().message();
  ASSERT_TRUE(tx->commit());
  std::map<std::int64_t, nlohmann::json> seen;
  for (const auto& c : claim(10)) {
    seen[c.attempt.job_id] = c.metadata.empty() ? nlohmann::json::object() : nlohmann::json::parse(c.metadata);
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[one.value()], m);
  EXPECT_EQ(seen[many.value()[0]], m);
  EXPECT_EQ(seen[many.value()[1]], nlohmann::json::object());
}

TEST_P(bridge_enqueue, a_connection_lost_inside_the_callers_transaction_is_unavailable_and_writes_nothing) {
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order());
  auto r = after_the_backend_is_terminated(*tx, [&] { return tx->enqueue({.kind = "charge"}, opts_); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::database_unavailable) << r.error().message();
  EXPECT_EQ(count("jobs"), 0);
  EXPECT_EQ(count("orders"), 0);
}

TEST_P(bridge_enqueue, a_connection_lost_in_autocommit_is_in_doubt) {
  auto tx = open_tx();
  tx->begin_autocommit();
  const std::vector<new_job> two{{.kind = "a"}, {.kind = "b"}};
  auto r = after_the_backend_is_terminated(*tx, [&] { return tx->enqueue_batch(two, opts_); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::commit_in_doubt) << r.error().message();
}

TEST_P(bridge_enqueue, a_keyed_enqueue_says_whether_it_inserted_and_answers_the_live_holder_otherwise) {
  const new_job keyed{.kind = "charge", .unique_key = "order-7"};
  auto tx = open_tx();
  tx->begin();
  auto first = tx->try_enqueue(keyed, opts_);
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_TRUE(first.value().inserted);
  auto again = tx->try_enqueue(keyed, opts_);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again.value().id, first.value().id);
  EXPECT_FALSE(again.value().inserted) << "held by the caller's own uncommitted job";
  ASSERT_TRUE(tx->commit());

  tx->begin();
  EXPECT_EQ(tx->enqueue(keyed, opts_).value(), first.value().id);
  const std::vector<new_job> batch{keyed, {.kind = "k", .unique_key = "new"}, {.kind = "k"},
                                   {.kind = "k", .unique_key = "new"}};
  auto out = tx->try_enqueue_batch(batch, opts_);
  ASSERT_TRUE(out) << out.error().message();
  ASSERT_EQ(out.value().size(), 4u);
  EXPECT_EQ(out.value()[0].id, first.value().id);
  EXPECT_FALSE(out.value()[0].inserted);
  EXPECT_TRUE(out.value()[1].inserted);
  EXPECT_TRUE(out.value()[2].inserted);
  EXPECT_EQ(out.value()[3].id, out.value()[1].id);
  EXPECT_FALSE(out.value()[3].inserted);
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(count("jobs"), 3);
  EXPECT_EQ(check_.scalar("SELECT unique_key FROM " + s("jobs") + " WHERE id = $1",
                          {std::to_string(out.value()[1].id)}),
            "new");
}

TEST_P(bridge_enqueue, a_producer_waits_for_an_uncommitted_holder_and_inserts_once_it_rolled_back_or_answers_it_once_committed) {
  const new_job keyed{.kind = "charge", .unique_key = "order-8"};
  for (const bool holder_commits : {false, true}) {
    auto holder = open_tx();
    holder->begin();
    auto held = holder->try_enqueue(keyed, opts_);
    ASSERT_TRUE(held && held.value().inserted);
    tenure::result<tenure::enqueue_result> waited = errc::protocol_error;
    std::thread other([&] {
      auto tx = open_tx();
      tx->begin();
      waited = tx->try_enqueue(keyed, opts_);
      EXPECT_TRUE(tx->commit());
    });
    std::this_thread::sleep_for(100ms);  // the other producer is now waiting for the holder
    if (holder_commits) {
      ASSERT_TRUE(holder->commit());
    } else {
      holder->rollback();
    }
    other.join();
    ASSERT_TRUE(waited) << waited.error().message();
    if (holder_commits) {
      EXPECT_EQ(waited.value().id, held.value().id);
      EXPECT_FALSE(waited.value().inserted);
    } else {
      EXPECT_NE(waited.value().id, held.value().id);
      EXPECT_TRUE(waited.value().inserted);
      // Free the key for the next round.
      check_.exec("SELECT " + s("cancel_job") + "($1)", {std::to_string(waited.value().id)});
    }
  }
}

// ---- bulk enqueue over COPY ----------------------------------------------------------------------

/// How many times this transaction called each of tenure's enqueue paths (needs
/// SET LOCAL track_functions = 'pl' first).
std::string paths_called(caller_tx& tx, const std::string& schema) {
  return tx.scalar("SELECT 'batch ' || coalesce(pg_stat_get_xact_function_calls('" + schema +
                   ".enqueue_batch'::regproc), 0) || ', copied ' || coalesce(pg_stat_get_xact_function_calls('" +
                   schema + ".enqueue_copied'::regproc), 0) || ', ready ' || coalesce(pg_stat_get_xact_function_calls('" +
                   schema + ".enqueue_copied_ready'::regproc), 0)");
}

/// 2,500 jobs whose fields vary and whose text needs COPY's escapes; one carries metadata.
std::vector<new_job> varied_jobs() {
  std::vector<new_job> jobs;
  for (int i = 0; i < 2'500; ++i) {
    jobs.push_back({.kind = i % 3 ? "k" : "k\\slash",
                    .args = {{"i", i}, {"text", "tab\tnew\nline \\ \"quote\" {,} \u00e9\u2713"}},
                    .queue = i % 2 ? "odd" : "even",
                    .priority = 1 + i % 4,
                    .max_attempts = 1 + i % 7});
  }
  jobs[11].metadata = {{"traceparent", "00-4bf9-01"}, {"tab", "a\tb"}};
  return jobs;
}

/// Enqueues `jobs` in a caller transaction that first runs `setup`, expects it to take `paths`
/// (as paths_called() says), commits, and answers the ids (none when anything failed).
std::vector<std::int64_t> bridge_enqueue::committed_through(const std::vector<std::string>& setup,
                                                            const std::vector<new_job>& jobs, const std::string& paths) {
  auto tx = open_tx();
  tx->begin();
  for (const auto& sql : setup) tx->exec(sql);
  tx->exec("SET LOCAL track_functions = 'pl'");
  auto ids = tx->enqueue_batch(jobs, opts_);
  EXPECT_TRUE(ids) << ids.error().message();
  if (!ids) return {};
  EXPECT_EQ(paths_called(*tx, schema_.name()), paths);
  EXPECT_TRUE(tx->commit());
  return ids.value();
}

/// Enqueues `jobs` in one caller transaction, which must take `paths` (as paths_called() says),
/// and checks that the ids come back in input order, each naming its job with every field.
void bridge_enqueue::expect_copied_in_input_order(const std::vector<new_job>& jobs, const std::string& paths) {
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order());
  tx->exec("SET LOCAL track_functions = 'pl'");
  auto ids = tx->enqueue_batch(jobs, opts_);
  ASSERT_TRUE(ids) << ids.error().message();
  ASSERT_EQ(ids.value().size(), jobs.size());
  EXPECT_EQ(paths_called(*tx, schema_.name()), paths);
  EXPECT_EQ(count("jobs"), 0) << "invisible before the caller commits";
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(count("jobs"), static_cast<long>(jobs.size()));
  EXPECT_EQ(count("orders"), 1);
  EXPECT_TRUE(std::is_sorted(ids.value().begin(), ids.value().end()));
  EXPECT_EQ(std::adjacent_find(ids.value().begin(), ids.value().end()), ids.value().end());
  for (std::size_t i = 0; i < jobs.size(); i += (i < 11 ? 1 : 97)) {
    const auto row = check_.query("SELECT kind, args::text, queue, priority, max_attempts, metadata::text, state, "
                                  "attempt FROM " + s("jobs") + " WHERE id = $1",
                                  {std::to_string(ids.value()[i])});
    ASSERT_TRUE(row.ok && row.rows.size() == 1) << i;
    const auto& j = jobs[i];
    EXPECT_EQ(row.at(0, 0), j.kind) << i;
    EXPECT_EQ(nlohmann::json::parse(row.at(0, 1)), j.args) << i;
    EXPECT_EQ(row.at(0, 2), j.queue) << i;
    EXPECT_EQ(row.at(0, 3), std::to_string(j.priority)) << i;
    EXPECT_EQ(row.at(0, 4), std::to_string(j.max_attempts)) << i;
    EXPECT_EQ(nlohmann::json::parse(row.at(0, 5)), j.metadata.is_null() ? nlohmann::json::object() : j.metadata) << i;
    EXPECT_EQ(row.at(0, 6), j.run_at ? "scheduled" : "available") << i;
    EXPECT_EQ(row.at(0, 7), "0") << i;
  }
}

TEST_P(bridge_enqueue, a_large_batch_inside_a_transaction_goes_through_copy_with_ids_in_input_order) {
  auto jobs = varied_jobs();
  jobs[7].run_at = tenure::clock_type::now() + 1h;
  expect_copied_in_input_order(jobs, "batch 0, copied 1, ready 0");  // a scheduled job: through the stage
}

TEST_P(bridge_enqueue, a_batch_of_jobs_to_run_now_is_copied_straight_into_ready_with_ids_in_input_order) {
  expect_copied_in_input_order(varied_jobs(), "batch 0, copied 0, ready 1");
  auto tx = open_tx();
  tx->begin();
  ASSERT_TRUE(tx->enqueue_batch(varied_jobs(), opts_));
  EXPECT_EQ(tx->scalar("SELECT to_regclass('pg_temp.tenure_enqueue_' || '" + schema_.name() +
                       "'::regnamespace::oid) IS NULL"),
            "t")
      << "no stage was made in this session";
  tx->rollback();
}

TEST_P(bridge_enqueue, copies_straight_into_ready_inside_savepoints_answer_each_batch_its_own_ids) {
  // Rows written inside a savepoint carry the subtransaction's id, not the transaction's.
  const auto batch = [](const std::string& tag, int n) {
    std::vector<new_job> jobs;
    for (int i = 0; i < n; ++i) jobs.push_back({.kind = "k", .args = {{"tag", tag}, {"i", i}}});
    return jobs;
  };
  auto tx = open_tx();
  tx->begin();
  tx->exec("SET LOCAL track_functions = 'pl'");
  std::map<std::string, std::vector<std::int64_t>> got;
  const auto enqueue = [&](const std::string& tag, int n) {
    auto ids = tx->enqueue_batch(batch(tag, n), opts_);
    ASSERT_TRUE(ids) << tag << ": " << ids.error().message();
    got[tag] = ids.value();
  };
  auto arrays = opts_;
  arrays.copy_threshold = 0;
  auto before = tx->enqueue_batch(batch("arrays", 1'000), arrays);  // same transaction id, lower ids
  ASSERT_TRUE(before);
  got["arrays"] = before.value();
  enqueue("top", 1'100);
  tx->exec("SAVEPOINT a");
  enqueue("in_a", 1'200);
  tx->exec("SAVEPOINT b");
  enqueue("in_b", 1'300);
  enqueue("in_b_again", 1'000);
  tx->exec("RELEASE SAVEPOINT b");
  tx->exec("RELEASE SAVEPOINT a");
  tx->exec("SAVEPOINT c");
  enqueue("rolled_back", 1'000);
  tx->exec("ROLLBACK TO SAVEPOINT c");
  enqueue("after", 1'400);
  EXPECT_EQ(paths_called(*tx, schema_.name()), "batch 1, copied 0, ready 6");
  ASSERT_TRUE(tx->commit());
  long kept = 0;
  for (const auto& [tag, ids] : got) {
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end())) << tag;
    // Each answered id is the row of that batch at that position.
    const std::string matched = check_.scalar(
        "SELECT count(*) FROM unnest($1::bigint[]) WITH ORDINALITY AS a(id, ord) JOIN " + s("jobs") +
            " j ON j.id = a.id WHERE j.args->>'tag' = $2 AND (j.args->>'i')::bigint = a.ord - 1",
        {tenure::postgres::int_array(ids), tag});
    if (tag == "rolled_back") {
      EXPECT_EQ(matched, "0");
    } else {
      EXPECT_EQ(matched, std::to_string(ids.size())) << tag;
      kept += static_cast<long>(ids.size());
    }
  }
  EXPECT_EQ(count("jobs"), kept);
}

TEST_P(bridge_enqueue, a_serializable_transactions_batch_goes_through_the_stage) {
  // The read-back of a COPY into ready steps over other producers' rows, which SERIALIZABLE would
  // count as conflicts: such a transaction's batch takes the stage.
  const auto ids = committed_through({"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"},
                                     std::vector<new_job>(1'200, new_job{.kind = "k"}), "batch 0, copied 1, ready 0");
  EXPECT_EQ(ids.size(), 1'200u);
  EXPECT_EQ(count("jobs"), 1'200);
}

TEST_P(bridge_enqueue, concurrent_copies_straight_into_ready_each_answer_their_own_ids) {
  // Producers copying at once draw ids from one sequence, so their rows' ids interleave; each
  // read-back must answer exactly its own rows, in its own input order.
  constexpr int producers = 4, batches = 12, size = 1'500;
  std::vector<std::vector<std::vector<std::int64_t>>> got(producers);
  std::vector<std::string> failures(producers);
  {
    std::vector<std::thread> threads;
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] {
        try {
          auto tx = open_tx();
          for (int b = 0; b < batches; ++b) {
            std::vector<new_job> jobs;
            for (int i = 0; i < size; ++i) jobs.push_back({.kind = "k", .args = {{"p", p}, {"b", b}, {"i", i}}});
            tx->begin();
            auto ids = tx->enqueue_batch(jobs, opts_);
            if (!ids) {
              failures[p] = ids.error().message();
              tx->rollback();
              return;
            }
            if (!tx->commit()) {
              failures[p] = "commit refused";
              return;
            }
            got[p].push_back(ids.value());
          }
        } catch (const std::exception& e) {
          failures[p] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  int interleaved = 0;
  for (int p = 0; p < producers; ++p) {
    ASSERT_EQ(failures[p], "") << "producer " << p;
    ASSERT_EQ(got[p].size(), static_cast<std::size_t>(batches));
    for (int b = 0; b < batches; ++b) {
      const auto& ids = got[p][b];
      ASSERT_EQ(ids.size(), static_cast<std::size_t>(size));
      if (ids.back() - ids.front() + 1 != size) ++interleaved;
      EXPECT_EQ(check_.scalar("SELECT count(*) FROM unnest($1::bigint[]) WITH ORDINALITY AS a(id, ord) JOIN " +
                                  s("jobs") + " j ON j.id = a.id WHERE (j.args->>'p')::int = $2 AND "
                                  "(j.args->>'b')::int = $3 AND (j.args->>'i')::bigint = a.ord - 1",
                              {tenure::postgres::int_array(ids), std::to_string(p), std::to_string(b)}),
                std::to_string(size))
          << "producer " << p << " batch " << b;
    }
  }
  EXPECT_EQ(count("jobs"), producers * batches * size);
  EXPECT_GT(interleaved, 0) << "no two producers' ids interleaved: the race did not happen";
}

TEST_P(bridge_enqueue, a_copy_enqueue_rolls_back_with_the_caller_and_two_in_one_transaction_get_their_own_ids) {
  const std::vector<new_job> jobs(1'000, new_job{.kind = "k"});
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order());
  auto first = tx->enqueue_batch(jobs, opts_);
  auto second = tx->enqueue_batch(jobs, opts_);
  ASSERT_TRUE(first && second);
  ASSERT_EQ(first.value().size(), 1'000u);
  ASSERT_EQ(second.value().size(), 1'000u);
  EXPECT_LT(first.value().back(), second.value().front());
  EXPECT_EQ(tx->scalar("SELECT count(*) FROM " + s("jobs")), "2000") << "both batches, seen by their transaction";
  tx->rollback();
  EXPECT_EQ(count("jobs"), 0);
  EXPECT_EQ(count("orders"), 0);
  // The stage was emptied with the transaction: the next batch moves only its own jobs.
  tx->begin();
  auto third = tx->enqueue_batch(jobs, opts_);
  ASSERT_TRUE(third) << third.error().message();
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(count("jobs"), 1'000);
  EXPECT_EQ(claim(2'000).size(), 1'000u);
}

TEST_P(bridge_enqueue, a_batch_below_the_threshold_with_a_key_or_with_copy_off_goes_over_arrays) {
  std::vector<new_job> keyed(1'500, new_job{.kind = "k"});
  keyed[3].unique_key = "only-one";
  const std::vector<new_job> small(999, new_job{.kind = "k"});
  const std::vector<new_job> large(1'500, new_job{.kind = "k"});
  tenure::sql_options off = opts_;
  off.copy_threshold = 0;
  auto tx = open_tx();
  tx->begin();
  tx->exec("SET LOCAL track_functions = 'pl'");
  ASSERT_TRUE(tx->enqueue_batch(small, opts_));
  ASSERT_TRUE(tx->try_enqueue_batch(keyed, opts_));
  ASSERT_TRUE(tx->enqueue_batch(large, off));
  EXPECT_EQ(paths_called(*tx, schema_.name()), "batch 3, copied 0, ready 0");
  ASSERT_TRUE(tx->commit());
  EXPECT_EQ(count("jobs"), 999 + 1'500 + 1'500);
}

TEST_P(bridge_enqueue, a_connection_not_in_utf8_sends_large_batches_over_arrays) {
  // COPY's text is escaped byte by byte; only a UTF-8 session gets it.
  const auto ids = committed_through({"SET LOCAL client_encoding = 'LATIN1'"},
                                     std::vector<new_job>(1'500, new_job{.kind = "k", .args = {{"s", "a\\b"}}}),
                                     "batch 1, copied 0, ready 0");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(count("jobs"), 1'500);
  EXPECT_EQ(check_.scalar("SELECT args->>'s' FROM " + s("jobs") + " WHERE id = $1", {std::to_string(ids[0])}), "a\\b");
}

TEST_P(bridge_enqueue, a_large_batch_outside_a_transaction_commits_on_its_own_over_arrays) {
  const std::vector<new_job> jobs(1'500, new_job{.kind = "k"});
  auto tx = open_tx();
  tx->begin_autocommit();
  auto ids = tx->enqueue_batch(jobs, opts_);
  ASSERT_TRUE(ids) << ids.error().message();
  EXPECT_EQ(count("jobs"), 1'500) << "visible at once: no transaction held it";
}

TEST_P(bridge_enqueue, a_job_the_copy_stage_refuses_aborts_the_callers_transaction_with_the_rule_it_broke) {
  std::vector<new_job> jobs(1'200, new_job{.kind = "k"});
  jobs[600].metadata = metadata_only_the_server_measures_over_the_limit();
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order());
  auto r = tx->enqueue_batch(jobs, opts_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument) << r.error().message();
  EXPECT_EQ(r.error().sqlstate(), "23514") << "a CHECK of ready";
  EXPECT_NE(r.error().detail().find("metadata must be a JSON object of at most 8192 bytes"), std::string::npos)
      << r.error().detail();
  EXPECT_TRUE(r.error().detail().ends_with("(the caller's transaction is aborted: roll it back)")) << r.error().detail();
  EXPECT_FALSE(tx->commit());
  EXPECT_EQ(count("jobs"), 0);
  EXPECT_EQ(count("orders"), 0);
}

TEST_P(bridge_enqueue, a_connection_lost_before_a_copy_enqueue_is_unavailable_and_writes_nothing) {
  const std::vector<new_job> jobs(1'500, new_job{.kind = "k"});
  auto tx = open_tx();
  tx->begin();
  tx->exec(insert_order());
  auto r = after_the_backend_is_terminated(*tx, [&] { return tx->enqueue_batch(jobs, opts_); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::database_unavailable) << r.error().message();
  EXPECT_EQ(count("jobs"), 0);
  EXPECT_EQ(count("orders"), 0);
}

/// The queues whose idle workers were woken while `jobs` were enqueued in one caller transaction
/// (workers of queues `idle` said they sleep), in the order of the notifications; `paths` as
/// paths_called() says.
std::vector<std::string> bridge_enqueue::woken_by(const std::vector<new_job>& jobs, const std::vector<std::string>& idle,
                                                  const std::string& paths) {
  pg listener{schema_.dsn()};
  listener.exec("LISTEN " + schema_.name() + "_wake");
  for (const auto& q : idle) check_.exec("SELECT " + s("worker_idle") + "($1, 'w-' || $1)", {q});
  EXPECT_EQ(committed_through({}, jobs, paths).size(), jobs.size());
  listener.query("SELECT 1");
  std::vector<std::string> woken;
  while (PGnotify* n = PQnotifies(listener.native())) {
    woken.emplace_back(n->extra);
    PQfreemem(n);
  }
  return woken;
}

TEST_P(bridge_enqueue, a_copy_enqueue_wakes_an_idle_worker_of_each_queue_with_a_job_ready_now) {
  std::vector<new_job> jobs(1'500, new_job{.kind = "k", .queue = "now"});
  jobs.push_back({.kind = "k", .queue = "later", .run_at = tenure::clock_type::now() + 1h});
  EXPECT_EQ(woken_by(jobs, {"now", "later"}, "batch 0, copied 1, ready 0"), std::vector<std::string>{"now"})
      << "the scheduled job's queue has nothing to run yet";
}

TEST_P(bridge_enqueue, a_copy_straight_into_ready_wakes_an_idle_worker_of_each_of_its_queues) {
  std::vector<new_job> jobs(1'500, new_job{.kind = "k", .queue = "a"});
  jobs[700].queue = "b";
  jobs[701].queue = "nobody_waits";
  auto woken = woken_by(jobs, {"a", "b"}, "batch 0, copied 0, ready 1");
  std::sort(woken.begin(), woken.end());
  EXPECT_EQ(woken, (std::vector<std::string>{"a", "b"}));
}

TEST_P(bridge_enqueue, through_transaction_pooling_each_copy_enqueue_finds_its_target_in_its_own_transaction) {
  // PgBouncer in transaction mode: a transaction may land on a server session that has never
  // seen the stage, or on one that made it for another client, or on one whose last drawn id
  // (which the read-back of a COPY into ready starts from) is another client's.
  const std::string pooled = tenure::test::pooler_dsn();
  std::vector<std::unique_ptr<caller_tx>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(open_caller_tx(GetParam(), pooled, false));
  std::vector<std::int64_t> all;
  for (int round = 0; round < 9; ++round) {
    caller_tx& tx = *clients[static_cast<std::size_t>(round) % clients.size()];
    std::vector<new_job> jobs(1'000 + round, new_job{.kind = "k", .args = {{"round", round}}});
    // Every other round holds a scheduled job: through the stage; the others go straight into ready.
    if (round % 2 == 1) jobs.back().run_at = tenure::clock_type::now() + 1h;
    tx.begin();
    tx.exec(insert_order());
    auto ids = tx.enqueue_batch(jobs, opts_);
    ASSERT_TRUE(ids) << "round " << round << ": " << ids.error().message();
    ASSERT_EQ(ids.value().size(), jobs.size());
    if (round % 3 == 2) {
      tx.rollback();
      continue;
    }
    ASSERT_TRUE(tx.commit());
    EXPECT_EQ(check_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE args->>'round' = $1 AND id = ANY($2::bigint[])",
                            {std::to_string(round), tenure::postgres::int_array(ids.value())}),
              std::to_string(jobs.size()))
        << "round " << round;
    all.insert(all.end(), ids.value().begin(), ids.value().end());
  }
  EXPECT_EQ(count("jobs"), static_cast<long>(all.size()));
  EXPECT_EQ(count("orders"), 6);
}

INSTANTIATE_TEST_SUITE_P(bridges, bridge_enqueue, ::testing::Values(bridge::libpq, bridge::soci, bridge::pqxx),
                         bridge_name);

}  // namespace
