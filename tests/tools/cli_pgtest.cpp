// Runs the real `tenure` binary against the test cluster (TENURE_TEST_DSN). Each test works in
// its own schema, dropped at the end; the command's stdout, stderr and exit code are checked
// exactly, because scripts depend on them.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "migrations.hpp"  // migrate_up_to: installs an older schema version
#include "support/pg.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/schema.hpp"

extern char** environ;

namespace {

/// The schema version this build migrates to.
int known_version() { return tenure::postgres::known_schema_version(); }

// ---- running the binary --------------------------------------------------------------------

struct run_result {
  std::string out;
  std::string err;
  int exit_code = -1;  ///< 128 + signal when the process was killed by a signal
};

std::ostream& operator<<(std::ostream& os, const run_result& r) {
  return os << "exit " << r.exit_code << "\n--- stdout ---\n" << r.out << "--- stderr ---\n" << r.err;
}

/// The parent's environment without the variables the binary reads, plus `extra`.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (name == "DATABASE_URL" || name == "TENURE_SCHEMA" || extra.contains(name)) continue;
    env.push_back(entry);
  }
  for (const auto& [name, value] : extra) env.push_back(name + "=" + value);
  return env;
}

/// Spawns TENURE_CLI_PATH with `args`, collecting stdout and stderr until it exits.
run_result run_tenure(const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env = {}) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
    posix_spawn_file_actions_addclose(&actions, fd);

  std::vector<std::string> argv_text{TENURE_CLI_PATH};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env_text = child_environment(env);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, TENURE_CLI_PATH, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (spawned != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    throw std::runtime_error(std::string{"cannot spawn " TENURE_CLI_PATH ": "} + std::strerror(spawned));
  }

  // Read both pipes together: a child blocked on a full stderr pipe would never exit.
  run_result r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

/// The error contract: exit code, nothing on stdout, exactly one `tenure: ` line on stderr.
void expect_one_error_line(const run_result& r, int exit_code, const std::string& must_contain) {
  EXPECT_EQ(r.exit_code, exit_code) << r;
  EXPECT_EQ(r.out, "") << r;
  EXPECT_TRUE(r.err.starts_with("tenure: ")) << r;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r;
  EXPECT_TRUE(r.err.ends_with("\n")) << r;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << "missing '" << must_contain << "'\n" << r;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r;
  EXPECT_EQ(r.err.find("what()"), std::string::npos) << r;
}

/// The success contract: exit 0, nothing on stderr.
void expect_success(const run_result& r) {
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, "") << r;
}

using tenure::test::random_hex;

// ---- the database, for setup and checks ------------------------------------------------------

class pg {
 public:
  explicit pg(const std::string& dsn) : conn_(PQconnectdb(dsn.c_str()), &PQfinish) {
    if (PQstatus(conn_.get()) != CONNECTION_OK) {
      throw std::runtime_error(std::string{"cannot connect to TENURE_TEST_DSN: "} +
                               PQerrorMessage(conn_.get()));
    }
    exec("SET client_min_messages = warning");
  }
  /// Runs SQL and returns the first column of the first row (nullopt for no row or NULL).
  std::optional<std::string> exec(const std::string& sql) {
    std::unique_ptr<PGresult, decltype(&PQclear)> res(PQexec(conn_.get(), sql.c_str()), &PQclear);
    const auto status = PQresultStatus(res.get());
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
      throw std::runtime_error("SQL failed: " + sql + ": " + PQresultErrorMessage(res.get()));
    }
    if (status != PGRES_TUPLES_OK || PQntuples(res.get()) == 0 || PQgetisnull(res.get(), 0, 0))
      return std::nullopt;
    return std::string{PQgetvalue(res.get(), 0, 0)};
  }

 private:
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn_;
};

// ---- fixture ---------------------------------------------------------------------------------

constexpr const char* k_unreachable = "postgresql://postgres@127.0.0.1:1/postgres";

class cli_pg : public testing::Test {
 protected:
  void SetUp() override {
    const char* dsn = std::getenv("TENURE_TEST_DSN");
    // Never a skip: a run without the database must not look green.
    ASSERT_TRUE(dsn != nullptr && *dsn != '\0') << "TENURE_TEST_DSN is not set. This test needs PostgreSQL: "
                                                   "export TENURE_TEST_DSN=$(scripts/pg start)";
    dsn_ = dsn;
    schema_ = "cli_" + random_hex(12);
    db_ = std::make_unique<pg>(dsn_);
  }

  void TearDown() override {
    if (!db_) return;
    db_->exec("DROP SCHEMA IF EXISTS " + schema_ + " CASCADE");
    // The schema's grants went with it; the roles can go now.
    for (const auto& role : roles_) db_->exec("DROP ROLE IF EXISTS " + role);
  }

  /// Runs `tenure --database-url <dsn> --schema <schema> args...`.
  run_result tenure(std::vector<std::string> args) {
    args.insert(args.begin(), {"--database-url", dsn_, "--schema", schema_});
    return run_tenure(args);
  }

  void migrate() {
    const auto r = tenure({"migrate"});
    ASSERT_EQ(r.exit_code, 0) << r;
  }

  /// Enqueues and returns the printed id.
  std::int64_t enqueue(std::vector<std::string> args) {
    args.insert(args.begin(), "enqueue");
    const auto r = tenure(args);
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_TRUE(std::regex_match(r.out, std::regex{"[0-9]+\n"})) << r;
    return std::stoll(r.out);
  }

  nlohmann::json show(std::int64_t id) {
    const auto r = tenure({"job", "show", std::to_string(id), "--json"});
    EXPECT_EQ(r.exit_code, 0) << r;
    return nlohmann::json::parse(r.out);
  }

