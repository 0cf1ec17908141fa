// Upgrading an installed schema: every older version, with attempts open across the upgrade.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "migrations.hpp"
#include "support/pg.hpp"
#include "tenure/postgres/schema.hpp"

using tenure::test::pg;

namespace {

// Drops the test's schema and role however the test ends (roles outlive the database's schemas).
struct cleanup {
  std::string dsn, schema, role;
  ~cleanup() {
    try {
      pg c{dsn};
      c.query("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
      c.query("DROP ROLE IF EXISTS " + role);
    } catch (...) {
      // Best effort, as scoped_schema.
    }
  }
};

/// The version of the embedded migration whose name ends with `suffix` (0 when none does): found by
/// name, as versions are renumbered when merged.
int version_named(std::string_view suffix) {
  for (const auto& m : tenure::postgres::detail::embedded_migrations()) {
    if (std::string_view{m.name}.ends_with(suffix)) return m.version;
  }
  return 0;
}

// Installs version `from`, opens two attempts through that version's functions (and grants a
// role one of them), upgrades to the latest, then finishes the work through the new functions.
void upgrade_keeps_open_attempts_and_their_guards(int from) {
  SCOPED_TRACE("from version " + std::to_string(from));
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upg" + std::to_string(from) + "_" + tenure::test::random_suffix();
  const std::string role = schema + "_worker";
  const cleanup drop{dsn, schema, role};
  pg db{dsn};
  auto older = tenure::postgres::detail::migrate_up_to(dsn, schema, from);
  ASSERT_TRUE(older) << older.error().message();
  ASSERT_EQ(db.scalar("SELECT max(version) FROM " + schema + ".schema_version"), std::to_string(from));

  for (int i = 0; i < 3; ++i) db.exec("SELECT " + schema + ".enqueue('k', '{}', 'q')");
  auto open = db.exec("SELECT job_id, run_lease, token FROM " + schema + ".claim('q', 2, 'old-worker')");
  ASSERT_EQ(open.rows.size(), 2u);
  db.exec("CREATE ROLE " + role);
  db.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + schema + ".claim_attempts(text, int, text, text) TO " + role);

  auto upgraded = tenure::postgres::migrate(dsn, schema);
  EXPECT_TRUE(upgraded) << upgraded.error().message();
  EXPECT_EQ(db.scalar("SELECT max(version) FROM " + schema + ".schema_version"),
            std::to_string(tenure::postgres::known_schema_version()));

  // Attempts open across the upgrade got a secret of their own that nobody holds, so a token
  // without one (version 1) cannot finalize them; it is refused as malformed and changes nothing.
  EXPECT_EQ(db.scalar("SELECT count(DISTINCT secret) FROM " + schema + ".receipts"), "2");
  for (std::size_t i = 0; i < open.rows.size(); ++i) {
    if (!open.at(i, 2).starts_with("tn1:")) continue;
    EXPECT_EQ(db.query("SELECT * FROM " + schema + ".complete_job($1)", {open.at(i, 2)}).sqlstate, "TN002");
  }
  EXPECT_EQ(db.scalar("SELECT count(*) FROM " + schema + ".jobs WHERE state = 'running'"), "2");

  // The role keeps what it was granted; the new claim takes the job left over.
  pg as_role{dsn};
  as_role.exec("SET ROLE " + role);
  auto fresh = as_role.exec("SELECT job_id, run_lease FROM " + schema + ".claim_attempts('q', 5, 'new-worker')");
  ASSERT_EQ(fresh.rows.size(), 1u);
  EXPECT_GT(std::stoll(*fresh.rows[0][1]), 65535) << "a lease of the new layout, above every lease of the old";
  as_role.exec("RESET ROLE");

