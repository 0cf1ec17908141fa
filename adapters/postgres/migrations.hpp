#pragma once
/// \file
/// The migrations embedded in the library (generated from sql/*.sql at build time).
#include <span>
#include <string>
#include <string_view>

#include "tenure/result.hpp"

namespace tenure::postgres::detail {

struct migration {
  int version;       ///< 1, 2, ... in order
  const char* name;  ///< file name without extension
  const char* sql;   ///< text with @schema@, @wake_channel@, @cancel_channel@ placeholders
};

std::span<const migration> embedded_migrations() noexcept;

/// migrate(), stopping after migration `up_to`: how the upgrade tests install an older version.
result<int> migrate_up_to(std::string_view dsn, std::string_view schema, int up_to);

}  // namespace tenure::postgres::detail
