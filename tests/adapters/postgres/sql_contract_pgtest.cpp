// The public SQL contract, driven as any other language would drive it: plain SQL over libpq.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "adapters/postgres/connection.hpp"
#include "support/pg.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/store.hpp"

using tenure::test::pg;
using tenure::test::scoped_schema;

namespace {

class sql_contract : public ::testing::Test {
 protected:
  scoped_schema schema_{"sqlc"};
  pg db_{schema_.dsn()};
  std::string s(const std::string& fn) const { return schema_.name() + "." + fn; }

  std::string enqueue(const std::string& kind, const std::string& extra = "") {
    return db_.scalar("SELECT " + s("enqueue") + "('" + kind + "'" + extra + ")");
  }
  struct claimed {
    std::string job_id, run_lease, attempt, token;
  };
  std::vector<claimed> claim(int n, const std::string& queue = "default") {
    auto r = db_.exec("SELECT job_id, run_lease, attempt, token FROM " + s("claim") + "($1, $2)",
                      {queue, std::to_string(n)});
    std::vector<claimed> out;
    for (auto& row : r.rows) out.push_back({*row[0], *row[1], *row[2], *row[3]});
    return out;
  }
  std::string state_of(const std::string& id) {
    return db_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id});
  }
  /// The token's secret (its last 32 characters).
  static std::string secret_of(const std::string& token) { return token.substr(token.size() - 32); }
  /// The same attempt with another secret: one bit of its last hex digit flipped.
  static std::string with_wrong_secret(std::string token) {
    char& last = token.back();
    last = last == '0' ? '1' : '0';
    return token;
  }
};

const std::regex k_token_v2{"tn2:[1-9][0-9]*:[1-9][0-9]*:[0-9a-f]{32}"};

TEST_F(sql_contract, queue_depths_and_list_queues_compile_nothing_with_jit_even_when_the_session_would) {
  // Their estimates can put them above jit_above_cost, and compiling them took longer than
  // running them (README, Flat cost as tables grow). A session that JITs every query:
  db_.exec("SET jit = on");
  db_.exec("SET jit_above_cost = 0");
  db_.exec("SET jit_inline_above_cost = 0");
  db_.exec("SET jit_optimize_above_cost = 0");
  const auto probe = db_.scalar("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM " + s("specs"));
  ASSERT_NE(probe.find("\"JIT\""), std::string::npos) << "this server compiles nothing with JIT: " << probe;
  // Their own statements, counted by pg_stat_statements (scripts/pg preloads its library).
  db_.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  db_.exec("SET pg_stat_statements.track = 'all'");
  enqueue("k");
  db_.exec("SELECT * FROM " + s("queue_depths") + "()");
  db_.exec("SELECT * FROM " + s("list_queues") + "()");
  const auto seen = db_.scalar(
      "SELECT count(*) || ' ' || coalesce(sum(calls), 0) || ' ' || coalesce(sum(jit_functions), 0) "
      "FROM pg_stat_statements WHERE query LIKE 'WITH c AS%' AND query LIKE '%' || $1 || '.open_claims%'",
      {schema_.name()});
  EXPECT_EQ(seen, "2 2 0") << "statements, calls, functions compiled";
}

TEST_F(sql_contract, migrate_twice_is_a_noop) {
  auto again = tenure::postgres::migrate(schema_.dsn(), schema_.name());
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again.value(), tenure::postgres::known_schema_version());
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("schema_version")),
            std::to_string(tenure::postgres::known_schema_version()));
}

TEST_F(sql_contract, newer_schema_version_is_refused_with_a_clear_error) {
  db_.exec("INSERT INTO " + s("schema_version") + " (version, name) VALUES (99, 'from_the_future')");
  auto m = tenure::postgres::migrate(schema_.dsn(), schema_.name());
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error(), tenure::errc::schema_mismatch);
  EXPECT_NE(m.error().message().find("version 99"), std::string::npos) << m.error().message();
  auto st = tenure::postgres::store::open({.dsn = schema_.dsn(), .schema = schema_.name()});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error(), tenure::errc::schema_mismatch);
}

TEST_F(sql_contract, enqueue_is_part_of_the_callers_transaction) {
  db_.exec("BEGIN");
  const auto rolled_back = enqueue("k");
  db_.exec("ROLLBACK");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE id = $1", {rolled_back}), "0");
  db_.exec("BEGIN");
  const auto committed = enqueue("k");
  pg other{schema_.dsn()};
  EXPECT_EQ(other.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE id = $1", {committed}), "0")
      << "an uncommitted job must be invisible to workers";
  EXPECT_TRUE(other.exec("SELECT * FROM " + s("claim") + "('default')").rows.empty());
  db_.exec("COMMIT");
  EXPECT_EQ(state_of(committed), "available");
}

TEST_F(sql_contract, enqueue_rejects_bad_input_with_22023) {
  for (const std::string& extra : {std::string{", '{}', 'default', 0"}, std::string{", '{}', 'default', 5"},
                                   std::string{", '{}', '', 2"}, std::string{", '{}', 'default', 2, NULL, 0"}}) {
    auto r = db_.query("SELECT " + s("enqueue") + "('k'" + extra + ")");
    EXPECT_FALSE(r.ok) << extra;
    EXPECT_EQ(r.sqlstate, "22023") << extra << ": " << r.error;
  }
  auto r = db_.query("SELECT " + s("enqueue") + "('')");
  EXPECT_EQ(r.sqlstate, "22023");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "0");
}

