#pragma once
/// \file
/// The migrations embedded in the library (generated from sql/*.sql at build time).
#include <span>

namespace tenure::postgres::detail {

struct migration {
  int version;       ///< 1, 2, ... in order
  const char* name;  ///< file name without extension
  const char* sql;   ///< text with @schema@, @wake_channel@, @cancel_channel@ placeholders
};

std::span<const migration> embedded_migrations() noexcept;

}  // namespace tenure::postgres::detail