  nlohmann::json status() {
    const auto r = tenure({"status", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_EQ(r.err, "") << r;
    return nlohmann::json::parse(r.out);
  }

  std::string create_role() {
    const std::string role = "cli_role_" + random_hex(12);
    db_->exec("CREATE ROLE " + role + " NOLOGIN");
    roles_.push_back(role);
    return role;
  }

  std::string dsn_;
  std::string schema_;
  std::unique_ptr<pg> db_;
  std::vector<std::string> roles_;
};

// ---- migrate ---------------------------------------------------------------------------------

TEST_F(cli_pg, migrate_then_migrate_again_is_a_no_op) {
  auto first = tenure({"migrate"});
  expect_success(first);
  EXPECT_EQ(first.out, "schema " + schema_ + ": migrated from version 0 to " + std::to_string(known_version()) + "\n");

  auto second = tenure({"migrate"});
  expect_success(second);  // in particular no server NOTICE leaking onto stderr
  EXPECT_EQ(second.out, "schema " + schema_ + ": already at version " + std::to_string(known_version()) + "\n");
}

TEST_F(cli_pg, environment_supplies_database_and_schema) {
  auto r = run_tenure({"migrate"}, {{"DATABASE_URL", dsn_}, {"TENURE_SCHEMA", schema_}});
  expect_success(r);
  EXPECT_EQ(r.out, "schema " + schema_ + ": migrated from version 0 to " + std::to_string(known_version()) + "\n");
}

// ---- enqueue and job show --------------------------------------------------------------------

TEST_F(cli_pg, enqueue_and_job_show_round_trip) {
  migrate();
  const auto id = enqueue({"send_email", "--args", R"({"to":"a@example.com","n":3})", "--queue", "mail",
                           "--priority", "1", "--max-attempts", "5"});

  const auto job = show(id);
  EXPECT_EQ(job["id"], id);
  EXPECT_EQ(job["kind"], "send_email");
  EXPECT_EQ(job["queue"], "mail");
  EXPECT_EQ(job["state"], "available");
  EXPECT_EQ(job["args"], nlohmann::json::parse(R"({"to":"a@example.com","n":3})"));
  EXPECT_EQ(job["priority"], 1);
  EXPECT_EQ(job["attempt"], 0);
  EXPECT_EQ(job["max_attempts"], 5);
  EXPECT_EQ(job["run_lease"], 0);
  EXPECT_TRUE(job["finalized_at"].is_null());
  EXPECT_TRUE(job["last_error"].is_null());
  EXPECT_TRUE(job["progress"].is_null());
  EXPECT_EQ(job["dead_lettered"], false);

  const auto text = tenure({"job", "show", std::to_string(id)});
  expect_success(text);
  EXPECT_TRUE(text.out.starts_with("job " + std::to_string(id) + "\n")) << text;
  for (const char* line : {R"(\n  kind +send_email\n)", R"(\n  state +available\n)", R"(\n  queue +mail\n)",
                           R"(\n  args +\{"n": 3, "to": "a@example.com"\}\n)", R"(\n  max attempts +5\n)",
                           R"(\n  finalized at +-\n)"}) {
    EXPECT_TRUE(std::regex_search(text.out, std::regex{line})) << line << "\n" << text;
  }
}

TEST_F(cli_pg, enqueue_in_the_future_is_scheduled) {
  migrate();
  const auto at = enqueue({"report", "--run-at", "2199-01-01T01:30:00+01:00"});
  const auto later = enqueue({"report", "--delay", "3600"});
  EXPECT_EQ(show(at)["state"], "scheduled");
  EXPECT_EQ(show(at)["run_at"], "2199-01-01T00:30:00Z");
  EXPECT_EQ(show(later)["state"], "scheduled");
}

TEST_F(cli_pg, bad_json_is_one_line_and_writes_nothing) {
  migrate();
  for (const char* bad : {R"({"to":)", "{'single': 1}", "[1, 2", ""}) {
    auto r = tenure({"enqueue", "send_email", "--args", bad});
    expect_one_error_line(r, 1, "--args is not valid JSON");
    EXPECT_NE(r.err.find("line 1, column"), std::string::npos) << r;  // names the position
  }
  EXPECT_EQ(status()["total"]["total"], 0);
}

TEST_F(cli_pg, enqueue_metadata_is_shown_by_job_show_and_handed_to_the_handler) {
  migrate();
  const std::string traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const auto traced = enqueue({"k", "--metadata", R"({"traceparent":")" + traceparent + R"("})"});
  const auto plain = enqueue({"k"});
  EXPECT_EQ(show(traced)["metadata"], (nlohmann::json{{"traceparent", traceparent}}));
  EXPECT_EQ(show(plain)["metadata"], nlohmann::json::object());
  const auto text = tenure({"job", "show", std::to_string(traced)});
  expect_success(text);
  EXPECT_NE(text.out.find("\n  metadata      {\"traceparent\": \"" + traceparent + "\"}\n"), std::string::npos) << text;

  auto rt = tenure::postgres::make_runtime({.dsn = dsn_, .schema = schema_});
  ASSERT_TRUE(rt) << rt.error().message();
  std::mutex mu;
  std::map<std::int64_t, nlohmann::json> seen;
  rt.value()->handle("k", [&](tenure::job_context& ctx) {
    std::lock_guard lock(mu);
    seen[ctx.job_id()] = ctx.metadata();
    return tenure::job_outcome::completed();
  });
  ASSERT_TRUE(rt.value()->start());
  const auto completed = [&] { return db_->exec("SELECT count(*) FROM " + schema_ + ".jobs WHERE state = 'completed'"); };
  for (int i = 0; i < 2000 && completed() != "2"; ++i) std::this_thread::sleep_for(std::chrono::milliseconds{10});
  rt.value()->stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(seen[traced], (nlohmann::json{{"traceparent", traceparent}}));
  EXPECT_EQ(seen[plain], nlohmann::json::object());
}

TEST_F(cli_pg, bad_metadata_is_one_line_naming_the_option_and_writes_nothing) {
  migrate();
  expect_one_error_line(tenure({"enqueue", "k", "--metadata", "[1]"}), 1,
                        "--metadata must be a JSON object (e.g. {\"id\": 42}), not a JSON array");
  expect_one_error_line(tenure({"enqueue", "k", "--metadata", R"({"a":)"}), 1, "--metadata is not valid JSON");
  expect_one_error_line(tenure({"enqueue", "k", "--metadata", R"({"k":")" + std::string(9000, 'x') + R"("})"}), 1,
                        "--metadata is 9009 bytes as JSON text, more than 8192");
  EXPECT_EQ(status()["total"]["total"], 0);
}

TEST_F(cli_pg, enqueue_with_a_unique_key_prints_the_live_holders_id_and_says_whether_it_inserted) {
  migrate();
  auto first = tenure({"enqueue", "k", "--unique-key", "order-9"});
  ASSERT_EQ(first.exit_code, 0) << first;
  const auto id = std::stoll(first.out);
  EXPECT_EQ(first.err, "enqueued job " + std::to_string(id) + " holding unique key 'order-9' in queue default\n");
  auto again = tenure({"enqueue", "k", "--unique-key", "order-9"});
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_EQ(again.out, std::to_string(id) + "\n") << "only the id on stdout, whoever holds the key";
  EXPECT_EQ(again.err, "not enqueued: live job " + std::to_string(id) + " holds unique key 'order-9' in queue default\n");
  EXPECT_NE(enqueue({"k", "--unique-key", "order-9", "--queue", "other"}), id);

  EXPECT_EQ(show(id)["unique_key"], "order-9");
  EXPECT_EQ(show(enqueue({"k"}))["unique_key"], nullptr);
  const auto text = tenure({"job", "show", std::to_string(id)});
  expect_success(text);
  EXPECT_NE(text.out.find("\n  unique key    order-9\n"), std::string::npos) << text;

  ASSERT_EQ(tenure({"job", "cancel", std::to_string(id)}).exit_code, 0);
  const auto after = tenure({"enqueue", "k", "--unique-key", "order-9"});
  ASSERT_EQ(after.exit_code, 0) << after;
  EXPECT_NE(std::stoll(after.out), id) << "a cancelled job frees its key";
  EXPECT_NE(after.err.find("enqueued job"), std::string::npos) << after;

  expect_one_error_line(tenure({"enqueue", "k", "--unique-key", ""}), 1, "--unique-key is empty");
  expect_one_error_line(tenure({"enqueue", "k", "--unique-key", std::string(256, 'x')}), 1,
                        "--unique-key has 256 bytes, more than 255");
  expect_one_error_line(tenure({"enqueue", "k", "--unique-key", "a\tb"}), 1, "--unique-key contains a control character");
}

TEST_F(cli_pg, numbers_the_command_line_cannot_hold_exactly_are_refused_never_rounded_or_clamped) {
  migrate();
  // NaN would have dropped the delay (the job ran at once); hex read as seconds.
  for (const char* delay : {"nan", "inf", "0x10"}) {
    expect_one_error_line(tenure({"enqueue", "k", "--delay", delay}), 2, "is not a number of seconds");
  }
  expect_one_error_line(tenure({"rescue", "--stale-after", "nan"}), 2, "is not a number of seconds");
  // An id past int64 was clamped to 9223372036854775807, and cancel/retry acted on that job.
  for (const char* verb : {"show", "cancel", "retry"}) {
    expect_one_error_line(tenure({"job", verb, "99999999999999999999999999"}), 2, "is not a job id");
    expect_one_error_line(tenure({"job", verb, "0"}), 2, "is not a job id");
  }
  expect_one_error_line(tenure({"enqueue", "k", "--args", "1e400"}), 1, "number overflow");
  expect_one_error_line(tenure({"enqueue", "k", "--args", R"({"order":12345678901234567890123})"}), 1,
                        "does not fit in 64 bits");
  EXPECT_EQ(status()["total"]["total"], 0) << "nothing was written";
  const auto id = enqueue({"k", "--args", R"({"min":-9223372036854775808,"max":18446744073709551615})"});
  EXPECT_EQ(show(id)["args"].dump(), R"({"max":18446744073709551615,"min":-9223372036854775808})");
}

// ---- status ------------------------------------------------------------------------------------

TEST_F(cli_pg, status_counts_per_queue_and_state) {
  migrate();
  const auto empty = tenure({"status"});
  expect_success(empty);
  EXPECT_EQ(empty.out, "no jobs in schema " + schema_ + "\n");
  EXPECT_EQ(status()["total"]["total"], 0);

  enqueue({"a"});
  enqueue({"a"});
  const auto doomed = enqueue({"a"});
  enqueue({"b", "--queue", "mail"});
  enqueue({"b", "--queue", "mail", "--delay", "3600"});
  expect_success(tenure({"job", "cancel", std::to_string(doomed)}));

  const auto s = status();
  EXPECT_EQ(s["schema"], schema_);
  EXPECT_EQ(s["queues"].size(), 2u);
  const auto& d = s["queues"]["default"];
  EXPECT_EQ(d["available"], 2);
  EXPECT_EQ(d["cancelled"], 1);
  EXPECT_EQ(d["scheduled"], 0);
  EXPECT_EQ(d["total"], 3);
  const auto& m = s["queues"]["mail"];
  EXPECT_EQ(m["available"], 1);
  EXPECT_EQ(m["scheduled"], 1);
  EXPECT_EQ(m["cancelled"], 0);
  EXPECT_EQ(m["total"], 2);
  EXPECT_EQ(s["total"]["available"], 3);
  EXPECT_EQ(s["total"]["scheduled"], 1);
  EXPECT_EQ(s["total"]["cancelled"], 1);
  EXPECT_EQ(s["total"]["running"], 0);
  EXPECT_EQ(s["total"]["total"], 5);

  // The table has a column per state that holds jobs, in lifecycle order, and a total.
  const auto table = tenure({"status"});
  expect_success(table);
  EXPECT_TRUE(std::regex_search(table.out, std::regex{R"(^QUEUE +scheduled +available +cancelled +total\n)"}))
      << table;
  EXPECT_TRUE(std::regex_search(table.out, std::regex{R"(\ndefault +0 +2 +1 +3\n)"})) << table;
  EXPECT_TRUE(std::regex_search(table.out, std::regex{R"(\nmail +1 +1 +0 +2\n)"})) << table;
  EXPECT_TRUE(std::regex_search(table.out, std::regex{R"(\n\(all\) +1 +3 +1 +5\n)"})) << table;
}

// ---- job show / cancel / retry -----------------------------------------------------------------

TEST_F(cli_pg, unknown_job_id_is_one_line) {
  migrate();
  for (const char* verb : {"show", "cancel", "retry"}) {
    auto r = tenure({"job", verb, "424242"});
    expect_one_error_line(r, 1, "job 424242 not found");
    EXPECT_EQ(r.err, "tenure: job 424242 not found\n");
  }
}

TEST_F(cli_pg, job_show_json_prints_args_as_the_database_holds_them) {
  // 1e1000 is valid jsonb but no double: it was printed as a JSON string of the text. An integer
  // past 64 bits was printed rounded through a double.
  migrate();
  const std::string big = "123456789012345678901234567890";
  const auto id = db_->exec("SELECT " + schema_ + ".enqueue('k', '{\"n\": 1e1000, \"big\": " + big +
                            ", \"s\": \"x\"}')");
  ASSERT_TRUE(id);
  const auto held = db_->exec("SELECT args::text FROM " + schema_ + ".jobs WHERE id = " + *id);
  ASSERT_TRUE(held);
  ASSERT_NE(held->find(big), std::string::npos) << *held;
  const auto r = tenure({"job", "show", *id, "--json"});
  expect_success(r);
  EXPECT_NE(r.out.find("\"args\": " + *held + ",\n"), std::string::npos) << r;
  // Still one JSON object, every other field as before.
  const auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_discarded()) << "nlohmann cannot hold 1e1000 either; the text is JSON all the same";
  const auto plain = enqueue({"k", "--args", R"({"a":[1,2],"b":{"c":null}})"});
  const auto p = show(plain);
  EXPECT_EQ(p["args"], nlohmann::json::parse(R"({"a":[1,2],"b":{"c":null}})"));
  EXPECT_EQ(p["kind"], "k");
  EXPECT_EQ(p["state"], "available");
  EXPECT_EQ(p["progress"], nullptr);
}

TEST_F(cli_pg, refusals_name_the_field_and_the_allowed_range_in_words) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"enqueue", "a", "--max-attempts", "0"}, "--max-attempts: '0' is out of range: must be a whole number from 1 to 2147483647"},
      {{"enqueue", "a", "--max-attempts", "-3"}, "--max-attempts: '-3' is out of range: must be a whole number from 1 to"},
      {{"enqueue", "a", "--max-attempts", "99999999999"}, "--max-attempts: '99999999999' is out of range"},
      {{"enqueue", "a", "--max-attempts", "0x10"}, "--max-attempts: '0x10' is not a whole number"},
      {{"enqueue", "a", "--priority", "9"}, "--priority: '9' is out of range: must be 1 (highest) to 4 (lowest)"},
      {{"enqueue", "a", "--priority", "1.5"}, "--priority: '1.5' is not a whole number: must be 1 (highest) to 4"},
      {{"enqueue", "a", "--delay", "1e30"}, "--delay: '1e30' is out of range: must be from 0 to 3153600000 seconds"},
      {{"rescue", "--stale-after", "-1"}, "--stale-after: '-1' is out of range: must be from 0 to 3153600000 seconds"},
      {{"bench", "--seconds", "0"}, "--seconds: '0' is out of range: must be from 0.1 to 3600 seconds"},
      {{"bench", "--rate", "-5"}, "--rate: '-5' is out of range: must be from 0 to 1000000 jobs per second"},
      {{"bench", "--workers", "0"}, "--workers: '0' is out of range: must be a whole number from 1 to 64"},
      {{"bench", "--jobs", "0"}, "--jobs: '0' is out of range: must be a whole number from 1 to 100000000"},
      {{"bench", "--producers", "300"}, "--producers: '300' is out of range: must be a whole number from 1 to 256"},
      {{"bench", "--pickup-samples", "0"}, "--pickup-samples: '0' is out of range"},
      {{"bench", "--max-concurrency", "-1"}, "--max-concurrency: '-1' is out of range: must be a whole number from 0 to 100000"},
      {{"bench", "--mode", "fast"}, "--mode: 'fast' is not a mode: must be runtime, sql-limit, enqueue-single, caller-owned or prune"},
  };
  for (auto [args, message] : cases) {
    args.insert(args.begin(), {"--database-url", dsn_});
    SCOPED_TRACE(testing::PrintToString(args));
    const auto r = run_tenure(args);
    expect_one_error_line(r, 2, message);
    EXPECT_EQ(r.err.find("0.000000"), std::string::npos) << r;
    EXPECT_EQ(r.err.find("1797693"), std::string::npos) << r;
  }
  // args are a JSON object, as the database requires.
  migrate();
  for (const char* args : {"[1,2]", "\"str\"", "7", "null", "true"}) {
    expect_one_error_line(tenure({"enqueue", "k", "--args", args}), 1, "--args must be a JSON object");
  }
  expect_one_error_line(tenure({"enqueue", "k", "--args", "[1,2]"}), 1, "not a JSON array");
  EXPECT_EQ(status()["total"]["total"], 0) << "nothing was written";
}

TEST_F(cli_pg, job_cancel_and_retry_say_what_happened) {
  migrate();
  const auto id = enqueue({"a"});
  const auto name = "job " + std::to_string(id);

  auto cancelled = tenure({"job", "cancel", std::to_string(id)});
  expect_success(cancelled);
  EXPECT_EQ(cancelled.out, name + " cancelled\n");
  EXPECT_EQ(show(id)["state"], "cancelled");

  auto again = tenure({"job", "cancel", std::to_string(id)});
  expect_success(again);
  EXPECT_EQ(again.out, name + " not cancelled: it already finished (cancelled)\n");

  auto retried = tenure({"job", "retry", std::to_string(id)});
  expect_success(retried);
  EXPECT_EQ(retried.out, name + " will run again: available now, attempts reset\n");
  EXPECT_EQ(show(id)["state"], "available");

  auto not_finished = tenure({"job", "retry", std::to_string(id)});
  expect_success(not_finished);
  EXPECT_EQ(not_finished.out, name + " not retried: it has not finished (available)\n");
}

// ---- rescue ------------------------------------------------------------------------------------

/// What `tenure maintain` (or `rescue`) prints for a pass of lease term `term` that rescued job
/// `id`'s first attempt back to available.
std::regex one_rescue_pass(int term, std::int64_t id) {
  return std::regex{"maintenance leader tenure-maintain:[^ ]+:[0-9]+, term " + std::to_string(term) +
                    "\n"
                    "maintenance pass done: due jobs promoted, expired finished jobs pruned, rescued 1 stale "
                    "attempt:\n"
                    "  job " + std::to_string(id) + " \\(queue default, run lease [1-9][0-9]*\\) -> available\n"};
}

TEST_F(cli_pg, rescue_is_an_alias_of_maintain_once_fenced_by_the_lease) {
  migrate();
  const auto id = enqueue({"a"});
  db_->exec("SELECT * FROM " + schema_ + ".claim('default', 1, 'gone-worker')");
  // While another process leads, `rescue` does what `maintain --once` does: nothing.
  ASSERT_EQ(db_->exec("SELECT " + schema_ + ".acquire_leadership('runtime-a', '1 hour')"), "1");
  auto standby = tenure({"rescue", "--stale-after", "0"});
  expect_success(standby);
  EXPECT_NE(standby.out.find("not the maintenance leader"), std::string::npos) << standby;
  EXPECT_EQ(show(id)["state"], "running") << "no unfenced rescue beside a leader";

  db_->exec("SELECT " + schema_ + ".release_leadership('runtime-a', 1)");
  auto one = tenure({"rescue", "--stale-after", "0"});
  expect_success(one);
  EXPECT_TRUE(std::regex_match(one.out, one_rescue_pass(2, id))) << one;
  EXPECT_EQ(show(id)["state"], "available");
  EXPECT_EQ(db_->exec("SELECT expires_at <= clock_timestamp() FROM " + schema_ + ".leadership"), "t")
      << "the lease is released, as after maintain --once";
}

// ---- queues and maintenance --------------------------------------------------------------------