TEST_F(sql_contract, enqueue_refuses_args_that_are_not_an_object_and_run_at_the_sdk_cannot_hold_with_22023) {
  // A scalar or array was stored as given; 'infinity' or year 10000 made a job that never ran
  // and that no tool could read back (the SDK's clock ends in 2262).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {", 'null'", "args must be a JSON object (got a JSON null)"},
      {", '\"str\"'", "args must be a JSON object (got a JSON string)"},
      {", '[1,2]'", "args must be a JSON object (got a JSON array)"},
      {", '7'", "args must be a JSON object (got a JSON number)"},
      {", '{}', 'default', 2, 'infinity'", "run_at must be before 2262-04-11 23:47:16.854775+00"},
      {", '{}', 'default', 2, '10000-01-01'", "run_at must be before 2262-04-11 23:47:16.854775+00"},
      {", '{}', 'default', 2, '2262-04-11 23:47:16.854776+00'", "run_at must be before"},
  };
  for (const auto& [extra, message] : cases) {
    auto r = db_.query("SELECT " + s("enqueue") + "('k'" + extra + ")");
    EXPECT_EQ(r.sqlstate, "22023") << extra << ": " << r.error;
    EXPECT_NE(r.error.find("tenure.enqueue: " + message), std::string::npos) << r.error;
  }
  auto batch = db_.query("SELECT * FROM " + s("enqueue_batch") +
                         "(ARRAY['a','b'], ARRAY['{}','[1]']::jsonb[], ARRAY['q','q'], ARRAY[2,2])");
  EXPECT_EQ(batch.sqlstate, "22023") << batch.error;
  EXPECT_NE(batch.error.find("tenure.enqueue_batch: job 2: args must be a JSON object (got a JSON array)"),
            std::string::npos)
      << batch.error;
  batch = db_.query("SELECT * FROM " + s("enqueue_batch") +
                    "(ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], ARRAY['q','q'], ARRAY[2,2], "
                    "ARRAY[NULL, 'infinity']::timestamptz[])");
  EXPECT_EQ(batch.sqlstate, "22023") << batch.error;
  EXPECT_NE(batch.error.find("tenure.enqueue_batch: job 2: run_at must be before"), std::string::npos) << batch.error;
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "0");

  // Still accepted: SQL NULL args (stored as {}), the last microsecond the SDK holds, and any past
  // time, '-infinity' included, which means now.
  const auto null_args = enqueue("k", ", NULL");
  EXPECT_EQ(db_.scalar("SELECT args::text FROM " + s("jobs") + " WHERE id = $1", {null_args}), "{}");
  const auto last = enqueue("k", ", '{}', 'default', 2, '2262-04-11 23:47:16.854775+00'");
  EXPECT_EQ(state_of(last), "scheduled");
  const auto past = enqueue("k", ", '{}', 'default', 2, '-infinity'");
  EXPECT_EQ(state_of(past), "available");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("enqueue_batch") +
                       "(ARRAY['a'], ARRAY[NULL]::jsonb[], ARRAY['q'], ARRAY[2], "
                       "ARRAY['2262-04-11 23:47:16.854775+00']::timestamptz[])"),
            "1");
}

TEST_F(sql_contract, enqueue_takes_metadata_as_a_named_last_parameter_and_claim_returns_it) {
  const std::string m = R"({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})";
  const auto traced = db_.scalar("SELECT " + s("enqueue") + "('k', metadata => $1::jsonb)", {m});
  const auto positional = db_.scalar("SELECT " + s("enqueue") + "('k', '{}', 'default', 2, NULL, 25, $1::jsonb)", {m});
  const auto old_style = enqueue("k", ", '{}', 'default', 2, NULL, 25");  // every older call still works
  const auto null_metadata = enqueue("k", ", metadata => NULL");          // stored as {}
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("enqueue_batch") +
                       "(ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], ARRAY['default','default'], ARRAY[2,2], "
                       "metadatas => ARRAY[$1, NULL]::jsonb[])",
                       {m}),
            "2");
  auto shown = db_.exec("SELECT id, metadata::text FROM " + s("jobs") + " ORDER BY id");
  ASSERT_EQ(shown.rows.size(), 6u);
  const std::vector<std::string> expected = {m, m, "{}", "{}", m, "{}"};
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(shown.at(i, 1), expected[i]) << i;
  EXPECT_EQ(shown.at(0, 0), traced);
  EXPECT_EQ(shown.at(1, 0), positional);
  EXPECT_EQ(shown.at(2, 0), old_style);
  EXPECT_EQ(shown.at(3, 0), null_metadata);

  auto claimed = db_.exec("SELECT job_id, metadata::text FROM " + s("claim") + "('default', 10) ORDER BY job_id");
  ASSERT_EQ(claimed.rows.size(), 6u);
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(claimed.at(i, 1), expected[i]) << i;
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs") + " WHERE state = 'running' AND metadata = $1::jsonb", {m}),
            "3")
      << "a running job shows its metadata";
}

TEST_F(sql_contract, enqueue_refuses_metadata_that_is_not_an_object_or_longer_than_8192_bytes_with_22023) {
  const std::string at_limit = std::string(8192 - 9, 'x');  // {"k": "..."} is 9 bytes of text around it
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"'[1,2]'", "metadata must be a JSON object (got a JSON array)"},
      {"'\"00-a-b-01\"'", "metadata must be a JSON object (got a JSON string)"},
      {"'7'", "metadata must be a JSON object (got a JSON number)"},
      {"'null'", "metadata must be a JSON object (got a JSON null)"},
      {"jsonb_build_object('k', '" + at_limit + "x')", "metadata must be at most 8192 bytes as JSON text (got 8193)"},
  };
  for (const auto& [value, message] : cases) {
    auto r = db_.query("SELECT " + s("enqueue") + "('k', metadata => " + value + ")");
    EXPECT_EQ(r.sqlstate, "22023") << value << ": " << r.error;
    EXPECT_NE(r.error.find("tenure.enqueue: " + message), std::string::npos) << r.error;
  }
  auto batch = db_.query("SELECT * FROM " + s("enqueue_batch") +
                         "(ARRAY['a','b'], ARRAY['{}','{}']::jsonb[], ARRAY['q','q'], ARRAY[2,2], "
                         "metadatas => ARRAY['{}','[1]']::jsonb[])");
  EXPECT_EQ(batch.sqlstate, "22023") << batch.error;
  EXPECT_NE(batch.error.find("tenure.enqueue_batch: job 2: metadata must be a JSON object (got a JSON array)"),
            std::string::npos)
      << batch.error;
  batch = db_.query("SELECT * FROM " + s("enqueue_batch") +
                    "(ARRAY['a'], ARRAY['{}']::jsonb[], ARRAY['q'], ARRAY[2], metadatas => ARRAY['{}','{}']::jsonb[])");
  EXPECT_EQ(batch.sqlstate, "22023") << batch.error;
  EXPECT_NE(batch.error.find("all arrays must have the same length"), std::string::npos) << batch.error;
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "0");

  // Exactly 8192 bytes, as PostgreSQL prints it, is accepted.
  const auto id = db_.scalar("SELECT " + s("enqueue") + "('k', metadata => jsonb_build_object('k', $1::text))",
                             {at_limit});
  EXPECT_EQ(db_.scalar("SELECT octet_length(metadata::text) FROM " + s("jobs") + " WHERE id = $1", {id}), "8192");
}