  // Attempts opened before the upgrade heartbeat and complete through the new functions, with
  // the one opened after it; a pair with a lease that was never handed out is stale and changes
  // nothing.
  std::vector<tenure::test::cell> attempts{tenure::test::array_literal(open, 0), tenure::test::array_literal(open, 1),
                                           tenure::test::array_literal(fresh, 0), tenure::test::array_literal(fresh, 1)};
  EXPECT_EQ(db.scalar("SELECT count(*) FROM " + schema +
                          ".heartbeat_batch($1::bigint[] || $3::bigint[], $2::bigint[] || $4::bigint[])",
                      attempts),
            "3");
  attempts.push_back(open.at(0, 0));
  EXPECT_EQ(db.scalar("SELECT count(*) FROM " + schema +
                          ".complete_batch($1::bigint[] || $3::bigint[] || $5::bigint, "
                          "$2::bigint[] || $4::bigint[] || 2::bigint)",
                      attempts),
            "3");
  EXPECT_EQ(db.scalar("SELECT string_agg(state || ':' || attempt, ',' ORDER BY id) FROM " + schema + ".jobs"),
            "completed:1,completed:1,completed:1");
  // The two old attempts by job id (their leases: 1 before the ledger layout, that layout's after).
  const bool in_order = std::stoll(open.at(0, 0)) < std::stoll(open.at(1, 0));
  EXPECT_EQ(db.scalar("SELECT string_agg(run_lease::text, ',' ORDER BY id) FROM " + schema + ".jobs"),
            open.at(in_order ? 0 : 1, 1) + "," + open.at(in_order ? 1 : 0, 1) + "," + *fresh.rows[0][1])
      << "the attempts opened before the upgrade completed under their old leases";
}

TEST(schema_upgrade, every_older_version_upgrades_with_open_attempts_kept_and_stale_pairs_rejected) {
  ASSERT_GE(tenure::postgres::known_schema_version(), 2);
  for (int from = 1; from < tenure::postgres::known_schema_version(); ++from) {
    upgrade_keeps_open_attempts_and_their_guards(from);
  }
}

// A caller-owned attempt opened before the ledger layout (its run lease below 65,536, found
// through legacy_attempts) completes with its token after the upgrade; a wrong secret and a second
// completion are stale (TN001) and change nothing.
TEST(schema_upgrade, an_attempt_opened_before_the_ledger_completes_with_its_token_in_the_callers_transaction) {
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upgtok_" + tenure::test::random_suffix();
  const cleanup drop{dsn, schema, schema + "_nobody"};
  pg db{dsn};
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, version_named("_ledger") - 1));
  db.exec("SELECT " + schema + ".enqueue('k', '{}', 'q')");
  db.exec("SELECT " + schema + ".enqueue('k', '{}', 'q')");
  auto open = db.exec("SELECT job_id, run_lease, token FROM " + schema + ".claim('q', 2, 'old-worker')");
  ASSERT_EQ(open.rows.size(), 2u);
  ASSERT_TRUE(open.at(0, 2).starts_with("tn2:")) << open.at(0, 2);
  ASSERT_TRUE(tenure::postgres::migrate(dsn, schema));
  ASSERT_LT(std::stoll(open.at(0, 1)), 65536);

  // The other attempt's secret on this attempt's pair: stale.
  const std::string forged = "tn2:" + open.at(0, 0) + ":" + open.at(0, 1) + ":" +
                             open.at(1, 2).substr(open.at(1, 2).rfind(':') + 1);
  EXPECT_EQ(db.query("SELECT * FROM " + schema + ".complete_job($1)", {forged}).sqlstate, "TN001");
  db.exec("BEGIN");
  auto done = db.exec("SELECT job_id, run_lease FROM " + schema + ".complete_job($1, '{\"n\":1}')", {open.at(0, 2)});
  ASSERT_EQ(done.rows.size(), 1u);
  EXPECT_EQ(done.at(0, 0), open.at(0, 0));
  EXPECT_EQ(done.at(0, 1), open.at(0, 1));
  db.exec("COMMIT");
  EXPECT_EQ(db.query("SELECT * FROM " + schema + ".complete_job($1)", {open.at(0, 2)}).sqlstate, "TN001");
  EXPECT_EQ(db.scalar("SELECT string_agg(state || ':' || run_lease || ':' || coalesce(progress::text, '-'), ',' ORDER BY id) FROM " +
                      schema + ".jobs"),
            "completed:" + open.at(0, 1) + ":{\"n\": 1},running:" + open.at(1, 1) + ":-");
}

// The version that added job metadata.
int metadata_version() { return version_named("_job_metadata"); }

