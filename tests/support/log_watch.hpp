#pragma once
// Counting what tenure logs: a sink added to tenure's logger for one scope, counting the lines
// that contain a needle.
#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::test {

/// Counts the lines containing `needle` while it is a sink of a logger.
class log_watch final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit log_watch(std::string needle) : needle_(std::move(needle)) {}
  std::atomic<int> hits{0};

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (std::string_view{msg.payload.data(), msg.payload.size()}.find(needle_) != std::string_view::npos) ++hits;
  }
  void flush_() override {}

 private:
  std::string needle_;
};

/// Adds a log_watch to tenure's logger for a scope.
class watching_log {
 public:
  explicit watching_log(std::string needle) : watch_(std::make_shared<log_watch>(std::move(needle))) {
    tenure::logger()->sinks().push_back(watch_);
  }
  ~watching_log() { std::erase(tenure::logger()->sinks(), std::static_pointer_cast<spdlog::sinks::sink>(watch_)); }
  watching_log(const watching_log&) = delete;
  watching_log& operator=(const watching_log&) = delete;
  int hits() const { return watch_->hits.load(); }

 private:
  std::shared_ptr<log_watch> watch_;
};

}  // namespace tenure::test
