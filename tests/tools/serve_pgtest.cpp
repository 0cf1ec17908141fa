// `tenure serve` as a real process against the test cluster (TENURE_TEST_DSN): the JSON API's
// shapes, the checks in front of the actions (token, POST only, same origin, read-only), escaping
// in the pages, bad input, and clients that send too much or nothing at all.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/pg.hpp"

extern char** environ;

namespace {

using namespace std::chrono_literals;

using tenure::test::random_hex;

/// Runs SQL; the first column of the first row.
std::optional<std::string> sql(const std::string& dsn, const std::string& statement) {
  std::unique_ptr<PGconn, decltype(&PQfinish)> c(PQconnectdb(dsn.c_str()), &PQfinish);
  if (PQstatus(c.get()) != CONNECTION_OK) throw std::runtime_error(PQerrorMessage(c.get()));
  PQclear(PQexec(c.get(), "SET client_min_messages = warning"));
  std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(c.get(), statement.c_str()), &PQclear);
  const auto st = PQresultStatus(r.get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) throw std::runtime_error(statement + ": " + PQresultErrorMessage(r.get()));
  if (st != PGRES_TUPLES_OK || PQntuples(r.get()) == 0 || PQgetisnull(r.get(), 0, 0)) return std::nullopt;
  return std::string{PQgetvalue(r.get(), 0, 0)};
}

/// A spawned `tenure ... serve ...`; its first stdout line names the URL. SIGTERM when destroyed.
class serve_process {
 public:
  explicit serve_process(const std::vector<std::string>& args) {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    posix_spawn_file_actions_addclose(&actions, out[1]);
    std::vector<std::string> text{TENURE_CLI_PATH};
    text.insert(text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : text) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int spawned = posix_spawn(&pid_, TENURE_CLI_PATH, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    if (spawned != 0) {
      pid_ = -1;
      throw std::runtime_error("cannot spawn tenure");
    }
    // The first line, or what came before the process ended.
    pollfd p{out[0], POLLIN, 0};
    char c;
    while (first_line_.empty() || first_line_.back() != '\n') {
      if (poll(&p, 1, 10'000) <= 0 || read(out[0], &c, 1) != 1) break;
      first_line_ += c;
    }
    close(out[0]);
    std::smatch m;
    if (std::regex_search(first_line_, m, std::regex{"http://127\\.0\\.0\\.1:([0-9]+)/"})) port_ = std::stoi(m[1]);
  }
  ~serve_process() {
    if (pid_ <= 0) return;  // never kill(-1): that is every process we may signal
    kill(pid_, SIGTERM);
    waitpid(pid_, &status_, 0);
  }
  /// Waits for the process to end (one that refuses to start); its exit code.
  int wait_exit() {
    waitpid(pid_, &status_, 0);
    const int code = WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
    pid_ = -1;
    return code;
  }
  int port() const { return port_; }
  const std::string& first_line() const { return first_line_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  int port_ = 0;
  std::string first_line_;
};

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
  return fd;
}

struct reply {
  int status = 0;
  std::string head, body;
  nlohmann::json json() const { return nlohmann::json::parse(body); }
  bool has_header(const std::string& line) const { return head.find("\r\n" + line + "\r\n") != std::string::npos; }
};

/// Sends raw bytes, reads until the server closes (5 s at most).
reply send_raw(int port, const std::string& raw) {
  const int fd = connect_to(port);
  send(fd, raw.data(), raw.size(), MSG_NOSIGNAL);
  std::string in;
  pollfd p{fd, POLLIN, 0};
  char buf[8192];
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < until && poll(&p, 1, 5000) > 0) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  close(fd);
  reply r;
  const auto split = in.find("\r\n\r\n");
  r.head = in.substr(0, split == std::string::npos ? in.size() : split + 2);
  r.body = split == std::string::npos ? "" : in.substr(split + 4);
  if (in.starts_with("HTTP/1.1 ")) r.status = std::stoi(in.substr(9, 3));
  return r;
}

reply request(int port, const std::string& method, const std::string& target,
              const std::vector<std::string>& headers = {}, const std::string& host = "") {
  std::string raw = method + " " + target + " HTTP/1.1\r\nHost: " +
                    (host.empty() ? "127.0.0.1:" + std::to_string(port) : host) + "\r\nConnection: close\r\n";
  for (const auto& h : headers) raw += h + "\r\n";
  if (method == "POST") raw += "Content-Length: 0\r\n";
  return send_raw(port, raw + "\r\n");
}

const std::string k_token = "s3cret-token-for-the-dashboard-tests";

class serve_pg : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* dsn = std::getenv("TENURE_TEST_DSN");
    ASSERT_TRUE(dsn != nullptr && *dsn != '\0') << "TENURE_TEST_DSN is not set: this test needs PostgreSQL";
    dsn_ = dsn;
    schema_ = "serve_" + random_hex(12);
    {
      serve_process migrate({"--database-url", dsn_, "--schema", schema_, "migrate"});
      ASSERT_EQ(migrate.wait_exit(), 0);
    }
    const std::string s = schema_;
    auto enqueue = [&](const std::string& queue, const std::string& args, int max_attempts = 25) {
      return std::stoll(*sql(dsn_, "SELECT " + s + ".enqueue('work', '" + args + "'::jsonb, '" + queue + "', 2, now(), " +
                                       std::to_string(max_attempts) + ")"));
    };
    hostile_ = enqueue("mail", R"({"note": "<script>window.__pwned=1</script>"})");
    enqueue("mail", "{}");
    failed_ = enqueue("billing", "{}", 1);
    sql(dsn_, "SELECT " + s + ".fail_attempt(c.job_id, c.run_lease, 'declined', true) FROM " + s +
                  ".claim_attempts('billing', 1, 'w') c");
    token_file_ = testing::TempDir() + "serve_token_" + random_hex(8);
    std::ofstream(token_file_) << k_token << "\n";
    chmod(token_file_.c_str(), 0600);
    server_ = new serve_process({"--database-url", dsn_, "--schema", schema_, "serve", "--listen", "127.0.0.1:0",
                                 "--token-file", token_file_});
    ASSERT_NE(server_->port(), 0) << server_->first_line();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    if (!schema_.empty()) sql(dsn_, "DROP SCHEMA IF EXISTS " + schema_ + " CASCADE");
    std::remove(token_file_.c_str());
  }
  static int port() { return server_->port(); }
  static std::string state_of(std::int64_t id) {
    return sql(dsn_, "SELECT state FROM " + schema_ + ".jobs WHERE id = " + std::to_string(id)).value_or("");
  }
  static std::string bearer(const std::string& t = k_token) { return "Authorization: Bearer " + t; }