TEST(schema_upgrade, jobs_from_before_metadata_read_an_empty_object_in_place_and_roles_keep_their_grants) {
  const int before = metadata_version() - 1;
  ASSERT_GE(before, 1);
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upgmeta_" + tenure::test::random_suffix();
  const std::string role = schema + "_app";
  const cleanup drop{dsn, schema, role};
  pg db{dsn};
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, before));
  const auto q = [&](const std::string& name) { return schema + "." + name; };
  // One job in each table: ready, deferred (scheduled), receipts (running), done, dead_letter.
  for (int i = 0; i < 3; ++i) db.exec("SELECT " + q("enqueue") + "('k', '{}', 'q')");
  db.exec("SELECT " + q("enqueue") + "('k', '{}', 'q', 2, now() + interval '1 hour')");
  db.exec("INSERT INTO " + q("queues") + " (name, dead_letter) VALUES ('dlq', true)");
  db.exec("SELECT " + q("enqueue") + "('k', '{}', 'dlq', 2, NULL, 1)");
  auto done = db.exec("SELECT job_id, run_lease FROM " + q("claim_attempts") + "('q', 1)");
  db.exec("SELECT * FROM " + q("complete_batch") + "(ARRAY[" + done.at(0, 0) + "]::bigint[], ARRAY[" + done.at(0, 1) +
          "]::bigint[])");
  auto dead = db.exec("SELECT job_id, run_lease FROM " + q("claim_attempts") + "('dlq', 1)");
  db.exec("SELECT " + q("fail_attempt") + "(" + dead.at(0, 0) + ", " + dead.at(0, 1) + ", 'boom')");
  db.exec("SELECT * FROM " + q("claim_attempts") + "('q', 1)");  // stays running
  db.exec("CREATE ROLE " + role);
  db.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + q("enqueue") + "(text, jsonb, text, int, timestamptz, int) TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + q("claim") + "(text, int, text) TO " + role);
  // The tables of the schema before the upgrade (later migrations may add tables of their own).
  const auto tables_before = db.scalar("SELECT array_agg(relname)::text FROM pg_class WHERE relnamespace = '" + schema +
                                       "'::regnamespace AND relkind = 'r'");
  const std::string files = "SELECT string_agg(relname || ':' || relfilenode, ',' ORDER BY relname) FROM pg_class "
                            "WHERE relnamespace = '" + schema + "'::regnamespace AND relkind = 'r' "
                            "AND relname = ANY ('" + tables_before + "'::text[])";
  const auto files_before = db.scalar(files);

  // The metadata migration itself rewrites no table (a later one, the ledger layout, moves the
  // jobs into tables of its own).
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, metadata_version()));
  EXPECT_EQ(db.scalar(files + " AND relname = ANY (regexp_split_to_array($1, ':[0-9]+,?'))", {files_before}),
            files_before)
      << "adding the column rewrote no table";
  auto upgraded = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(upgraded) << upgraded.error().message();
  EXPECT_EQ(db.scalar("SELECT string_agg(state || ':' || metadata::text, ',' ORDER BY id) FROM " + q("jobs")),
            "completed:{},running:{},available:{},scheduled:{},failed:{}");
  EXPECT_EQ(db.scalar("SELECT to_regprocedure('" + q("enqueue") + "(text, jsonb, text, int, timestamptz, int)') IS NULL"),
            "t")
      << "replaced, not overloaded";

  // The role kept what it was granted, on the new signatures; the old job is claimed with {}.
  pg as_role{dsn};
  as_role.exec("SET ROLE " + role);
  const auto id = as_role.scalar("SELECT " + q("enqueue") + "('k', '{}', 'q', metadata => '{\"tenant\": \"acme\"}')");
  auto claimed = as_role.exec("SELECT job_id, metadata::text FROM " + q("claim") + "('q', 5) ORDER BY job_id");
  ASSERT_EQ(claimed.rows.size(), 2u);
  EXPECT_EQ(claimed.at(0, 1), "{}");
  EXPECT_EQ(claimed.at(1, 0), id);
  EXPECT_EQ(claimed.at(1, 1), R"({"tenant": "acme"})");
}

