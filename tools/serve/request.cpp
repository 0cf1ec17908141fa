// The request parsing and routing of `tenure serve` (request.hpp): no database, no Beast.
#include "serve/request.hpp"

#include <charconv>

#include <boost/asio/ip/address_v4.hpp>

#include "tenure/job.hpp"

namespace tenure::serve {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// %XX decoded (and + as a space in a query); a broken escape is a 400, and so is a NUL (%00):
/// libpq would end a query parameter there, so "a%00b" would name the queue "a".
std::string decode(std::string_view text, bool plus_is_space) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%') {
      if (i + 2 >= text.size()) throw http_error(400, "malformed percent-escape in the URL");
      const int hi = hex_digit(text[i + 1]);
      const int lo = hex_digit(text[i + 2]);
      if (hi < 0 || lo < 0) throw http_error(400, "malformed percent-escape in the URL");
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += plus_is_space && text[i] == '+' ? ' ' : text[i];
    }
    if (out.back() == '\0') throw http_error(400, "the URL holds a NUL character (%00)");
  }
  return out;
}

void require_get(const request_head& head) {
  if (!head.get) throw http_error(405, "only GET here", "GET");
}

}  // namespace

request_target parse_target(std::string_view t) {
  if (t.empty() || t[0] != '/') throw http_error(400, "the request target must be a path");
  request_target out;
  const auto q = t.find('?');
  std::string_view path = t.substr(0, q);
  if (q != std::string_view::npos) {
    std::string_view rest = t.substr(q + 1);
    while (!rest.empty()) {
      const auto amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      const auto eq = pair.find('=');
      if (!pair.empty()) {
        out.query[decode(pair.substr(0, eq), true)] = eq == std::string_view::npos ? "" : decode(pair.substr(eq + 1), true);
      }
      if (amp == std::string_view::npos) break;
      rest = rest.substr(amp + 1);
    }
  }
  path.remove_prefix(1);
  while (!path.empty()) {
    const auto slash = path.find('/');
    out.segments.push_back(decode(path.substr(0, slash), false));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
    if (path.empty()) out.segments.emplace_back();  // a trailing slash is a segment of its own
  }
  return out;
}

std::int64_t parse_id(std::string_view text, const char* what) {
  std::int64_t id = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || id <= 0 || text[0] == '+') {
    throw http_error(400, std::string{what} + " must be a positive integer");
  }
  return id;
}

jobs_query parse_jobs_query(const std::map<std::string, std::string>& q) {
  jobs_query out;
  auto get = [&](const char* key) { auto it = q.find(key); return it == q.end() ? std::string{} : it->second; };
  out.state = get("state");
  out.queue = get("queue");
  out.kind = get("kind");
  if (!out.state.empty() && !parse_job_state(out.state)) {
    throw http_error(400, "unknown state '" + out.state +
                              "': scheduled, available, running, waiting_external, retryable, completed, failed or "
                              "cancelled");
  }
  if (const auto limit = get("limit"); !limit.empty()) {
    int n = 0;
    const auto [end, ec] = std::from_chars(limit.data(), limit.data() + limit.size(), n);
    if (ec != std::errc{} || end != limit.data() + limit.size() || n < 1 || n > k_max_limit) {
      throw http_error(400, "limit must be an integer from 1 to " + std::to_string(k_max_limit));
    }
    out.limit = n;
  }
  if (const auto after = get("after_id"); !after.empty()) out.after_id = parse_id(after, "after_id");
  return out;
}

bool loopback_host(std::string_view host) {
  if (host.starts_with("[")) {
    const auto close = host.find(']');
    if (close == std::string_view::npos) return false;
    const auto rest = host.substr(close + 1);
    return host.substr(1, close - 1) == "::1" && (rest.empty() || rest.starts_with(":"));
  }
  const auto colon = host.find(':');
  const auto name = host.substr(0, colon);
  if (name == "localhost") return true;
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address_v4(std::string{name}, ec);
  return !ec && addr.is_loopback();
}

resolved_route resolve(const request_head& head, bool loopback_hosts_only, const std::function<void()>& authorize,
                       route_info& info) {
  // HTTP/1.1 always names the host; a client that sends none is no browser (rebinding needs one).
  if (loopback_hosts_only && head.host && !loopback_host(*head.host)) {
    throw http_error(421, "this dashboard answers only requests addressed to a loopback host");
  }
  const auto t = parse_target(head.target);
  const auto& s = t.segments;
  const auto n = s.size();
  resolved_route out;
  auto route = [&](route_kind kind, const char* pattern, bool html) {
    out.kind = kind;
    info.route = pattern;
    info.html = html;
  };
  if (n >= 1 && s[0] == "api") {
    if (n == 3 && s[1] == "jobs" && s[2] != "") {
      route(route_kind::api_job, "/api/jobs/{id}", false);
      require_get(head);
      out.id = parse_id(s[2]);
      return out;
    }
    if (n == 4 && s[1] == "jobs" && (s[3] == "retry" || s[3] == "cancel")) {
      if (s[3] == "retry") {
        route(route_kind::api_job_retry, "/api/jobs/{id}/retry", false);
      } else {
        route(route_kind::api_job_cancel, "/api/jobs/{id}/cancel", false);
      }
      authorize();
      out.id = parse_id(s[2]);
      return out;
    }
    if (n == 4 && s[1] == "queues" && (s[3] == "pause" || s[3] == "resume")) {
      if (s[3] == "pause") {
        route(route_kind::api_queue_pause, "/api/queues/{name}/pause", false);
      } else {
        route(route_kind::api_queue_resume, "/api/queues/{name}/resume", false);
      }
      authorize();
      if (s[2].empty()) throw http_error(400, "queue name is empty");
      out.queue = s[2];
      return out;
    }
    if (n == 2 && s[1] == "queues") {
      route(route_kind::api_queues, "/api/queues", false);
      require_get(head);
      return out;
    }
    if (n == 2 && s[1] == "jobs") {
      route(route_kind::api_jobs, "/api/jobs", false);
      require_get(head);
      out.jobs = parse_jobs_query(t.query);
      return out;
    }
    info.route = "(unknown)";
    info.html = false;
    throw http_error(404, "no such API route");
  }
  if (n == 0) {
    route(route_kind::overview, "/", true);
    require_get(head);
    return out;
  }
  if (n == 1 && s[0] == "jobs") {
    route(route_kind::jobs_page, "/jobs", true);
    require_get(head);
    out.jobs = parse_jobs_query(t.query);
    return out;
  }
  if (n == 2 && s[0] == "jobs") {
    route(route_kind::job_page, "/jobs/{id}", true);
    require_get(head);
    out.id = parse_id(s[1]);
    return out;
  }
  if (n == 2 && s[0] == "assets" && (s[1] == "app.js" || s[1] == "style.css")) {
    route(s[1] == "app.js" ? route_kind::asset_js : route_kind::asset_css, "/assets/{file}", false);
    require_get(head);
    return out;
  }
  if (n == 1 && s[0] == "metrics") {
    route(route_kind::metrics, "/metrics", false);
    require_get(head);
    return out;
  }
  info.route = "(unknown)";
  info.html = true;
  throw http_error(404, "no such page");
}

}  // namespace tenure::serve
