// tenure's own logger: the library's lines go to the logger named "tenure" (or the one the
// application gives it), never to the application's default spdlog logger.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "tenure/sqlite/store.hpp"
#include "tenure/clock.hpp"
#include "tenure/log.hpp"
#include "tenure/runtime.hpp"

namespace tenure {
namespace {

using namespace std::chrono_literals;

class kept_lines final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  spdlog::level::level_enum lowest_level() {
    std::lock_guard lock(mutex_);
    return lowest_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
    if (msg.level < lowest_) lowest_ = msg.level;
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
  spdlog::level::level_enum lowest_ = spdlog::level::off;
};

bool has_line_with(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

class logging : public ::testing::Test {
 protected:
  void SetUp() override {
    default_sink_ = std::make_shared<kept_lines>();
    previous_default_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("application", default_sink_));
  }
  void TearDown() override {
    spdlog::set_default_logger(previous_default_);
    set_logger(nullptr);
  }

  /// Runs one job whose handler fails for good: the runtime logs "job <id> lease 1 queue default failed".
  std::int64_t run_one_failing_job(runtime_config c) {
    auto store = sqlite::store::open(":memory:", clock_);
    if (!store) throw std::runtime_error(store.error().message());
    std::shared_ptr<storage_port> shared{std::move(store).value()};
    auto id = shared->enqueue({.kind = "k"});
    if (!id) throw std::runtime_error(id.error().message());
    c.queues = {{.name = "default", .max_concurrency = 1}};
    c.poll_interval = 5ms;
    c.heartbeat_interval = 1h;
    c.maintenance_interval = 1h;
    auto rt = runtime::create(std::move(c), shared, nullptr);
    if (!rt) throw std::runtime_error(rt.error().message());
    rt.value()->handle("k", [](job_context&) { return job_outcome::fail("broken on purpose"); });
    if (!rt.value()->start()) throw std::runtime_error("start failed");
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (shared->read_job(id.value()).value().state != job_state::failed && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(2ms);
    }
    rt.value()->stop();
    return id.value();
  }

  manual_clock clock_;
  std::shared_ptr<kept_lines> default_sink_;
  std::shared_ptr<spdlog::logger> previous_default_;
};

TEST_F(logging, the_library_logs_to_its_own_logger_named_tenure_never_to_the_applications_default_logger) {
  auto mine = std::make_shared<kept_lines>();
  auto before = logger();
  EXPECT_EQ(before->name(), "tenure");
  before->sinks().push_back(mine);
  const auto id = run_one_failing_job({});
  std::erase(before->sinks(), std::static_pointer_cast<spdlog::sinks::sink>(mine));
  EXPECT_TRUE(has_line_with(mine->lines(), "job " + std::to_string(id) + " lease 1 queue default failed"))
      << "tenure's logger got " << mine->lines().size() << " line(s)";
  EXPECT_TRUE(default_sink_->lines().empty()) << "the application's default logger got: " << default_sink_->lines().front();
}

TEST_F(logging, a_logger_given_in_runtime_config_receives_the_runtimes_lines_at_its_own_level) {
  auto sink = std::make_shared<kept_lines>();
  auto given = std::make_shared<spdlog::logger>("my-app-tenure", sink);
  given->set_level(spdlog::level::warn);
  runtime_config c;
  c.logger = given;
  const auto id = run_one_failing_job(std::move(c));
  EXPECT_EQ(logger(), given);
  EXPECT_TRUE(has_line_with(sink->lines(), "job " + std::to_string(id) + " lease 1 queue default failed"));
  EXPECT_TRUE(default_sink_->lines().empty());
  EXPECT_GE(sink->lowest_level(), spdlog::level::warn);  // its own level holds
}

TEST_F(logging, set_logger_with_nullptr_restores_the_default_stderr_logger) {
  set_logger(std::make_shared<spdlog::logger>("other"));
  EXPECT_EQ(logger()->name(), "other");
  set_logger(nullptr);
  EXPECT_EQ(logger()->name(), "tenure");
  EXPECT_EQ(logger()->level(), spdlog::level::info);
}

}  // namespace
}  // namespace tenure