TEST(schema_upgrade, producers_keep_their_grants_on_the_keyed_enqueue_functions_and_old_jobs_have_no_key) {
  const int unique_version = version_named("_unique_jobs");
  ASSERT_GE(unique_version, 2);
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upguniq_" + tenure::test::random_suffix();
  const std::string role = schema + "_app";
  const cleanup drop{dsn, schema, role};
  pg db{dsn};
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, unique_version - 1));
  const auto q = [&](const std::string& name) { return schema + "." + name; };
  const auto old_job = db.scalar("SELECT " + q("enqueue") + "('k', '{}', 'q')");
  db.exec("CREATE ROLE " + role);
  db.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + q("enqueue") + "(text, jsonb, text, int, timestamptz, int, jsonb) TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + q("enqueue_batch") +
          "(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[]) TO " + role);

  auto upgraded = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(upgraded) << upgraded.error().message();
  EXPECT_EQ(db.scalar("SELECT to_regprocedure('" + q("enqueue") + "(text, jsonb, text, int, timestamptz, int, jsonb)') IS NULL"),
            "t")
      << "replaced, not overloaded";
  EXPECT_EQ(db.scalar("SELECT count(*) FROM " + q("jobs") + " WHERE id = $1 AND unique_key IS NULL", {old_job}), "1");

  pg as_role{dsn};
  as_role.exec("SET ROLE " + role);
  const auto id = as_role.scalar("SELECT " + q("enqueue") + "('k', '{}', 'q', unique_key => 'u')");
  EXPECT_EQ(as_role.scalar("SELECT " + q("enqueue") + "('k', '{}', 'q', unique_key => 'u')"), id);
  EXPECT_EQ(as_role.scalar("SELECT job_id || ':' || inserted FROM " + q("enqueue_batch") +
                           "(ARRAY['k'], ARRAY['{}']::jsonb[], ARRAY['q'], ARRAY[2], unique_keys => ARRAY['u'])"),
            id + ":false");
}

TEST(schema_upgrade, producers_of_an_older_schema_get_the_copy_enqueue_path_with_it) {
  const int copy_version = version_named("_copy_enqueue");
  ASSERT_GE(copy_version, 2);
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upgcopy_" + tenure::test::random_suffix();
  const std::string role = schema + "_app";
  const cleanup drop{dsn, schema, role};
  pg db{dsn};
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, copy_version - 1));
  db.exec("CREATE ROLE " + role);
  // What `tenure grant-producer` of the older version gave (its enqueue_batch among them).
  db.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + schema +
          ".enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[], text[]) TO " + role);
  EXPECT_EQ(db.query("SELECT " + schema + ".enqueue_copy_stage()").sqlstate, "42883") << "not there yet";
  auto upgraded = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(upgraded) << upgraded.error().message();

  pg as_role{dsn};
  as_role.exec("SET ROLE " + role);
  as_role.exec("BEGIN");
  const std::string stage = as_role.scalar("SELECT " + schema + ".enqueue_copy_stage()");
  as_role.exec("INSERT INTO " + stage + " VALUES (1, 'k', '{}', 'q', 2, NULL, 25, '{}')");
  const std::string ids = as_role.scalar("SELECT " + schema + ".enqueue_copied()");
  as_role.exec("COMMIT");
  EXPECT_EQ(db.scalar("SELECT count(*) FROM " + schema + ".jobs WHERE id = ANY($1::bigint[])", {ids}), "1") << ids;
}

TEST(schema_upgrade, producers_of_an_older_schema_get_the_copy_straight_into_ready_with_it) {
  const int ready_version = version_named("_copy_into_ready");
  ASSERT_GE(ready_version, 2);
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upgready_" + tenure::test::random_suffix();
  const std::string role = schema + "_app";
  const cleanup drop{dsn, schema, role};
  pg db{dsn};
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, ready_version - 1));
  db.exec("CREATE ROLE " + role);
  // What `tenure grant-producer` of the older version gave, and a job enqueued before.
  db.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + schema +
          ".enqueue_batch(text[], jsonb[], text[], int[], timestamptz[], int[], jsonb[], text[]), " + schema +
          ".enqueue_copy_stage(), " + schema + ".enqueue_copied() TO " + role);
  const std::string before = db.scalar("SELECT " + schema + ".enqueue('k', '{}', 'q')");
  EXPECT_EQ(db.query("SELECT " + schema + ".enqueue_copy_target(false)").sqlstate, "42883") << "not there yet";
  auto upgraded = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(upgraded) << upgraded.error().message();

  pg as_role{dsn};
  as_role.exec("SET ROLE " + role);
  as_role.exec("BEGIN");
  EXPECT_EQ(as_role.scalar("SELECT " + schema + ".enqueue_copy_target(false)"), schema + ".specs");
  as_role.exec("INSERT INTO " + schema + ".specs (kind, args, queue, priority, max_attempts, metadata) "
               "VALUES ('k', '{}', 'q', 2, 25, '{}')");
  const std::string ids = as_role.scalar("SELECT " + schema + ".enqueue_copied_ready(1)");
  as_role.exec("COMMIT");
  EXPECT_EQ(db.scalar("SELECT count(*) FROM " + schema + ".jobs WHERE id = ANY($1::bigint[]) AND id > $2::bigint",
                      {ids, before}),
            "1")
      << ids;
  EXPECT_EQ(db.scalar("SELECT string_agg(state, ',') FROM " + schema + ".jobs"), "available,available");
}

