// The trace recorder against PostgreSQL: it costs nothing until installed, records the committed
// transitions of every tenure function (and only committed ones), and rows corrupted by hand fail
// the check, through the library and through `tenure trace`.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "support/pg.hpp"
#include "trace/trace.hpp"

namespace tenure::test {
namespace {

class trace_pg : public ::testing::Test {
 protected:
  scoped_schema schema_{"tr"};
  pg db_{schema_.dsn()};
  std::string s(const std::string& name) const { return schema_.name() + "." + name; }

  void install(bool business = true) {
    db_.exec("CREATE TABLE IF NOT EXISTS " + s("orders") + " (job_id bigint, run_lease bigint)");
    std::vector<trace::business_table> tables;
    if (business) tables.push_back({s("orders")});
    auto r = trace::install(schema_.dsn(), schema_.name(), tables);
    ASSERT_TRUE(r) << r.error().message();
  }
  trace::report checked() {
    auto r = trace::check_database(schema_.dsn(), schema_.name());
    if (!r) throw std::runtime_error(r.error().message());
    return std::move(r).value();
  }
  long triggers() {
    return std::stol(db_.scalar("SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n "
                                "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND NOT t.tgisinternal",
                                {schema_.name()}));
  }
  std::string token(const std::string& job) {
    return db_.scalar("SELECT " + s("make_token") + "(job_id, run_lease, secret) FROM " + s("receipts") + " WHERE job_id = $1",
                      {job});
  }
  std::string claim() { return db_.scalar("SELECT job_id FROM " + s("claim_attempts") + "('default', 1)"); }
  /// The run lease of the job's open attempt.
  std::string lease(const std::string& job) {
    return db_.scalar("SELECT run_lease FROM " + s("receipts") + " WHERE job_id = $1", {job});
  }
  void complete(const std::string& job) {
    db_.exec("SELECT * FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])", {job, lease(job)});
  }
  static std::string rules(const trace::report& r) {
    std::string out;
    for (const auto& v : r.violations) out += std::to_string(v.property) + ":" + v.rule + " ";
    return out;
  }
};

TEST_F(trace_pg, nothing_is_installed_until_asked_and_remove_takes_the_recorder_away) {
  EXPECT_EQ(triggers(), 0) << "a migrated schema carries no trigger: the hot paths pay nothing";
  install();
  EXPECT_GT(triggers(), 0);
  install();  // idempotent
  ASSERT_TRUE(trace::remove(schema_.dsn(), schema_.name()));
  EXPECT_EQ(triggers(), 0);
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 "
                       "AND c.relname LIKE 'trace%'",
                       {schema_.name()}),
            "0");
  EXPECT_EQ(trace::check_database(schema_.dsn(), schema_.name()).error(), errc::invalid_argument);
  ASSERT_TRUE(trace::remove(schema_.dsn(), schema_.name())) << "idempotent";
}

