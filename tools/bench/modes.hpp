#pragma once
/// \file
/// The `tenure bench` scenarios, one file each; `run` (bench.cpp) picks one and owns its schema.
#include <string>

#include <nlohmann/json.hpp>

#include "bench/bench.hpp"

namespace tenure::bench {

nlohmann::json run_runtime(const options& o, const std::string& schema);
nlohmann::json run_sql_limit(const options& o, const std::string& schema);
nlohmann::json run_enqueue_single(const options& o, const std::string& schema);
nlohmann::json run_caller_owned(const options& o, const std::string& schema);
nlohmann::json run_prune(const options& o, const std::string& schema);

}  // namespace tenure::bench