TEST_F(sql_contract, claim_advances_run_lease_and_attempt_and_returns_a_token) {
  const auto id = enqueue("k", ", '{\"n\":1}'");
  auto c1 = claim(1);
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0].job_id, id);
  EXPECT_GT(std::stoll(c1[0].run_lease), 0);
  EXPECT_EQ(c1[0].attempt, "1");
  EXPECT_TRUE(std::regex_match(c1[0].token, k_token_v2)) << c1[0].token;
  EXPECT_TRUE(c1[0].token.starts_with("tn2:" + id + ":" + c1[0].run_lease + ":")) << c1[0].token;
  EXPECT_EQ(state_of(id), "running");
  db_.exec("SELECT " + s("fail_job") + "($1, 'boom', true)", {c1[0].token});
  db_.exec("UPDATE " + s("deferred") + " SET run_at = now() - interval '1 second'");
  auto c2 = claim(1);
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_GT(std::stoll(c2[0].run_lease), std::stoll(c1[0].run_lease)) << "every claim advances the run lease";
  EXPECT_EQ(c2[0].attempt, "2");
}

TEST_F(sql_contract, claim_orders_by_priority_then_fifo_and_skips_future_run_at) {
  const auto low = enqueue("low", ", '{}', 'default', 4");
  const auto a = enqueue("a");
  const auto future = enqueue("future", ", '{}', 'default', 1, now() + interval '1 hour'");
  const auto b = enqueue("b");
  const auto high = enqueue("high", ", '{}', 'default', 1");
  auto c = claim(10);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].job_id, high);
  EXPECT_EQ(c[1].job_id, a);
  EXPECT_EQ(c[2].job_id, b);
  EXPECT_EQ(c[3].job_id, low);
  EXPECT_EQ(state_of(future), "scheduled");
  db_.exec("UPDATE " + s("deferred") + " SET run_at = now() - interval '1 second'");
  auto later = claim(10);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].job_id, future);
}

TEST_F(sql_contract, complete_job_returns_evidence_and_is_stale_the_second_time) {
  const auto id = enqueue("k");
  auto c = claim(1);
  auto r = db_.exec("SELECT job_id, run_lease, completed_at FROM " + s("complete_job") + "($1, '{\"pct\":100}')",
                    {c[0].token});
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.at(0, 0), id);
  EXPECT_EQ(r.at(0, 1), c[0].run_lease);
  EXPECT_EQ(state_of(id), "completed");
  EXPECT_EQ(db_.scalar("SELECT progress->>'pct' FROM " + s("jobs") + " WHERE id = $1", {id}), "100");
  auto again = db_.query("SELECT * FROM " + s("complete_job") + "($1)", {c[0].token});
  EXPECT_EQ(again.sqlstate, "TN001") << again.error;
}

// (job_id, run_lease) is guessable; the secret is not. A token with the right attempt and a wrong
// secret is answered by every token function exactly as a stale one, and changes nothing.
TEST_F(sql_contract, a_token_with_a_wrong_secret_is_answered_as_stale_and_changes_nothing) {
  const auto id = enqueue("k");
  const auto c = claim(1).at(0);
  const auto forged = with_wrong_secret(c.token);
  ASSERT_NE(forged, c.token);
  const auto wrong = db_.query("SELECT * FROM " + s("complete_job") + "($1, '{\"forged\":true}')", {forged});
  EXPECT_EQ(wrong.sqlstate, "TN001") << wrong.error;
  EXPECT_EQ(db_.query("SELECT " + s("fail_job") + "($1, 'forged', false)", {forged}).sqlstate, "TN001");
  EXPECT_EQ(db_.scalar("SELECT " + s("heartbeat") + "($1)", {forged}), "f");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("attempt_state")), "0") << "the forged heartbeat wrote nothing";
  EXPECT_EQ(state_of(id), "running");

  // The same words as for an attempt that is really stale (another job's, already finished).
  const auto other = enqueue("k");
  const auto finished = claim(1).at(0);
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {finished.token});
  const auto stale = db_.query("SELECT * FROM " + s("complete_job") + "($1, '{\"forged\":true}')", {finished.token});
  EXPECT_EQ(stale.sqlstate, "TN001");
  const std::regex numbers{"[0-9]+"};
  EXPECT_EQ(std::regex_replace(wrong.error, numbers, "N"), std::regex_replace(stale.error, numbers, "N"));

  // The right token still completes it.
  auto done = db_.exec("SELECT job_id, run_lease FROM " + s("complete_job") + "($1)", {c.token});
  ASSERT_EQ(done.rows.size(), 1u);
  EXPECT_EQ(state_of(id), "completed");
  EXPECT_EQ(state_of(other), "completed");
  EXPECT_EQ(db_.scalar("SELECT progress IS NULL FROM " + s("jobs") + " WHERE id = $1", {id}), "t");
}

// complete_batch (the runtime's completion flush) names each attempt by its secret too: after a
// failover to an asynchronous standby the same (job_id, run_lease) can name another attempt.
TEST_F(sql_contract, complete_batch_completes_an_item_only_with_its_attempts_secret_and_without_one_by_the_pair) {
  const auto a = enqueue("k");
  const auto b = enqueue("k");
  const auto c = enqueue("k");
  const auto got = claim(3);
  ASSERT_EQ(got.size(), 3u);
  const auto batch = [&](const std::vector<std::pair<claimed, std::string>>& items) {
    std::string ids = "{", leases = "{", secrets = "{";
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::string sep = i ? "," : "";
      ids += sep + items[i].first.job_id;
      leases += sep + items[i].first.run_lease;
      secrets += sep + items[i].second;
    }
    return db_.exec("SELECT job_id FROM " + s("complete_batch") +
                    "($1::bigint[], $2::bigint[], NULL, $3::uuid[]) ORDER BY job_id",
                    {ids + "}", leases + "}", secrets + "}"})
        .rows.size();
  };
  // A wrong secret is stale and changes nothing; the right one and a NULL one complete.
  EXPECT_EQ(batch({{got[0], secret_of(with_wrong_secret(got[0].token))}}), 0u);
  EXPECT_EQ(state_of(got[0].job_id), "running");
  EXPECT_EQ(batch({{got[0], secret_of(got[0].token)}, {got[1], "NULL"}, {got[2], secret_of(got[1].token)}}), 2u);
  EXPECT_EQ(state_of(a) + " " + state_of(b) + " " + state_of(c), "completed completed running");
  // Without the secrets array (callers of schema 16): by (job_id, run_lease), as before.
  EXPECT_EQ(db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[" + got[2].job_id + "]::bigint[], ARRAY[" +
                     got[2].run_lease + "]::bigint[])")
                .rows.size(),
            1u);
  EXPECT_EQ(state_of(c), "completed");
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_batch") + "('{1}', '{1}', NULL, '{}'::uuid[])").sqlstate, "22023");
}