TEST_F(trace_pg, a_run_through_every_closing_function_records_committed_transitions_that_pass) {
  install();
  db_.exec("SELECT " + s("configure_queue") + "('default', '{\"backoff_base\": \"0s\", \"backoff_cap\": \"0s\"}')");
  // Batch completion.
  const auto a = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), a);
  complete(a);
  // A caller's transaction: business row and complete_job commit together; one that rolls back
  // leaves nothing in the trace.
  const auto b = db_.scalar("SELECT " + s("enqueue") + "('b')");
  ASSERT_EQ(claim(), b);
  const auto tok = token(b);
  db_.exec("BEGIN");
  db_.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)", {b, lease(b)});
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {tok});
  db_.exec("ROLLBACK");
  db_.exec("BEGIN");
  db_.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)", {b, lease(b)});
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {tok});
  db_.exec("COMMIT");
  // Retry through fail_attempt, promotion, then rescue, cancel, admin retry, snooze.
  const auto c = db_.scalar("SELECT " + s("enqueue") + "('c')");
  ASSERT_EQ(claim(), c);
  db_.exec("SELECT " + s("fail_attempt") + "($1, $2, 'boom')", {c, lease(c)});
  ASSERT_EQ(claim(), c);  // promotes the due retry, then claims lease 2
  db_.exec("SELECT * FROM " + s("rescue_stale") + "('0 seconds')");
  ASSERT_EQ(claim(), c);
  db_.exec("SELECT " + s("cancel_job") + "($1)", {c});
  db_.exec("SELECT " + s("retry_job") + "($1)", {c});
  ASSERT_EQ(claim(), c);
  db_.exec("SELECT " + s("snooze_attempt") + "($1, $2, '0 seconds')", {c, lease(c)});
  ASSERT_EQ(claim(), c);
  complete(c);
  // A parked attempt resumed and continued (under a new lease).
  const auto d = db_.scalar("SELECT " + s("enqueue") + "('d')");
  ASSERT_EQ(claim(), d);
  const auto cb = db_.scalar("SELECT " + s("register_callback") + "($1, $2, '1 minute')", {d, lease(d)});
  EXPECT_EQ(db_.scalar("SELECT " + s("park_callback") + "($1, $2, $3)", {d, lease(d), cb}), "parked");
  EXPECT_EQ(db_.scalar("SELECT " + s("resume_callback") + "($1)", {cb}), "t");
  ASSERT_EQ(claim(), d);
  complete(d);
  // A parked attempt finished from outside.
  const auto e = db_.scalar("SELECT " + s("enqueue") + "('e')");
  ASSERT_EQ(claim(), e);
  const auto cb2 = db_.scalar("SELECT " + s("register_callback") + "($1, $2, '1 minute')", {e, lease(e)});
  EXPECT_EQ(db_.scalar("SELECT " + s("park_callback") + "($1, $2, $3)", {e, lease(e), cb2}), "parked");
  EXPECT_EQ(db_.scalar("SELECT " + s("complete_callback") + "($1)", {cb2}), "t");

  const auto r = checked();
  EXPECT_TRUE(r.ok()) << trace::to_json(r).dump(2);
  EXPECT_EQ(r.jobs, 5u);
  EXPECT_EQ(r.business_writes, 1u) << "the rolled-back transaction left no event";
  for (const char* who : {"enqueue", "claim", "worker", "caller", "promote", "rescue", "cancel", "admin_retry", "callback"}) {
    EXPECT_GE(r.by_who.value(who, 0), 1) << who << " in " << r.by_who.dump();
  }
  EXPECT_EQ(r.by_transition.value("running->waiting_external", 0), 2);
  EXPECT_EQ(r.by_transition.value("waiting_external->running", 0), 1) << "complete_callback resolves the wait";
  EXPECT_EQ(r.by_transition.value("waiting_external->available", 0), 1);
  EXPECT_EQ(r.by_transition.value("running->completed", 0), 5);
  EXPECT_EQ(r.by_transition.value("running->cancelled", 0), 1);
  EXPECT_EQ(r.by_transition.value("cancelled->available", 0), 1);
}

TEST_F(trace_pg, jobs_of_a_bulk_batch_in_a_run_row_are_recorded_available_taken_and_cancelled_and_pass) {
  install(false);
  db_.exec("BEGIN");
  db_.copy_in("COPY " + s("specs") + " (kind, args, queue, priority, max_attempts, metadata) FROM STDIN",
              "k\t{}\tdefault\t2\t3\t{}\nk\t{}\tdefault\t2\t3\t{}\nk\t{}\tdefault\t2\t3\t{}\n"
              "k\t{}\tdefault\t2\t3\t{}\nk\t{}\tdefault\t2\t3\t{}\n");
  const auto ids = db_.scalar("SELECT " + s("enqueue_copied_ready") + "(5)");
  db_.exec("COMMIT");
  ASSERT_EQ(db_.scalar("SELECT count(*) FROM " + s("runs")), "1");
  const auto first = db_.scalar("SELECT ($1::bigint[])[1]", {ids});
  const auto third = db_.scalar("SELECT ($1::bigint[])[3]", {ids});
  ASSERT_EQ(claim(), first);
  complete(first);
  db_.exec("SELECT " + s("cancel_job") + "($1)", {third});  // cut out of the run
  for (int i = 0; i < 3; ++i) complete(claim());
  EXPECT_EQ(db_.scalar("SELECT count(*) FROM " + s("runs")), "0");

  const auto r = checked();
  EXPECT_TRUE(r.ok()) << trace::to_json(r).dump(2);
  EXPECT_EQ(r.jobs, 5u);
  EXPECT_EQ(r.by_transition.value("available->running", 0), 4) << r.by_transition.dump();
  EXPECT_EQ(r.by_transition.value("available->cancelled", 0), 1) << r.by_transition.dump();
  EXPECT_EQ(r.by_transition.value("running->completed", 0), 4);
}