  static inline std::string dsn_, schema_, token_file_;
  static inline std::int64_t hostile_ = 0, failed_ = 0;
  static inline serve_process* server_ = nullptr;
};

// ---- the JSON API ---------------------------------------------------------------------------------

TEST_F(serve_pg, api_queues_lists_counts_per_state_paused_flag_and_sixty_minutes_of_finished_jobs) {
  const auto r = request(port(), "GET", "/api/queues");
  ASSERT_EQ(r.status, 200) << r.head << r.body;
  EXPECT_TRUE(r.has_header("Content-Type: application/json")) << r.head;
  const auto j = r.json();
  EXPECT_EQ(j["schema"], schema_);
  ASSERT_EQ(j["queues"].size(), 2u) << j;
  const auto& billing = j["queues"][0];
  EXPECT_EQ(billing["name"], "billing");
  EXPECT_EQ(billing["paused"], false);
  EXPECT_EQ(billing["counts"]["failed"], 1);
  EXPECT_EQ(billing["counts"].size(), 8u);
  EXPECT_TRUE(billing["settings"].contains("backoff_base"));
  EXPECT_EQ(j["queues"][1]["counts"]["available"], 2);
  ASSERT_EQ(j["finished_per_minute"].size(), 60u);
  // The failure set up a moment ago is in the current minute, or in the one before when a minute
  // began between the two.
  EXPECT_EQ(j["finished_per_minute"][58]["failed"].get<int>() + j["finished_per_minute"][59]["failed"].get<int>(), 1)
      << j["finished_per_minute"][58] << " " << j["finished_per_minute"][59];
  EXPECT_TRUE(std::regex_match(j["finished_per_minute"][0]["minute"].get<std::string>(),
                               std::regex{"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}Z"}));
}

