#include "cli/logging.hpp"

#include <cctype>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::cli {
namespace {

/// Keeps warn+ messages instead of printing them.
class held_sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::optional<std::string> last() {
    std::lock_guard lock(mutex_);
    if (held_.empty()) return std::nullopt;
    return held_.back();
  }
  std::vector<std::string> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(held_, {});
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::string text(msg.payload.data(), msg.payload.size());
    constexpr std::string_view adapter_prefix = "tenure.pg: ";
    if (text.starts_with(adapter_prefix)) text.erase(0, adapter_prefix.size());
    // libpq's CONTEXT (the PL/pgSQL call stack) is for debugging; -v logs it in full.
    if (const auto context = text.find("CONTEXT:"); context != std::string::npos) {
      text.erase(context);
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    }
    // A misbehaving caller could log without bound; the last few say enough.
    if (held_.size() >= 64) held_.erase(held_.begin());
    held_.push_back(std::move(text));
  }
  void flush_() override {}

 private:
  std::vector<std::string> held_;
};

std::shared_ptr<held_sink>& holder() {
  static std::shared_ptr<held_sink> sink;
  return sink;
}

}  // namespace

void setup_logging(int verbosity) {
  std::shared_ptr<spdlog::logger> logger;
  if (verbosity <= 0) {
    holder() = std::make_shared<held_sink>();
    logger = std::make_shared<spdlog::logger>("tenure", holder());
    logger->set_level(spdlog::level::warn);
  } else {
    holder().reset();
    // stderr: stdout carries the command's output (ids, JSON) and must stay parseable.
    logger = std::make_shared<spdlog::logger>("tenure", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    logger->set_level(verbosity == 1 ? spdlog::level::info : spdlog::level::debug);
    logger->set_pattern("[%H:%M:%S.%e] [%l] %v");
  }
  tenure::set_logger(logger);  // the library's lines
  spdlog::set_default_logger(std::move(logger));
}

std::optional<std::string> last_held_warning() {
  if (!holder()) return std::nullopt;
  return holder()->last();
}

std::vector<std::string> take_held_warnings() {
  if (!holder()) return {};
  return holder()->take();
}

}  // namespace tenure::cli
