// The routes: pages (/, /jobs, /jobs/{id}), the JSON API (/api/...), the assets and /metrics.
// Input is checked here (400 with a JSON error, or an error page); the database work is the
// shared operators' code (cli/admin.hpp) and the store.
#include "serve/routes.hpp"

#include <optional>

#include "cli/admin.hpp"
#include "cli/context.hpp"
#include "serve/assets.hpp"
#include "serve/html.hpp"

namespace tenure::serve {
namespace {

namespace admin = cli::admin;

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

admin::job_filter filter_of(const jobs_query& q) { return admin::job_filter{q.state, q.queue, q.kind}; }

response api_jobs(app& a, const jobs_query& q) {
  return with_db(a, [&](cli::pg_session& db) {
    return json_answer(200, dump(admin::to_json(admin::list_jobs(db, a.config().schema, filter_of(q), q.limit, q.after_id))));
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

response page_jobs(app& a, const jobs_query& q) {
  return with_db(a, [&](cli::pg_session& db) {
    const auto filter = filter_of(q);
    const auto page = admin::list_jobs(db, a.config().schema, filter, q.limit, q.after_id);
    return html_answer(200, render_jobs(page, filter, q.limit, q.after_id, a.actions_enabled()));
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

}  // namespace

response dispatch(app& a, const request& req, route_info& info) {
  request_head head;
  head.get = req.method() == http::verb::get;
  head.target = std::string_view{req.target().data(), req.target().size()};
  if (auto host = req.find(http::field::host); host != req.end()) {
    head.host = std::string_view{host->value().data(), host->value().size()};
  }
  const auto r = resolve(head, a.config().loopback_hosts_only, [&] { check_action(a, req); }, info);
  switch (r.kind) {
    case route_kind::overview: return page_overview(a);
    case route_kind::jobs_page: return page_jobs(a, r.jobs);
    case route_kind::job_page: return page_job(a, r.id);
    case route_kind::asset_js: return asset(k_app_js, "text/javascript; charset=utf-8");
    case route_kind::asset_css: return asset(k_style_css, "text/css; charset=utf-8");
    case route_kind::metrics: {
      response res{http::status::ok, 11};
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = a.stats().render();
      return res;
    }
    case route_kind::api_queues: return api_queues(a);
    case route_kind::api_jobs: return api_jobs(a, r.jobs);
    case route_kind::api_job: return api_job(a, r.id);
    case route_kind::api_job_retry: return api_job_action(a, r.id, true);
    case route_kind::api_job_cancel: return api_job_action(a, r.id, false);
    case route_kind::api_queue_pause: return api_pause(a, r.queue, true);
    case route_kind::api_queue_resume: return api_pause(a, r.queue, false);
  }
  throw http_error(404, "no such page");
}

}  // namespace tenure::serve