TEST_F(sql_contract, version_1_tokens_are_refused_with_tn002_and_a_hint_naming_tn2) {
  const auto id = enqueue("k");
  claim(1);
  for (const auto& fn : {"complete_job($1)", "fail_job($1, 'x')", "heartbeat($1)"}) {
    auto r = db_.query("SELECT * FROM " + s(fn), {"tn1:" + id + ":1"});
    EXPECT_EQ(r.sqlstate, "TN002") << fn << ": " << r.error;
    EXPECT_NE(r.error.find("version tn1 is no longer accepted"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("tn2:<job_id>:<run_lease>:<secret>"), std::string::npos) << r.error;
  }
  EXPECT_EQ(state_of(id), "running");
}

TEST_F(sql_contract, every_attempt_gets_its_own_secret_and_keeps_it_in_its_receipt) {
  const auto id = enqueue("k");
  const auto first = claim(1).at(0);
  EXPECT_EQ(db_.scalar("SELECT encode(uuid_send(secret), 'hex') FROM " + s("receipts") + " WHERE job_id = $1", {id}),
            secret_of(first.token));
  db_.exec("SELECT " + s("fail_job") + "($1, 'again', true)", {first.token});
  db_.exec("UPDATE " + s("deferred") + " SET run_at = now() - interval '1 second'");
  const auto second = claim(1).at(0);
  ASSERT_EQ(second.job_id, id);
  ASSERT_GT(std::stoll(second.run_lease), std::stoll(first.run_lease));
  EXPECT_NE(secret_of(second.token), secret_of(first.token));
  // The first attempt's secret does not open the second: only its own does.
  const auto borrowed = "tn2:" + id + ":" + second.run_lease + ":" + secret_of(first.token);
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {borrowed}).sqlstate, "TN001");

  db_.exec("SELECT " + s("enqueue_batch") +
           "(array_fill('k'::text, ARRAY[200]), array_fill('{}'::jsonb, ARRAY[200]), "
           "array_fill('default'::text, ARRAY[200]), array_fill(2, ARRAY[200]))");
  std::set<std::string> secrets{secret_of(second.token)};
  for (const auto& c : claim(200)) {
    EXPECT_TRUE(std::regex_match(c.token, k_token_v2)) << c.token;
    secrets.insert(secret_of(c.token));
  }
  EXPECT_EQ(secrets.size(), 201u) << "two attempts share a secret";
  EXPECT_EQ(db_.scalar("SELECT count(DISTINCT secret) FROM " + s("receipts")), "201");
}

TEST_F(sql_contract, stale_tokens_raise_tn001_after_rescue_cancel_and_reclaim) {
  enqueue("a");
  enqueue("b");
  auto c = claim(2);
  ASSERT_EQ(c.size(), 2u);
  // Rescue wins: the first attempt is closed; its token is stale everywhere.
  db_.exec("SELECT " + s("rescue_stale") + "('0 seconds')");
  for (const auto& fn : {"complete_job($1)", "fail_job($1, 'x')"}) {
    auto r = db_.query("SELECT * FROM " + s(fn), {c[0].token});
    EXPECT_EQ(r.sqlstate, "TN001") << fn << ": " << r.error;
  }
  EXPECT_EQ(db_.scalar("SELECT " + s("heartbeat") + "($1)", {c[0].token}), "f");
  // Re-claimed: the new attempt has a new lease; the old token still cannot touch it.
  auto again = claim(2);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].job_id, c[0].job_id);
  EXPECT_GT(std::stoll(again[0].run_lease), std::stoll(c[0].run_lease));
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {c[0].token}).sqlstate, "TN001");
  EXPECT_EQ(state_of(again[0].job_id), "running");
  // Cancel wins: the running attempt is closed and its completion is stale.
  EXPECT_EQ(db_.scalar("SELECT " + s("cancel_job") + "($1)", {again[1].job_id}), "t");
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {again[1].token}).sqlstate, "TN001");
  EXPECT_EQ(state_of(again[1].job_id), "cancelled");
}

TEST_F(sql_contract, every_token_function_raises_only_tn002_for_malformed_input) {
  const std::string h = "00112233445566778899aabbccddeeff";
  std::vector<tenure::test::cell> inputs = {
      std::nullopt, "", "tn2", "tn2:", "tn2:1", "tn2:1:", "tn2:1:1", "tn2:1:1:", "tn2:0:1:" + h, "tn2:-1:1:" + h,
      "tn2:01:1:" + h, "tn1:1:1", "tn1:1:1:" + h, "tn3:1:1:" + h, "tn2:1:1:" + h + ":1",
      "tn2:9223372036854775808:1:" + h, "tn2:1:99999999999999999999:" + h, " tn2:1:1:" + h, "tn2:1:1:" + h + "\n",
      "tn2:１:1:" + h, "tn2:1:1:" + h.substr(1), "tn2:1:1:" + h + "0", "tn2:1:1:00112233445566778899AABBCCDDEEFF",
      "tn2:1:1:00112233-4455-6677-8899-aabbccddeeff", "'; DROP TABLE x; --", std::string(100000, 'x'),
      "tn2:" + std::string(70, '1') + ":1:" + h, "\xF0\x9F\x98\x80", "tn2:1e3:1:" + h, "tn2:0x1:1:" + h};
  std::mt19937 rng{12345};
  // Whole code points, so every input is valid text (invalid UTF-8 never reaches a function).
  const std::vector<std::string> alphabet = {"t", "n", "1", "2", ":", "0", "5", "9", "a", "f", "-", "+", " ", "x",
                                             "\xC3\xA9", "\xF0\x9F\x98\x80", "\t", "\\", "'", "\""};
  for (int i = 0; i < 300; ++i) {
    std::string t = rng() % 2 ? "tn2:" : "";
    const auto len = rng() % 40;
    for (unsigned j = 0; j < len; ++j) t += alphabet[rng() % alphabet.size()];
    inputs.emplace_back(t);
  }
  for (const auto& input : inputs) {
    for (const auto& fn : {"complete_job($1)", "fail_job($1, 'x')", "heartbeat($1)"}) {
      auto r = db_.query("SELECT * FROM " + s(fn), {input});
      if (r.ok) {
        // Only a well-formed token may get past parsing; for an unknown attempt that is a
        // stale answer (heartbeat false), never success.
        ASSERT_EQ(std::string{fn}, "heartbeat($1)") << input.value_or("NULL");
        EXPECT_EQ(r.at(0, 0), "f");
        continue;
      }
      EXPECT_TRUE(r.sqlstate == "TN002" || r.sqlstate == "TN001")
          << fn << " with " << input.value_or("NULL").substr(0, 60) << " -> " << r.sqlstate << " " << r.error;
      if (r.sqlstate == "TN001") {
        // A well-formed token naming no live attempt.
        EXPECT_TRUE(input && std::regex_match(*input, k_token_v2)) << *input;
      }
    }
  }
  for (const auto& t : {std::string{}, "tn2:0:1:" + h, "tn9:1:1:" + h, "tn2:9223372036854775808:1:" + h,
                        std::string{"tn1:1:1"}}) {
    EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {std::string{t}}).sqlstate, "TN002") << t;
  }
}