TEST_F(trace_pg, jobs_from_before_the_recorder_are_checked_from_where_the_trace_first_sees_them) {
  const auto rescued = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), rescued);
  const auto completed = db_.scalar("SELECT " + s("enqueue") + "('b')");
  ASSERT_EQ(claim(), completed);
  install();
  complete(completed);
  db_.exec("SELECT * FROM " + s("rescue_stale") + "('0 seconds')");
  ASSERT_EQ(claim(), rescued);
  const auto r = checked();
  EXPECT_TRUE(r.ok()) << trace::to_json(r).dump(2);
  EXPECT_EQ(r.by_transition.value("running->available", 0), 1);
  EXPECT_EQ(r.by_transition.value("running->completed", 0), 1);
}

TEST_F(trace_pg, a_completion_recorded_by_hand_for_an_older_lease_fails_property_1) {
  install();
  const auto j = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), j);
  db_.exec("SELECT * FROM " + s("rescue_stale") + "('0 seconds')");
  ASSERT_EQ(claim(), j);  // lease 2 is live
  // What a completion without its guard would commit: the live attempt closed, and lease 1's
  // outcome recorded (a finished job's record naming the older lease).
  const auto first = db_.scalar("SELECT run_lease FROM " + s("claim_items") + " WHERE job_id = $1 ORDER BY claim_id LIMIT 1",
                                {j});
  db_.exec("BEGIN");
  db_.exec("INSERT INTO " + s("closures") + " (claim_id, pos, outcome, closed_at) SELECT claim_id, pos, 'a', now() FROM " +
               s("open_attempts") + " WHERE job_id = $1",
           {j});
  db_.exec("WITH k AS (INSERT INTO " + s("claims") + " (claim_id, queue, claimed_at, lo, hi, job_ids, attempts, secrets, "
               "run_ats, run_leases) VALUES (nextval('" + s("claim_id_seq") + "'), 'default', now(), $1, $1, ARRAY[$1::bigint], "
               "ARRAY[1], ARRAY[gen_random_uuid()], ARRAY[now()], ARRAY[$2::bigint]) RETURNING claim_id) "
               "INSERT INTO " + s("closures") + " (claim_id, pos, outcome, closed_at) SELECT claim_id, 1, 'c', now() FROM k",
           {j, first});
  db_.exec("COMMIT");
  const auto r = checked();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.violations.front().property, 1) << rules(r);
  EXPECT_EQ(r.violations.front().rule, "stale_finalization");
  EXPECT_EQ(r.violations.front().transitions.back().who, "") << "SQL run by hand names no tenure function";
}

TEST_F(trace_pg, a_stale_completion_through_a_guardless_complete_batch_fails_property_1_as_the_models_mutant) {
  // The SQL counterpart of `spin -DMUTANT`: lease 1 claimed, rescued, lease 2 claimed; the stale
  // completion of lease 1 is refused by tenure's guarded complete_batch (the trace passes) and
  // applied by a complete_batch without its (job_id, run_lease) guard (the trace fails).
  install();
  const auto j = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), j);
  db_.exec("SELECT * FROM " + s("rescue_stale") + "('0 seconds')");
  ASSERT_EQ(claim(), j);
  const auto first = db_.scalar("SELECT run_lease FROM " + s("claim_items") + " WHERE job_id = $1 ORDER BY claim_id LIMIT 1",
                                {j});
  const auto second = lease(j);
  const std::string stale = "SELECT count(*) FROM " + s("complete_batch") + "(ARRAY[$1::bigint], ARRAY[$2::bigint])";
  EXPECT_EQ(db_.scalar(stale, {j, first}), "0");
  EXPECT_TRUE(checked().ok());
  db_.exec("CREATE OR REPLACE FUNCTION " + s("complete_batch") +
           "(job_ids bigint[], run_leases bigint[], progress jsonb[] DEFAULT NULL, secrets uuid[] DEFAULT NULL) "
           "RETURNS TABLE(job_id bigint, run_lease bigint, completed_at timestamptz) LANGUAGE plpgsql SECURITY DEFINER "
           "SET search_path = pg_catalog, pg_temp AS $$ #variable_conflict use_column\nBEGIN RETURN QUERY "
           "WITH live AS (INSERT INTO " + s("closures") + " (claim_id, pos, outcome, closed_at) SELECT o.claim_id, o.pos, "
           "'a', now() FROM " + s("open_attempts") + " o WHERE o.job_id = job_ids[1] RETURNING 1), "
           "k AS (INSERT INTO " + s("claims") + " (claim_id, queue, claimed_at, lo, hi, job_ids, attempts, secrets, run_ats, "
           "run_leases) SELECT nextval('" + s("claim_id_seq") + "'), 'default', now(), job_ids[1], job_ids[1], "
           "ARRAY[job_ids[1]], ARRAY[1], ARRAY[gen_random_uuid()], ARRAY[now()], ARRAY[run_leases[1]] FROM live "
           "RETURNING claim_id) "
           "INSERT INTO " + s("closures") + " AS x (claim_id, pos, outcome, closed_at) SELECT k.claim_id, 1, 'c', now() "
           "FROM k RETURNING job_ids[1], run_leases[1], x.closed_at; END $$");
  EXPECT_EQ(db_.scalar(stale, {j, first}), "1");
  const auto r = checked();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.violations.front().rule, "stale_finalization") << rules(r);
  EXPECT_EQ(r.violations.front().transitions.back().from, (trace::point{"running", std::stoll(second)}));
  EXPECT_EQ(r.violations.front().transitions.back().to, (trace::point{"completed", std::stoll(first)}));
  EXPECT_EQ(r.violations.front().transitions.back().who, "complete_batch");
}