TEST_F(cli_pg, queue_pause_and_resume_say_whether_the_state_changed_and_a_paused_queue_is_not_claimed) {
  migrate();
  const auto id = enqueue({"a", "--queue", "mail"});
  auto paused = tenure({"queue", "pause", "mail"});
  expect_success(paused);
  EXPECT_EQ(paused.out, "queue mail paused: no worker claims its jobs until it is resumed\n");
  auto again = tenure({"queue", "pause", "mail"});
  expect_success(again);
  EXPECT_EQ(again.out, "queue mail was already paused\n");
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema_ + ".claim('mail', 10)"), "0");
  auto resumed = tenure({"queue", "resume", "mail"});
  expect_success(resumed);
  EXPECT_EQ(resumed.out, "queue mail resumed\n");
  EXPECT_EQ(tenure({"queue", "resume", "mail"}).out, "queue mail was not paused\n");
  EXPECT_EQ(db_->exec("SELECT job_id FROM " + schema_ + ".claim('mail', 10)"), std::to_string(id));
}

TEST_F(cli_pg, queue_list_prints_paused_settings_counts_and_the_oldest_available_age) {
  migrate();
  enqueue({"a", "--queue", "mail"});
  enqueue({"a", "--queue", "mail"});
  enqueue({"a", "--queue", "sms"});
  db_->exec("SELECT * FROM " + schema_ + ".claim('sms', 1)");
  expect_success(tenure({"queue", "pause", "mail"}));
  expect_success(tenure({"queue", "configure", "sms", "--retain-completed", "2h", "--dead-letter", "on"}));

  auto text = tenure({"queue", "list"});
  expect_success(text);
  EXPECT_TRUE(std::regex_match(
      text.out,
      std::regex{"queue mail  PAUSED\n"
                 "  jobs      scheduled 0, available 2, running 0, waiting_external 0, retryable 0, completed 0, "
                 "failed 0, cancelled 0\n"
                 "  oldest available job  [0-9]+\\.[0-9]s\n"
                 "  settings  dead_letter off, hard_deadline none, backoff_base 1s, backoff_cap 1h, "
                 "retain_completed 1d, retain_cancelled 1d, retain_failed 7d, max_running none, rate_per_second none, "
                 "rate_burst none, priority_aging none\n"
                 "queue sms  running\n"
                 "  jobs      scheduled 0, available 0, running 1, waiting_external 0, retryable 0, completed 0, "
                 "failed 0, cancelled 0\n"
                 "  oldest available job  -\n"
                 "  settings  dead_letter on, hard_deadline none, backoff_base 1s, backoff_cap 1h, "
                 "retain_completed 2h, retain_cancelled 1d, retain_failed 7d, max_running none, rate_per_second none, "
                 "rate_burst none, priority_aging none\n"}))
      << text;

  auto json = tenure({"queue", "list", "--json"});
  expect_success(json);
  const auto j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["queues"].size(), 2u);
  EXPECT_EQ(j["queues"][0]["name"], "mail");
  EXPECT_EQ(j["queues"][0]["paused"], true);
  EXPECT_EQ(j["queues"][0]["counts"]["available"], 2);
  EXPECT_TRUE(j["queues"][0]["oldest_available_seconds"].is_number());
  EXPECT_EQ(j["queues"][1]["settings"]["retain_completed"], "2h");
  EXPECT_EQ(j["queues"][1]["settings"]["dead_letter"], true);
  EXPECT_TRUE(j["queues"][1]["oldest_available_seconds"].is_null());
}

TEST_F(cli_pg, queue_names_are_user_data_and_are_printed_escaped) {
  migrate();
  // enqueue refuses control characters; bidi overrides and backslashes get through, and a row
  // written by hand (or by a future version) may hold a C1 control such as an 8-bit CSI.
  const std::string csi = "\xC2\x9B" "31m";  // U+009B, a CSI on some terminals
  const std::string rlo = "\xE2\x80\xAE";    // U+202E RIGHT-TO-LEFT OVERRIDE
  const std::string name = "q" + rlo + "\\x";
  db_->exec("SELECT " + schema_ + ".enqueue('k', '{}', E'q\\xE2\\x80\\xAE\\\\x')");
  db_->exec("INSERT INTO " + schema_ + ".queues (name) VALUES (E'r\\xC2\\x9B31m')");
  auto text = tenure({"queue", "list"});
  expect_success(text);
  EXPECT_NE(text.out.find("queue q\\u{202E}\\\\x  running\n"), std::string::npos) << text;
  EXPECT_NE(text.out.find("queue r\\u{009B}31m  running\n"), std::string::npos) << text;
  EXPECT_EQ(text.out.find(csi), std::string::npos) << text;
  EXPECT_EQ(text.out.find(rlo), std::string::npos) << text;
  auto paused = tenure({"queue", "pause", name});
  expect_success(paused);
  EXPECT_EQ(paused.out, "queue q\\u{202E}\\\\x paused: no worker claims its jobs until it is resumed\n");
  auto json = tenure({"queue", "list", "--json"});
  expect_success(json);
  EXPECT_EQ(nlohmann::json::parse(json.out)["queues"][0]["name"], name) << "JSON carries the exact name, escaped by JSON";
  EXPECT_EQ(nlohmann::json::parse(json.out)["queues"][1]["name"], "r" + csi);
}

TEST_F(cli_pg, queue_configure_changes_only_what_is_given_and_refuses_bad_values_with_exit_2) {
  migrate();
  auto r = tenure({"queue", "configure", "mail", "--retain-failed", "30d", "--backoff-base", "250ms",
                   "--hard-deadline", "15m"});
  expect_success(r);
  EXPECT_EQ(r.out, "queue mail configured\n"
                   "  settings  dead_letter off, hard_deadline 15m, backoff_base 250ms, backoff_cap 1h, "
                   "retain_completed 1d, retain_cancelled 1d, retain_failed 30d, max_running none, "
                   "rate_per_second none, rate_burst none, priority_aging none\n");
  const std::string before = *db_->exec("SELECT row_to_json(q)::text FROM " + schema_ + ".queues q WHERE name = 'mail'");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--retain-failed", "7 days"}), 2,
                        "--retain-failed: '7 days' is not a duration");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--retain-completed", "-1s"}), 2, "--retain-completed");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--dead-letter", "yes"}), 2, "'yes' must be on or off");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--hard-deadline", "0s"}), 2, "must be positive");
  expect_one_error_line(tenure({"queue", "configure", "mail"}), 2, "nothing to change");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--backoff-cap", "100ms"}), 2,
                        "cannot configure queue mail: tenure.configure_queue: backoff_cap (100ms) must not be less "
                        "than backoff_base (250ms)");
  EXPECT_EQ(*db_->exec("SELECT row_to_json(q)::text FROM " + schema_ + ".queues q WHERE name = 'mail'"), before)
      << "nothing changed";
  expect_success(tenure({"queue", "configure", "mail", "--hard-deadline", "none", "--retain-completed", "0s"}));
  EXPECT_EQ(db_->exec("SELECT hard_deadline IS NULL AND retain_completed = '0' FROM " + schema_ +
                      ".queues WHERE name = 'mail'"),
            "t");
}

TEST_F(cli_pg, queue_configure_sets_and_clears_limits_and_aging_and_queue_list_shows_them) {
  migrate();
  auto r = tenure({"queue", "configure", "mail", "--max-running", "5", "--rate-per-second", "0.5", "--rate-burst", "3",
                   "--priority-aging", "90s"});
  expect_success(r);
  EXPECT_EQ(r.out, "queue mail configured\n"
                   "  settings  dead_letter off, hard_deadline none, backoff_base 1s, backoff_cap 1h, "
                   "retain_completed 1d, retain_cancelled 1d, retain_failed 7d, max_running 5, "
                   "rate_per_second 0.5, rate_burst 3, priority_aging 90s\n");
  const std::string before = *db_->exec("SELECT row_to_json(q)::text FROM " + schema_ + ".queues q WHERE name = 'mail'");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--max-running", "0"}), 2,
                        "--max-running: '0' is out of range: must be a whole number from 1 to 2147483647 (or none)");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--max-running", "2.5"}), 2, "--max-running");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--rate-per-second", "0"}), 2,
                        "--rate-per-second: '0' must be positive (or none, for no limit)");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--rate-per-second", "nan"}), 2, "--rate-per-second");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--rate-burst", "0.5"}), 2, "--rate-burst");
  expect_one_error_line(tenure({"queue", "configure", "mail", "--priority-aging", "0s"}), 2,
                        "priority aging must be positive");
  EXPECT_EQ(*db_->exec("SELECT row_to_json(q)::text FROM " + schema_ + ".queues q WHERE name = 'mail'"), before)
      << "nothing changed";

  auto json = tenure({"queue", "list", "--json"});
  expect_success(json);
  const auto settings = nlohmann::json::parse(json.out)["queues"][0]["settings"];
  EXPECT_EQ(settings["max_running"], 5);
  EXPECT_EQ(settings["rate_per_second"], 0.5);
  EXPECT_EQ(settings["rate_burst"], 3);
  EXPECT_EQ(settings["priority_aging"], "90s");

  expect_success(tenure({"queue", "configure", "mail", "--max-running", "none", "--rate-per-second", "none",
                         "--rate-burst", "none", "--priority-aging", "none"}));
  auto text = tenure({"queue", "list"});
  expect_success(text);
  EXPECT_NE(text.out.find("max_running none, rate_per_second none, rate_burst none, priority_aging none\n"),
            std::string::npos)
      << text;
}

TEST_F(cli_pg, maintain_once_rescues_a_stale_attempt_as_leader_and_releases_the_lease) {
  migrate();
  const auto id = enqueue({"a"});
  db_->exec("SELECT * FROM " + schema_ + ".claim('default', 1, 'gone-worker')");
  auto r = tenure({"maintain", "--once", "--stale-after", "0"});
  expect_success(r);
  EXPECT_TRUE(std::regex_match(r.out, one_rescue_pass(1, id))) << r;
  EXPECT_EQ(show(id)["state"], "available");
  EXPECT_EQ(db_->exec("SELECT expires_at <= clock_timestamp() FROM " + schema_ + ".leadership"), "t")
      << "the lease is released: a runtime leads again at once";
  // Without options it is one pass too.
  auto plain = tenure({"maintain"});
  expect_success(plain);
  EXPECT_NE(plain.out.find(", term 2\n"), std::string::npos) << plain;
}

TEST_F(cli_pg, maintain_once_while_another_process_leads_does_nothing_and_says_who_leads) {
  migrate();
  const auto id = enqueue({"a"});
  db_->exec("SELECT * FROM " + schema_ + ".claim('default', 1, 'gone-worker')");
  ASSERT_EQ(db_->exec("SELECT " + schema_ + ".acquire_leadership('runtime-a', '1 hour')"), "1");
  auto r = tenure({"maintain", "--once", "--stale-after", "0"});
  expect_success(r);
  EXPECT_TRUE(std::regex_match(r.out, std::regex{"not the maintenance leader: another process holds the lease "
                                                 "\\(held by runtime-a, term 1, for another [0-9.]+s\\); nothing done\n"}))
      << r;
  EXPECT_EQ(show(id)["state"], "running") << "no second leader acted";
  EXPECT_EQ(db_->exec("SELECT holder || ' ' || term FROM " + schema_ + ".leadership"), "runtime-a 1");
}

TEST_F(cli_pg, maintain_interval_runs_until_sigterm_and_refuses_bad_options) {
  migrate();
  expect_one_error_line(tenure({"maintain", "--interval", "10ms"}), 2, "at least 100ms");
  expect_one_error_line(tenure({"maintain", "--interval", "1s", "--once"}), 2, "excludes");
}

TEST_F(cli_pg, grant_admin_gives_the_queue_functions_and_nothing_else) {
  migrate();
  const auto role = create_role();
  auto r = tenure({"grant-admin", role});
  expect_success(r);
  EXPECT_EQ(r.out, "granted admin access on schema " + schema_ + " to role " + role + "\n");
  auto has = [&](const std::string& check) { return db_->exec("SELECT " + check) == "t"; };
  for (const char* fn : {"pause_queue(text)", "resume_queue(text)", "configure_queue(text,jsonb)", "list_queues()",
                         "schedule_upsert(text,text,text,jsonb,text,text)", "schedule_remove(text)",
                         "list_schedules()", "cron_next(text,timestamptz,text)"}) {
    EXPECT_TRUE(has("has_function_privilege('" + role + "', '" + schema_ + "." + fn + "', 'EXECUTE')")) << fn;
  }
  EXPECT_FALSE(has("has_function_privilege('" + role + "', '" + schema_ + ".prune_expired(interval,int,int)', 'EXECUTE')"));
  EXPECT_FALSE(has("has_function_privilege('" + role + "', '" + schema_ + ".complete_job(text,jsonb)', 'EXECUTE')"));
  EXPECT_FALSE(has("has_function_privilege('" + role + "', '" + schema_ + ".enqueue_due_schedules(timestamptz,int)', 'EXECUTE')"));
  EXPECT_FALSE(has("has_table_privilege('" + role + "', '" + schema_ + ".schedules', 'SELECT')"));
  EXPECT_FALSE(has("has_table_privilege('" + role + "', '" + schema_ + ".queues', 'SELECT')"));
  EXPECT_FALSE(has("has_table_privilege('" + role + "', '" + schema_ + ".jobs', 'SELECT')"));
}

// ---- schedules -----------------------------------------------------------------------------------