// parse_token and complete_job recognize a well-formed token without a regular expression; they
// must accept exactly the language of the pattern below (numbers within bigint) and read the
// same three fields from it.
TEST_F(sql_contract, the_token_fast_path_accepts_exactly_the_tokens_the_pattern_accepts) {
  const std::string h = "00112233445566778899aabbccddeeff";
  std::vector<std::string> inputs = {
      "tn2:1:1:" + h, "tn2:123456789012345678:1:" + h, "tn2:1234567890123456789:1:" + h,
      "tn2:9223372036854775807:9223372036854775807:" + h, "tn2:9223372036854775808:1:" + h,
      "tn2:1:9999999999999999999:" + h, "tn2:12345678901234567890:1:" + h, "tn2:0:1:" + h, "tn2:01:1:" + h,
      "tn2:1:0:" + h, "tn2::1:" + h, "tn2:1::" + h, "tn2:1:1:", "tn2:1:1:" + h + ":", ":tn2:1:1:" + h,
      "TN2:1:1:" + h, "tn2:1:1:" + h.substr(0, 31) + "g", "tn2:1:1:" + h.substr(0, 31) + "F",
      "tn2:1:1:" + h.substr(0, 31) + "Ã©", "tn2:Ù£:1:" + h, "tn2:+1:1:" + h, "tn2:1 :1:" + h,
      "tn2:1:1:" + h + "\n", "tn2:1:1:" + h + " ", "tn2:1:1:" + h + "0"};
  std::mt19937 rng{4242};
  const std::vector<std::string> alphabet = {"1", "0", "9", ":", "a", "f", "g", "tn2", "Ù£", " "};
  for (int i = 0; i < 400; ++i) {
    std::string t = "tn2:";
    const auto len = 1 + rng() % 45;
    for (unsigned j = 0; j < len; ++j) t += alphabet[rng() % alphabet.size()];
    inputs.push_back(t);
    inputs.push_back("tn2:" + std::to_string(1 + rng() % 100000) + ":" + std::to_string(1 + rng() % 100) + ":" +
                     h.substr(0, 32 - rng() % 2) + (rng() % 5 == 0 ? "a" : ""));
  }
  const std::string pattern = "^tn2:([1-9][0-9]{0,18}):([1-9][0-9]{0,18}):([0-9a-f]{32})$";
  int accepted = 0;
  for (const auto& t : inputs) {
    const auto m = db_.exec(
        "SELECT m[1], m[2], m[3], m IS NOT NULL AND m[1]::numeric <= 9223372036854775807 "
        "AND m[2]::numeric <= 9223372036854775807 FROM regexp_match($1, $2) AS m",
        {t, pattern});
    const bool valid = m.at(0, 3) == "t";
    const auto r = db_.query("SELECT job_id, run_lease, replace(secret::text, '-', '') FROM " + s("parse_token") + "($1)",
                             {t});
    if (!valid) {
      EXPECT_EQ(r.sqlstate, "TN002") << t;
      EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {t}).sqlstate, "TN002") << t;
      continue;
    }
    ++accepted;
    ASSERT_TRUE(r.ok) << t << ": " << r.error;
    EXPECT_EQ(r.at(0, 0), m.at(0, 0)) << t;
    EXPECT_EQ(r.at(0, 1), m.at(0, 1)) << t;
    EXPECT_EQ(r.at(0, 2), m.at(0, 2)) << t;
    // Well formed, naming no live attempt: stale.
    EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {t}).sqlstate, "TN001") << t;
  }
  EXPECT_GT(accepted, 100) << "the generated inputs must exercise the accepting side too";
}

// A job id of 19 digits is well formed up to bigint's largest value; complete_job reads such a
// token through its slower path and completes the attempt all the same.
TEST_F(sql_contract, complete_job_completes_an_attempt_whose_job_id_has_nineteen_digits) {
  db_.exec("SELECT setval('" + s("job_id_seq") + "', 9223372036854775000)");
  const auto id = enqueue("k");
  ASSERT_EQ(id.size(), 19u);
  const auto c = claim(1).at(0);
  ASSERT_EQ(c.job_id, id);
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {with_wrong_secret(c.token)}).sqlstate, "TN001");
  auto r = db_.exec("SELECT job_id FROM " + s("complete_job") + "($1)", {c.token});
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.at(0, 0), id);
  EXPECT_EQ(state_of(id), "completed");
}

// The runtime reads the evidence of a batch of attempts with one call; each answer must be what
// attempt_evidence answers for that attempt alone, in input order (repeats and unknowns included).
TEST_F(sql_contract, attempt_evidence_batch_answers_as_attempt_evidence_does_in_input_order) {
  // Rescued first (its own queue, so later claims leave it alone), then one completed, one open.
  const auto rescued_id = enqueue("k", ", '{}', 'rq'");
  const auto rescued = claim(1, "rq").at(0);
  db_.exec("SELECT count(*) FROM " + s("rescue_attempts") + "('0 seconds')");
  ASSERT_EQ(state_of(rescued_id), "available");
  const auto done_id = enqueue("k");
  const auto finished = claim(1).at(0);
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {finished.token});
  const auto open_id = enqueue("k");
  const auto open = claim(1).at(0);
  ASSERT_EQ(open.job_id, open_id);
  ASSERT_EQ(finished.job_id, done_id);
  const std::vector<std::pair<std::string, std::string>> asked = {
      {open.job_id, open.run_lease},         {finished.job_id, finished.run_lease}, {rescued.job_id, rescued.run_lease},
      {finished.job_id, "7"},                {"999999999", "1"},                    {open.job_id, open.run_lease},
      {rescued.job_id, "0"}};
  std::string ids = "{", leases = "{";
  for (std::size_t i = 0; i < asked.size(); ++i) {
    ids += (i ? "," : "") + asked[i].first;
    leases += (i ? "," : "") + asked[i].second;
  }
  const auto batch = db_.exec("SELECT ord, evidence FROM " + s("attempt_evidence_batch") +
                                  "($1::bigint[], $2::bigint[]) ORDER BY ord",
                              {ids + "}", leases + "}"});
  ASSERT_EQ(batch.rows.size(), asked.size());
  std::vector<std::string> seen;
  for (std::size_t i = 0; i < asked.size(); ++i) {
    EXPECT_EQ(batch.at(static_cast<int>(i), 0), std::to_string(i + 1));
    const auto one = db_.scalar("SELECT " + s("attempt_evidence") + "($1::bigint, $2::bigint)",
                                {asked[i].first, asked[i].second});
    EXPECT_EQ(batch.at(static_cast<int>(i), 1), one) << "attempt " << i;
    seen.push_back(one);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"open", "completed", "closed_by_other", "closed_by_other", "unknown_job",
                                            "open", "closed_by_other"}));
  EXPECT_EQ(db_.query("SELECT * FROM " + s("attempt_evidence_batch") + "('{1,2}', '{1}')").sqlstate, "22023");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("attempt_evidence_batch") + "('{}', '{}')"), "0");
}