TEST_F(trace_pg, a_second_terminal_outcome_written_by_hand_fails_property_2) {
  install();
  const auto j = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), j);
  const auto only = lease(j);
  complete(j);
  db_.exec("UPDATE " + s("closures") + " x SET outcome = 'f' FROM " + s("claim_items") +
               " i WHERE i.claim_id = x.claim_id AND i.pos = x.pos AND i.job_id = $1 AND i.run_lease = $2",
           {j, only});
  const auto r = checked();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.violations.front().property, 2) << rules(r);
  EXPECT_EQ(r.violations.front().rule, "second_terminal_outcome");
}

TEST_F(trace_pg, a_run_lease_set_back_by_hand_fails_property_3) {
  install();
  const auto j = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), j);
  db_.exec("SELECT * FROM " + s("rescue_stale") + "('0 seconds')");
  db_.exec("UPDATE " + s("ready") + " SET run_lease = 0 WHERE id = $1", {j});
  const auto r = checked();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.violations.front().property, 3) << rules(r);
  EXPECT_EQ(r.violations.front().rule, "lease_went_down");
}

TEST_F(trace_pg, a_business_row_committed_apart_from_its_completion_fails_property_4) {
  install();
  const auto j = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), j);
  const auto tok = token(j);
  // The business write commits first, the completion in a transaction of its own.
  db_.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)", {j, lease(j)});
  db_.exec("SELECT * FROM " + s("complete_job") + "($1)", {tok});
  const auto r = checked();
  ASSERT_EQ(r.violations.size(), 2u) << rules(r);
  EXPECT_EQ(r.violations[0].rule, "business_without_completion");
  EXPECT_EQ(r.violations[1].rule, "completion_without_business");
  EXPECT_EQ(r.violations[1].property, 4);
}

/// Runs the tenure binary; stdout, and the exit code.
std::pair<std::string, int> tenure_cli(const std::string& args) {
  const std::string cmd = std::string{TENURE_CLI_PATH} + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed");
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

TEST_F(trace_pg, tenure_trace_installs_checks_with_a_json_summary_exits_1_on_a_violation_and_removes) {
  db_.exec("CREATE TABLE " + s("orders") + " (job_id bigint, lease bigint)");
  const std::string common = "--database-url '" + schema_.dsn() + "' --schema " + schema_.name();
  auto [out, code] = tenure_cli("trace install --business " + s("orders") + ":job_id:lease " + common);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("watching " + s("orders") + " (job_id, lease)"), std::string::npos) << out;
  const auto j = db_.scalar("SELECT " + s("enqueue") + "('a')");
  ASSERT_EQ(claim(), j);
  complete(j);
  std::tie(out, code) = tenure_cli("trace check " + common);
  ASSERT_EQ(code, 0) << out;
  const auto summary = nlohmann::json::parse(out);
  EXPECT_TRUE(summary["ok"].get<bool>());
  EXPECT_EQ(summary["transitions"], 3);
  db_.exec("INSERT INTO " + s("orders") + " VALUES ($1, 7)", {j});
  std::tie(out, code) = tenure_cli("trace check " + common);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("tenure: 1 violation(s); the first breaks property 4 (business_without_completion)"), std::string::npos)
      << out;
  std::tie(out, code) = tenure_cli("trace install --business " + s("orders") + ":job_id " + common);
  EXPECT_EQ(code, 2) << out;
  std::tie(out, code) = tenure_cli("trace remove " + common);
  ASSERT_EQ(code, 0) << out;
  std::tie(out, code) = tenure_cli("trace check " + common);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("no trace recorder in schema"), std::string::npos) << out;
  EXPECT_EQ(triggers(), 0);
}

}  // namespace
}  // namespace tenure::test