TEST(schema_upgrade, a_job_from_before_readys_checks_that_breaks_them_is_still_promoted_and_retried) {
  const int ready_version = version_named("_copy_into_ready");
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upglegacy_" + tenure::test::random_suffix();
  const cleanup drop{dsn, schema, schema + "_nobody"};
  pg db{dsn};
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, ready_version - 1));
  // Jobs of the oldest schemas, whose enqueue checked fewer rules: args that are not an object,
  // one due and scheduled, one running.
  const std::string running = db.scalar("SELECT " + schema + ".enqueue('k', '{}', 'q')");
  const std::string token = db.scalar("SELECT token FROM " + schema + ".claim('q')");
  db.exec("UPDATE " + schema + ".receipts SET args = '\"old\"' WHERE job_id = " + running);
  const std::string due = db.scalar("SELECT nextval('" + schema + ".job_id_seq')");
  db.exec("INSERT INTO " + schema + ".deferred (id, queue, kind, args, priority, attempt, max_attempts, run_lease, "
          "run_at, created_at, state) VALUES (" + due + ", 'q', 'k', '[1]', 2, 0, 25, 0, now() - interval '1 hour', "
          "now() - interval '1 day', 'scheduled')");
  auto upgraded = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(upgraded) << upgraded.error().message();

  EXPECT_EQ(db.scalar("SELECT " + schema + ".promote_due()"), "1");
  const auto retried = db.query("SELECT * FROM " + schema + ".fail_job($1, 'boom', true)", {token});
  EXPECT_TRUE(retried.ok) << retried.error;
  db.exec("UPDATE " + schema + ".deferred SET run_at = now() - interval '1 second' WHERE id = " + running);
  EXPECT_EQ(db.scalar("SELECT " + schema + ".promote_due()"), "1");
  EXPECT_EQ(db.scalar("SELECT string_agg(s.args::text, ',' ORDER BY r.id) FROM " + schema + ".ready r JOIN " + schema +
                      ".specs s ON s.id = r.id"),
            "\"old\",[1]");
  // A job numbered after the upgrade is held to the rules.
  EXPECT_EQ(db.query("INSERT INTO " + schema + ".specs (kind, args, queue) VALUES ('k', '[2]', 'q')").sqlstate, "23514");
}

// ---- where a fresh install may go --------------------------------------------------------------

// An application's schema: a table and a function every role may call, as PostgreSQL grants it.
struct app_schema {
  std::string dsn, name;
  pg db{dsn};
  app_schema(std::string d, std::string n) : dsn(std::move(d)), name(std::move(n)) {
    db.exec("CREATE SCHEMA " + name);
    db.exec("CREATE TABLE " + name + ".orders (id bigint)");
    db.exec("CREATE FUNCTION " + name + ".order_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM " +
            name + ".orders'");
    db.exec("GRANT USAGE ON SCHEMA " + name + " TO PUBLIC");
  }
  ~app_schema() { db.query("DROP SCHEMA IF EXISTS " + name + " CASCADE"); }
  bool public_may(const std::string& privilege_check) { return db.scalar("SELECT " + privilege_check) == "t"; }
};

TEST(schema_install, a_schema_holding_the_applications_objects_is_refused_and_their_grants_are_left_alone) {
  app_schema app{tenure::test::test_dsn(), "app_" + tenure::test::random_suffix()};
  auto m = tenure::postgres::migrate(app.dsn, app.name);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error(), tenure::errc::invalid_argument);
  EXPECT_NE(m.error().message().find("already exists and holds 2 object(s) tenure did not create"), std::string::npos) << m.error().message();
  EXPECT_NE(m.error().message().find("choose another schema name"), std::string::npos) << m.error().message();
  // Nothing of tenure's was created, and PUBLIC keeps what it had on the application's objects.
  EXPECT_EQ(app.db.scalar("SELECT to_regclass('" + app.name + ".schema_version') IS NULL"), "t");
  EXPECT_TRUE(app.public_may("has_function_privilege('public', '" + app.name + ".order_count()', 'EXECUTE')"));
  EXPECT_TRUE(app.public_may("has_schema_privilege('public', '" + app.name + "', 'USAGE')"));
}