TEST_F(cli_pg, schedule_add_list_and_remove_round_trip_through_sql) {
  migrate();
  auto added = tenure({"schedule", "add", "nightly", "--cron", "30 2 * * *", "--kind", "report", "--args",
                       R"({"n": 123456789012345678901234567890})", "--queue", "reports", "--timezone", "Europe/Berlin"});
  expect_success(added);
  EXPECT_TRUE(std::regex_match(added.out, std::regex{"schedule nightly created; next run "
                                                     "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:00Z "
                                                     "\\([0-9]{4}-[0-9]{2}-[0-9]{2} 02:30 Europe/Berlin\\)\n"}))
      << added;
  auto again = tenure({"schedule", "add", "nightly", "--cron", "30 2 * * *", "--kind", "report2", "--timezone",
                       "Europe/Berlin"});
  expect_success(again);
  EXPECT_TRUE(again.out.starts_with("schedule nightly updated; next run ")) << again;
  expect_success(tenure({"schedule", "add", "every-minute", "--cron", "* * * * *", "--kind", "tick"}));
  // The second schedule's slot comes due and a pass enqueues it.
  db_->exec("UPDATE " + schema_ + ".schedules SET next_slot = now() - interval '1 second' WHERE name = 'every-minute'");
  db_->exec("SELECT " + schema_ + ".enqueue_due_schedules()");

  auto text = tenure({"schedule", "list"});
  expect_success(text);
  EXPECT_TRUE(std::regex_match(
      text.out,
      std::regex{"schedule every-minute  \\* \\* \\* \\* \\*  \\(UTC\\)\n"
                 "  job       kind tick, queue default, args \\{\\}\n"
                 "  next run  [0-9T:-]+Z \\([0-9: -]+ UTC\\)\n"
                 "  last run  [0-9T:-]+Z \\(job [0-9]+\\)\n"
                 "schedule nightly  30 2 \\* \\* \\*  \\(Europe/Berlin\\)\n"
                 "  job       kind report2, queue default, args \\{\\}\n"
                 "  next run  [0-9T:-]+Z \\([0-9-]+ 02:30 Europe/Berlin\\)\n"
                 "  last run  never\n"}))
      << text;

  // --json: args is the stored JSON text, never parsed (a number no double holds stays exact).
  expect_success(tenure({"schedule", "add", "big", "--cron", "@daily", "--kind", "k", "--args",
                         R"({"n": 123456789012345678901234567890})"}));
  auto json = tenure({"schedule", "list", "--json"});
  expect_success(json);
  EXPECT_NE(json.out.find(R"("args":{"n": 123456789012345678901234567890})"), std::string::npos) << json;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["schema"], schema_);
  ASSERT_EQ(j["schedules"].size(), 3u);
  const auto& m = j["schedules"][1];
  EXPECT_EQ(m["name"], "every-minute");
  EXPECT_EQ(m["cron"], "* * * * *");
  EXPECT_EQ(m["timezone"], "UTC");
  EXPECT_EQ(m["kind"], "tick");
  EXPECT_EQ(m["queue"], "default");
  EXPECT_TRUE(m["last_job_id"].is_number_integer()) << m;
  EXPECT_TRUE(m["last_run"].is_string()) << m;
  EXPECT_TRUE(m["next_run"].is_string()) << m;
  EXPECT_TRUE(m["last_error"].is_null()) << m;
  EXPECT_TRUE(j["schedules"][2]["last_run"].is_null());

  auto removed = tenure({"schedule", "remove", "nightly"});
  expect_success(removed);
  EXPECT_EQ(removed.out, "schedule nightly removed (jobs it enqueued stay)\n");
  expect_one_error_line(tenure({"schedule", "remove", "nightly"}), 1, "schedule nightly not found");
  expect_success(tenure({"schedule", "remove", "big"}));
  expect_success(tenure({"schedule", "remove", "every-minute"}));
  auto none = tenure({"schedule", "list"});
  expect_success(none);
  EXPECT_EQ(none.out, "no schedules in schema " + schema_ + "\n");
}

TEST_F(cli_pg, schedule_add_refuses_a_bad_expression_time_zone_or_args_with_exit_2_and_the_reason) {
  migrate();
  expect_one_error_line(tenure({"schedule", "add", "s", "--cron", "0 0 32 * *", "--kind", "k"}), 2,
                        "day-of-month field, token \"32\": 32 is out of range 1-31");
  expect_one_error_line(tenure({"schedule", "add", "s", "--cron", "0 0 * * * *", "--kind", "k"}), 2,
                        "expected 5 fields");
  expect_one_error_line(tenure({"schedule", "add", "s", "--cron", "0 0 * * *", "--kind", "k", "--timezone", "Mars/Base"}),
                        2, "unknown time zone \"Mars/Base\"");
  expect_one_error_line(tenure({"schedule", "add", "s", "--cron", "0 0 * * *", "--kind", "k", "--args", "[1]"}), 2,
                        "args must be a JSON object");
  expect_one_error_line(tenure({"schedule", "add", "s", "--cron", "0 0 * * *", "--kind", "k", "--args", "{"}), 2,
                        "invalid input syntax for type json");
  expect_one_error_line(tenure({"schedule", "add", "s", "--kind", "k"}), 2, "--cron");
  auto none = tenure({"schedule", "list"});
  EXPECT_EQ(none.out, "no schedules in schema " + schema_ + "\n");
}

TEST_F(cli_pg, schedule_list_escapes_names_and_kinds_as_user_data) {
  migrate();
  const std::string rlo = "\xE2\x80\xAE";  // U+202E RIGHT-TO-LEFT OVERRIDE
  expect_success(tenure({"schedule", "add", "s" + rlo + "\\x", "--cron", "@hourly", "--kind", "k" + rlo}));
  auto text = tenure({"schedule", "list"});
  expect_success(text);
  EXPECT_NE(text.out.find("schedule s\\u{202E}\\\\x  @hourly  (UTC)\n"), std::string::npos) << text;
  EXPECT_NE(text.out.find("kind k\\u{202E}, queue default"), std::string::npos) << text;
  auto json = tenure({"schedule", "list", "--json"});
  expect_success(json);
  EXPECT_EQ(nlohmann::json::parse(json.out)["schedules"][0]["name"], "s" + rlo + "\\x");
  auto removed = tenure({"schedule", "remove", "s" + rlo + "\\x"});
  EXPECT_EQ(removed.out, "schedule s\\u{202E}\\\\x removed (jobs it enqueued stay)\n");
}

// ---- many jobs -----------------------------------------------------------------------------------

TEST_F(cli_pg, job_list_pages_newest_first_by_keyset_and_filters) {
  migrate();
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(enqueue({"a", "--queue", i % 2 ? "odd" : "even"}));
  const auto sms = enqueue({"b", "--queue", "odd"});
  auto first = tenure({"job", "list", "--limit", "2", "--json"});
  expect_success(first);
  auto j = nlohmann::json::parse(first.out);
  ASSERT_EQ(j["jobs"].size(), 2u);
  EXPECT_EQ(j["jobs"][0]["id"], sms);
  EXPECT_EQ(j["jobs"][1]["id"], ids[4]);
  EXPECT_EQ(j["next_after_id"], ids[4]);
  auto second = tenure({"job", "list", "--limit", "2", "--after-id", std::to_string(ids[4]), "--json"});
  j = nlohmann::json::parse(second.out);
  ASSERT_EQ(j["jobs"].size(), 2u);
  EXPECT_EQ(j["jobs"][0]["id"], ids[3]);
  EXPECT_EQ(j["jobs"][1]["id"], ids[2]);
  auto odd_a = nlohmann::json::parse(tenure({"job", "list", "--queue", "odd", "--kind", "a", "--json"}).out);
  ASSERT_EQ(odd_a["jobs"].size(), 2u);
  EXPECT_EQ(odd_a["jobs"][0]["id"], ids[3]);
  EXPECT_TRUE(odd_a["next_after_id"].is_null());
  auto text = tenure({"job", "list", "--state", "available", "--limit", "1"});
  expect_success(text);
  EXPECT_TRUE(std::regex_match(text.out, std::regex{std::to_string(sms) + " +available +odd b attempt 0/25 created "
                                                    "[0-9T:Z-]+\nmore: --after-id " + std::to_string(sms) + "\n"}))
      << text;
  expect_one_error_line(tenure({"job", "list", "--state", "done"}), 2, "'done' is not a state");
}

TEST_F(cli_pg, job_retry_and_cancel_by_filter_count_dry_run_and_requeue_dead_letters) {
  migrate();
  db_->exec("SELECT " + schema_ + ".configure_queue('dlq', '{\"dead_letter\": true}')");
  std::vector<std::int64_t> dead;
  for (int i = 0; i < 3; ++i) dead.push_back(enqueue({"a", "--queue", "dlq", "--max-attempts", "1"}));
  const auto other = enqueue({"a", "--queue", "other"});
  db_->exec("SELECT " + schema_ + ".fail_attempt(c.job_id, c.run_lease, 'boom', true) FROM " + schema_ +
            ".claim_attempts('dlq', 10) c");
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema_ + ".dead_letter"), "3");

  auto dry = tenure({"job", "retry", "--state", "failed", "--dry-run"});
  expect_success(dry);
  EXPECT_EQ(dry.out, "would retry 3 job(s) (dry run: nothing changed)\n");
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema_ + ".dead_letter"), "3");
  auto retried = tenure({"job", "retry", "--queue", "dlq"});
  expect_success(retried);
  EXPECT_EQ(retried.out, "retried 3 job(s): available now, attempts reset\n");
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema_ + ".dead_letter"), "0");
  for (auto id : dead) EXPECT_EQ(show(id)["state"], "available");

  auto cancel_dry = tenure({"job", "cancel", "--queue", "dlq", "--dry-run"});
  EXPECT_EQ(cancel_dry.out, "would cancel 3 job(s) (dry run: nothing changed)\n");
  auto cancelled = tenure({"job", "cancel", "--queue", "dlq"});
  expect_success(cancelled);
  EXPECT_EQ(cancelled.out, "cancelled 3 job(s)\n");
  for (auto id : dead) EXPECT_EQ(show(id)["state"], "cancelled");
  EXPECT_EQ(show(other)["state"], "available") << "another queue is untouched";

  expect_one_error_line(tenure({"job", "retry"}), 2, "give a job ID, or at least one of");
  expect_one_error_line(tenure({"job", "retry", "--state", "available"}), 2, "matches no job that can be retried");
  expect_one_error_line(tenure({"job", "cancel", "1", "--queue", "x"}), 2, "either an ID or filters");
}

// ---- grants ------------------------------------------------------------------------------------

TEST_F(cli_pg, grant_finalizer_on_unknown_role_is_one_line) {
  migrate();
  const std::string role = "cli_no_such_role_" + random_hex(8);
  expect_one_error_line(tenure({"grant-finalizer", role}), 1, "role \"" + role + "\" does not exist");
}

TEST_F(cli_pg, grant_finalizer_gives_complete_job_and_nothing_else) {
  migrate();
  const auto role = create_role();
  auto r = tenure({"grant-finalizer", role});
  expect_success(r);
  EXPECT_EQ(r.out, "granted finalizer access on schema " + schema_ + " to role " + role + "\n");

  auto has = [&](const std::string& check) { return db_->exec("SELECT " + check) == "t"; };
  EXPECT_TRUE(
      has("has_function_privilege('" + role + "', '" + schema_ + ".complete_job(text,jsonb)', 'EXECUTE')"));
  EXPECT_FALSE(has("has_table_privilege('" + role + "', '" + schema_ + ".ready', 'SELECT')"));
  EXPECT_FALSE(has("has_table_privilege('" + role + "', '" + schema_ + ".jobs', 'SELECT')"));
  EXPECT_FALSE(has("has_function_privilege('" + role + "', '" + schema_ +
                   ".enqueue(text,jsonb,text,int,timestamptz,int,jsonb,text)', 'EXECUTE')"));
}

TEST_F(cli_pg, grant_worker_and_producer_succeed) {
  migrate();
  const auto role = create_role();
  expect_success(tenure({"grant-worker", role}));
  expect_success(tenure({"grant-producer", role}));
  EXPECT_EQ(db_->exec("SELECT has_function_privilege('" + role + "', '" + schema_ +
                      ".enqueue(text,jsonb,text,int,timestamptz,int,jsonb,text)', 'EXECUTE')"),
            "t");
  EXPECT_EQ(db_->exec("SELECT has_table_privilege('" + role + "', '" + schema_ + ".jobs', 'SELECT')"), "t");
}

TEST_F(cli_pg, grant_producer_gives_insert_on_the_six_job_columns_of_specs_and_the_sequence) {
  migrate();
  const auto role = create_role();
  expect_success(tenure({"grant-producer", role}));
  EXPECT_EQ(db_->exec("SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = '" + schema_ +
                      ".specs'::regclass AND attnum > 0 AND has_column_privilege('" + role +
                      "', attrelid, attnum, 'INSERT')"),
            "queue,kind,args,priority,max_attempts,metadata");
  EXPECT_EQ(db_->exec("SELECT has_table_privilege('" + role + "', '" + schema_ + ".specs', 'SELECT') OR "
                      "has_any_column_privilege('" + role + "', '" + schema_ + ".specs', 'SELECT, UPDATE') OR "
                      "has_any_column_privilege('" + role + "', '" + schema_ + ".ready', 'SELECT, INSERT, UPDATE')"),
            "f");
  EXPECT_EQ(db_->exec("SELECT has_sequence_privilege('" + role + "', '" + schema_ + ".job_id_seq', 'USAGE')"), "t");
  EXPECT_EQ(db_->exec("SELECT has_sequence_privilege('" + role + "', '" + schema_ + ".job_id_seq', 'UPDATE')"), "f");
}

