#pragma once
/// \file
/// `tenure::result<T>`: Boost.Outcome's result over `std::error_code`.
#include <boost/outcome/std_result.hpp>
#include <boost/outcome/try.hpp>

#include "tenure/error.hpp"

namespace tenure {
namespace outcome = BOOST_OUTCOME_V2_NAMESPACE;

template <class T>
using result = outcome::std_result<T>;

using outcome::success;
}  // namespace tenure

/// Propagate a failed result from the enclosing function (see BOOST_OUTCOME_TRY).
#define TENURE_TRY BOOST_OUTCOME_TRY
