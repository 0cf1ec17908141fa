// The privilege boundary: roles get only what `tenure grant-*` gives them, and the
// SECURITY DEFINER functions cannot be steered by a caller's search_path.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>

#include "support/pg.hpp"
#include "tenure/postgres/schema.hpp"

using tenure::test::pg;
using tenure::test::scoped_schema;

namespace {

/// The SQLSTATE `sql` fails with inside `db`'s open transaction, run in a savepoint of its own so
/// the transaction goes on ("" when it succeeds).
std::string refused_in_savepoint(pg& db, const std::string& sql) {
  db.exec("SAVEPOINT probe");
  const auto r = db.query(sql);
  db.exec("ROLLBACK TO SAVEPOINT probe");
  return r.ok ? "" : r.sqlstate;
}

class security : public ::testing::Test {
 protected:
  void SetUp() override {
    role_ = "tenure_role_" + tenure::test::random_suffix();
    admin_.exec("CREATE ROLE " + role_ + " LOGIN");
    // The role owns a schema of its own: the attacker's playground.
    admin_.exec("CREATE SCHEMA " + role_ + "_own AUTHORIZATION " + role_);
  }
  void TearDown() override {
    admin_.query("DROP SCHEMA IF EXISTS " + role_ + "_own CASCADE");
    admin_.query("DROP OWNED BY " + role_ + " CASCADE");
    admin_.query("DROP ROLE IF EXISTS " + role_);
  }
  std::string s(const std::string& name) const { return schema_.name() + "." + name; }
  void grant(tenure::postgres::grant_kind kind) {
    auto g = tenure::postgres::grant(schema_.dsn(), kind, role_, schema_.name());
    ASSERT_TRUE(g) << g.error().message();
  }
  std::string claim_token() {
    admin_.exec("SELECT " + s("enqueue") + "('k')");
    return admin_.scalar("SELECT token FROM " + s("claim") + "('default')");
  }

  scoped_schema schema_{"sec"};
  pg admin_{schema_.dsn()};
  std::string role_;
};

TEST_F(security, execute_is_revoked_from_public_on_every_function) {
  EXPECT_EQ(admin_.scalar("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                          "WHERE n.nspname = $1 AND has_function_privilege('public', p.oid, 'EXECUTE')",
                          {schema_.name()}),
            "0");
  EXPECT_EQ(admin_.scalar("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                          "WHERE n.nspname = $1 AND (NOT p.prosecdef OR NOT "
                          "array_to_string(p.proconfig, ',') LIKE '%search_path=pg_catalog, pg_temp%')",
                          {schema_.name()}),
            "0")
      << "every function is SECURITY DEFINER with search_path ending in pg_temp";
}

TEST_F(security, a_role_without_grants_can_do_nothing) {
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue") + "('k')").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("jobs")).sqlstate, "42501");
}

TEST_F(security, finalizer_can_complete_a_token_in_its_own_transaction_and_nothing_else) {
  grant(tenure::postgres::grant_kind::finalizer);
  const auto token = claim_token();
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  // Hostile search_path: shadow functions and operators the contract's SQL uses.
  as_role.exec("CREATE FUNCTION " + role_ + "_own.regexp_match(text, text) RETURNS text[] "
               "LANGUAGE sql AS $$ SELECT ARRAY['1','1'] $$");
  as_role.exec("CREATE FUNCTION " + role_ + "_own.now() RETURNS timestamptz LANGUAGE sql AS "
               "$$ SELECT '2000-01-01'::timestamptz $$");
  as_role.exec("CREATE FUNCTION " + role_ + "_own.tbig_eq(bigint, bigint) RETURNS boolean LANGUAGE sql "
               "AS $$ SELECT true $$");
  as_role.exec("CREATE OPERATOR " + role_ + "_own.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = " +
               role_ + "_own.tbig_eq)");
  as_role.exec("SET search_path = " + role_ + "_own, pg_catalog");

  EXPECT_EQ(as_role.query("SELECT count(*) FROM " + s("jobs")).sqlstate, "42501");
  for (const auto& table : {"specs", "ready", "deferred", "claims", "closures", "open_claims", "legacy_attempts",
                            "settled_claims", "attempt_state", "queues", "schema_version"}) {
    EXPECT_EQ(as_role.query("SELECT count(*) FROM " + s(table)).sqlstate, "42501") << table;
    EXPECT_EQ(as_role.query("DELETE FROM " + s(table)).sqlstate, "42501") << table;
  }
  for (const auto& view : {"receipts", "done", "claim_items", "open_attempts"}) {
    EXPECT_EQ(as_role.query("SELECT count(*) FROM " + s(view)).sqlstate, "42501") << view;
  }
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue") + "('k')").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("claim") + "('default')").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT " + s("cancel_job") + "(1)").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT " + s("parse_token") + "('tn2:1:1:00112233445566778899aabbccddeeff')").sqlstate,
            "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("token_attempt") + "($1)", {token}).sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT " + s("secret_matches") + "(gen_random_uuid(), gen_random_uuid())").sqlstate,
            "42501");

  // A malformed or stale token is still refused despite the shadowing.
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("complete_job") + "('tn2:1:999:00112233445566778899aabbccddeeff')")
                .sqlstate,
            "TN001");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("complete_job") + "('garbage')").sqlstate, "TN002");

  as_role.exec("BEGIN");
  as_role.exec("CREATE TABLE " + role_ + "_own.business (n int)");
  as_role.exec("INSERT INTO " + role_ + "_own.business VALUES (1)");
  auto done = as_role.query("SELECT job_id, run_lease FROM " + s("complete_job") + "($1)", {token});
  ASSERT_TRUE(done.ok) << done.error;
  as_role.exec("COMMIT");
  EXPECT_EQ(admin_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {done.at(0, 0)}), "completed");
  EXPECT_EQ(admin_.scalar("SELECT finalized_at > now() - interval '1 hour' FROM " + s("jobs") +
                          " WHERE id = $1", {done.at(0, 0)}),
            "t")
      << "the shadow now() was not used";
}

