#pragma once
/// \file
/// tenure's own logger. The library never writes to stdout and never to the application's
/// default spdlog logger: every line goes to the logger named "tenure" (stderr, level info, by
/// default). Replace it with your own spdlog logger (your sinks, your level) through set_logger(),
/// `runtime_config::logger` or `postgres::store_options::logger`.
///
/// Lines about an attempt name it as `job <id> lease <run_lease> queue <queue>`.
#include <memory>

#include <spdlog/logger.h>

namespace tenure {

/// The logger tenure writes to. Never null. Thread-safe.
std::shared_ptr<spdlog::logger> logger() noexcept;

/// Replaces the logger tenure writes to (process-wide, thread-safe); nullptr restores the
/// default one (stderr, level info). Lines already being written finish on the old logger.
void set_logger(std::shared_ptr<spdlog::logger> replacement) noexcept;

}  // namespace tenure