TEST_F(sql_contract, fail_job_retries_with_backoff_then_fails_when_attempts_are_spent) {
  const auto id = enqueue("k", ", '{}', 'default', 2, NULL, 2");
  auto c = claim(1);
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_job") + "($1, 'first')", {c[0].token}), "retryable");
  EXPECT_EQ(state_of(id), "retryable");
  // Backoff for the first failure lies in [0.5 s, 1 s] (equal jitter of 1 s).
  const auto wait = std::stod(db_.scalar("SELECT extract(epoch from run_at - now()) FROM " + s("jobs") +
                                         " WHERE id = $1", {id}));
  EXPECT_GT(wait, 0.3);
  EXPECT_LE(wait, 1.0);
  EXPECT_TRUE(claim(1).empty()) << "a retryable job waits for its backoff";
  db_.exec("UPDATE " + s("deferred") + " SET run_at = now() - interval '1 second'");
  auto c2 = claim(1);
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_job") + "($1, 'second')", {c2[0].token}), "failed");
  EXPECT_EQ(state_of(id), "failed");
  EXPECT_EQ(db_.scalar("SELECT last_error FROM " + s("jobs") + " WHERE id = $1", {id}), "second");

  const auto permanent = enqueue("k");
  auto c3 = claim(1);
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_job") + "($1, 'no retry', false)", {c3[0].token}), "failed");
  EXPECT_EQ(state_of(permanent), "failed");
}

TEST_F(sql_contract, backoff_is_capped_without_overflow_however_many_attempts_failed) {
  // A one-hour base doubled 32 times no longer fits an interval: the delay must be capped, not
  // refused (22008), or the failure of such a job could never be recorded.
  db_.exec("INSERT INTO " + s("queues") + " (name, backoff_base, backoff_cap) VALUES ('slow', '1 hour', '1 day')");
  for (const char* n : {"33", "39", "64", "1000", "2147483647"}) {
    const auto secs = std::stod(db_.scalar("SELECT extract(epoch FROM " + s("backoff") + "('slow', $1::int))", {n}));
    EXPECT_GE(secs, 43'200) << "attempt " << n << ": at least half the cap";
    EXPECT_LE(secs, 86'400) << "attempt " << n << ": at most the cap";
  }
  const auto first = std::stod(db_.scalar("SELECT extract(epoch FROM " + s("backoff") + "('slow', 1))"));
  EXPECT_GE(first, 1'800);
  EXPECT_LE(first, 3'600);
  const auto third = std::stod(db_.scalar("SELECT extract(epoch FROM " + s("backoff") + "('slow', 3))"));
  EXPECT_GE(third, 7'200);
  EXPECT_LE(third, 14'400);
  // End to end: the 40th failure of a job in that queue is recorded as a retry a day away.
  const auto id = enqueue("k", ", '{}', 'slow', 2, NULL, 100");
  db_.exec("UPDATE " + s("ready") + " SET attempt = 39 WHERE id = $1", {id});
  auto c = claim(1, "slow");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].attempt, "40");
  EXPECT_EQ(db_.scalar("SELECT " + s("fail_job") + "($1, 'still down')", {c[0].token}), "retryable");
  const auto wait = std::stod(db_.scalar("SELECT extract(epoch FROM run_at - now()) FROM " + s("jobs") +
                                         " WHERE id = $1", {id}));
  EXPECT_GE(wait, 43'100);
  EXPECT_LE(wait, 86'400);
}

TEST(sqlstate_mapping, transient_and_unavailable_states_are_never_reported_as_permanent) {
  using tenure::errc;
  using tenure::postgres::detail::errc_from_sqlstate;
  for (const char* s : {"40001", "40P01", "55P03", "57014"}) EXPECT_EQ(errc_from_sqlstate(s), errc::transient_conflict) << s;
  for (const char* s : {"08006", "53100", "53200", "53300", "57P01", "25006"}) {
    EXPECT_EQ(errc_from_sqlstate(s), errc::database_unavailable) << s;
  }
  EXPECT_EQ(errc_from_sqlstate("40003"), errc::commit_in_doubt);
  EXPECT_EQ(errc_from_sqlstate("22P05"), errc::invalid_argument);
  EXPECT_EQ(errc_from_sqlstate("XX000"), errc::database_error);
}

TEST_F(sql_contract, a_statement_cancelled_by_statement_timeout_is_a_transient_conflict) {
  auto c = tenure::postgres::detail::connection::open(schema_.dsn());
  ASSERT_TRUE(c) << c.error().message();
  ASSERT_TRUE(c.value()->exec_script("SET statement_timeout = 50", tenure::postgres::detail::effect::read));
  auto r = c.value()->exec_script("SELECT pg_sleep(5)", tenure::postgres::detail::effect::read);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), tenure::errc::transient_conflict) << r.error().message();
  EXPECT_EQ(r.error().sqlstate(), "57014");
  EXPECT_NE(r.error().detail().find("statement timeout"), std::string::npos) << r.error().message();
  EXPECT_TRUE(c.value()->ok()) << "the session survives a cancelled statement";
}

TEST_F(sql_contract, a_write_refused_by_a_read_only_server_is_unavailable_never_in_doubt) {
  // A standby right after a failover answers every write with 25006 on a live session: the
  // statement certainly failed, so "it may or may not have been applied" would be wrong.
  auto c = tenure::postgres::detail::connection::open(schema_.dsn());
  ASSERT_TRUE(c) << c.error().message();
  ASSERT_TRUE(c.value()->exec_script("SET default_transaction_read_only = on", tenure::postgres::detail::effect::read));
  auto r = c.value()->exec_script("SELECT " + s("enqueue") + "('k')", tenure::postgres::detail::effect::write);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), tenure::errc::database_unavailable) << r.error().message();
  EXPECT_EQ(r.error().sqlstate(), "25006");
  EXPECT_NE(r.error().detail().find("read-only transaction"), std::string::npos) << r.error().message();
  EXPECT_TRUE(c.value()->ok());
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "0");
}

TEST_F(sql_contract, rescue_makes_attempts_available_at_once_or_failed_when_spent) {
  const auto again = enqueue("a");
  const auto spent = enqueue("b", ", '{}', 'default', 2, NULL, 1");
  claim(2);
  EXPECT_EQ(db_.scalar("SELECT " + s("rescue_stale") + "('0 seconds')"), "2");
  EXPECT_EQ(state_of(again), "available");
  EXPECT_EQ(db_.scalar("SELECT attempt FROM " + s("jobs") + " WHERE id = $1", {again}), "1");
  EXPECT_EQ(state_of(spent), "failed");
  EXPECT_EQ(db_.scalar("SELECT " + s("rescue_stale") + "()"), "0");
}

TEST_F(sql_contract, rescue_respects_heartbeats) {
  enqueue("a");
  auto c = claim(1);
  db_.exec("UPDATE " + s("claims") + " SET claimed_at = now() - interval '1 hour'");
  EXPECT_EQ(db_.scalar("SELECT " + s("heartbeat") + "($1)", {c[0].token}), "t");
  EXPECT_EQ(db_.scalar("SELECT " + s("rescue_stale") + "('30 seconds')"), "0") << "fresh heartbeat";
  db_.exec("UPDATE " + s("attempt_state") + " SET heartbeat_at = now() - interval '31 seconds'");
  EXPECT_EQ(db_.scalar("SELECT " + s("rescue_stale") + "('30 seconds')"), "1");
}

TEST_F(sql_contract, retry_job_makes_a_finished_job_runnable_and_the_lease_keeps_counting) {
  const auto id = enqueue("k");
  auto c = claim(1);
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {c[0].token});
  EXPECT_EQ(db_.scalar("SELECT " + s("retry_job") + "($1)", {id}), "t");
  EXPECT_EQ(state_of(id), "available");
  EXPECT_EQ(db_.scalar("SELECT " + s("retry_job") + "($1)", {id}), "f") << "not finished";
  auto c2 = claim(1);
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_GT(std::stoll(c2[0].run_lease), std::stoll(c[0].run_lease));
  EXPECT_EQ(c2[0].attempt, "1") << "admin retry resets the attempt budget";
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {c[0].token}).sqlstate, "TN001");
  EXPECT_EQ(db_.query("SELECT " + s("retry_job") + "(987654321)").sqlstate, "TN003");
  EXPECT_EQ(db_.query("SELECT " + s("cancel_job") + "(987654321)").sqlstate, "TN003");
}