// The attack on guessable tokens: a role granted only grant-finalizer loops over (job, lease)
// pairs, in the old form and in the new one with secrets of its own making, completing whatever
// answers with progress of its choosing, or rolling back to learn which jobs are running. It
// completes nothing and learns nothing: every probe of a running attempt is answered exactly as
// a probe of a finished or unknown one. The token the claim handed out still completes the job.
TEST_F(security, a_finalizer_cannot_complete_or_detect_running_jobs_by_enumerating_attempts) {
  grant(tenure::postgres::grant_kind::finalizer);
  for (int i = 0; i < 3; ++i) admin_.exec("SELECT " + s("enqueue") + "('k')");
  auto claimed = admin_.exec("SELECT job_id, run_lease, token FROM " + s("claim") + "('default', 3)");
  ASSERT_EQ(claimed.rows.size(), 3u);
  // Job 3 finishes; jobs 1 and 2 stay running.
  admin_.exec("SELECT * FROM " + s("complete_job") + "($1)", {claimed.at(2, 2)});
  const std::string running[] = {claimed.at(0, 0), claimed.at(1, 0)};
  const std::string finished = claimed.at(2, 0);
  const std::string& token_2 = claimed.at(1, 2);
  const std::string secret_of_job_2 =
      token_2.size() > 32 ? token_2.substr(token_2.size() - 32) : std::string(32, 'f');

  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  const std::regex numbers{"[0-9]+"};
  std::map<std::string, std::set<std::string>> answers;  // form -> normalized answers
  int probes = 0;
  for (long long job = 1; job <= std::stoll(finished) + 2; ++job) {
    for (int lease = 1; lease <= 3; ++lease) {
      const std::string pair = std::to_string(job) + ":" + std::to_string(lease);
      const std::map<std::string, std::string> forms = {
          {"tn1", "tn1:" + pair},
          {"tn2 zero secret", "tn2:" + pair + ":" + std::string(32, '0')},
          {"tn2 made-up secret", "tn2:" + pair + ":0123456789abcdef0123456789abcdef"},
          {"tn2 another attempt's secret", "tn2:" + pair + ":" + secret_of_job_2},
      };
      for (const auto& [form, token] : forms) {
        if (token == claimed.at(1, 2)) continue;  // job 2's own token: not a guess
        for (const bool commit : {false, true}) {
          as_role.exec("BEGIN");
          auto r = as_role.query("SELECT job_id FROM " + s("complete_job") + "($1, '{\"owned\": true}')", {token});
          as_role.query(commit ? "COMMIT" : "ROLLBACK");
          ++probes;
          EXPECT_FALSE(r.ok) << token << " completed job " << (r.ok && !r.rows.empty() ? r.at(0, 0) : "?");
          EXPECT_EQ(r.sqlstate, form == "tn1" ? "TN002" : "TN001") << token << ": " << r.error;
          answers[form].insert(r.sqlstate + " " + std::regex_replace(r.error, numbers, "N"));
        }
      }
    }
  }
  EXPECT_GT(probes, 50);
  for (const auto& [form, seen] : answers) {
    EXPECT_EQ(seen.size(), 1u) << form << ": running and finished attempts were answered differently";
  }
  for (const auto& id : running) {
    EXPECT_EQ(admin_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {id}), "running") << id;
    EXPECT_EQ(admin_.scalar("SELECT progress IS NULL FROM " + s("jobs") + " WHERE id = $1", {id}), "t") << id;
  }

  // The token the claim handed out is the one that works.
  auto done = as_role.query("SELECT job_id FROM " + s("complete_job") + "($1)", {claimed.at(0, 2)});
  ASSERT_TRUE(done.ok) << done.error;
  EXPECT_EQ(done.at(0, 0), running[0]);
  EXPECT_EQ(admin_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {running[0]}), "completed");
  EXPECT_EQ(admin_.scalar("SELECT state FROM " + s("jobs") + " WHERE id = $1", {running[1]}), "running");
}

