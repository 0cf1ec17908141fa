// The dashboard's request parsing and routing (tools/serve/request.hpp): arbitrary request
// targets, Host headers and methods, without a database.
#include <set>

#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_check.hpp"
#include "serve/request.hpp"
#include "tenure/job.hpp"

namespace {

using namespace tenure::serve;

const std::set<std::string> k_routes = {
    "(unknown)", "/", "/jobs", "/jobs/{id}", "/assets/{file}", "/metrics", "/api/queues", "/api/jobs",
    "/api/jobs/{id}", "/api/jobs/{id}/retry", "/api/jobs/{id}/cancel", "/api/queues/{name}/pause",
    "/api/queues/{name}/resume"};

bool action(route_kind k) {
  return k == route_kind::api_job_retry || k == route_kind::api_job_cancel || k == route_kind::api_queue_pause ||
         k == route_kind::api_queue_resume;
}

std::string percent_encoded(std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    out += '%';
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const bool get = in.ConsumeBool();
  const bool loopback_only = in.ConsumeBool();
  const bool deny_actions = in.ConsumeBool();
  const bool has_host = in.ConsumeBool();
  const std::string host = in.ConsumeRandomLengthString(64);
  const std::string target = in.ConsumeRemainingBytesAsString();

  request_head head;
  head.get = get;
  head.target = target;
  if (has_host) head.host = host;
  route_info info;
  bool authorized = false;
  try {
    const auto r = resolve(head, loopback_only, [&] {
      if (deny_actions) throw http_error(401, "this action needs the bearer token");
      authorized = true;
    }, info);
    // Routed: a known route; reading routes are GET, actions passed the check; parameters in range.
    FUZZ_CHECK(k_routes.count(info.route) && info.route != "(unknown)");
    FUZZ_CHECK(action(r.kind) ? authorized : get);
    if (r.kind == route_kind::api_job || r.kind == route_kind::job_page || r.kind == route_kind::api_job_retry ||
        r.kind == route_kind::api_job_cancel) {
      FUZZ_CHECK(r.id > 0);
    }
    if (r.kind == route_kind::api_queue_pause || r.kind == route_kind::api_queue_resume) FUZZ_CHECK(!r.queue.empty());
    FUZZ_CHECK(r.jobs.limit >= 1 && r.jobs.limit <= k_max_limit);
    FUZZ_CHECK(r.jobs.after_id >= 0);
    FUZZ_CHECK(r.jobs.state.empty() || tenure::parse_job_state(r.jobs.state));
    if (loopback_only && has_host) FUZZ_CHECK(loopback_host(host));
    // What reaches the database as a text parameter holds no NUL: libpq would cut it there, and
    // the query would run for another name (a%00b for a).
    for (const auto* p : {&r.queue, &r.jobs.state, &r.jobs.queue, &r.jobs.kind}) {
      FUZZ_CHECK(p->find('\0') == std::string::npos);
    }
  } catch (const http_error& e) {
    // Refused: a 4xx with a message; 405 names the allowed method.
    FUZZ_CHECK(e.status == 400 || e.status == 401 || e.status == 404 || e.status == 405 || e.status == 421);
    FUZZ_CHECK(k_routes.count(info.route));
    FUZZ_CHECK(std::string_view{e.what()}.size() > 0);
    FUZZ_CHECK((e.status == 405) == !e.allow.empty());
    if (e.status == 401) FUZZ_CHECK(deny_actions);
  }

  // The target's parts, each percent-encoded, parse back to the same parts.
  try {
    const auto t = parse_target(target);
    std::string again;
    for (const auto& s : t.segments) again += "/" + percent_encoded(s);
    if (again.empty()) again = "/";
    std::string query;
    for (const auto& [k, v] : t.query) query += (query.empty() ? "?" : "&") + percent_encoded(k) + "=" + percent_encoded(v);
    const auto back = parse_target(again + query);
    // "/" has no segment; "/x/" ends with an empty one, which re-encodes as "/x/".
    FUZZ_CHECK(back.segments == t.segments);
    FUZZ_CHECK(back.query == t.query);
  } catch (const http_error& e) {
    FUZZ_CHECK(e.status == 400);
  }
  return 0;
}