TEST_F(sql_contract, jobs_view_shows_every_state) {
  const auto available = enqueue("available");
  const auto scheduled = enqueue("scheduled", ", '{}', 'other', 2, now() + interval '1 hour'");
  const auto completed = enqueue("completed", ", '{}', 'q1'");
  const auto failed = enqueue("failed", ", '{}', 'q2'");
  const auto running = enqueue("running", ", '{}', 'q3'");
  const auto retryable = enqueue("retryable", ", '{}', 'q4'");
  const auto cancelled = enqueue("cancelled", ", '{}', 'q5'");
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {claim(1, "q1")[0].token});
  db_.exec("SELECT " + s("fail_job") + "($1, 'x', false)", {claim(1, "q2")[0].token});
  claim(1, "q3");
  db_.exec("SELECT " + s("fail_job") + "($1, 'x')", {claim(1, "q4")[0].token});
  db_.exec("SELECT " + s("cancel_job") + "($1)", {cancelled});
  EXPECT_EQ(state_of(available), "available");
  EXPECT_EQ(state_of(scheduled), "scheduled");
  EXPECT_EQ(state_of(completed), "completed");
  EXPECT_EQ(state_of(failed), "failed");
  EXPECT_EQ(state_of(running), "running");
  EXPECT_EQ(state_of(retryable), "retryable");
  EXPECT_EQ(state_of(cancelled), "cancelled");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("jobs")), "7");
  auto cols = db_.exec("SELECT id, queue, kind, args, state, priority, attempt, max_attempts, run_lease, run_at, "
                       "created_at, finalized_at, last_error FROM " + s("jobs") + " WHERE id = $1", {completed});
  ASSERT_EQ(cols.rows.size(), 1u);
  EXPECT_TRUE(cols.rows[0][11].has_value()) << "finalized_at set for a completed job";
}

// Completion and rescue of the same attempts race for real; a business row written in the same
// transaction as complete_job exists if and only if that attempt ended completed. Each round
// claims a batch, then a finisher (business insert + complete_job + COMMIT per job) and a rescuer
// start together, so every round has attempts decided by the race itself.
TEST_F(sql_contract, complete_and_rescue_race_and_exactly_one_wins_per_attempt) {
  const int rounds = 20, per_round = 25;
  db_.exec("CREATE TABLE " + s("business") + " (job_id bigint, run_lease bigint)");
  pg finisher_db{schema_.dsn()}, rescuer_db{schema_.dsn()};
  int completed = 0, stale = 0;
  for (int round = 0; round < rounds; ++round) {
    db_.exec("SELECT " + s("enqueue_batch") +
             "(array_fill('k'::text, ARRAY[$1::int]), array_fill('{}'::jsonb, ARRAY[$1::int]), "
             "array_fill('default'::text, ARRAY[$1::int]), array_fill(2, ARRAY[$1::int]))",
             {std::to_string(per_round)});
    auto jobs = claim(per_round);
    ASSERT_EQ(jobs.size(), static_cast<std::size_t>(per_round));
    std::atomic<int> ready{0}, finished{0};
    std::thread finisher([&] {
      ++ready;
      while (ready < 2) std::this_thread::yield();
      for (const auto& j : jobs) {
        finisher_db.exec("BEGIN");
        finisher_db.exec("INSERT INTO " + s("business") + " VALUES ($1, $2)", {j.job_id, j.run_lease});
        auto r = finisher_db.query("SELECT * FROM " + s("complete_job") + "($1)", {j.token});
        if (r.ok) {
          finisher_db.exec("COMMIT");
          ++completed;
        } else {
          EXPECT_EQ(r.sqlstate, "TN001") << r.error;
          finisher_db.query("COMMIT");  // the server aborted the transaction: this rolls back
          ++stale;
        }
        ++finished;
      }
    });
    ++ready;
    while (ready < 2) std::this_thread::yield();
    // Let the finisher get a round-dependent head start, then rescue everything still open while
    // it keeps going: the attempts around that point are decided by the race.
    while (finished < round) std::this_thread::yield();
    rescuer_db.exec("SELECT " + s("rescue_stale") + "('0 seconds')");
    finisher.join();
    // Whatever the rescue made available again is drained so the next round starts clean.
    db_.exec("SELECT " + s("cancel_job") + "(id) FROM " + s("ready"));
  }
  EXPECT_EQ(completed + stale, rounds * per_round);
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("business") + " b LEFT JOIN " + s("done") +
                       " d ON d.id = b.job_id AND d.run_lease = b.run_lease AND d.state = 'completed' "
                       "WHERE d.id IS NULL"),
            "0")
      << "a business row committed without its attempt's completion";
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("done") + " d WHERE d.state = 'completed' AND NOT EXISTS "
                       "(SELECT 1 FROM " + s("business") + " b WHERE b.job_id = d.id AND b.run_lease = d.run_lease)"),
            "0");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("business")), std::to_string(completed));
  EXPECT_GT(completed, 0);
  EXPECT_GT(stale, 0);
  std::cout << "race: " << completed << " completed first, " << stale << " rescued first\n";
}