TEST_F(security, producer_can_enqueue_but_not_claim_or_read) {
  grant(tenure::postgres::grant_kind::producer);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  auto id = as_role.query("SELECT " + s("enqueue") + "('k', '{\"a\":1}')");
  ASSERT_TRUE(id.ok) << id.error;
  EXPECT_TRUE(as_role.query("SELECT * FROM " + s("enqueue_batch") +
                            "(ARRAY['a'], ARRAY['{}'::jsonb], ARRAY['q'], ARRAY[2])").ok);
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("claim") + "('default')").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("jobs")).sqlstate, "42501");
  EXPECT_EQ(admin_.scalar("SELECT count(*) FROM " + s("jobs")), "2");
}

TEST_F(security, producer_enqueues_over_copy_holding_only_insert_on_a_stage_tenure_owns) {
  grant(tenure::postgres::grant_kind::producer);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  as_role.exec("BEGIN");
  const std::string stage = as_role.scalar("SELECT " + s("enqueue_copy_stage") + "()");
  EXPECT_TRUE(std::regex_match(stage, std::regex{"pg_temp\\.tenure_enqueue_[0-9]+"})) << stage;
  EXPECT_EQ(as_role.scalar("SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = $1::regclass",
                           {stage}),
            admin_.scalar("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = $1", {schema_.name()}))
      << "the stage belongs to the schema's owner, not to the caller";
  // Everything but INSERT is refused, each in a savepoint of its own.
  for (const std::string& sql : {"SELECT * FROM " + stage, "DELETE FROM " + stage, "TRUNCATE " + stage,
                                 "DROP TABLE " + stage, "ALTER TABLE " + stage + " DROP CONSTRAINT \"priority must be 1..4\"",
                                 "CREATE TRIGGER t BEFORE INSERT ON " + stage +
                                     " FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()"}) {
    EXPECT_EQ(refused_in_savepoint(as_role, sql), "42501") << sql;
  }
  // Rows the checks refuse never get in.
  for (const char* row : {"(1, '', '{}', 'q', 2, NULL, 25, '{}')", "(1, 'k', '[1]', 'q', 2, NULL, 25, '{}')",
                                 "(1, 'k', '{}', E'q\\n', 2, NULL, 25, '{}')", "(1, 'k', '{}', 'q', 9, NULL, 25, '{}')",
                                 "(1, 'k', '{}', 'q', 2, 'infinity', 25, '{}')", "(1, 'k', '{}', 'q', 2, NULL, 0, '{}')"}) {
    EXPECT_EQ(refused_in_savepoint(as_role, "INSERT INTO " + stage + " VALUES " + row), "23514") << row;
  }
  as_role.exec("INSERT INTO " + stage + " VALUES (2, 'b', '{}', 'q', 2, NULL, 25, '{}'), (1, 'a', '{}', 'q', 2, NULL, 25, '{}')");
  const std::string ids = as_role.scalar("SELECT " + s("enqueue_copied") + "()");
  as_role.exec("COMMIT");
  EXPECT_EQ(admin_.scalar("SELECT string_agg(j.kind, ',' ORDER BY a.ord) FROM unnest($1::bigint[]) WITH ORDINALITY "
                          "AS a(id, ord) JOIN " + s("jobs") + " j ON j.id = a.id",
                          {ids}),
            "a,b")
      << "the answer lists the ids in ord order: " << ids;
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("ready")).sqlstate, "42501");
}

