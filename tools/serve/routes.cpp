// The routes: pages (/, /jobs, /jobs/{id}), the JSON API (/api/...), the assets and /metrics.
// Input is checked here (400 with a JSON error, or an error page); the database work is the
// shared operators' code (cli/admin.hpp) and the store.
#include "serve/routes.hpp"

#include <charconv>
#include <map>
#include <optional>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "cli/admin.hpp"
#include "cli/context.hpp"
#include "serve/assets.hpp"
#include "serve/html.hpp"

namespace tenure::serve {
namespace {

namespace admin = cli::admin;

constexpr int k_default_limit = 50;
constexpr int k_max_limit = 500;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// %XX decoded (and + as a space in a query); a broken escape is a 400.
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
  }
  return out;
}

struct target {
  std::vector<std::string> segments;  ///< the path's segments, each decoded
  std::map<std::string, std::string> query;
};

target parse_target(std::string_view t) {
  if (t.empty() || t[0] != '/') throw http_error(400, "the request target must be a path");
  target out;
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

/// A job id: digits only, 1 .. 2^63-1.
std::int64_t parse_id(std::string_view text, const char* what = "job id") {
  std::int64_t id = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || id <= 0 || text[0] == '+') {
    throw http_error(400, std::string{what} + " must be a positive integer");
  }
  return id;
}

struct jobs_query {
  admin::job_filter filter;
  int limit = k_default_limit;
  std::int64_t after_id = 0;
};

