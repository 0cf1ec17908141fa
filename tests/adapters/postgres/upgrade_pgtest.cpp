// Upgrading an installed schema: every older version, with attempts open across the upgrade.
#include <gtest/gtest.h>

#include <string>
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

// Installs version `from`, opens two attempts through that version's functions (and grants a
// role one of them), upgrades to the latest, then finishes the work through the new functions.
void upgrade_keeps_open_attempts_and_their_guards(int from) {
  SCOPED_TRACE("from version " + std::to_string(from));
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = "upg" + std::to_string(from) + "_" + tenure::test::random_suffix();
  const std::string role = schema + "_worker";
  const cleanup drop{dsn, schema, role};
  pg db{dsn};
  std::string why;
  auto older = tenure::postgres::detail::migrate_up_to(dsn, schema, from, &why);
  ASSERT_TRUE(older) << why;
  ASSERT_EQ(db.scalar("SELECT max(version) FROM " + schema + ".schema_version"), std::to_string(from));

  for (int i = 0; i < 3; ++i) db.exec("SELECT " + schema + ".enqueue('k', '{}', 'q')");
  auto open = db.exec("SELECT job_id, run_lease FROM " + schema + ".claim('q', 2, 'old-worker')");
  ASSERT_EQ(open.rows.size(), 2u);
  db.exec("CREATE ROLE " + role);
  db.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + role);
  db.exec("GRANT EXECUTE ON FUNCTION " + schema + ".claim_attempts(text, int, text, text) TO " + role);

  auto upgraded = tenure::postgres::migrate(dsn, schema, &why);
  EXPECT_TRUE(upgraded) << why;
  EXPECT_EQ(db.scalar("SELECT max(version) FROM " + schema + ".schema_version"),
            std::to_string(tenure::postgres::known_schema_version()));

  // The role keeps what it was granted; the new claim takes the job left over.
  pg as_role{dsn};
  as_role.exec("SET ROLE " + role);
  auto fresh = as_role.exec("SELECT job_id, run_lease FROM " + schema + ".claim_attempts('q', 5, 'new-worker')");
  ASSERT_EQ(fresh.rows.size(), 1u);
  EXPECT_EQ(*fresh.rows[0][1], "1");
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
  EXPECT_EQ(db.scalar("SELECT string_agg(state || ':' || run_lease, ',' ORDER BY id) FROM " + schema + ".jobs"),
            "completed:1,completed:1,completed:1");
}

TEST(schema_upgrade, every_older_version_upgrades_with_open_attempts_kept_and_stale_pairs_rejected) {
  ASSERT_GE(tenure::postgres::known_schema_version(), 2);
  for (int from = 1; from < tenure::postgres::known_schema_version(); ++from) {
    upgrade_keeps_open_attempts_and_their_guards(from);
  }
}

}  // namespace
