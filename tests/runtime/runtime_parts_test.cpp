// Parts of the runtime on their own: the metrics HTTP server and job_context's waiting.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "sdk/runtime/attempt_entry.hpp"
#include "sdk/runtime/metrics.hpp"
#include "sdk/runtime/metrics_server.hpp"
#include "tenure/runtime.hpp"

namespace tenure {
namespace {

using namespace std::chrono_literals;

/// A TCP connection to 127.0.0.1:port (-1 when it fails), with 3 s send/receive deadlines.
int connect_to(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// GET `path` on a fresh connection; the raw answer ("" when none came within 3 s).
std::string get(std::uint16_t port, const std::string& path) {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string raw;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return raw;
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::unique_ptr<detail::metrics_server> start_metrics() {
  auto s = detail::metrics_server::start("127.0.0.1", 0, [] { return std::string{"tenure_test_total 7\n"}; });
  EXPECT_TRUE(s);
  return s ? std::move(s).value() : nullptr;
}

TEST(metrics_server, a_silent_client_blocks_neither_other_scrapes_nor_stop) {
  auto server = start_metrics();
  ASSERT_TRUE(server);
  // A client that connects and never sends a byte (a half-open scraper, a port scanner).
  const int silent = connect_to(server->port());
  ASSERT_GE(silent, 0);
  std::this_thread::sleep_for(100ms);
  const auto scraped = get(server->port(), "/metrics");
  EXPECT_EQ(scraped.rfind("HTTP/1.1 200", 0), 0u) << scraped;
  EXPECT_NE(scraped.find("tenure_test_total 7"), std::string::npos) << scraped;
  auto stopped = std::async(std::launch::async, [&] { server->stop(); });
  EXPECT_EQ(stopped.wait_for(3s), std::future_status::ready) << "stop() waited for the silent client";
  ::close(silent);  // (lets a stop() that waited for it return, so the test ends either way)
  stopped.wait();
}

TEST(metrics_server, at_the_descriptor_limit_accept_pauses_instead_of_spinning_and_recovers) {
  auto server = start_metrics();
  ASSERT_TRUE(server);
  // The scraper's socket exists before the process runs out of descriptors.
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  std::size_t open_now = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++open_now;
  rlimit low = old;
  low.rlim_cur = open_now + 16;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> hogs;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) hogs.push_back(fd);
  // Every descriptor is taken: the server's accept() now fails with EMFILE, again and again.
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(server->port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::this_thread::sleep_for(200ms);
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(2s);
  const double used = process_cpu_seconds() - before;
  EXPECT_LT(used, 0.3) << "the metrics thread burned " << used << " s of CPU in 2 s retrying accept()";
  for (int fd : hogs) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  // Descriptors are free again: the queued connection is accepted and answered.
  const std::string req = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  timeval tv{3, 0};
  ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ASSERT_GT(::send(client, req.data(), req.size(), MSG_NOSIGNAL), 0);
  std::string raw;
  char buf[1024];
  for (ssize_t n; (n = ::recv(client, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<std::size_t>(n));
  ::close(client);
  EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw;
  server->stop();
}

TEST(metrics_server, probes_answer_503_with_their_reason_and_200_when_ok) {
  std::atomic<bool> healthy{true};
  auto s = detail::metrics_server::start(
      "127.0.0.1", 0, [] { return std::string{}; },
      [&] { return detail::metrics_server::probe_answer{healthy.load(), healthy ? "ok" : "unhealthy: quiet"}; },
      [] { return detail::metrics_server::probe_answer{false, "not ready: stopping"}; });
  ASSERT_TRUE(s);
  auto server = std::move(s).value();
  EXPECT_EQ(get(server->port(), "/healthz").rfind("HTTP/1.1 200", 0), 0u);
  healthy = false;
  const auto sick = get(server->port(), "/healthz");
  EXPECT_EQ(sick.rfind("HTTP/1.1 503", 0), 0u) << sick;
  EXPECT_NE(sick.find("unhealthy: quiet"), std::string::npos) << sick;
  const auto ready = get(server->port(), "/readyz");
  EXPECT_EQ(ready.rfind("HTTP/1.1 503", 0), 0u) << ready;
  EXPECT_NE(ready.find("not ready: stopping"), std::string::npos) << ready;
  server->stop();
}

TEST(metrics_text, a_queue_name_with_quotes_backslashes_and_newlines_is_escaped_in_every_label) {
  detail::live_metrics m;
  const std::string name = "a\"b\\c\nd";
  m.queues.get(name).completed.fetch_add(2);
  m.queues.get(name).depth_known = true;
  m.queues.get(name).pickup.observe(3ms);
  const auto text = detail::prometheus_text(m.snapshot());
  const std::string escaped = R"(queue="a\"b\\c\nd")";
  EXPECT_NE(text.find("tenure_completed_total{" + escaped + "} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tenure_pickup_latency_seconds_count{" + escaped + "} 1\n"), std::string::npos);
  EXPECT_NE(text.find("tenure_queue_depth{" + escaped + ",state=\"available\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("tenure_run_duration_seconds_bucket{" + escaped + ",outcome=\"stale\",le=\"+Inf\"} 0\n"),
            std::string::npos);
  // No raw newline inside a sample line: every line is a comment or starts with tenure_.
  std::size_t start = 0;
  for (std::size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    const auto line = text.substr(start, nl - start);
    EXPECT_TRUE(line.starts_with("# ") || line.starts_with("tenure_")) << line;
  }
  EXPECT_EQ(detail::escape_label_value("plain"), "plain");
}

TEST(metrics_text, histogram_buckets_are_cumulative_and_count_every_observation) {
  detail::live_histogram h;
  h.observe(0ms);
  h.observe(1ms);    // on a bound: counted in le="0.001"
  h.observe(1001us);
  h.observe(700ms);
  h.observe(2h);     // beyond the last bound: only +Inf
  h.observe(-5ms);   // clock skew: counted as zero
  const auto s = h.snapshot();
  ASSERT_EQ(s.upper_bounds.size(), s.cumulative.size());
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.cumulative.front(), 3u) << "0, -5 ms and 1 ms are <= 0.001 s";
  EXPECT_DOUBLE_EQ(s.upper_bounds.front(), 0.001);
  EXPECT_EQ(s.cumulative[1], 4u) << "1.001 ms <= 0.0025 s";
  EXPECT_EQ(s.cumulative.back(), 5u) << "2 h is past the last bound";
  for (std::size_t i = 1; i < s.cumulative.size(); ++i) EXPECT_LE(s.cumulative[i - 1], s.cumulative[i]);
  EXPECT_NEAR(s.sum, 0.001 + 0.001001 + 0.7 + 7200, 1e-6);
}

TEST(metrics_text, per_queue_counters_are_labelled_and_summed_into_the_totals) {
  detail::live_metrics m;
  m.queues.get("billing").completed.fetch_add(3);
  m.queues.get("mail").completed.fetch_add(4);
  m.queues.get("mail").in_flight.fetch_add(2);
  const auto r = m.snapshot();
  EXPECT_EQ(r.completed, 7u);
  EXPECT_EQ(r.in_flight, 2);
  ASSERT_NE(r.queue("billing"), nullptr);
  EXPECT_EQ(r.queue("billing")->completed, 3u);
  const auto text = detail::prometheus_text(r);
  EXPECT_NE(text.find("# TYPE tenure_completed_total counter\ntenure_completed_total{queue=\"billing\"} 3\n"
                      "tenure_completed_total{queue=\"mail\"} 4\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE tenure_pickup_latency_seconds histogram\n"), std::string::npos);
  EXPECT_EQ(text.find("tenure_queue_depth{queue=\"mail\""), std::string::npos) << "no depth until counted";
}

TEST(job_context, wait_cancelled_with_no_limit_blocks_until_the_cancel) {
  claimed_attempt c;
  c.attempt = {1, 1};
  auto entry = std::make_shared<detail::attempt_entry>(c);
  job_context ctx{entry};
  auto waited = std::async(std::launch::async, [&] { return ctx.wait_cancelled(std::chrono::milliseconds::max()); });
  EXPECT_EQ(waited.wait_for(300ms), std::future_status::timeout) << "returned without a cancel";
  entry->cancel();
  ASSERT_EQ(waited.wait_for(3s), std::future_status::ready);
  EXPECT_TRUE(waited.get());
  EXPECT_TRUE(ctx.wait_cancelled(std::chrono::milliseconds{0})) << "once cancelled, a zero wait says so";
}

}  // namespace
}  // namespace tenure
