#include "tenure/log.hpp"

#include <atomic>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tenure {
namespace {

/// Made once, outside spdlog's registry: the application's own registry and default logger are
/// never touched.
std::shared_ptr<spdlog::logger> make_default() {
  auto l = std::make_shared<spdlog::logger>("tenure", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  l->set_level(spdlog::level::info);
  return l;
}

std::atomic<std::shared_ptr<spdlog::logger>>& current() {
  static std::atomic<std::shared_ptr<spdlog::logger>> l{make_default()};
  return l;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger() noexcept { return current().load(std::memory_order_acquire); }

void set_logger(std::shared_ptr<spdlog::logger> replacement) noexcept {
  current().store(replacement ? std::move(replacement) : make_default(), std::memory_order_release);
}

}  // namespace tenure
