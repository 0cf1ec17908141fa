#pragma once
/// \file
/// Private to the bridges: the one place a finalization_receipt is made, from the row
/// `complete_job` returned inside the caller's transaction.
#include "tenure/finalization.hpp"

namespace tenure::detail {

struct receipt_access {
  static finalization_receipt make(const finalization_token& token, time_point completed_at) noexcept {
    return finalization_receipt{token, completed_at};
  }
};

}  // namespace tenure::detail
