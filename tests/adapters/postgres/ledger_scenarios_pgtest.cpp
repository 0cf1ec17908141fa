// The ledger layout's SQL functions, group by group, through the psql scenario files of
// tests/sql/ledger: each runs against a schema installed at the version before the ledger with a
// job in every state (one open attempt, one completed, one scheduled, one available), then
// upgraded, so the legacy attempts of the upgrade are exercised too. The files raise on the first
// expectation that fails and race a second session (psql in the background) where it matters.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
#include <string_view>

#include "migrations.hpp"
#include "support/pg.hpp"
#include "tenure/postgres/schema.hpp"

namespace {

using tenure::test::pg;

int version_named(std::string_view suffix) {
  for (const auto& m : tenure::postgres::detail::embedded_migrations()) {
    if (std::string_view{m.name}.ends_with(suffix)) return m.version;
  }
  return 0;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return "popen failed";
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return (WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok\n" : "failed\n") + out;
}

class ledger_scenarios : public ::testing::TestWithParam<const char*> {};

TEST_P(ledger_scenarios, each_function_group_holds_its_expectations_after_an_upgrade_with_jobs_in_every_state) {
  const std::string dsn = tenure::test::test_dsn();
  const std::string schema = std::string{"lgs"} + std::string{GetParam()}.substr(0, 2) + "_" + tenure::test::random_suffix();
  pg db{dsn};
  ASSERT_TRUE(tenure::postgres::detail::migrate_up_to(dsn, schema, version_named("_ledger") - 1));
  for (const char* sql : {"SELECT %s.enqueue('k', '{\"a\":1}', 'q')", "SELECT %s.enqueue('k', '{\"a\":3}', 'q')",
                          "SELECT %s.enqueue('k', '{\"a\":4}', 'q')",
                          "SELECT %s.enqueue('k', '{\"a\":2}', 'q', run_at => now() + interval '1 hour')",
                          "SELECT * FROM %s.claim_attempts('q', 1, 'w')",
                          "SELECT %s.complete_batch(ARRAY[job_id], ARRAY[run_lease]) FROM %s.claim_attempts('q', 1, 'w')"}) {
    std::string s{sql};
    for (auto at = s.find("%s"); at != std::string::npos; at = s.find("%s")) s.replace(at, 2, schema);
    db.exec(s);
  }
  auto upgraded = tenure::postgres::migrate(dsn, schema);
  ASSERT_TRUE(upgraded) << upgraded.error().message();
  const std::string out = run("psql -X -v ON_ERROR_STOP=1 -v s=" + schema + " -v root=" + TENURE_SOURCE_ROOT + " -f " + TENURE_LEDGER_SCENARIOS + "/" +
                              GetParam() + ".sql '" + dsn + "'");
  EXPECT_TRUE(out.starts_with("ok\n")) << out;
  EXPECT_NE(out.find("all expectations"), std::string::npos) << out;
  db.query("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
}

INSTANTIATE_TEST_SUITE_P(groups, ledger_scenarios,
                         ::testing::Values("10_enqueue", "20_claim", "30_close", "40_callbacks", "50_admin"),
                         [](const auto& info) { return std::string{info.param}.substr(3); });

}  // namespace