TEST(schema_install, an_existing_empty_schema_created_for_tenure_is_installed_into_and_upgraded_later) {
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "empty_" + tenure::test::random_suffix();
  const cleanup drop{dsn, schema, schema + "_role"};
  pg db{dsn};
  db.exec("CREATE SCHEMA " + schema);  // as a DBA would, to choose its owner
  auto first = tenure::postgres::detail::migrate_up_to(dsn, schema, 1);
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_EQ(first.value(), 0);
  // Now it holds tenure's own objects: an upgrade is not a fresh install and goes ahead.
  auto upgraded = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(upgraded) << upgraded.error().message();
  EXPECT_EQ(upgraded.value(), 1);
  EXPECT_EQ(db.scalar("SELECT max(version) FROM " + schema + ".schema_version"),
            std::to_string(tenure::postgres::known_schema_version()));
}

TEST(schema_install, public_and_names_reserved_by_postgresql_are_refused) {
  // In a database of the test's own, so that even a wrong answer could not touch the shared one.
  const std::string dsn = tenure::test::test_dsn();
  const std::string name = "tenure_install_" + tenure::test::random_suffix();
  pg admin{dsn};
  admin.exec("CREATE DATABASE " + name);
  struct drop_db {
    pg& admin;
    std::string name;
    ~drop_db() { admin.query("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); }
  } drop{admin, name};
  const std::string own = dsn.substr(0, dsn.rfind('/') + 1) + name;
  pg db{own};
  ASSERT_EQ(db.scalar("SELECT has_schema_privilege('public', 'public', 'USAGE')"), "t");

  auto into_public = tenure::postgres::migrate(own, "public");
  ASSERT_FALSE(into_public);
  EXPECT_EQ(into_public.error(), tenure::errc::invalid_argument);
  EXPECT_NE(into_public.error().message().find("PostgreSQL's default schema, which every role uses"), std::string::npos) << into_public.error().message();
  EXPECT_EQ(db.scalar("SELECT has_schema_privilege('public', 'public', 'USAGE')"), "t");
  EXPECT_EQ(db.scalar("SELECT to_regclass('public.schema_version') IS NULL"), "t");

  for (const std::string reserved : {"pg_catalog", "pg_tenure"}) {
    auto m = tenure::postgres::migrate(own, reserved);
    ASSERT_FALSE(m) << reserved;
    EXPECT_EQ(m.error(), tenure::errc::invalid_argument);
    EXPECT_NE(m.error().message().find("reserved for PostgreSQL"), std::string::npos) << m.error().message();
  }
  EXPECT_EQ(db.scalar("SELECT count(*) FROM pg_namespace WHERE nspname = 'pg_tenure'"), "0");
}

// ---- who controls the schema -------------------------------------------------------------------
// tenure's SECURITY DEFINER functions run with the migrating role's rights (a superuser's, often),
// and call one another. Whoever can replace one of them, or add objects beside them, can act with
// those rights, so migrate refuses a schema that another role controls.

/// A login role for one test and the schema it is handed, both dropped however the test ends.
struct other_role {
  std::string dsn, name, schema;
  pg admin{dsn};
  other_role(std::string d, const std::string& prefix)
      : dsn(std::move(d)), name(prefix + "_" + tenure::test::random_suffix()), schema(name + "_q") {
    admin.exec("CREATE ROLE " + name + " LOGIN");
  }
  ~other_role() {
    admin.query("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
    admin.query("DROP OWNED BY " + name + " CASCADE");
    admin.query("DROP ROLE IF EXISTS " + name);
  }
  bool is_superuser() { return admin.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = $1", {name}) == "t"; }
};

/// The attack: the owner of the schema drops check_job, which enqueue (SECURITY DEFINER) calls on
/// bad input, and puts a function of its own in its place; the next bad enqueue, by anyone allowed
/// to enqueue, runs it with the rights of enqueue's owner.
void replace_check_job_and_wait_for_an_enqueue(other_role& attacker) {
  pg as_attacker{tenure::test::dsn_with_user(attacker.dsn, attacker.name)};
  as_attacker.query("DROP FUNCTION " + attacker.schema + ".check_job(text, text, int, int, text)");
  as_attacker.query("CREATE FUNCTION " + attacker.schema +
                    ".check_job(kind text, queue text, priority int, max_attempts int, what text DEFAULT 'job') "
                    "RETURNS void LANGUAGE plpgsql AS $$BEGIN EXECUTE 'ALTER ROLE " + attacker.name +
                    " SUPERUSER'; END$$");
  attacker.admin.query("SELECT " + attacker.schema + ".enqueue('')");
}

TEST(schema_control, a_schema_owned_by_another_role_is_refused_so_its_owner_cannot_become_superuser) {
  other_role attacker{tenure::test::test_dsn(), "sch_owner"};
  attacker.admin.exec("CREATE SCHEMA " + attacker.schema + " AUTHORIZATION " + attacker.name);
  auto m = tenure::postgres::migrate(attacker.dsn, attacker.schema);
  EXPECT_FALSE(m);
  if (!m) {
    EXPECT_EQ(m.error(), tenure::errc::invalid_argument);
  }
  EXPECT_NE(m.error().message().find("schema '" + attacker.schema + "' is owned by role '" + attacker.name + "', not by '"),
            std::string::npos)
      << m.error().message();
  EXPECT_NE(m.error().message().find("a schema's owner may drop and replace any of them"), std::string::npos) << m.error().message();
  EXPECT_NE(m.error().message().find("ALTER SCHEMA " + attacker.schema + " OWNER TO"), std::string::npos) << m.error().message();
  EXPECT_EQ(attacker.admin.scalar("SELECT to_regclass('" + attacker.schema + ".schema_version') IS NULL"), "t");

  replace_check_job_and_wait_for_an_enqueue(attacker);
  EXPECT_FALSE(attacker.is_superuser()) << "the schema's owner ran code with the migrating role's rights";

  // The fix the message names makes the schema installable (once the attacker's function is gone).
  attacker.admin.exec("DROP FUNCTION IF EXISTS " + attacker.schema + ".check_job(text, text, int, int, text)");
  attacker.admin.exec("ALTER SCHEMA " + attacker.schema + " OWNER TO current_user");
  auto fixed = tenure::postgres::migrate(attacker.dsn, attacker.schema);
  EXPECT_TRUE(fixed) << fixed.error().message();
}

TEST(schema_control, a_schema_on_which_another_role_or_public_holds_create_is_refused) {
  other_role creator{tenure::test::test_dsn(), "sch_create"};
  creator.admin.exec("CREATE SCHEMA " + creator.schema);
  for (const std::string& grantee : {creator.name, std::string{"PUBLIC"}}) {
    SCOPED_TRACE(grantee);
    creator.admin.exec("GRANT CREATE ON SCHEMA " + creator.schema + " TO " + grantee);
    auto m = tenure::postgres::migrate(creator.dsn, creator.schema);
    EXPECT_FALSE(m);
    EXPECT_NE(m.error().message().find(grantee == "PUBLIC" ? "every role (CREATE is granted to PUBLIC)" : "role(s) " + creator.name),
              std::string::npos)
        << m.error().message();
    EXPECT_NE(m.error().message().find("may create objects in schema '" + creator.schema + "' (CREATE on the schema)"),
              std::string::npos)
        << m.error().message();
    EXPECT_NE(m.error().message().find("REVOKE CREATE ON SCHEMA " + creator.schema), std::string::npos) << m.error().message();
    EXPECT_EQ(creator.admin.scalar("SELECT to_regclass('" + creator.schema + ".schema_version') IS NULL"), "t");
    creator.admin.exec("REVOKE CREATE ON SCHEMA " + creator.schema + " FROM " + grantee);
  }
  // Through a group role as well.
  const std::string group = creator.name + "_grp";
  creator.admin.exec("CREATE ROLE " + group);
  creator.admin.exec("GRANT " + group + " TO " + creator.name);
  creator.admin.exec("GRANT CREATE ON SCHEMA " + creator.schema + " TO " + group);
  auto refused = tenure::postgres::migrate(creator.dsn, creator.schema);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().detail().find(creator.name), std::string::npos) << refused.error().message();
  creator.admin.exec("REVOKE CREATE ON SCHEMA " + creator.schema + " FROM " + group);
  creator.admin.exec("DROP ROLE " + group);
  auto m = tenure::postgres::migrate(creator.dsn, creator.schema);
  EXPECT_TRUE(m) << m.error().message();
}

TEST(schema_control, an_upgrade_is_refused_once_another_role_may_create_in_the_schema_or_owns_an_object_in_it) {
  ASSERT_GE(tenure::postgres::known_schema_version(), 2);
  const int older = tenure::postgres::known_schema_version() - 1;
  other_role other{tenure::test::test_dsn(), "sch_upg"};
  auto installed = tenure::postgres::detail::migrate_up_to(other.dsn, other.schema, older);
  ASSERT_TRUE(installed) << installed.error().message();
  const auto version = [&] { return other.admin.scalar("SELECT max(version) FROM " + other.schema + ".schema_version"); };

  other.admin.exec("GRANT CREATE ON SCHEMA " + other.schema + " TO " + other.name);
  auto m = tenure::postgres::migrate(other.dsn, other.schema);
  EXPECT_FALSE(m);
  EXPECT_NE(m.error().message().find("may create objects in schema"), std::string::npos) << m.error().message();
  EXPECT_EQ(version(), std::to_string(older));
  EXPECT_FALSE(tenure::postgres::check_schema_control(other.dsn, other.schema)) << "the same check, on its own";
  other.admin.exec("REVOKE CREATE ON SCHEMA " + other.schema + " FROM " + other.name);

  // The owner of a function may replace its body; the owner of a table may add triggers to it.
  for (const std::string& object : {"FUNCTION " + other.schema + ".check_job(text, text, int, int, text)",
                                   "TABLE " + other.schema + ".ready"}) {
    SCOPED_TRACE(object);
    other.admin.exec("ALTER " + object + " OWNER TO " + other.name);
    m = tenure::postgres::migrate(other.dsn, other.schema);
    EXPECT_FALSE(m);
    EXPECT_NE(m.error().message().find("are owned by other roles"), std::string::npos) << m.error().message();
    EXPECT_NE(m.error().message().find("owned by " + other.name), std::string::npos) << m.error().message();
    EXPECT_EQ(version(), std::to_string(older));
    other.admin.exec("ALTER " + object + " OWNER TO current_user");
  }

  other.admin.exec("GRANT TRIGGER ON " + other.schema + ".done TO " + other.name);
  m = tenure::postgres::migrate(other.dsn, other.schema);
  EXPECT_FALSE(m);
  EXPECT_NE(m.error().message().find("hold TRIGGER on tenure's tables"), std::string::npos) << m.error().message();
  other.admin.exec("REVOKE TRIGGER ON " + other.schema + ".done FROM " + other.name);

  auto controlled = tenure::postgres::check_schema_control(other.dsn, other.schema);
  EXPECT_TRUE(controlled) << controlled.error().message();
  m = tenure::postgres::migrate(other.dsn, other.schema);
  ASSERT_TRUE(m) << m.error().message();
  EXPECT_EQ(m.value(), older);
  EXPECT_EQ(version(), std::to_string(tenure::postgres::known_schema_version()));
}

TEST(schema_control, a_role_that_owns_its_schema_installs_into_it_and_members_of_that_role_are_trusted_as_it) {
  other_role owner{tenure::test::test_dsn(), "sch_self"};
  owner.admin.exec("CREATE SCHEMA " + owner.schema + " AUTHORIZATION " + owner.name);
  // migrate says CREATE SCHEMA IF NOT EXISTS, which asks for CREATE on the database.
  owner.admin.exec("DO $$BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO " + owner.name +
                   "', current_database()); END$$");
  // A member of the owner can act as the owner already: it is not a reason to refuse.
  const std::string member = owner.name + "_member";
  owner.admin.exec("CREATE ROLE " + member);
  owner.admin.exec("GRANT " + owner.name + " TO " + member);
  auto m = tenure::postgres::migrate(tenure::test::dsn_with_user(owner.dsn, owner.name), owner.schema);
  EXPECT_TRUE(m) << m.error().message();
  owner.admin.query("DROP SCHEMA IF EXISTS " + owner.schema + " CASCADE");
  owner.admin.exec("DROP ROLE " + member);
}

}  // namespace