TEST_F(security, producer_copies_straight_into_specs_holding_insert_on_the_six_job_columns_only) {
  grant(tenure::postgres::grant_kind::producer);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  EXPECT_EQ(as_role.scalar("SELECT " + s("enqueue_copy_target") + "(false)"), s("specs"));
  as_role.exec("BEGIN");
  EXPECT_TRUE(std::regex_match(as_role.scalar("SELECT " + s("enqueue_copy_target") + "(true)"),
                               std::regex{"pg_temp\\.tenure_enqueue_[0-9]+"}))
      << "a batch with a scheduled job goes through the stage";
  const std::string columns = " (kind, args, queue, priority, max_attempts, metadata)";
  // Every column tenure sets itself, every other statement on the job tables, and moving the
  // sequence are refused, each in a savepoint of its own.
  for (const std::string& sql :
       {"INSERT INTO " + s("specs") + " (id, kind, queue) VALUES (1, 'k', 'q')",
        "INSERT INTO " + s("specs") + " (kind, queue, created_at) VALUES ('k', 'q', now() - interval '1 day')",
        "INSERT INTO " + s("ready") + " (id, queue, priority, run_at, created_at, run_lease, attempt) "
                                      "VALUES (1, 'q', 2, now(), now(), 0, 0)",
        "INSERT INTO " + s("deferred") + " (id, queue, priority, run_at, created_at, state, run_lease, attempt) "
                                         "VALUES (1, 'q', 2, now(), now(), 'scheduled', 0, 0)",
        "INSERT INTO " + s("claims") + " (claim_id, queue, claimed_at, lo, hi, job_ids, attempts, secrets, run_ats) "
                                       "VALUES (1, 'q', now(), 1, 1, '{1}', '{1}', '{}', '{}')",
        "INSERT INTO " + s("closures") + " (claim_id, pos, outcome, closed_at) VALUES (1, 1, 'c', now())",
        "INSERT INTO " + s("runs") + " (run_id, queue, priority, created_at, lo, hi, job_ids) "
                                     "VALUES (1, 'q', 2, now(), 1, 1, '{1}')",
        "UPDATE " + s("runs") + " SET taken = 0", "SELECT * FROM " + s("runs"),
        "INSERT INTO " + s("specs") + columns + " VALUES ('k', '{}', 'q', 2, 25, '{}') RETURNING id",
        "SELECT * FROM " + s("specs"), "SELECT id FROM " + s("specs"), "UPDATE " + s("specs") + " SET priority = 1",
        "DELETE FROM " + s("specs"), "TRUNCATE " + s("specs"), "SELECT * FROM " + s("ready"),
        "ALTER TABLE " + s("specs") + " DROP CONSTRAINT \"priority must be 1..4\"",
        "SELECT setval('" + s("job_id_seq") + "', 1)", "LOCK TABLE " + s("specs") + " IN SHARE MODE"}) {
    EXPECT_EQ(refused_in_savepoint(as_role, sql), "42501") << sql;
  }
  // Rows enqueue's checks refuse never get in.
  for (const char* row : {"('', '{}', 'q', 2, 25, '{}')", "('k', '[1]', 'q', 2, 25, '{}')",
                          "('k', '{}', E'q\\n', 2, 25, '{}')", "('k', '{}', '', 2, 25, '{}')",
                          "(E'k\\t', '{}', 'q', 2, 25, '{}')", "('k', '{}', 'q', 9, 25, '{}')",
                          "('k', '{}', 'q', 0, 25, '{}')", "('k', '{}', 'q', 2, 0, '{}')",
                          "('k', '{}', 'q', 2, 25, '[]')",
                          "('k', '{}', 'q', 2, 25, jsonb_build_object('pad', repeat('x', 9000)))"}) {
    EXPECT_EQ(refused_in_savepoint(as_role, "INSERT INTO " + s("specs") + columns + " VALUES " + row), "23514") << row;
  }
  as_role.exec("INSERT INTO " + s("specs") + columns + " VALUES ('b', '{}', 'q', 1, 3, '{}'), ('a', '{\"x\": 1}', 'q', 4, 25, '{}')");
  const std::string ids = as_role.scalar("SELECT " + s("enqueue_copied_ready") + "(2)");
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue_copied_ready") + "(3)").rows.at(0).at(0), std::nullopt)
      << "only two rows were written";
  as_role.exec("COMMIT");
  EXPECT_EQ(admin_.scalar("SELECT string_agg(format('%s %s %s %s %s', j.kind, j.priority, j.max_attempts, j.attempt, "
                          "j.run_lease), ',' ORDER BY a.ord) FROM unnest($1::bigint[]) WITH ORDINALITY AS a(id, ord) "
                          "JOIN " + s("jobs") + " j ON j.id = a.id AND j.state = 'available'",
                          {ids}),
            "b 1 3 0 0,a 4 25 0 0")
      << "the answer lists the ids in the order the rows were written: " << ids;
  EXPECT_EQ(admin_.scalar("SELECT bool_and(run_at = created_at AND created_at > now() - interval '1 minute') FROM " +
                          s("jobs") + " WHERE id = ANY ($1::bigint[])",
                          {ids}),
            "t");
  EXPECT_EQ(admin_.scalar("SELECT count(*) FROM " + s("runs")), "2") << "one run row per priority of the batch";
  // A later transaction of the session is not answered the rows an earlier one wrote.
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue_copied_ready") + "(2)").rows.at(0).at(0), std::nullopt);
  pg fresh{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  EXPECT_EQ(fresh.query("SELECT " + s("enqueue_copied_ready") + "(1)").rows.at(0).at(0), std::nullopt)
      << "a session that drew no id";
}

TEST_F(security, the_name_checks_of_specs_refuse_exactly_the_kinds_and_queues_with_a_control_character) {
  grant(tenure::postgres::grant_kind::producer);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  as_role.exec("BEGIN");
  // Printable ASCII, other letters, and control characters inside and outside ASCII: refused
  // exactly where the server's [[:cntrl:]] finds one, in the kind and in the queue alike.
  for (const char* name : {"noop", "a b~!", "k\u00e4se", "\u65e5\u672c", "a\u0085b", "a\u2028b", "a\tb", "a\u007fb",
                           "\u001b[2J"}) {
    const std::string literal = std::string{"U&'"} + name + "'";
    const bool control = admin_.scalar("SELECT " + literal + " ~ '[[:cntrl:]]'") == "t";
    for (const std::string& row : {"(" + literal + ", '{}', 'q', 2, 25, '{}')", "('k', '{}', " + literal + ", 2, 25, '{}')"}) {
      const std::string sql = "INSERT INTO " + s("specs") + " (kind, args, queue, priority, max_attempts, metadata) VALUES " + row;
      EXPECT_EQ(refused_in_savepoint(as_role, sql), control ? "23514" : "") << row;
    }
  }
  as_role.exec("ROLLBACK");
}

TEST_F(security, the_copy_read_back_never_answers_rows_another_transaction_wrote) {
  grant(tenure::postgres::grant_kind::producer);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  const std::string columns = " (kind, args, queue, priority, max_attempts, metadata)";
  // The producer's own earlier transaction, and another session's job numbered after it.
  as_role.exec("INSERT INTO " + s("specs") + columns + " VALUES ('mine', '{}', 'q', 2, 25, '{}')");
  admin_.exec("INSERT INTO " + s("specs") + " (kind, queue) VALUES ('theirs', 'q')");
  as_role.exec("BEGIN");
  as_role.exec("SELECT pg_current_xact_id()");
  const auto r = as_role.query("SELECT " + s("enqueue_copied_ready") + "(1)");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.rows.at(0).at(0), std::nullopt) << "rows this transaction did not write";
  as_role.exec("ROLLBACK");
  EXPECT_EQ(admin_.scalar("SELECT count(*) FROM " + s("ready")), "0") << "nothing was made claimable";
}