TEST_F(cli_pg, grant_callback_gives_the_callback_functions_and_nothing_else) {
  migrate();
  const auto role = create_role();
  auto r = tenure({"grant-callback", role});
  expect_success(r);
  EXPECT_EQ(r.out, "granted callback access on schema " + schema_ + " to role " + role + "\n");
  auto has = [&](const std::string& check) { return db_->exec("SELECT " + check) == "t"; };
  for (const char* fn : {"resume_callback(uuid,jsonb)", "extend_callback(uuid,interval)",
                         "complete_callback(uuid,jsonb)", "fail_callback(uuid,text,boolean)"}) {
    EXPECT_TRUE(has("has_function_privilege('" + role + "', '" + schema_ + "." + fn + "', 'EXECUTE')")) << fn;
  }
  EXPECT_FALSE(has("has_function_privilege('" + role + "', '" + schema_ +
                   ".register_callback(bigint,bigint,interval)', 'EXECUTE')"));
  EXPECT_FALSE(has("has_function_privilege('" + role + "', '" + schema_ + ".complete_job(text,jsonb)', 'EXECUTE')"));
  EXPECT_FALSE(has("has_table_privilege('" + role + "', '" + schema_ + ".jobs', 'SELECT')"));
  EXPECT_FALSE(has("has_table_privilege('" + role + "', '" + schema_ + ".attempt_state', 'SELECT')"));
}

TEST_F(cli_pg, grants_to_public_and_reserved_role_names_are_refused_with_exit_2) {
  // "public" is PUBLIC even quoted: the grant went to every role, exit 0.
  migrate();
  for (const char* command : {"grant-finalizer", "grant-worker", "grant-producer", "grant-callback", "grant-admin"}) {
    for (const char* role : {"public", "PUBLIC", "Public", "none", "current_user", "SESSION_USER", "current_role",
                             "pg_monitor", "PG_READ_ALL_DATA", "pg_database_owner"}) {
      SCOPED_TRACE(std::string{command} + " " + role);
      auto r = tenure({command, role});
      expect_one_error_line(r, 2, "tenure: cannot grant ");
      EXPECT_NE(r.err.find("role name '" + std::string{role} + "'"), std::string::npos) << r;
    }
  }
  expect_one_error_line(tenure({"grant-producer", "public"}), 2,
                        "role name 'public' means every role (PUBLIC): tenure grants only to a named role");
  expect_one_error_line(tenure({"grant-worker", "pg_monitor"}), 2, "names starting with pg_ are PostgreSQL's");
  auto has = [&](const std::string& check) { return db_->exec("SELECT " + check) == "t"; };
  EXPECT_FALSE(has("has_schema_privilege('public', '" + schema_ + "', 'USAGE')"));
  EXPECT_FALSE(has("has_function_privilege('public', '" + schema_ + ".complete_job(text,jsonb)', 'EXECUTE')"));
  EXPECT_FALSE(has("has_schema_privilege('pg_monitor', '" + schema_ + "', 'USAGE')"));
  EXPECT_EQ(db_->exec("SELECT count(*) FROM pg_namespace n, aclexplode(n.nspacl) a WHERE n.nspname = '" + schema_ +
                      "' AND a.grantee <> n.nspowner"),
            "0")
      << "nobody was granted anything";
}

// ---- failures every command shares -------------------------------------------------------------

/// One invocation of each database command, for the failure cases that apply to all of them.
const std::vector<std::vector<std::string>> k_database_commands = {
    {"status"},
    {"enqueue", "a"},
    {"job", "show", "1"},
    {"job", "cancel", "1"},
    {"job", "retry", "1"},
    {"grant-finalizer", "postgres"},
    {"rescue"},
    {"queue", "list"},
    {"queue", "pause", "q"},
    {"maintain", "--once"},
};

TEST_F(cli_pg, unreachable_database_is_one_line) {
  auto commands = k_database_commands;
  commands.push_back({"migrate"});
  for (auto args : commands) {
    args.insert(args.begin(), {"--database-url", k_unreachable, "--schema", schema_});
    auto r = run_tenure(args);
    SCOPED_TRACE(args[4]);
    expect_one_error_line(r, 1, "cannot connect to the database: ");
    EXPECT_TRUE(r.err.starts_with("tenure: cannot connect to the database: ")) << r;
  }
}

TEST_F(cli_pg, newer_schema_version_is_one_line_naming_it) {
  migrate();
  db_->exec("INSERT INTO " + schema_ + ".schema_version (version, name) VALUES (99, 'from the future')");
  auto commands = k_database_commands;
  commands.push_back({"migrate"});
  for (const auto& args : commands) {
    SCOPED_TRACE(args[0]);
    auto r = tenure(args);
    expect_one_error_line(r, 1, "version 99");
    EXPECT_NE(r.err.find("upgrade tenure"), std::string::npos) << r;
  }
}

TEST_F(cli_pg, not_migrated_schema_is_one_line_saying_run_migrate) {
  for (const auto& args : k_database_commands) {
    SCOPED_TRACE(args[0]);
    expect_one_error_line(tenure(args), 1, "run tenure migrate");
  }
  // Nothing created the schema behind the user's back.
  EXPECT_EQ(db_->exec("SELECT to_regnamespace('" + schema_ + "') IS NULL"), "t");
}

TEST_F(cli_pg, unexpected_database_error_is_one_line_with_the_server_message) {
  migrate();
  // The store reports only an error code; the server's sentence reaches the user through the
  // adapter's log line, which the command folds into its one line.
  db_->exec("CREATE FUNCTION " + schema_ +
            ".boom() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'boom: disk on fire'; END$$");
  db_->exec("CREATE TRIGGER boom BEFORE INSERT ON " + schema_ + ".ready FOR EACH ROW EXECUTE FUNCTION " +
            schema_ + ".boom()");
  auto r = tenure({"enqueue", "a"});
  expect_one_error_line(r, 1, "cannot enqueue the job: unexpected database error");
  EXPECT_NE(r.err.find("boom: disk on fire"), std::string::npos) << r;
  EXPECT_EQ(r.err.find("CONTEXT"), std::string::npos) << r;
}

TEST_F(cli_pg, missing_database_is_a_usage_error) {
  expect_one_error_line(run_tenure({"status"}), 2, "DATABASE_URL");
}

TEST_F(cli_pg, usage_errors_are_one_line_exit_2) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"frobnicate"},
      {"enqueue"},
      {"enqueue", "a", "--priority", "9"},
      {"enqueue", "a", "--max-attempts", "0"},
      {"enqueue", "a", "--run-at", "tomorrow"},
      {"enqueue", "a", "--run-at", "2999-01-01T00:00:00Z"},  // beyond what time_point holds
      {"enqueue", "a", "--delay", "1e30"},
      {"enqueue", "a", "--run-at", "2030-01-01", "--delay", "5"},
      {"job"},
      {"job", "show", "abc"},
      {"job", "show", "0"},
      {"grant-finalizer"},
      {"--schema", "Not-Valid", "status"},
  };
  for (auto args : cases) {
    args.insert(args.begin(), {"--database-url", dsn_});
    auto r = run_tenure(args);
    SCOPED_TRACE(testing::PrintToString(args));
    expect_one_error_line(r, 2, "tenure: ");
  }
}

TEST_F(cli_pg, a_schema_name_too_long_for_its_notification_channels_is_refused_before_anything_is_created) {
  // <schema>_callback must stay within PostgreSQL's 63-byte identifiers, or NOTIFY on it fails
  // (and with it rescue, cancel and resume).
  const std::string longest(54, 'a'), too_long(55, 'b');
  auto r = run_tenure({"--database-url", dsn_, "--schema", too_long, "migrate"});
  expect_one_error_line(r, 2, "tenure: ");
  EXPECT_NE(r.err.find("at most 54 characters"), std::string::npos) << r;
  EXPECT_EQ(db_->exec("SELECT count(*) FROM pg_namespace WHERE nspname = '" + too_long + "'"), "0");
  auto ok = run_tenure({"--database-url", dsn_, "--schema", longest, "migrate"});
  EXPECT_EQ(ok.exit_code, 0) << ok;
  auto enq = run_tenure({"--database-url", dsn_, "--schema", longest, "enqueue", "k"});
  EXPECT_EQ(enq.exit_code, 0) << enq;
  db_->exec("DROP SCHEMA " + longest + " CASCADE");
}

TEST_F(cli_pg, migrate_into_a_schema_holding_other_objects_is_refused_with_the_reason) {
  // tenure revokes PUBLIC's rights on everything in its schema: never on the application's own.
  const std::string app = "cli_app_" + random_hex(8);
  db_->exec("CREATE SCHEMA " + app);
  db_->exec("CREATE FUNCTION " + app + ".answer() RETURNS int LANGUAGE sql AS 'SELECT 42'");
  auto r = run_tenure({"--database-url", dsn_, "--schema", app, "migrate"});
  expect_one_error_line(r, 2, "tenure: ");
  EXPECT_NE(r.err.find("holds 1 object(s) tenure did not create"), std::string::npos) << r;
  EXPECT_EQ(db_->exec("SELECT has_function_privilege('public', '" + app + ".answer()', 'EXECUTE')"), "t");
  db_->exec("DROP SCHEMA " + app + " CASCADE");
}

TEST_F(cli_pg, migrate_into_a_schema_another_role_controls_is_refused_with_the_reason) {
  // The schema's owner could drop tenure's SECURITY DEFINER functions and put its own in their
  // place, to run with the migrating role's rights.
  const auto role = create_role();
  db_->exec("CREATE SCHEMA " + schema_ + " AUTHORIZATION " + role);
  auto owned = tenure({"migrate"});
  expect_one_error_line(owned, 2, "tenure: cannot migrate schema " + schema_ + ": schema '" + schema_ +
                                      "' is owned by role '" + role + "', not by 'postgres'");
  EXPECT_NE(owned.err.find("a schema's owner may drop and replace any of them"), std::string::npos) << owned;
  // A role that may create objects beside tenure's functions is refused the same way.
  db_->exec("ALTER SCHEMA " + schema_ + " OWNER TO current_user");
  db_->exec("GRANT CREATE ON SCHEMA " + schema_ + " TO " + role);
  auto create = tenure({"migrate"});
  expect_one_error_line(create, 2, "role(s) " + role + " may create objects in schema '" + schema_ + "'");
  EXPECT_EQ(db_->exec("SELECT to_regclass('" + schema_ + ".schema_version') IS NULL"), "t");
  db_->exec("REVOKE CREATE ON SCHEMA " + schema_ + " FROM " + role);
  expect_success(tenure({"migrate"}));
}

TEST_F(cli_pg, version_and_help_go_to_stdout) {
  auto version = run_tenure({"--version"});
  expect_success(version);
  EXPECT_TRUE(
      std::regex_match(version.out, std::regex{R"(tenure [0-9]+\.[0-9]+\.[0-9]+ \(schema version )" + std::to_string(known_version()) + R"(\)\n)"}))
      << version;
  auto help = run_tenure({"--help"});
  expect_success(help);
  for (const char* command : {"migrate", "enqueue", "status", "job", "grant-finalizer", "rescue"}) {
    EXPECT_NE(help.out.find(command), std::string::npos) << command;
  }
}

// ---- bench -----------------------------------------------------------------------------------
// A benchmark measures and never asserts speed; these check that it runs end to end on the real
// database, prints one JSON line with the figures the README quotes, and leaves no schema behind.

/// Whether the schema a bench run named still exists (other tests may run benches meanwhile).
bool schema_exists(pg& db, const nlohmann::json& bench) {
  const std::string name = bench.at("schema");
  EXPECT_TRUE(std::regex_match(name, std::regex{"bench_[0-9a-f]+"})) << name;
  return db.exec("SELECT 1 FROM pg_namespace WHERE nspname = '" + name + "'").has_value();
}

nlohmann::json run_bench(const std::string& dsn, std::vector<std::string> args) {
  args.insert(args.begin(), {"--database-url", dsn, "bench"});
  const auto r = run_tenure(args);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r;
  return nlohmann::json::parse(r.out);
}