TEST_F(serve_pg, api_jobs_filters_and_pages_newest_first_by_after_id) {
  auto first = request(port(), "GET", "/api/jobs?queue=mail&limit=1").json();
  ASSERT_EQ(first["jobs"].size(), 1u);
  EXPECT_EQ(first["jobs"][0]["id"], hostile_ + 1);
  EXPECT_EQ(first["jobs"][0]["state"], "available");
  EXPECT_EQ(first["next_after_id"], hostile_ + 1);
  auto second = request(port(), "GET", "/api/jobs?queue=mail&limit=1&after_id=" + std::to_string(hostile_ + 1)).json();
  ASSERT_EQ(second["jobs"].size(), 1u);
  EXPECT_EQ(second["jobs"][0]["id"], hostile_);
  auto failed = request(port(), "GET", "/api/jobs?state=failed").json();
  ASSERT_EQ(failed["jobs"].size(), 1u);
  EXPECT_EQ(failed["jobs"][0]["last_error"], "declined");
  EXPECT_TRUE(failed["next_after_id"].is_null());
  EXPECT_EQ(request(port(), "GET", "/api/jobs?kind=nothing").json()["jobs"].size(), 0u);
}

TEST_F(serve_pg, api_job_has_args_state_attempt_run_lease_and_timestamps) {
  const auto j = request(port(), "GET", "/api/jobs/" + std::to_string(failed_)).json();
  EXPECT_EQ(j["id"], failed_);
  EXPECT_EQ(j["state"], "failed");
  EXPECT_TRUE(j["args"].is_object());
  EXPECT_EQ(j["attempt"], 1);
  EXPECT_TRUE(j["run_lease"].is_number_integer() && j["run_lease"].get<long long>() > 0) << j;
  EXPECT_EQ(j["last_error"], "declined");
  EXPECT_TRUE(j["finalized_at"].is_string());
  EXPECT_TRUE(j.contains("worker") && j.contains("progress") && j.contains("created_at"));
  const auto hostile = request(port(), "GET", "/api/jobs/" + std::to_string(hostile_)).json();
  EXPECT_EQ(hostile["args"]["note"], "<script>window.__pwned=1</script>");
}

TEST_F(serve_pg, bad_input_is_a_400_with_a_json_error) {
  for (const std::string target :
       {"/api/jobs/abc", "/api/jobs/0", "/api/jobs/-1", "/api/jobs/+5", "/api/jobs/99999999999999999999",
        "/api/jobs?state=done", "/api/jobs?limit=0", "/api/jobs?limit=501", "/api/jobs?limit=x",
        "/api/jobs?after_id=x", "/api/jobs?queue=%zz"}) {
    const auto r = request(port(), "GET", target);
    EXPECT_EQ(r.status, 400) << target << "\n" << r.head << r.body;
    EXPECT_TRUE(r.json().contains("error")) << target << r.body;
  }
  EXPECT_EQ(request(port(), "GET", "/jobs/abc").status, 400);
}

TEST_F(serve_pg, unknown_job_is_a_404) {
  const auto r = request(port(), "GET", "/api/jobs/987654321");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_EQ(r.json()["error"], "job 987654321 not found");
  EXPECT_EQ(request(port(), "GET", "/jobs/987654321").status, 404);
  EXPECT_EQ(request(port(), "POST", "/api/jobs/987654321/retry", {bearer()}).status, 404);
}

// ---- actions ---------------------------------------------------------------------------------------

TEST_F(serve_pg, action_without_a_token_is_401_and_changes_nothing) {
  const auto r = request(port(), "POST", "/api/jobs/" + std::to_string(failed_) + "/retry");
  EXPECT_EQ(r.status, 401) << r.body;
  EXPECT_TRUE(r.has_header("WWW-Authenticate: Bearer")) << r.head;
  EXPECT_EQ(state_of(failed_), "failed");
}

TEST_F(serve_pg, action_with_a_wrong_token_is_401_and_changes_nothing) {
  for (const auto& header : {bearer("wrong"), bearer(k_token + "x"), bearer(k_token.substr(0, 10)),
                             "Authorization: Basic " + k_token, std::string{"Authorization: Bearer"}}) {
    const auto r = request(port(), "POST", "/api/jobs/" + std::to_string(failed_) + "/retry", {header});
    EXPECT_EQ(r.status, 401) << header << r.body;
  }
  EXPECT_EQ(state_of(failed_), "failed");
}

