#pragma once
/// \file
/// Where the driver bridges (tenure/soci.hpp, tenure/libpq.hpp, tenure/pqxx.hpp) find tenure's SQL
/// functions when they enqueue on the caller's connection, and when a batch goes through COPY.
#include <cstddef>
#include <string>

namespace tenure {

struct sql_options {
  std::string schema = "tenure";  ///< where tenure is installed
  /// A batch of at least this many jobs, none with a unique key, enqueued inside the caller's
  /// transaction, goes through COPY instead of one enqueue_batch statement over arrays: straight
  /// into `ready` when no job is scheduled, else into a stage of the session (a temporary table)
  /// and one move into the job tables. Same checks, same all-or-nothing, ids in input order.
  /// 0: never. A transaction that touched a temporary table cannot PREPARE TRANSACTION: for
  /// two-phase commit set 0, or keep scheduled jobs out of large batches.
  std::size_t copy_threshold = 1000;
};

}  // namespace tenure