TEST_F(cli_pg, bench_enqueue_single_prints_all_three_phases_and_their_ratios) {
  const auto j = run_bench(dsn_, {"--mode", "enqueue-single", "--producers", "2", "--seconds", "0.5"});
  EXPECT_EQ(j.at("scenario"), "enqueue-single");
  EXPECT_EQ(j.at("producers"), 2);
  EXPECT_TRUE(j.at("offered_jobs_per_s").is_null()) << "flat out unless --rate";
  EXPECT_GT(j.at("jobs").get<long>(), 0);
  // Phase 3: the bare SQL drain under the same producers, and the runtime's pickup against it.
  EXPECT_GT(j.at("sql_limit_enqueue_jobs_per_s").get<double>(), 0);
  EXPECT_GT(j.at("sql_limit_pickup_p50_ms").get<double>(), 0);
  EXPECT_GE(j.at("sql_limit_pickup_p99_ms").get<double>(), j.at("sql_limit_pickup_p50_ms").get<double>());
  EXPECT_NEAR(j.at("pickup_p99_ratio_to_sql_limit").get<double>(),
              j.at("pickup_p99_ms").get<double>() / j.at("sql_limit_pickup_p99_ms").get<double>(), 0.01);
  // A durable commit's round trip under this load, from both sides: never zero, p99 over p50.
  EXPECT_GT(j.at("producer_commit_p50_ms").get<double>(), 0);
  EXPECT_GE(j.at("producer_commit_p99_ms").get<double>(), j.at("producer_commit_p50_ms").get<double>());
  EXPECT_GT(j.at("sql_limit_claim_p50_ms").get<double>(), 0);
  EXPECT_GE(j.at("sql_limit_claim_p99_ms").get<double>(), j.at("sql_limit_claim_p50_ms").get<double>());
  // The bare drain's pickup includes its claim's round trip.
  EXPECT_GE(j.at("sql_limit_pickup_p99_ms").get<double>(), j.at("sql_limit_claim_p50_ms").get<double>());
  const double drained = j.at("enqueue_jobs_per_s"), undrained = j.at("undrained_enqueue_jobs_per_s");
  EXPECT_GT(drained, 0);
  EXPECT_GT(undrained, 0);
  EXPECT_NEAR(j.at("ratio_to_undrained").get<double>(), drained / undrained, 0.01);
  // The load the bare drain's floor was taken under: its producers' rate against the undrained
  // one, and their commit round trip in that phase.
  EXPECT_NEAR(j.at("sql_limit_ratio_to_undrained").get<double>(),
              j.at("sql_limit_enqueue_jobs_per_s").get<double>() / undrained, 0.01);
  EXPECT_GT(j.at("sql_limit_producer_commit_p50_ms").get<double>(), 0);
  EXPECT_GE(j.at("sql_limit_producer_commit_p99_ms").get<double>(), j.at("sql_limit_producer_commit_p50_ms").get<double>());
  EXPECT_GT(j.at("pickup_p50_ms").get<double>(), 0);
  EXPECT_GE(j.at("pickup_p99_ms").get<double>(), j.at("pickup_p50_ms").get<double>());
  // One producer commit per job, and the drain's claims and flushes on top of it.
  EXPECT_GT(j.at("commits_per_job").get<double>(), 1.0);
  EXPECT_GT(j.at("claims_per_job").get<double>(), 0);
  EXPECT_GT(j.at("flushes_per_job").get<double>(), 0);
  EXPECT_GT(j.at("wal_bytes_per_job").get<double>(), 0);
  for (const char* pct : {"cpu_busy_pct", "cpu_steal_pct", "undrained_cpu_busy_pct", "undrained_cpu_steal_pct"}) {
    EXPECT_GE(j.at(pct).get<double>(), 0) << pct;
    EXPECT_LE(j.at(pct).get<double>(), 100) << pct;
  }
  EXPECT_GT(j.at("cpu_busy_pct").get<double>(), 0);
  EXPECT_EQ(j.at("schema_kept"), false);
  EXPECT_FALSE(schema_exists(*db_, j)) << "the bench schema is dropped after the run";
}

TEST_F(cli_pg, bench_enqueue_single_rate_paces_the_producers_to_the_offered_load) {
  // 4 producers aiming at 120 jobs/s together for 1 s per phase: flat out they would commit
  // thousands. Every phase is paced, and every job of each drained phase is picked up. (How close
  // a phase comes to the offered rate is not asserted: beside the other tests, a commit can stall
  // for much of the second.)
  const auto j = run_bench(dsn_, {"--mode", "enqueue-single", "--producers", "4", "--seconds", "1", "--rate", "120"});
  EXPECT_EQ(j.at("offered_jobs_per_s").get<double>(), 120);
  for (const char* rate : {"undrained_enqueue_jobs_per_s", "enqueue_jobs_per_s", "sql_limit_enqueue_jobs_per_s"}) {
    EXPECT_LE(j.at(rate).get<double>(), 132) << rate;
    EXPECT_GT(j.at(rate).get<double>(), 0) << rate;
  }
  EXPECT_LE(j.at("jobs").get<long>(), 132);
  EXPECT_GT(j.at("pickup_p50_ms").get<double>(), 0);
  EXPECT_GT(j.at("sql_limit_pickup_p50_ms").get<double>(), 0);
}

TEST_F(cli_pg, bench_rejects_a_negative_rate) {
  const auto r = run_tenure({"--database-url", dsn_, "bench", "--mode", "enqueue-single", "--rate", "-5"});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("--rate"), std::string::npos) << r;
}

/// A database of the test's own, dropped with it: the bench reads commits from
/// pg_stat_database, which would also count every test running beside it in a shared one.
class own_database {
 public:
  own_database(pg& admin, const std::string& dsn)
      : admin_(admin), name_("tenure_bench_" + std::to_string(::getpid())) {
    admin_.exec("DROP DATABASE IF EXISTS " + name_);
    admin_.exec("CREATE DATABASE " + name_);
    const auto slash = dsn.rfind('/');
    dsn_ = dsn.substr(0, slash + 1) + name_;
  }
  ~own_database() { admin_.exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)"); }
  const std::string& dsn() const { return dsn_; }

 private:
  pg& admin_;
  std::string name_, dsn_;
};

TEST_F(cli_pg, bench_runtime_drains_every_job_with_batched_commits) {
  own_database own{*db_, dsn_};
  const auto j = run_bench(own.dsn(), {"--mode", "runtime", "--jobs", "2000", "--pickup-samples", "3"});
  EXPECT_EQ(j.at("scenario"), "runtime");
  EXPECT_EQ(j.at("jobs"), 2000);  // the run ends only once all of them completed
  EXPECT_GT(j.at("drain_jobs_per_s").get<double>(), 0);
  EXPECT_LT(j.at("commits_per_job").get<double>(), 0.5);
  EXPECT_GT(j.at("wal_bytes_per_job").get<double>(), 0);
  EXPECT_GE(j.at("pickup_p99_ms").get<double>(), j.at("pickup_p50_ms").get<double>());
  EXPECT_GE(j.at("cpu_steal_pct").get<double>(), 0);
  EXPECT_EQ(j.at("checkpoint_first"), false);
  EXPECT_GE(j.at("drain_checkpoint_buffers").get<double>(), 0);
  EXPECT_GE(j.at("pickup_checkpoint_buffers").get<double>(), 0);
  EXPECT_EQ(j.at("schema_kept"), false);
  pg in_own{own.dsn()};
  EXPECT_FALSE(schema_exists(in_own, j)) << "the bench schema is dropped after the run";
}

TEST_F(cli_pg, bench_runtime_splits_its_resident_set_into_allocated_and_mapped_memory) {
  own_database own{*db_, dsn_};
  const auto j = run_bench(own.dsn(), {"--mode", "runtime", "--jobs", "200", "--pickup-samples", "3"});
  const double anon = j.at("rss_anon_mb_after_pickups"), file = j.at("rss_file_mb_after_pickups");
  EXPECT_GT(anon, 0) << j;
  EXPECT_GT(file, 1) << j << " (the binary's own code is mapped)";
  // Read after the pickups, within the run's peak (rounded to 0.1 MB each).
  EXPECT_LE(anon + file, j.at("peak_rss_mb").get<double>() + 0.2) << j;
}

TEST_F(cli_pg, bench_runtime_reports_its_peak_through_the_pickups_apart_from_the_enqueue_paths) {
  own_database own{*db_, dsn_};
  // Batches of 25,000 jobs in the enqueue paths that run last: their arrays and COPY text (several
  // MB at once) lift the process's peak above anything the drain and the pickups needed.
  const auto j = run_bench(own.dsn(), {"--mode", "runtime", "--jobs", "200", "--pickup-samples", "3",
                                       "--enqueue-batch", "25000"});
  const double through = j.at("peak_rss_mb_through_pickups"), peak = j.at("peak_rss_mb");
  const double resident = j.at("rss_anon_mb_after_pickups").get<double>() + j.at("rss_file_mb_after_pickups").get<double>();
  EXPECT_GE(through + 0.2, resident) << j << " (read as the pickups end, so at least what was resident then)";
  EXPECT_GE(peak, through + 2.0) << j << " (the enqueue paths' batches come after that reading)";
}

TEST_F(cli_pg, bench_runtime_checkpoint_first_checkpoints_before_the_run_and_says_so) {
  own_database own{*db_, dsn_};
  const auto requested_checkpoints = [&] {
    db_->exec("SELECT pg_stat_clear_snapshot()");
    return std::stol(db_->exec("SELECT checkpoints_req FROM pg_stat_bgwriter").value());
  };
  const auto before = requested_checkpoints();
  const auto j = run_bench(own.dsn(), {"--mode", "runtime", "--jobs", "200", "--pickup-samples", "3", "--checkpoint-first"});
  EXPECT_EQ(j.at("checkpoint_first"), true);
  EXPECT_EQ(j.at("jobs"), 200);
  // A CHECKPOINT command counts as a requested checkpoint (other tests may request more).
  EXPECT_GT(requested_checkpoints(), before);
}

TEST_F(cli_pg, bench_runtime_times_the_callers_array_and_copy_enqueue_side_by_side) {
  own_database own{*db_, dsn_};
  pg in_own{own.dsn()};
  // Counted by the server: every call of the two paths' functions in this database.
  in_own.exec("ALTER DATABASE " + own.dsn().substr(own.dsn().rfind('/') + 1) + " SET track_functions = 'pl'");
  const auto j = run_bench(own.dsn(), {"--mode", "runtime", "--jobs", "300", "--pickup-samples", "3",
                                       "--enqueue-batch", "1000", "--keep-schema"});
  EXPECT_EQ(j.at("enqueue_batch"), 1000);
  EXPECT_GT(j.at("enqueue_copy_jobs_per_s").get<double>(), 0) << j;
  EXPECT_GT(j.at("enqueue_array_jobs_per_s_beside_copy").get<double>(), 0) << j;
  EXPECT_NEAR(j.at("enqueue_copy_vs_array").get<double>(),
              j.at("enqueue_copy_jobs_per_s").get<double>() / j.at("enqueue_array_jobs_per_s_beside_copy").get<double>(),
              0.01);
  const std::string schema = j.at("schema");
  // 20,000 jobs through each path after one uncounted batch of each, left in a queue nobody serves:
  // the array path's as ready rows, the COPY path's in run rows of 200 ids.
  EXPECT_EQ(in_own.exec("SELECT count(*) FROM " + schema + ".ready WHERE queue = 'bench_enqueue'"), "21000");
  EXPECT_EQ(in_own.exec("SELECT count(*) || ' ' || sum(cardinality(job_ids) - taken) FROM " + schema +
                        ".runs WHERE queue = 'bench_enqueue'"),
            "105 21000");
  // (a session's function counts reach the view when it reports them, at its end at the latest)
  const std::string expected_calls = "enqueue_batch 22, enqueue_copied_ready 21";
  std::optional<std::string> calls;
  for (int i = 0; i < 100 && calls != expected_calls; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    in_own.exec("SELECT pg_stat_clear_snapshot()");
    calls = in_own.exec("SELECT string_agg(funcname || ' ' || calls, ', ' ORDER BY funcname) FROM pg_stat_user_functions "
                        "WHERE schemaname = '" + schema + "' AND funcname IN ('enqueue_batch', 'enqueue_copied', "
                        "'enqueue_copied_ready')");
  }
  EXPECT_EQ(calls, expected_calls)
      << "arrays and COPY took turns, each batch in its own path (and one batch enqueued the drain's 300 jobs); "
         "jobs to run now are copied straight into specs and made claimable as run rows";
}

TEST_F(cli_pg, bench_runtime_splits_the_drain_wal_between_claims_completions_and_the_rest) {
  own_database own{*db_, dsn_};
  pg in_own{own.dsn()};
  in_own.exec("CREATE EXTENSION pg_stat_statements");  // scripts/pg preloads its library
  const auto j = run_bench(own.dsn(), {"--mode", "runtime", "--jobs", "2000", "--pickup-samples", "3"});
  const double claim = j.at("claim_wal_bytes_per_job"), completion = j.at("completion_wal_bytes_per_job");
  const double other = j.at("drain_other_wal_bytes_per_job"), total = j.at("wal_bytes_per_job");
  // Every claim writes (the bench's jobs were copied in: a run row's new version and a claims row
  // per claim) and every completion appends a closure: together with the rest they are the
  // drain's WAL (each figure rounded on its own).
  EXPECT_GT(claim, 10) << j;
  EXPECT_GT(completion, 50) << j;
  EXPECT_GE(other, 0) << j;
  EXPECT_NEAR(claim + completion + other, total, 2) << j;
  // Enqueue is measured on its own, before the drain: a row and its index entries per job.
  EXPECT_GT(j.at("enqueue_wal_bytes_per_job").get<double>(), 50) << j;
}