TEST_F(serve_pg, get_on_an_action_route_is_405) {
  for (const std::string& target : {"/api/jobs/" + std::to_string(failed_) + "/retry", std::string{"/api/queues/mail/pause"}}) {
    const auto r = request(port(), "GET", target, {bearer()});
    EXPECT_EQ(r.status, 405) << target;
    EXPECT_TRUE(r.has_header("Allow: POST")) << r.head;
  }
  EXPECT_EQ(request(port(), "POST", "/api/queues", {bearer()}).status, 405);
  EXPECT_EQ(state_of(failed_), "failed");
}

TEST_F(serve_pg, cross_origin_post_is_403_even_with_the_token) {
  const std::string target = "/api/jobs/" + std::to_string(failed_) + "/retry";
  for (const std::string header : {"Origin: http://evil.example", "Origin: null", "Sec-Fetch-Site: cross-site",
                                   "Sec-Fetch-Site: same-site", "Origin: http://localhost:1"}) {
    const auto r = request(port(), "POST", target, {bearer(), header});
    EXPECT_EQ(r.status, 403) << header << r.body;
  }
  EXPECT_EQ(state_of(failed_), "failed");
}

TEST_F(serve_pg, retry_cancel_pause_and_resume_with_the_token_change_the_database) {
  const auto id = std::stoll(*sql(dsn_, "SELECT " + schema_ + ".enqueue('work', '{}', 'actions', 2, now(), 1)"));
  const std::string origin = "Origin: http://127.0.0.1:" + std::to_string(port());
  auto cancel = request(port(), "POST", "/api/jobs/" + std::to_string(id) + "/cancel", {bearer(), origin});
  EXPECT_EQ(cancel.status, 200) << cancel.body;
  EXPECT_EQ(cancel.json()["cancelled"], true);
  EXPECT_EQ(state_of(id), "cancelled");
  auto again = request(port(), "POST", "/api/jobs/" + std::to_string(id) + "/cancel", {bearer()});
  EXPECT_EQ(again.status, 409) << again.body;
  auto retry = request(port(), "POST", "/api/jobs/" + std::to_string(id) + "/retry",
                       {bearer(), origin, "Sec-Fetch-Site: same-origin"});
  EXPECT_EQ(retry.status, 200) << retry.body;
  EXPECT_EQ(retry.json()["state"], "available");
  EXPECT_EQ(state_of(id), "available");
  auto pause = request(port(), "POST", "/api/queues/actions/pause", {bearer()});
  EXPECT_EQ(pause.status, 200) << pause.body;
  EXPECT_EQ(pause.json()["changed"], true);
  EXPECT_EQ(sql(dsn_, "SELECT paused FROM " + schema_ + ".list_queues() WHERE queue = 'actions'"), "t");
  EXPECT_EQ(request(port(), "POST", "/api/queues/actions/resume", {bearer()}).status, 200);
  EXPECT_EQ(sql(dsn_, "SELECT paused FROM " + schema_ + ".list_queues() WHERE queue = 'actions'"), "f");
}

TEST_F(serve_pg, read_only_or_no_token_file_refuses_actions_with_403) {
  for (const bool read_only : {true, false}) {
    std::vector<std::string> args{"--database-url", dsn_, "--schema", schema_, "serve", "--listen", "127.0.0.1:0"};
    if (read_only) args.insert(args.end(), {"--read-only", "--token-file", token_file_});
    serve_process ro(args);
    ASSERT_NE(ro.port(), 0) << ro.first_line();
    const auto r = request(ro.port(), "POST", "/api/jobs/" + std::to_string(failed_) + "/retry", {bearer()});
    EXPECT_EQ(r.status, 403) << r.body;
    EXPECT_EQ(r.json()["error"], "actions are disabled (read-only dashboard)");
    const auto page = request(ro.port(), "GET", "/jobs/" + std::to_string(failed_));
    EXPECT_NE(page.body.find("Actions are disabled"), std::string::npos);
    EXPECT_EQ(page.body.find("id=\"retry\""), std::string::npos);
  }
  EXPECT_EQ(state_of(failed_), "failed");
}

TEST_F(serve_pg, a_token_file_others_can_read_is_refused) {
  const std::string path = testing::TempDir() + "serve_open_token_" + random_hex(8);
  std::ofstream(path) << k_token << "\n";
  chmod(path.c_str(), 0644);
  serve_process p({"--database-url", dsn_, "--schema", schema_, "serve", "--listen", "127.0.0.1:0", "--token-file", path});
  EXPECT_EQ(p.wait_exit(), 2);
  std::remove(path.c_str());
}

