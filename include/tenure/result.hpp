#pragma once
/// \file
/// `tenure::result<T>`: Boost.Outcome's result over `tenure::error` (an error code and its detail).
#include <boost/outcome/std_result.hpp>
#include <utility>

#include "tenure/error.hpp"

namespace tenure {
namespace outcome = BOOST_OUTCOME_V2_NAMESPACE;

template <class T>
using result = outcome::std_result<T, error>;

using outcome::success;
}  // namespace tenure

#define TENURE_CONCAT_IMPL_(a, b) a##b
#define TENURE_CONCAT_(a, b) TENURE_CONCAT_IMPL_(a, b)
#define TENURE_TRY_IMPL_(tmp, lhs, ...)       \
  auto&& tmp = (__VA_ARGS__);                 \
  if (!tmp) return std::move(tmp).as_failure(); \
  lhs = std::move(tmp).value()

/// `TENURE_TRY(auto x, f());` or `TENURE_TRY(obj.field, f());`: on failure, return the error
/// from the enclosing function; else assign the value. (Spelled out here because the
/// BOOST_OUTCOME_TRY syntax changed between Boost versions.)
#define TENURE_TRY(lhs, ...) TENURE_TRY_IMPL_(TENURE_CONCAT_(tenure_try_, __COUNTER__), lhs, __VA_ARGS__)
/// `TENURE_TRYV(f());`: on failure, return the error from the enclosing function.
#define TENURE_TRYV(...)                                        \
  do {                                                          \
    auto&& tenure_tryv_ = (__VA_ARGS__);                        \
    if (!tenure_tryv_) return std::move(tenure_tryv_).as_failure(); \
  } while (0)
