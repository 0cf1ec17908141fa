// The infrastructure of the routes: errors as answers, security headers, metrics, the checks in
// front of the actions, and the database sessions. The handlers are in routes.cpp.
#include "serve/app.hpp"

#include <chrono>

#include <spdlog/spdlog.h>

#include "cli/context.hpp"
#include "serve/html.hpp"
#include "serve/routes.hpp"

namespace tenure::serve {

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Every byte of the longer one is looked at, whatever matches; the length difference counts too.
  const std::size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

app::app(app_config config, std::unique_ptr<postgres::store> store)
    : config_(std::move(config)), store_(std::move(store)) {}

app::~app() = default;

std::unique_ptr<cli::pg_session> app::take_session() {
  {
    std::lock_guard lock(sessions_mutex_);
    if (!idle_sessions_.empty()) {
      auto s = std::move(idle_sessions_.back());
      idle_sessions_.pop_back();
      return s;
    }
  }
  auto s = std::make_unique<cli::pg_session>(config_.dsn);
  s->set_statement_timeout(config_.statement_timeout);
  return s;
}

void app::give_back(std::unique_ptr<cli::pg_session> s) {
  std::lock_guard lock(sessions_mutex_);
  if (idle_sessions_.size() < 4) idle_sessions_.push_back(std::move(s));
}

namespace {

/// Headers on every answer: no sniffing, no framing, no script but the server's own, no caching
/// of operators' data, no referrer leaving the dashboard.
void secure(response& res) {
  res.set("X-Content-Type-Options", "nosniff");
  res.set("X-Frame-Options", "DENY");
  res.set("Content-Security-Policy",
          "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
          "form-action 'self'; base-uri 'none'; frame-ancestors 'none'");
  res.set("Referrer-Policy", "no-referrer");
  res.set("Cross-Origin-Resource-Policy", "same-origin");
  if (!res.count(http::field::cache_control)) res.set(http::field::cache_control, "no-store");
}

}  // namespace

response app::handle(const request& req) {
  const auto start = std::chrono::steady_clock::now();
  route_info info;
  response res;
  auto fail = [&](unsigned status, const std::string& message) {
    res = info.html ? html_answer(status, render_error(status, message, actions_enabled()))
                    : json_error(status, message);
  };
  try {
    res = dispatch(*this, req, info);
  } catch (const http_error& e) {
    fail(e.status, e.what());
    if (e.status == 405) res.set(http::field::allow, e.allow);
    if (e.status == 401) res.set(http::field::www_authenticate, "Bearer");
  } catch (const database_failure& e) {
    metrics_.database_error();
    spdlog::warn("tenure serve: {} {}: {}", std::string{req.method_string()}, info.route, e.what());
    fail(e.status, e.what());
  } catch (const std::exception& e) {
    spdlog::error("tenure serve: {} {}: {}", std::string{req.method_string()}, info.route, e.what());
    fail(500, "internal error");
  }
  secure(res);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_.record(info.route, res.result_int(), seconds);
  return res;
}

response json_answer(unsigned status, std::string body) {
  response res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "application/json");
  res.body() = std::move(body) + "\n";
  return res;
}

response json_error(unsigned status, const std::string& message) {
  nlohmann::json body = {{"error", message}};
  return json_answer(status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

response html_answer(unsigned status, std::string body) {
  response res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, "text/html; charset=utf-8");
  res.body() = std::move(body);
  return res;
}

void check_action(app& a, const request& req) {
  if (req.method() != http::verb::post) throw http_error(405, "actions take POST", "POST");
  // A page of another site may make the browser send a POST here; refuse it before anything.
  // Browsers send Sec-Fetch-Site, and Origin on every POST; tools like curl send neither.
  if (auto site = req.find("Sec-Fetch-Site"); site != req.end()) {
    if (site->value() != "same-origin" && site->value() != "none") {
      throw http_error(403, "cross-origin request refused");
    }
  }
  if (auto origin = req.find(http::field::origin); origin != req.end()) {
    const auto host = req.find(http::field::host);
    if (host == req.end() || origin->value() != "http://" + std::string{host->value()}) {
      throw http_error(403, "cross-origin request refused");
    }
  }
  if (!a.actions_enabled()) throw http_error(403, "actions are disabled (read-only dashboard)");
  const auto auth = req.find(http::field::authorization);
  if (auth == req.end()) throw http_error(401, "this action needs the bearer token");
  const std::string_view value{auth->value().data(), auth->value().size()};
  constexpr std::string_view scheme = "Bearer ";
  if (value.size() <= scheme.size() || value.substr(0, scheme.size()) != scheme ||
      !constant_time_equal(std::string{value.substr(scheme.size())}, a.config().token)) {
    throw http_error(401, "wrong token");
  }
}

}  // namespace tenure::serve