TEST_F(security, a_producer_without_the_column_grants_is_offered_the_stage_instead_of_specs) {
  grant(tenure::postgres::grant_kind::producer);
  admin_.exec("REVOKE INSERT (metadata) ON " + s("specs") + " FROM " + role_);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  as_role.exec("BEGIN");
  EXPECT_TRUE(std::regex_match(as_role.scalar("SELECT " + s("enqueue_copy_target") + "(false)"),
                               std::regex{"pg_temp\\.tenure_enqueue_[0-9]+"}));
  as_role.exec("ROLLBACK");
}

TEST_F(security, a_stage_the_caller_made_before_tenure_did_is_refused) {
  grant(tenure::postgres::grant_kind::producer);
  const std::string name =
      "tenure_enqueue_" + admin_.scalar("SELECT oid FROM pg_namespace WHERE nspname = $1", {schema_.name()});
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  // The caller's own table of that name, without the checks, rows already in it.
  as_role.exec("CREATE TEMP TABLE " + name +
               " (ord int, kind text, args jsonb, queue text, priority int, run_at timestamptz, max_attempts int, "
               "metadata jsonb)");
  as_role.exec("INSERT INTO pg_temp." + name + " VALUES (1, E'evil\\n', '[]', '', 99, NULL, -1, '[]')");
  const auto staged = as_role.query("SELECT " + s("enqueue_copy_stage") + "()");
  EXPECT_EQ(staged.sqlstate, "42501") << staged.error;
  EXPECT_NE(staged.error.find("is not the stage tenure made"), std::string::npos) << staged.error;
  const auto moved = as_role.query("SELECT " + s("enqueue_copied") + "()");
  EXPECT_EQ(moved.sqlstate, "42501") << moved.error;
  EXPECT_EQ(admin_.scalar("SELECT count(*) FROM " + s("jobs")), "0");
}