// ---- pages -----------------------------------------------------------------------------------------

TEST_F(serve_pg, job_args_are_escaped_in_html_and_pages_forbid_foreign_scripts) {
  const auto r = request(port(), "GET", "/jobs/" + std::to_string(hostile_));
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("&lt;script&gt;window.__pwned=1&lt;/script&gt;"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("<script>window"), std::string::npos);
  EXPECT_TRUE(r.has_header("X-Content-Type-Options: nosniff")) << r.head;
  EXPECT_NE(r.head.find("script-src 'self'"), std::string::npos) << r.head;
  EXPECT_NE(r.head.find("frame-ancestors 'none'"), std::string::npos) << r.head;
  const auto list = request(port(), "GET", "/jobs?queue=%3Cb%3E");
  EXPECT_EQ(list.status, 200);
  EXPECT_NE(list.body.find("value=\"&lt;b&gt;\""), std::string::npos);
  const auto js = request(port(), "GET", "/assets/app.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_TRUE(js.has_header("Content-Type: text/javascript; charset=utf-8")) << js.head;
}

TEST_F(serve_pg, a_jobs_metadata_is_in_the_api_as_json_and_escaped_on_its_page) {
  const auto id = std::stoll(*sql(dsn_, "SELECT " + schema_ + ".enqueue('work', '{}'::jsonb, 'mail', " +
                                            "metadata => '{\"traceparent\": \"00-ab\", \"tenant\": \"<i>t</i>\"}')"));
  const auto j = request(port(), "GET", "/api/jobs/" + std::to_string(id)).json();
  EXPECT_EQ(j["metadata"]["traceparent"], "00-ab");
  EXPECT_EQ(j["metadata"]["tenant"], "<i>t</i>");
  const auto page = request(port(), "GET", "/jobs/" + std::to_string(id));
  ASSERT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("&lt;i&gt;t&lt;/i&gt;"), std::string::npos) << page.body;
  EXPECT_EQ(page.body.find("<i>t</i>"), std::string::npos);
  sql(dsn_, "SELECT " + schema_ + ".cancel_job(" + std::to_string(id) + ")");
}

// ---- hostile clients -------------------------------------------------------------------------------

