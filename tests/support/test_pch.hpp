#pragma once
/// \file
/// What nearly every test translation unit includes, parsed once for all of them (see
/// tests/CMakeLists.txt). Only stable third-party and standard headers and tenure's public API.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/store.hpp"
#include "tenure/runtime.hpp"