TEST_F(security, a_role_without_the_producer_grant_cannot_stage_or_move_jobs) {
  grant(tenure::postgres::grant_kind::worker);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue_copy_stage") + "()").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue_copied") + "()").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue_copy_target") + "(false)").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT " + s("enqueue_copied_ready") + "(1)").sqlstate, "42501");
  EXPECT_EQ(as_role.query("INSERT INTO " + s("specs") + " (kind, queue) VALUES ('k', 'q')").sqlstate, "42501");
}

TEST_F(security, worker_can_drive_the_attempt_protocol_but_not_touch_tables) {
  grant(tenure::postgres::grant_kind::worker);
  admin_.exec("SELECT " + s("enqueue") + "('k')");
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  auto c = as_role.query("SELECT token FROM " + s("claim") + "('default')");
  ASSERT_TRUE(c.ok) << c.error;
  ASSERT_EQ(c.rows.size(), 1u);
  EXPECT_EQ(as_role.scalar("SELECT " + s("heartbeat") + "($1)", {c.at(0, 0)}), "t");
  EXPECT_TRUE(as_role.query("SELECT * FROM " + s("complete_job") + "($1)", {c.at(0, 0)}).ok);
  EXPECT_EQ(as_role.scalar("SELECT state FROM " + s("jobs")), "completed");
  EXPECT_EQ(as_role.query("DELETE FROM " + s("closures")).sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("receipts")).sqlstate, "42501");
}

