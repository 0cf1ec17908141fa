#pragma once
/// \file
/// Private to the bridges: the one place a finalization_receipt is made, from the row
/// `complete_job` returned inside the caller's transaction, and marked committed once the bridge
/// saw the server answer that transaction's COMMIT.
#include "tenure/finalization.hpp"

namespace tenure::detail {

struct receipt_access {
  static finalization_receipt make(const finalization_token& token, time_point completed_at) noexcept {
    return finalization_receipt{token, completed_at, false};
  }
  /// `r`, as the receipt of a transaction whose COMMIT the server answered.
  static finalization_receipt committed(const finalization_receipt& r) noexcept {
    return finalization_receipt{r.token(), r.completed_at(), true};
  }
};

}  // namespace tenure::detail