TEST_F(cli_pg, bench_runtime_leaves_the_wal_split_null_without_pg_stat_statements) {
  own_database own{*db_, dsn_};  // a new database: the extension is not installed in it
  const auto j = run_bench(own.dsn(), {"--mode", "runtime", "--jobs", "500", "--pickup-samples", "3"});
  EXPECT_TRUE(j.at("claim_wal_bytes_per_job").is_null()) << j;
  EXPECT_TRUE(j.at("completion_wal_bytes_per_job").is_null()) << j;
  EXPECT_TRUE(j.at("drain_other_wal_bytes_per_job").is_null()) << j;
  EXPECT_GT(j.at("wal_bytes_per_job").get<double>(), 0) << j;
  EXPECT_GT(j.at("enqueue_wal_bytes_per_job").get<double>(), 0) << j;
  pg in_own{own.dsn()};
  EXPECT_EQ(in_own.exec("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"), std::optional<std::string>("0"))
      << "the bench installs no extension";
}

TEST_F(cli_pg, bench_prune_deletes_every_expired_row_and_reports_its_wal_per_row) {
  own_database own{*db_, dsn_};
  pg in_own{own.dsn()};
  in_own.exec("CREATE EXTENSION pg_stat_statements");
  const auto j = run_bench(own.dsn(), {"--mode", "prune", "--jobs", "300", "--prune-rows", "3000",
                                       "--pickup-samples", "3"});
  EXPECT_EQ(j.at("scenario"), "prune");
  EXPECT_EQ(j.at("prune_rows"), 3000);
  EXPECT_GE(j.at("prune_passes").get<long>(), 1);
  EXPECT_GT(j.at("prune_rows_per_s").get<double>(), 0);
  EXPECT_GT(j.at("baseline_drain_jobs_per_s").get<double>(), 0);
  EXPECT_GT(j.at("pruning_drain_jobs_per_s").get<double>(), 0);
  // A deleted row writes at least its heap delete record.
  EXPECT_GT(j.at("prune_wal_bytes_per_row").get<double>(), 20) << j;
  EXPECT_FALSE(schema_exists(in_own, j)) << "the bench schema is dropped after the run";
}

TEST_F(cli_pg, bench_caller_owned_reports_the_bare_commit_rate_its_ratio_and_where_the_cost_goes) {
  own_database own{*db_, dsn_};
  const auto j = run_bench(own.dsn(), {"--mode", "caller-owned", "--jobs", "300", "--producers", "2"});
  EXPECT_EQ(j.at("scenario"), "caller-owned");
  EXPECT_EQ(j.at("caller_owned_handler_failures"), 0);
  const double bare = j.at("bare_commits_per_s").get<double>();
  const double owned = j.at("caller_owned_drain_jobs_per_s").get<double>();
  ASSERT_GT(bare, 0);
  ASSERT_GT(owned, 0);
  // The ratio is the two rates of this run, rounded to two places.
  EXPECT_NEAR(j.at("caller_owned_vs_bare").get<double>(), owned / bare, 0.006 + owned / bare * 0.01) << j;
  // One commit per caller-owned job: its own business transaction.
  EXPECT_GE(j.at("caller_owned_commits_per_job").get<double>(), 1.0);
  // Six permits per handler thread unless --max-concurrency says otherwise.
  EXPECT_EQ(j.at("max_concurrency"), 12) << j;

  // Where the cost goes. Both phases took CPU for every job. (Which took more is not asserted: other tests share the
  // machine's CPU, and these phases last a fraction of a second.)
  const double bare_cpu = j.at("bare_cpu_ms_per_job"), owned_cpu = j.at("caller_owned_cpu_ms_per_job");
  EXPECT_GT(bare_cpu, 0) << j;
  EXPECT_GT(owned_cpu, 0) << j;
  EXPECT_GT(j.at("bare_cpu_busy_pct").get<double>(), 0);
  EXPECT_GT(j.at("caller_owned_cpu_busy_pct").get<double>(), 0);
  // The handlers' transaction time: a share of the threads' time, and per job at least the
  // business transaction's four round trips.
  const double busy = j.at("caller_owned_handler_busy");
  EXPECT_GT(busy, 0) << j;
  EXPECT_LE(busy, 1.0) << j;
  EXPECT_GT(j.at("caller_owned_handler_ms").get<double>(), 0.01) << j;
  // CPU per job is the busy share of both cores over the phase's rate.
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_NEAR(owned_cpu, j.at("caller_owned_cpu_busy_pct").get<double>() / 100 * cores * 1000 / owned,
              owned_cpu * 0.02 + 0.002) << j;
}

TEST_F(cli_pg, bench_caller_owned_max_concurrency_bounds_each_claim) {
  own_database own{*db_, dsn_};
  pg in_own{own.dsn()};
  const auto j = run_bench(own.dsn(), {"--mode", "caller-owned", "--jobs", "200", "--producers", "2",
                                       "--max-concurrency", "3", "--keep-schema"});
  EXPECT_EQ(j.at("max_concurrency"), 3) << j;
  EXPECT_EQ(j.at("caller_owned_handler_failures"), 0) << j;
  ASSERT_TRUE(schema_exists(in_own, j));
  const std::string schema = j.at("schema");
  // Every claim of the caller-owned jobs took at most the queue's three permits (with the default
  // twelve, claims of up to twelve), and they all ran.
  EXPECT_EQ(in_own.exec("SELECT max(cardinality(c.job_ids)) FROM " + schema + ".claims c WHERE EXISTS (SELECT FROM " +
                        schema + ".specs s WHERE s.id = c.job_ids[1] AND s.kind = 'charge')"),
            "3");
  EXPECT_GE(j.at("caller_owned_claims_per_job").get<double>(), 0.333) << j;
  in_own.exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_F(cli_pg, bench_runtime_waiting_jobs_stay_in_their_queue_through_the_drain) {
  const auto j = run_bench(dsn_, {"--mode", "runtime", "--jobs", "300", "--waiting", "500", "--pickup-samples", "3",
                                  "--keep-schema"});
  EXPECT_EQ(j.at("waiting_jobs"), 500);
  ASSERT_TRUE(schema_exists(*db_, j));
  const std::string schema = j.at("schema");
  // The drained jobs and the pickups' completed; the backlog of the other queue untouched.
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema + ".done WHERE state = 'completed' AND queue = 'bench'"), "303");
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema + ".ready WHERE queue = 'bench_waiting' AND attempt = 0"), "500");
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema + ".jobs WHERE queue = 'bench_waiting'"), "500");
  db_->exec("DROP SCHEMA " + schema + " CASCADE");
}

TEST_F(cli_pg, bench_reclaim_dead_rows_sets_when_the_leader_vacuums) {
  // 12,000 jobs enqueued over arrays (a ready row each, not a run row per batch) leave 12,000 dead
  // rows in ready; the idle runtime of the pickups leads next.
  const auto vacuums_after = [&](const std::string& reclaim) {
    const auto j = run_bench(dsn_, {"--mode", "runtime", "--jobs", "12000", "--pickup-samples", "100",
                                    "--drain-enqueue", "arrays", "--reclaim-dead-rows", reclaim, "--keep-schema"});
    EXPECT_EQ(j.at("drain_enqueue"), "arrays");
    const std::string schema = j.at("schema");
    const auto n = db_->exec("SELECT vacuum_count FROM pg_stat_user_tables WHERE schemaname = '" + schema +
                             "' AND relname = 'ready'");
    db_->exec("DROP SCHEMA " + schema + " CASCADE");
    return std::stol(n.value_or("-1"));
  };
  EXPECT_EQ(vacuums_after("0"), 0) << "0: the leader never vacuums";
  EXPECT_GE(vacuums_after("5000"), 1) << "the leader vacuums once 5,000 dead rows wait";
  const auto r = run_tenure({"--database-url", dsn_, "bench", "--reclaim-dead-rows", "-1"});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("--reclaim-dead-rows"), std::string::npos) << r;
}

TEST_F(cli_pg, bench_keep_schema_leaves_the_named_schema_for_inspection) {
  const auto j = run_bench(dsn_, {"--mode", "sql-limit", "--jobs", "300", "--keep-schema"});
  EXPECT_EQ(j.at("completed"), 300);
  EXPECT_EQ(j.at("schema_kept"), true);
  ASSERT_TRUE(schema_exists(*db_, j));
  const std::string schema = j.at("schema");
  EXPECT_EQ(db_->exec("SELECT count(*) FROM " + schema + ".done WHERE state = 'completed'"), "300");
  db_->exec("DROP SCHEMA " + schema + " CASCADE");
}

// ---- through a transaction-pooling pooler ----------------------------------------------------

/// The same commands through a PgBouncer with its default settings in transaction pooling mode
/// (TENURE_TEST_POOLER_DSN, scripts/pgbouncer): no startup options, no named statement or
/// setting left on a server session that the next command (or anyone else) would trip over.
class cli_pooler : public cli_pg {
 protected:
  void SetUp() override {
    cli_pg::SetUp();  // db_ stays a direct connection, for setup and checks
    const char* pooled = std::getenv("TENURE_TEST_POOLER_DSN");
    ASSERT_TRUE(pooled != nullptr && *pooled != '\0')
        << "TENURE_TEST_POOLER_DSN is not set. This test needs a PgBouncer in transaction mode: "
           "export TENURE_TEST_POOLER_DSN=$(scripts/pgbouncer start)";
    dsn_ = pooled;
  }
};

TEST_F(cli_pooler, every_command_works_twice_in_a_row_through_transaction_pooling) {
  for (int round = 0; round < 2; ++round) {
    auto m = tenure({"migrate"});
    expect_success(m);
    EXPECT_TRUE(m.out.starts_with("schema " + schema_ + (round == 0 ? ": migrated from version 0 to " : ": already at version ")))
        << m;
  }
  for (const char* grant : {"grant-finalizer", "grant-worker", "grant-producer", "grant-callback"}) {
    const auto role = create_role();
    for (int round = 0; round < 2; ++round) expect_success(tenure({grant, role}));
  }
  const auto first = enqueue({"send_email", "--args", R"({"to":"a@example.com"})"});
  const auto second = enqueue({"send_email", "--queue", "mail", "--delay", "60"});
  EXPECT_NE(first, second);
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(status()["total"]["total"], 2);
    expect_success(tenure({"status"}));
    EXPECT_EQ(show(first)["state"], "available");
    expect_success(tenure({"job", "show", std::to_string(second)}));
  }
  const std::string name = "job " + std::to_string(first);
  auto cancelled = tenure({"job", "cancel", std::to_string(first)});
  expect_success(cancelled);
  EXPECT_EQ(cancelled.out, name + " cancelled\n");
  auto cancelled_again = tenure({"job", "cancel", std::to_string(first)});
  expect_success(cancelled_again);
  EXPECT_EQ(cancelled_again.out, name + " not cancelled: it already finished (cancelled)\n");
  auto retried = tenure({"job", "retry", std::to_string(first)});
  expect_success(retried);
  EXPECT_EQ(retried.out, name + " will run again: available now, attempts reset\n");
  auto retried_again = tenure({"job", "retry", std::to_string(first)});
  expect_success(retried_again);
  EXPECT_EQ(retried_again.out, name + " not retried: it has not finished (available)\n");

  db_->exec("SELECT * FROM " + schema_ + ".claim('default', 1, 'gone-worker')");
  auto rescued = tenure({"rescue", "--stale-after", "0"});
  expect_success(rescued);
  EXPECT_NE(rescued.out.find("maintenance pass done: due jobs promoted, expired finished jobs pruned, rescued 1 "
                             "stale attempt:\n"),
            std::string::npos)
      << rescued;
  auto rescued_again = tenure({"rescue", "--stale-after", "0"});
  expect_success(rescued_again);
  EXPECT_NE(rescued_again.out.find("rescued 0 stale attempts\n"), std::string::npos) << rescued_again;
}

TEST_F(cli_pooler, errors_through_transaction_pooling_are_still_one_line) {
  migrate();
  expect_one_error_line(tenure({"job", "show", "424242"}), 1, "job 424242 not found");
  expect_one_error_line(tenure({"job", "show", "424242"}), 1, "job 424242 not found");
  expect_one_error_line(tenure({"enqueue", "k", "--args", "{"}), 1, "--args is not valid JSON");
}

// ---- doctor ------------------------------------------------------------------------------------

/// The findings of one check in a doctor document.
std::vector<nlohmann::json> findings_of(const nlohmann::json& doc, const std::string& check) {
  std::vector<nlohmann::json> out;
  for (const auto& f : doc["findings"]) {
    if (f["check"] == check) out.push_back(f);
  }
  return out;
}

/// The one finding of `check` at `severity` whose text holds `needle` (fails the test when none).
nlohmann::json finding_with(const nlohmann::json& doc, const std::string& check, const std::string& severity,
                            const std::string& needle) {
  for (const auto& f : findings_of(doc, check)) {
    if (f["severity"] == severity && f["found"].get<std::string>().find(needle) != std::string::npos) return f;
  }
  ADD_FAILURE() << "no " << severity << " finding of " << check << " holding '" << needle << "' in\n"
                << doc.dump(2);
  return {};
}

/// Every check but `check` is ok: a finding fires for its own cause only.
void expect_only(const nlohmann::json& doc, const std::string& check) {
  for (const auto& f : doc["findings"]) {
    if (f["check"] != check) {
      EXPECT_EQ(f["severity"], "ok") << f.dump(2);
    }
  }
}

