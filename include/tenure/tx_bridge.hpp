#pragma once
/// \file
/// The hook between caller_owned_context::complete_in_tx and the bridges: each bridge header
/// (tenure/soci.hpp, tenure/libpq.hpp, tenure/pqxx.hpp) specializes tx_bridge for its transaction
/// type. A bridge header needs only this and tenure/finalization.hpp, not the runtime.
#include "tenure/finalization.hpp"

namespace tenure {

/// Each bridge header specializes this for its transaction type (see tenure/finalization.hpp).
template <class Tx, class = void>
struct tx_bridge {
  static_assert(sizeof(Tx) == 0,
                "complete_in_tx: no bridge for this transaction type; include tenure/soci.hpp "
                "(soci::session&), tenure/libpq.hpp (PGconn*) or tenure/pqxx.hpp (pqxx::work&) and "
                "link the matching tenure:: target");
};

}  // namespace tenure
