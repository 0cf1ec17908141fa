#pragma once
/// \file
/// The routes of `tenure serve` (routes.cpp) and what they share with app.cpp.
#include <stdexcept>
#include <string>

#include "serve/app.hpp"
#include "serve/http.hpp"
#include "serve/request.hpp"

namespace tenure::serve {

/// The database failed or could not be reached: 503 (counted in the metrics).
struct database_failure : std::runtime_error {
  explicit database_failure(const std::string& message, unsigned s = 503) : std::runtime_error(message), status(s) {}
  unsigned status;
};

/// Routes the request; throws http_error, database_failure.
response dispatch(app& a, const request& req, route_info& info);

response json_answer(unsigned status, std::string body);
response json_error(unsigned status, const std::string& message);
response html_answer(unsigned status, std::string body);

/// The checks in front of every action, in order: POST (405), same origin (403), actions on
/// (403), the bearer token (401).
void check_action(app& a, const request& req);

}  // namespace tenure::serve