TEST_F(security, worker_can_lead_maintenance_through_the_lease_functions_but_not_touch_the_lease_row) {
  grant(tenure::postgres::grant_kind::worker);
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  EXPECT_EQ(as_role.scalar("SELECT " + s("acquire_leadership") + "('w', '1 minute')"), "1");
  auto pass = as_role.query("SELECT * FROM " + s("maintain") + "('w', 1, '30 seconds')");
  EXPECT_TRUE(pass.ok) << pass.error;
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("maintain") + "('w', 7, '30 seconds')").sqlstate, "TN004");
  EXPECT_EQ(as_role.scalar("SELECT " + s("release_leadership") + "('w', 1)"), "t");
  EXPECT_EQ(as_role.query("UPDATE " + s("leadership") + " SET holder = 'w'").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("leadership")).sqlstate, "42501");
}

TEST_F(security, worker_can_register_and_await_callbacks_and_read_checkpoints) {
  grant(tenure::postgres::grant_kind::worker);
  admin_.exec("SELECT " + s("enqueue") + "('k')");
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  auto c = as_role.query("SELECT job_id, run_lease FROM " + s("claim") + "('default')");
  ASSERT_TRUE(c.ok) << c.error;
  auto id = as_role.query("SELECT " + s("register_callback") + "($1, $2, '1 hour')", {c.at(0, 0), c.at(0, 1)});
  ASSERT_TRUE(id.ok) << id.error;
  EXPECT_EQ(as_role.scalar("SELECT status FROM " + s("await_callback") + "($1, $2, $3::uuid)",
                           {c.at(0, 0), c.at(0, 1), id.at(0, 0)}),
            "waiting");
  EXPECT_EQ(as_role.scalar("SELECT count(*) FROM " + s("attempt_checkpoint") + "($1, $2)", {c.at(0, 0), c.at(0, 1)}),
            "1");
  EXPECT_EQ(as_role.query("SELECT " + s("resume_callback") + "($1::uuid)", {id.at(0, 0)}).sqlstate, "42501")
      << "resolving callbacks is grant-callback's, not the worker's";
}

TEST_F(security, callback_role_can_resolve_callbacks_but_nothing_else) {
  grant(tenure::postgres::grant_kind::callback);
  admin_.exec("SELECT " + s("enqueue") + "('k')");
  auto c = admin_.exec("SELECT job_id, run_lease FROM " + s("claim") + "('default')");
  const auto id = admin_.scalar("SELECT " + s("register_callback") + "($1, $2, '1 hour')", {c.at(0, 0), c.at(0, 1)});
  pg as_role{tenure::test::dsn_with_user(schema_.dsn(), role_)};
  EXPECT_EQ(as_role.scalar("SELECT " + s("extend_callback") + "($1::uuid, '2 hours')", {id}), "t");
  EXPECT_EQ(as_role.scalar("SELECT " + s("resume_callback") + "($1::uuid, '{\"x\": 1}')", {id}), "t");
  EXPECT_EQ(as_role.scalar("SELECT " + s("resume_callback") + "($1::uuid)", {id}), "f");
  EXPECT_EQ(as_role.scalar("SELECT " + s("complete_callback") + "(gen_random_uuid())"), "f");
  EXPECT_EQ(as_role.scalar("SELECT " + s("fail_callback") + "(gen_random_uuid(), 'no')"), "f");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("claim") + "('default')").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT " + s("register_callback") + "(1, 1, '1 hour')").sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("jobs")).sqlstate, "42501");
  EXPECT_EQ(as_role.query("SELECT * FROM " + s("attempt_state")).sqlstate, "42501");
}

TEST_F(security, grant_to_an_unknown_role_is_a_clear_error) {
  auto g = tenure::postgres::grant(schema_.dsn(), tenure::postgres::grant_kind::finalizer,
                                   "no_such_role_" + tenure::test::random_suffix(), schema_.name());
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error(), tenure::errc::invalid_argument);
  EXPECT_NE(g.error().detail().find("does not exist"), std::string::npos) << g.error().message();
  EXPECT_EQ(g.error().sqlstate(), "42704") << "the server's SQLSTATE travels with the error";
}

}  // namespace