TEST_F(serve_pg, oversized_requests_are_431_or_413_and_the_server_still_answers) {
  const auto big_header = request(port(), "GET", "/api/queues", {"X-Filler: " + std::string(20'000, 'a')});
  EXPECT_EQ(big_header.status, 431) << big_header.head;
  const auto big_body = send_raw(port(), "POST /api/jobs/1/retry HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" +
                                             std::string(70'000, 'b'));
  EXPECT_EQ(big_body.status, 413) << big_body.head;
  EXPECT_EQ(request(port(), "GET", "/api/queues").status, 200);
}

TEST_F(serve_pg, a_silent_client_does_not_block_another) {
  const int silent = connect_to(port());
  send(silent, "GET /api/queues HTTP/1.1\r\n", 26, MSG_NOSIGNAL);  // and nothing more
  const int idle = connect_to(port());                              // nothing at all
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(request(port(), "GET", "/api/queues").status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  close(silent);
  close(idle);
}

TEST_F(serve_pg, a_request_for_another_host_name_is_refused_on_loopback) {
  // A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) sends its own Host.
  for (const std::string& host : {std::string{"evil.example"}, "evil.example:" + std::to_string(port()), std::string{"127.0.0.1.evil.example"}}) {
    const auto r = request(port(), "GET", "/api/jobs/" + std::to_string(hostile_), {}, host);
    EXPECT_EQ(r.status, 421) << host << r.body;
    EXPECT_EQ(r.body.find("pwned"), std::string::npos);
  }
  for (const std::string& host : {"localhost:" + std::to_string(port()), std::string{"127.0.0.2"}, "[::1]:" + std::to_string(port())}) {
    EXPECT_EQ(request(port(), "GET", "/api/queues", {}, host).status, 200) << host;
  }
}

TEST_F(serve_pg, connections_past_the_cap_are_closed_and_the_server_recovers) {
  std::vector<int> held;
  for (int i = 0; i < 128; ++i) held.push_back(connect_to(port()));  // the cap, all silent
  std::this_thread::sleep_for(200ms);                                   // accepted by now
  const auto refused = request(port(), "GET", "/api/queues");
  EXPECT_EQ(refused.status, 0) << "connection 129 was served: " << refused.head;
  for (int fd : held) close(fd);
  // The server notices the closed connections at once (end of stream), not at their deadline.
  int status = 0;
  for (int i = 0; i < 50 && status != 200; ++i) {
    std::this_thread::sleep_for(20ms);
    status = request(port(), "GET", "/api/queues").status;
  }
  EXPECT_EQ(status, 200);
}

TEST_F(serve_pg, a_failing_database_is_a_5xx_counted_in_metrics_and_the_server_keeps_answering) {
  const std::string other = "serve_" + random_hex(12);
  {
    serve_process migrate({"--database-url", dsn_, "--schema", other, "migrate"});
    ASSERT_EQ(migrate.wait_exit(), 0);
  }
  serve_process p({"--database-url", dsn_, "--schema", other, "serve", "--listen", "127.0.0.1:0"});
  ASSERT_NE(p.port(), 0) << p.first_line();
  EXPECT_EQ(request(p.port(), "GET", "/api/queues").status, 200);
  sql(dsn_, "DROP SCHEMA " + other + " CASCADE");
  const auto r = request(p.port(), "GET", "/api/queues");
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_TRUE(r.json().contains("error"));
  EXPECT_EQ(request(p.port(), "GET", "/").status, 500);
  const auto m = request(p.port(), "GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("tenure_serve_database_errors_total 2"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("tenure_serve_requests_total{route=\"/api/queues\",status=\"500\"} 1"), std::string::npos);
}

TEST_F(serve_pg, a_query_blocked_by_a_lock_is_cancelled_after_the_statement_timeout) {
  serve_process p({"--database-url", dsn_, "--schema", schema_, "serve", "--listen", "127.0.0.1:0",
                   "--statement-timeout", "300ms"});
  ASSERT_NE(p.port(), 0) << p.first_line();
  ASSERT_EQ(request(p.port(), "GET", "/api/jobs").status, 200);
  // Another session holds every table under the jobs view; a dashboard query must not wait on it
  // for ever (send_raw gives up after 5 s, so a query without a limit reads as status 0).
  std::unique_ptr<PGconn, decltype(&PQfinish)> holder(PQconnectdb(dsn_.c_str()), &PQfinish);
  ASSERT_EQ(PQstatus(holder.get()), CONNECTION_OK);
  PQclear(PQexec(holder.get(), "BEGIN"));
  std::unique_ptr<PGresult, decltype(&PQclear)> locked(
      PQexec(holder.get(), ("LOCK TABLE " + schema_ + ".jobs IN ACCESS EXCLUSIVE MODE").c_str()), &PQclear);
  ASSERT_EQ(PQresultStatus(locked.get()), PGRES_COMMAND_OK) << PQresultErrorMessage(locked.get());
  const auto start = std::chrono::steady_clock::now();
  const auto blocked = request(p.port(), "GET", "/api/jobs");
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(blocked.status, 500) << blocked.body;
  EXPECT_NE(blocked.body.find("statement timeout"), std::string::npos) << blocked.body;
  EXPECT_LT(waited, 4s);
  PQclear(PQexec(holder.get(), "ROLLBACK"));
  EXPECT_EQ(request(p.port(), "GET", "/api/jobs").status, 200);
}

TEST_F(serve_pg, a_bad_statement_timeout_is_a_usage_error) {
  serve_process p({"--database-url", dsn_, "--schema", schema_, "serve", "--listen", "127.0.0.1:0",
                   "--statement-timeout", "soon"});
  EXPECT_EQ(p.wait_exit(), 2);
}

TEST_F(serve_pg, metrics_count_requests_by_route_and_status) {
  for (int i = 0; i < 3; ++i) request(port(), "GET", "/api/jobs/not-a-number");
  const auto r = request(port(), "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.body, m, std::regex{R"re(tenure_serve_requests_total\{route="/api/jobs/\{id\}",status="400"\} ([0-9]+))re"}))
      << r.body;
  EXPECT_GE(std::stoi(m[1]), 3);
  EXPECT_NE(r.body.find("tenure_serve_request_duration_seconds_count{route=\"/api/jobs/{id}\"}"), std::string::npos);
  EXPECT_NE(r.body.find("tenure_serve_database_errors_total 0"), std::string::npos);
}

}  // namespace