// The documented misuse: a savepoint that swallows TN001 lets the business writes commit without
// the completion. It is the one way to separate them, and it is outside the contract (README).
TEST_F(sql_contract, a_savepoint_that_swallows_tn001_is_the_one_way_to_separate_the_writes) {
  db_.exec("CREATE TABLE " + s("business") + " (note text)");
  enqueue("k");
  const auto token = claim(1).at(0).token;
  db_.exec("SELECT " + s("rescue_stale") + "('0 seconds')");  // the attempt is stale now
  // Without a savepoint: TN001 aborts the transaction and the business write is lost with it.
  db_.exec("BEGIN");
  db_.exec("INSERT INTO " + s("business") + " VALUES ('without savepoint')");
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {token}).sqlstate, "TN001");
  db_.query("COMMIT");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("business")), "0");
  // With a savepoint that swallows the error: the write commits although the job did not complete.
  db_.exec("BEGIN");
  db_.exec("INSERT INTO " + s("business") + " VALUES ('with savepoint')");
  db_.exec("SAVEPOINT swallow");
  EXPECT_EQ(db_.query("SELECT * FROM " + s("complete_job") + "($1)", {token}).sqlstate, "TN001");
  db_.exec("ROLLBACK TO SAVEPOINT swallow");
  db_.exec("COMMIT");
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("business")), "1");
  EXPECT_EQ(db_.scalar("SELECT state FROM " + s("jobs")), "available") << "the job did not complete";
}

TEST_F(sql_contract, concurrent_claimers_never_share_a_job) {
  const int n = 2000;
  db_.exec("SELECT " + s("enqueue_batch") +
           "(array_fill('k'::text, ARRAY[$1::int]), array_fill('{}'::jsonb, ARRAY[$1::int]), "
           "array_fill('default'::text, ARRAY[$1::int]), array_fill(2, ARRAY[$1::int]))",
           {std::to_string(n)});
  std::mutex mu;
  std::multiset<std::string> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      pg c{schema_.dsn()};
      for (;;) {
        auto r = c.exec("SELECT job_id FROM " + s("claim") + "('default', 13)");
        if (r.rows.empty()) break;
        std::lock_guard lock(mu);
        for (auto& row : r.rows) seen.insert(*row[0]);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), static_cast<std::size_t>(n));
}

// Claim, heartbeats and completion must cost per job, not per row left in the table: between vacuums,
// ready's heap still holds every row claimed since the last one. Small,
// freshly analyzed tables are where the planner likes sequential scans best, so this is the
// case to check. The statistics of the current transaction count every scan the functions did.
TEST_F(sql_contract, claim_heartbeat_and_completion_reach_rows_by_index_never_by_scanning_the_table) {
  db_.exec("SELECT " + s("enqueue_batch") +
           "(array_fill('k'::text, ARRAY[300]), array_fill('{}'::jsonb, ARRAY[300]), "
           "array_fill('default'::text, ARRAY[300]), array_fill(2, ARRAY[300]))");
  auto warm = claim(100);
  ASSERT_EQ(warm.size(), 100u);
  db_.exec("ANALYZE " + s("ready") + ", " + s("specs") + ", " + s("claims") + ", " + s("closures") + ", " +
           s("open_claims"));

  db_.exec("BEGIN");
  for (int round = 0; round < 6; ++round) {  // past plpgsql's first five (custom) plans
    auto got = db_.exec("SELECT job_id, run_lease FROM " + s("claim_attempts") + "('default', 20, 'w')");
    ASSERT_EQ(got.rows.size(), 20u) << "round " << round;
    const std::vector<tenure::test::cell> attempts{tenure::test::array_literal(got, 0),
                                                   tenure::test::array_literal(got, 1)};
    EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("heartbeat_batch") + "($1::bigint[], $2::bigint[])", attempts),
              "20")
        << "round " << round;
    EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("complete_batch") + "($1::bigint[], $2::bigint[])", attempts),
              "20")
        << "round " << round;
  }
  auto scans = db_.exec(
      "SELECT relname, seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = $1 "
      "AND relname IN ('ready', 'specs', 'claims', 'closures', 'attempt_state') ORDER BY relname",
      {schema_.name()});
  db_.exec("COMMIT");
  ASSERT_EQ(scans.rows.size(), 5u);
  for (const auto& row : scans.rows) EXPECT_EQ(*row[1], "0") << "sequential scans of " << *row[0];
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("done")), "120");
}

TEST_F(sql_contract, cancel_of_a_running_job_is_announced_on_the_cancel_channel) {
  const auto id = enqueue("k");
  auto c = claim(1);
  pg listener{schema_.dsn()};
  listener.exec("LISTEN " + schema_.name() + "_cancel");
  db_.exec("SELECT " + s("cancel_job") + "($1)", {id});
  PQconsumeInput(listener.native());
  listener.query("SELECT 1");  // a round trip delivers pending notifications
  PGnotify* n = PQnotifies(listener.native());
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(std::string{n->extra}, id + ":" + c[0].run_lease);
  PQfreemem(n);
}

}  // namespace