class cli_doctor : public cli_pg {
 protected:
  std::pair<run_result, nlohmann::json> doctor(std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"doctor", "--json"});
    auto r = tenure(extra);
    EXPECT_EQ(r.err, "") << r;
    nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(doc.is_discarded()) << r;
    return {r, doc};
  }

  /// Claims one job of `queue` as a worker that never comes back; returns its job id.
  std::string claim_and_vanish(const std::string& queue) {
    return *db_->exec("SELECT job_id FROM " + schema_ + ".claim_attempts('" + queue + "', 1, 'vanished-worker')");
  }
};

TEST_F(cli_doctor, a_fresh_installation_with_every_grant_is_healthy) {
  migrate();
  const auto role = create_role();
  for (const char* grant : {"grant-worker", "grant-producer", "grant-finalizer", "grant-callback", "grant-admin"}) {
    expect_success(tenure({grant, role}));
  }
  enqueue({"send_email"});
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(doc["healthy"], true) << r;
  std::vector<std::string> checks;
  for (const auto& f : doc["findings"]) {
    EXPECT_EQ(f["severity"], "ok") << f.dump(2);
    checks.push_back(f["check"]);
  }
  EXPECT_EQ(checks, (std::vector<std::string>{"schema_version", "schema_control", "privileges", "security_definer",
                                              "stale_attempts", "queue_age", "retention", "vacuum", "pooler"}));
  EXPECT_EQ(findings_of(doc, "pooler").at(0)["details"]["session"], "direct");

  const auto text = tenure({"doctor"});
  expect_success(text);
  EXPECT_TRUE(text.out.starts_with("tenure doctor: schema " + schema_ + "\n[ok]      schema_version: ")) << text;
  EXPECT_TRUE(text.out.ends_with("healthy: every check is ok\n")) << text;
}

TEST_F(cli_doctor, an_older_schema_says_run_migrate_and_a_newer_one_says_upgrade_the_binary) {
  auto older = tenure::postgres::detail::migrate_up_to(dsn_, schema_, 7);
  ASSERT_TRUE(older) << older.error().detail();
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto f = finding_with(doc, "schema_version", "error", "version 7, older than this binary's " + std::to_string(known_version()));
  EXPECT_NE(f["fix"].get<std::string>().find("tenure migrate"), std::string::npos) << f;
  EXPECT_EQ(f["details"]["installed"], 7);
  finding_with(doc, "stale_attempts", "warning", "not checked");

  migrate();
  db_->exec("INSERT INTO " + schema_ + ".schema_version (version, name) VALUES (" +
            std::to_string(known_version() + 1) + ", 'from the future')");
  auto [newer, newer_doc] = doctor();
  EXPECT_EQ(newer.exit_code, 1) << newer;
  const auto g = finding_with(newer_doc, "schema_version", "error", "version " + std::to_string(known_version() + 1) +
                                           ", newer than this binary's " + std::to_string(known_version()));
  EXPECT_NE(g["fix"].get<std::string>().find("upgrade the tenure binary"), std::string::npos) << g;
}

TEST_F(cli_doctor, execute_granted_to_public_and_privileges_beyond_grants_are_named) {
  migrate();
  const auto role = create_role();
  expect_success(tenure({"grant-producer", role}));
  db_->exec("GRANT EXECUTE ON FUNCTION " + schema_ + ".complete_job(text, jsonb) TO PUBLIC");
  db_->exec("GRANT INSERT ON " + schema_ + ".closures TO " + role);
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto pub = finding_with(doc, "privileges", "error", "PUBLIC (every role) holds EXECUTE on function " +
                                                                schema_ + ".complete_job(text,jsonb)");
  EXPECT_EQ(pub["details"]["role"], "PUBLIC");
  EXPECT_EQ(pub["details"]["privilege"], "EXECUTE");
  EXPECT_EQ(pub["fix"], "REVOKE EXECUTE ON FUNCTION " + schema_ +
                            ".complete_job(text,jsonb) FROM PUBLIC CASCADE; give roles access only through tenure "
                            "grant-*");
  const auto beyond = finding_with(doc, "privileges", "error", "role " + role + " holds INSERT on table " + schema_ +
                                                                   ".closures, which no tenure grant-* gives");
  EXPECT_EQ(beyond["details"]["object"], schema_ + ".closures");
  EXPECT_EQ(findings_of(doc, "privileges").size(), 2u) << doc.dump(2);  // the producer's own grants are fine
  expect_only(doc, "privileges");

  db_->exec("REVOKE EXECUTE ON FUNCTION " + schema_ + ".complete_job(text, jsonb) FROM PUBLIC");
  db_->exec("REVOKE INSERT ON " + schema_ + ".closures FROM " + role);
  EXPECT_EQ(doctor().first.exit_code, 0);
}

TEST_F(cli_doctor, insert_on_ready_beyond_the_six_job_columns_is_named) {
  migrate();
  const auto role = create_role();
  expect_success(tenure({"grant-producer", role}));
  EXPECT_EQ(doctor().first.exit_code, 0) << "the producer's own column and sequence grants are fine";
  db_->exec("GRANT INSERT (run_lease) ON " + schema_ + ".ready TO " + role);
  db_->exec("GRANT UPDATE ON SEQUENCE " + schema_ + ".job_id_seq TO " + role);
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  finding_with(doc, "privileges", "error",
               "role " + role + " holds INSERT on column " + schema_ + ".ready.run_lease, which no tenure grant-* gives");
  finding_with(doc, "privileges", "error",
               "role " + role + " holds UPDATE on sequence " + schema_ + ".job_id_seq, which no tenure grant-* gives");
  EXPECT_EQ(findings_of(doc, "privileges").size(), 2u) << doc.dump(2);

  // The producer's column and sequence grants, on a role that may not enqueue (a worker, or a
  // producer whose functions were revoked): it could still write jobs straight into specs.
  const auto worker = create_role();
  expect_success(tenure({"grant-worker", worker}));
  db_->exec("GRANT INSERT (kind, queue) ON " + schema_ + ".specs TO " + worker);
  db_->exec("GRANT USAGE ON SEQUENCE " + schema_ + ".job_id_seq TO " + worker);
  auto [w, wdoc] = doctor();
  EXPECT_EQ(w.exit_code, 1) << w;
  finding_with(wdoc, "privileges", "error",
               "role " + worker + " holds INSERT on column " + schema_ + ".specs.kind, which no tenure grant-* gives");
  finding_with(wdoc, "privileges", "error",
               "role " + worker + " holds USAGE on sequence " + schema_ + ".job_id_seq, which no tenure grant-* gives");
  EXPECT_EQ(findings_of(wdoc, "privileges").size(), 5u) << wdoc.dump(2);
}

TEST_F(cli_doctor, a_security_definer_function_without_search_path_is_named) {
  migrate();
  db_->exec("CREATE FUNCTION " + schema_ + ".report() RETURNS bigint LANGUAGE sql SECURITY DEFINER AS "
            "'SELECT count(*) FROM " + schema_ + ".done'");
  db_->exec("REVOKE ALL ON FUNCTION " + schema_ + ".report() FROM PUBLIC");
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto f = finding_with(doc, "security_definer", "error", "function " + schema_ + ".report() has no search_path");
  EXPECT_NE(f["fix"].get<std::string>().find("ALTER FUNCTION " + schema_ + ".report() SET search_path = pg_catalog, pg_temp"),
            std::string::npos) << f;
  expect_only(doc, "security_definer");
}

TEST_F(cli_doctor, a_stale_open_attempt_with_no_rescue_running_is_named) {
  migrate();
  enqueue({"send_email", "--queue", "mail"});
  const auto job = claim_and_vanish("mail");
  db_->exec("UPDATE " + schema_ + ".claims SET claimed_at = now() - interval '10 minutes'");
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto f = finding_with(doc, "stale_attempts", "error", "1 open attempt(s) past their staleness");
  EXPECT_NE(f["found"].get<std::string>().find(": job " + job + " (queue mail, worker vanished-worker, no heartbeat, "
                                               "silent 10m). Their workers are gone and rescue has not closed them: "
                                               "no process has ever held the maintenance lease"),
            std::string::npos) << f;
  EXPECT_EQ(f["details"]["maintenance_lease_live"], false);
  EXPECT_EQ(f["details"]["oldest"][0]["job_id"].dump(), job);
  EXPECT_EQ(f["details"]["oldest"][0]["worker"], "vanished-worker");
  EXPECT_NE(f["fix"].get<std::string>().find("tenure maintain"), std::string::npos) << f;
  expect_only(doc, "stale_attempts");
  // Not stale yet by a longer staleness.
  EXPECT_EQ(doctor({"--stale-after", "3600"}).first.exit_code, 0);
  // A live lease holder should rescue it: a warning naming that holder.
  db_->exec("SELECT " + schema_ + ".acquire_leadership('frozen-leader', '1 hour')");
  auto [held, held_doc] = doctor();
  EXPECT_EQ(held.exit_code, 1) << held;
  const auto g = finding_with(held_doc, "stale_attempts", "warning", "the maintenance lease is held by frozen-leader");
  EXPECT_EQ(g["details"]["maintenance_lease_live"], true);
}

TEST_F(cli_doctor, an_old_available_job_is_named_per_queue_and_printed_safely) {
  migrate();
  // enqueue and the constraints of specs refuse control characters in a queue name; a row of a
  // schema older than those constraints, written by hand, may hold one.
  const std::string queue = "mail\x1b[2J";
  enqueue({"send_email", "--queue", "mail"});
  enqueue({"send_email", "--queue", "fresh"});
  db_->exec("UPDATE " + schema_ + ".ready SET run_at = now() - interval '2 hours', queue = 'mail' || chr(27) || '[2J' "
            "WHERE queue = 'mail'");
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto f = finding_with(doc, "queue_age", "warning", "oldest available job has waited 2h");
  EXPECT_EQ(f["details"]["queue"], queue);
  EXPECT_EQ(findings_of(doc, "queue_age").size(), 1u) << doc.dump(2);
  expect_only(doc, "queue_age");

  const auto text = tenure({"doctor"});
  EXPECT_EQ(text.exit_code, 1) << text;
  EXPECT_EQ(text.out.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.out.find("[warning] queue_age: queue mail\\x1B[2J: oldest available job has waited 2h"),
            std::string::npos) << text;
  EXPECT_EQ(doctor({"--max-queue-age", "3h"}).first.exit_code, 0);
}

TEST_F(cli_doctor, finished_jobs_kept_past_their_retention_are_named) {
  migrate();
  const auto id = enqueue({"send_email", "--queue", "mail"});
  expect_success(tenure({"job", "cancel", std::to_string(id)}));
  expect_success(tenure({"queue", "configure", "mail", "--retain-cancelled", "1h"}));
  // Three days pass.
  db_->exec("UPDATE " + schema_ + ".closures SET closed_at = now() - interval '3 days'");
  db_->exec("UPDATE " + schema_ + ".settled_claims SET ripe_at = ripe_at - interval '3 days'");
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto f = finding_with(doc, "retention", "warning", "queue mail: 1 cancelled job(s) kept past their retention of 1h");
  EXPECT_EQ(f["details"]["expired"], 1);
  expect_only(doc, "retention");
  expect_success(tenure({"maintain", "--once"}));
  EXPECT_EQ(doctor().first.exit_code, 0);
}

TEST_F(cli_doctor, autovacuum_disabled_on_a_queue_table_is_named) {
  migrate();
  db_->exec("ALTER TABLE " + schema_ + ".ready SET (autovacuum_enabled = off)");
  auto [r, doc] = doctor();
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto f = finding_with(doc, "vacuum", "warning", "autovacuum is disabled on table " + schema_ + ".ready");
  EXPECT_EQ(f["fix"], "ALTER TABLE " + schema_ + ".ready RESET (autovacuum_enabled)");
  expect_only(doc, "vacuum");
}

TEST_F(cli_doctor, bad_flags_are_usage_errors_and_an_unreachable_database_is_one_line) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"doctor", "--max-queue-age", "5 minutes"}, {"doctor", "--stale-after", "nan"},
        {"doctor", "--retention-grace", "-1h"}, {"doctor", "--frobnicate"}, {"doctor", "extra"}}) {
    SCOPED_TRACE(args[1]);
    expect_one_error_line(tenure(args), 2, "");
  }
  expect_one_error_line(run_tenure({"doctor"}), 2, "DATABASE_URL");
  expect_one_error_line(run_tenure({"--database-url", k_unreachable, "doctor"}), 1, "cannot connect to the database");
}

/// Through the transaction pooler (TENURE_TEST_POOLER_DSN): every check runs, and the pooler
/// check says a runtime could not use this DSN.
class cli_doctor_pooler : public cli_pooler {};

TEST_F(cli_doctor_pooler, a_transaction_pooler_is_named_as_unfit_for_a_runtime) {
  migrate();
  auto r = tenure({"doctor", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r;
  const auto doc = nlohmann::json::parse(r.out);
  const auto f = finding_with(doc, "pooler", "warning", "does not keep a server session per client");
  EXPECT_EQ(f["details"]["session"], "pooled_without_session");
  expect_only(doc, "pooler");
}

}  // namespace