jobs_query parse_jobs_query(const std::map<std::string, std::string>& q) {
  jobs_query out;
  auto get = [&](const char* key) { auto it = q.find(key); return it == q.end() ? std::string{} : it->second; };
  out.filter.state = get("state");
  out.filter.queue = get("queue");
  out.filter.kind = get("kind");
  if (!out.filter.state.empty() && !parse_job_state(out.filter.state)) {
    throw http_error(400, "unknown state '" + out.filter.state +
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

/// Runs `f` on a database session. A value the database refuses (SQLSTATE class 22) is a 400; any
/// other failure a database_failure. A session that failed is dropped, never reused.
template <class F>
auto with_db(app& a, F&& f) {
  std::unique_ptr<cli::pg_session> s;
  try {
    s = a.take_session();
  } catch (const cli::command_error& e) {
    throw database_failure(e.what());
  }
  try {
    auto result = f(*s);
    a.give_back(std::move(s));
    return result;
  } catch (const cli::command_error& e) {
    const std::string state = s->last_sqlstate();
    if (state.starts_with("22")) {
      a.give_back(std::move(s));
      throw http_error(400, e.what());
    }
    throw database_failure(e.what(), state.empty() ? 503 : 500);
  }
}

/// A store call that failed: an unknown job is a 404, the rest the database's fault.
[[noreturn]] void store_failure(std::int64_t id, const tenure::error& e) {
  if (e == errc::job_not_found) throw http_error(404, "job " + std::to_string(id) + " not found");
  throw database_failure(cli::adapter_error("job " + std::to_string(id), e).what());
}

job_info read_job(app& a, std::int64_t id) {
  auto job = a.store().read_job(id);
  if (!job) store_failure(id, job.error());
  return std::move(job).value();
}

std::string dump(const admin::ordered_json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- the JSON API --------------------------------------------------------------------------------

response api_queues(app& a) {
  return with_db(a, [&](cli::pg_session& db) {
    admin::ordered_json out;
    out["schema"] = a.config().schema;
    out["queues"] = admin::ordered_json::array();
    for (const auto& q : admin::read_queues(db, a.config().schema)) out["queues"].push_back(admin::to_json(q));
    out["finished_per_minute"] = admin::to_json(admin::finished_per_minute(db, a.config().schema));
    return json_answer(200, dump(out));
  });
}

response api_jobs(app& a, const target& t) {
  const auto q = parse_jobs_query(t.query);
  return with_db(a, [&](cli::pg_session& db) {
    return json_answer(200, dump(admin::to_json(admin::list_jobs(db, a.config().schema, q.filter, q.limit, q.after_id))));
  });
}

response api_job(app& a, std::int64_t id) {
  const auto job = read_job(a, id);
  const auto attempt = with_db(a, [&](cli::pg_session& db) { return admin::read_attempt(db, a.config().schema, id); });
  auto fields = admin::job_fields(job);
  auto opt = [](const std::optional<std::string>& v) { return v ? admin::ordered_json(*v) : admin::ordered_json(); };
  fields["worker"] = opt(attempt.worker);
  fields["claimed_at"] = opt(attempt.claimed_at);
  fields["heartbeat_at"] = opt(attempt.heartbeat_at);
  return json_answer(200, admin::job_json_text(fields, job.args, job.metadata, -1));
}

response api_job_action(app& a, std::int64_t id, bool retry) {
  auto changed = retry ? a.store().retry_job(id) : a.store().cancel_job(id);
  if (!changed) store_failure(id, changed.error());
  const auto job = read_job(a, id);
  admin::ordered_json out;
  out["id"] = id;
  out[retry ? "retried" : "cancelled"] = changed.value();
  out["state"] = std::string{to_string(job.state)};
  if (!changed.value()) {
    out["error"] = "job " + std::to_string(id) + (retry ? " has not finished (" : " already finished (") +
                   std::string{to_string(job.state)} + ")";
    return json_answer(409, dump(out));
  }
  return json_answer(200, dump(out));
}

response api_pause(app& a, const std::string& queue, bool pause) {
  if (queue.empty()) throw http_error(400, "queue name is empty");
  return with_db(a, [&](cli::pg_session& db) {
    const bool changed = admin::set_paused(db, a.config().schema, queue, pause);
    admin::ordered_json out;
    out["queue"] = queue;
    out["paused"] = pause;
    out["changed"] = changed;
    return json_answer(200, dump(out));
  });
}

// ---- pages -----------------------------------------------------------------------------------------

response page_overview(app& a) {
  return with_db(a, [&](cli::pg_session& db) {
    const auto queues = admin::read_queues(db, a.config().schema);
    const auto minutes = admin::finished_per_minute(db, a.config().schema);
    return html_answer(200, render_overview(queues, minutes, a.actions_enabled()));
  });
}

response page_jobs(app& a, const target& t) {
  const auto q = parse_jobs_query(t.query);
  return with_db(a, [&](cli::pg_session& db) {
    const auto page = admin::list_jobs(db, a.config().schema, q.filter, q.limit, q.after_id);
    return html_answer(200, render_jobs(page, q.filter, q.limit, q.after_id, a.actions_enabled()));
  });
}

response page_job(app& a, std::int64_t id) {
  const auto job = read_job(a, id);
  const auto attempt = with_db(a, [&](cli::pg_session& db) { return admin::read_attempt(db, a.config().schema, id); });
  return html_answer(200, render_job(job, attempt, a.actions_enabled()));
}

response asset(const char* body, const char* type) {
  response res{http::status::ok, 11};
  res.set(http::field::content_type, type);
  res.set(http::field::cache_control, "no-cache");
  res.body() = body;
  return res;
}

void require_get(const request& req) {
  if (req.method() != http::verb::get) throw http_error(405, "only GET here", "GET");
}

/// A Host header naming a loopback address, with or without a port.
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

}  // namespace

response dispatch(app& a, const request& req, route_info& info) {
  if (a.config().loopback_hosts_only) {
    // HTTP/1.1 always names the host; a client that sends none is no browser (rebinding needs one).
    if (auto host = req.find(http::field::host);
        host != req.end() && !loopback_host(std::string_view{host->value().data(), host->value().size()})) {
      throw http_error(421, "this dashboard answers only requests addressed to a loopback host");
    }
  }
  const auto t = parse_target(std::string_view{req.target().data(), req.target().size()});
  const auto& s = t.segments;
  const auto n = s.size();
  auto route = [&](const char* pattern, bool html) {
    info.route = pattern;
    info.html = html;
  };
  if (n >= 1 && s[0] == "api") {
    if (n == 3 && s[1] == "jobs" && s[2] != "") {
      route("/api/jobs/{id}", false);
      require_get(req);
      return api_job(a, parse_id(s[2]));
    }
    if (n == 4 && s[1] == "jobs" && (s[3] == "retry" || s[3] == "cancel")) {
      route(s[3] == "retry" ? "/api/jobs/{id}/retry" : "/api/jobs/{id}/cancel", false);
      check_action(a, req);
      return api_job_action(a, parse_id(s[2]), s[3] == "retry");
    }
    if (n == 4 && s[1] == "queues" && (s[3] == "pause" || s[3] == "resume")) {
      route(s[3] == "pause" ? "/api/queues/{name}/pause" : "/api/queues/{name}/resume", false);
      check_action(a, req);
      return api_pause(a, s[2], s[3] == "pause");
    }
    if (n == 2 && s[1] == "queues") {
      route("/api/queues", false);
      require_get(req);
      return api_queues(a);
    }
    if (n == 2 && s[1] == "jobs") {
      route("/api/jobs", false);
      require_get(req);
      return api_jobs(a, t);
    }
    route("(unknown)", false);
    throw http_error(404, "no such API route");
  }
  if (n == 0) {
    route("/", true);
    require_get(req);
    return page_overview(a);
  }
  if (n == 1 && s[0] == "jobs") {
    route("/jobs", true);
    require_get(req);
    return page_jobs(a, t);
  }
  if (n == 2 && s[0] == "jobs") {
    route("/jobs/{id}", true);
    require_get(req);
    return page_job(a, parse_id(s[1]));
  }
  if (n == 2 && s[0] == "assets" && (s[1] == "app.js" || s[1] == "style.css")) {
    route("/assets/{file}", false);
    require_get(req);
    return s[1] == "app.js" ? asset(k_app_js, "text/javascript; charset=utf-8") : asset(k_style_css, "text/css; charset=utf-8");
  }
  if (n == 1 && s[0] == "metrics") {
    route("/metrics", false);
    require_get(req);
    response res{http::status::ok, 11};
    res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = a.stats().render();
    return res;
  }
  route("(unknown)", true);
  throw http_error(404, "no such page");
}

}  // namespace tenure::serve
