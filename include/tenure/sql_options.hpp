#pragma once
/// \file
/// Where the driver bridges (tenure/soci.hpp, tenure/libpq.hpp, tenure/pqxx.hpp) find tenure's SQL
/// functions when they enqueue on the caller's connection.
#include <string>

namespace tenure {

struct sql_options {
  std::string schema = "tenure";  ///< where tenure is installed
};

}  // namespace tenure
