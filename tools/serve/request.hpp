#pragma once
/// \file
/// What `tenure serve` reads from a request before it touches the database: the target's path
/// and query (percent-decoded), the route it names, the job id and the job-list parameters, and
/// the Host check. Pure functions of the request text: no connection, no Beast types, so they
/// can be tested and fuzzed alone (tests/fuzz).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tenure::serve {

/// What the request was, for the metrics label and the error format.
struct route_info {
  std::string route = "(unknown)";  ///< the pattern, e.g. /api/jobs/{id}
  bool html = false;                ///< a page: errors are pages too
};

/// A request the dashboard refuses: 4xx with the message.
struct http_error : std::runtime_error {
  http_error(unsigned s, const std::string& message, std::string allow_methods = {})
      : std::runtime_error(message), status(s), allow(std::move(allow_methods)) {}
  unsigned status;
  std::string allow;  ///< for 405
};

inline constexpr int k_default_limit = 50;
inline constexpr int k_max_limit = 500;

/// A request target split into its path's segments (each percent-decoded; a trailing slash is an
/// empty last segment) and its query (keys and values decoded, `+` as a space; a repeated key
/// keeps its last value). Throws http_error 400 for a target that is not a path, a broken %XX or
/// a NUL character (%00), which no name holds and a query parameter cannot carry.
struct request_target {
  std::vector<std::string> segments;
  std::map<std::string, std::string> query;
};
request_target parse_target(std::string_view target);

/// A job id: base-10 digits only, 1 .. 2^63-1; anything else is http_error 400 naming `what`.
std::int64_t parse_id(std::string_view text, const char* what = "job id");

/// The job list's parameters: state (one of the job states), queue, kind, limit (1..k_max_limit)
/// and after_id (a job id). A bad one is http_error 400.
struct jobs_query {
  std::string state, queue, kind;
  int limit = k_default_limit;
  std::int64_t after_id = 0;
};
jobs_query parse_jobs_query(const std::map<std::string, std::string>& query);

/// A Host header naming a loopback address (127.x.y.z, [::1], localhost), with or without a port.
bool loopback_host(std::string_view host);

/// What the dashboard answers.
enum class route_kind {
  overview, jobs_page, job_page, asset_js, asset_css, metrics,
  api_queues, api_jobs, api_job, api_job_retry, api_job_cancel, api_queue_pause, api_queue_resume,
};

/// A routed request: the route and its parameters.
struct resolved_route {
  route_kind kind = route_kind::overview;
  std::int64_t id = 0;  ///< the job of a job route
  std::string queue;    ///< the queue of a pause/resume route (decoded, not empty)
  jobs_query jobs;      ///< the parameters of the job lists
};

/// The request line and Host of one request.
struct request_head {
  bool get = true;                      ///< the method is GET
  std::string_view target;              ///< as sent
  std::optional<std::string_view> host;  ///< the Host header, when there is one
};

/// Routes a request, in this order: the Host check (when `loopback_hosts_only`; 421), the target
/// (400), the route (404), GET for reading routes (405), then the route's parameters (400). An
/// action route calls `authorize` (which throws http_error) before its parameters are read.
/// `info` is filled as soon as the route is known, so a refusal is reported as that route's.
resolved_route resolve(const request_head& head, bool loopback_hosts_only, const std::function<void()>& authorize,
                       route_info& info);

}  // namespace tenure::serve
