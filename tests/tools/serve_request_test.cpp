// The dashboard's request parsing and routing, without a database (tools/serve/request.hpp).
#include <gtest/gtest.h>

#include "serve/request.hpp"

namespace {

using namespace tenure::serve;

/// The status resolve() refuses the request with, or 0 when it routes it.
unsigned refusal(std::string_view target, bool get = true) {
  route_info info;
  try {
    resolve(request_head{get, target, std::nullopt}, true, [] {}, info);
    return 0;
  } catch (const http_error& e) {
    return e.status;
  }
}

TEST(serve_request, routes_a_job_list_with_its_parameters) {
  route_info info;
  const auto r = resolve(request_head{true, "/api/jobs?state=failed&queue=de%66ault+x&limit=20&after_id=7", "127.0.0.1:8080"},
                         true, [] {}, info);
  EXPECT_EQ(r.kind, route_kind::api_jobs);
  EXPECT_EQ(info.route, "/api/jobs");
  EXPECT_EQ(r.jobs.state, "failed");
  EXPECT_EQ(r.jobs.queue, "default x");
  EXPECT_EQ(r.jobs.limit, 20);
  EXPECT_EQ(r.jobs.after_id, 7);
}

// libpq ends a text parameter at its first NUL: "default%00x" would pause, or list, "default".
TEST(serve_request, a_nul_in_a_queue_name_is_refused_before_it_reaches_the_database) {
  EXPECT_EQ(refusal("/api/queues/default%00x/pause", false), 400u);
  EXPECT_EQ(refusal("/api/jobs?queue=default%00x"), 400u);
  EXPECT_EQ(refusal("/jobs?kind=a%00"), 400u);
  EXPECT_EQ(refusal(std::string_view{"/jobs?queue=a\0b", 15}), 400u);
  EXPECT_EQ(refusal("/api/queues/default/pause", false), 0u);
}

TEST(serve_request, an_action_is_authorized_before_its_parameters_are_read) {
  route_info info;
  try {
    resolve(request_head{false, "/api/jobs/abc/retry", std::nullopt}, true,
            [] { throw http_error(401, "this action needs the bearer token"); }, info);
    FAIL() << "routed";
  } catch (const http_error& e) {
    EXPECT_EQ(e.status, 401u);
    EXPECT_EQ(info.route, "/api/jobs/{id}/retry");
  }
}

TEST(serve_request, a_host_that_is_not_loopback_is_refused) {
  route_info info;
  EXPECT_THROW(resolve(request_head{true, "/", "evil.example:8080"}, true, [] {}, info), http_error);
  EXPECT_NO_THROW(resolve(request_head{true, "/", "evil.example:8080"}, false, [] {}, info));
  EXPECT_TRUE(loopback_host("[::1]:80"));
  EXPECT_TRUE(loopback_host("127.9.9.9"));
  EXPECT_FALSE(loopback_host("128.0.0.1"));
}

}  // namespace
