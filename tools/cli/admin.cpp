#include "cli/admin.hpp"

#include <cstdlib>

#include "cli/time_text.hpp"

namespace tenure::cli::admin {
namespace {

constexpr const char* k_iso_second = "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'";

std::string text(const std::optional<std::string>& v) { return v.value_or(""); }

/// Parsed JSON from the database, keys put in `order` (jsonb keeps its own order).
ordered_json ordered(const std::optional<std::string>& text, const auto& order) {
  ordered_json out = ordered_json::object();
  if (!text) return out;
  auto v = ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!v.is_object()) return out;
  for (const char* key : order) out[key] = v.contains(key) ? v[key] : ordered_json();
  return out;
}

}  // namespace

std::string where_of(const job_filter& f, std::vector<std::string>& params) {
  std::string sql;
  auto add = [&](const char* column, const std::string& value) {
    if (value.empty()) return;
    params.push_back(value);
    sql += std::string{" AND "} + column + " = $" + std::to_string(params.size());
  };
  add("state", f.state);
  add("queue", f.queue);
  add("kind", f.kind);
  return sql;
}

job_page list_jobs(pg_session& db, const std::string& schema, const job_filter& f, int limit, std::int64_t after_id) {
  std::vector<std::string> params;
  std::string sql = std::string{"SELECT id, state, queue, kind, attempt, max_attempts, "} +
                    "to_char(created_at AT TIME ZONE 'UTC', " + k_iso_second + "), " +
                    "to_char(finalized_at AT TIME ZONE 'UTC', " + k_iso_second + "), last_error, " +
                    "dead_lettered FROM " + db.quote_ident(schema) + ".jobs WHERE true" + where_of(f, params);
  if (after_id > 0) {
    params.push_back(std::to_string(after_id));
    sql += " AND id < $" + std::to_string(params.size()) + "::bigint";
  }
  params.push_back(std::to_string(limit));
  sql += " ORDER BY id DESC LIMIT $" + std::to_string(params.size()) + "::int";
  const auto rows = db.query(sql, params, "cannot list jobs");
  job_page page;
  for (const auto& r : rows) {
    job_row j;
    j.id = std::stoll(text(r[0]));
    j.state = text(r[1]);
    j.queue = text(r[2]);
    j.kind = text(r[3]);
    j.attempt = std::stoi(text(r[4]));
    j.max_attempts = std::stoi(text(r[5]));
    j.created_at = text(r[6]);
    j.finalized_at = r[7];
    j.last_error = r[8];
    j.dead_lettered = text(r[9]) == "t";
    page.jobs.push_back(std::move(j));
  }
  // A full page may have more after it: the keyset to ask for the next one.
  if (static_cast<int>(page.jobs.size()) == limit && !page.jobs.empty()) page.next_after_id = page.jobs.back().id;
  return page;
}

ordered_json to_json(const job_page& page) {
  ordered_json out;
  out["jobs"] = ordered_json::array();
  for (const auto& r : page.jobs) {
    ordered_json j;
    j["id"] = r.id;
    j["state"] = r.state;
    j["queue"] = r.queue;
    j["kind"] = r.kind;
    j["attempt"] = r.attempt;
    j["max_attempts"] = r.max_attempts;
    j["created_at"] = r.created_at;
    j["finalized_at"] = r.finalized_at ? ordered_json(*r.finalized_at) : nullptr;
    j["last_error"] = r.last_error ? ordered_json(*r.last_error) : nullptr;
    j["dead_lettered"] = r.dead_lettered;
    out["jobs"].push_back(std::move(j));
  }
  out["next_after_id"] = page.next_after_id ? ordered_json(*page.next_after_id) : nullptr;
  return out;
}

std::vector<queue_row> read_queues(pg_session& db, const std::string& schema, const std::optional<std::string>& only) {
  const auto rows = db.query("SELECT queue, paused, settings::text, counts::text, extract(epoch FROM oldest_available) "
                             "FROM " + db.quote_ident(schema) + ".list_queues() q "
                             "WHERE $1 = '' OR q.queue = $1",
                             {only.value_or("")}, "cannot list queues");
  std::vector<queue_row> out;
  for (const auto& r : rows) {
    if (!r[0]) continue;
    if (only && *r[0] != *only) continue;
    queue_row q;
    q.name = *r[0];
    q.paused = r[1] && *r[1] == "t";
    q.settings = ordered(r[2], k_setting_keys);
    q.counts = ordered(r[3], k_state_keys);
    if (r[4]) q.oldest_available_seconds = std::strtod(r[4]->c_str(), nullptr);
    out.push_back(std::move(q));
  }
  return out;
}

ordered_json ordered_settings(const std::optional<std::string>& text) { return ordered(text, k_setting_keys); }

ordered_json to_json(const queue_row& q) {
  ordered_json item;
  item["name"] = q.name;
  item["paused"] = q.paused;
  item["settings"] = q.settings;
  item["counts"] = q.counts;
  item["oldest_available_seconds"] =
      q.oldest_available_seconds ? ordered_json(*q.oldest_available_seconds) : ordered_json();
  return item;
}

std::vector<minute_count> finished_per_minute(pg_session& db, const std::string& schema,
                                              const std::optional<std::string>& queue) {
  // Counted first (one pass over the last hour's terminal jobs), then laid on 60 minutes so a
  // quiet minute is a zero, not a gap.
  const auto rows = db.query(
      "WITH span AS (SELECT date_trunc('minute', now()) - interval '59 minutes' AS since), "
      "c AS (SELECT date_trunc('minute', j.finalized_at) AS m, "
      "             count(*) FILTER (WHERE j.state = 'completed') AS completed, "
      "             count(*) FILTER (WHERE j.state = 'failed') AS failed "
      "        FROM " + db.quote_ident(schema) + ".jobs j, span "
      "       WHERE j.state IN ('completed', 'failed') AND j.finalized_at >= span.since "
      "         AND ($1 = '' OR j.queue = $1) GROUP BY 1) "
      "SELECT to_char(g AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI\"Z\"'), coalesce(c.completed, 0), "
      "       coalesce(c.failed, 0) "
      "  FROM span, generate_series(span.since, date_trunc('minute', now()), interval '1 minute') g "
      "  LEFT JOIN c ON c.m = g ORDER BY g",
      {queue.value_or("")}, "cannot count finished jobs");
  std::vector<minute_count> out;
  out.reserve(rows.size());
  for (const auto& r : rows) {
    out.push_back({text(r[0]), std::stoll(text(r[1])), std::stoll(text(r[2]))});
  }
  return out;
}

ordered_json to_json(const std::vector<minute_count>& minutes) {
  ordered_json out = ordered_json::array();
  for (const auto& m : minutes) {
    out.push_back({{"minute", m.minute}, {"completed", m.completed}, {"failed", m.failed}});
  }
  return out;
}

bool set_paused(pg_session& db, const std::string& schema, const std::string& queue, bool paused) {
  const auto rows = db.query("SELECT " + db.quote_ident(schema) + (paused ? ".pause_queue($1)" : ".resume_queue($1)"),
                             {queue}, std::string{"cannot "} + (paused ? "pause" : "resume") + " queue " + printable(queue));
  return !rows.empty() && rows[0][0] && *rows[0][0] == "t";
}

attempt_info read_attempt(pg_session& db, const std::string& schema, std::int64_t job_id) {
  const auto rows = db.query(std::string{"SELECT worker, to_char(claimed_at AT TIME ZONE 'UTC', "} + k_iso_second +
                                 "), to_char(heartbeat_at AT TIME ZONE 'UTC', " + k_iso_second + ") FROM " +
                                 db.quote_ident(schema) + ".jobs WHERE id = $1::bigint AND claimed_at IS NOT NULL",
                             {std::to_string(job_id)}, "cannot read the job's attempt");
  if (rows.empty()) return {};
  return {rows[0][0], rows[0][1], rows[0][2]};
}

ordered_json json_value(const std::string& text) {
  auto v = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? ordered_json(text) : v;
}

ordered_json job_fields(const job_info& j) {
  ordered_json out;
  out["id"] = j.id;
  out["kind"] = j.kind;
  out["queue"] = j.queue;
  out["state"] = std::string{to_string(j.state)};
  out["args"] = nullptr;  // replaced by the text the database holds
  out["priority"] = j.priority;
  out["attempt"] = j.attempt;
  out["max_attempts"] = j.max_attempts;
  out["run_lease"] = j.run_lease;
  out["run_at"] = format_iso8601(j.run_at);
  out["created_at"] = format_iso8601(j.created_at);
  out["finalized_at"] = j.finalized_at ? ordered_json(format_iso8601(*j.finalized_at)) : nullptr;
  out["last_error"] = j.last_error ? ordered_json(*j.last_error) : nullptr;
  out["progress"] = j.progress ? json_value(*j.progress) : nullptr;
  out["dead_lettered"] = j.dead_lettered;
  out["metadata"] = nullptr;  // replaced by the text the database holds, as args
  out["unique_key"] = j.unique_key ? ordered_json(*j.unique_key) : nullptr;
  return out;
}

std::string job_json_text(const ordered_json& fields, const std::string& args_text,
                          const std::string& metadata_text, int indent) {
  // Members are printed one by one to splice the args and metadata texts in. User data (kinds, errors) may hold
  // invalid UTF-8: it becomes U+FFFD instead of an exception.
  auto dump = [](const ordered_json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  const std::string pad = indent >= 0 ? "\n" + std::string(static_cast<std::size_t>(indent), ' ') : "";
  const std::string colon = indent >= 0 ? ": " : ":";
  std::string text = "{";
  bool first = true;
  for (const auto& [key, value] : fields.items()) {
    text += first ? pad : "," + pad;
    first = false;
    text += ordered_json(key).dump() + colon;
    text += key == "args" ? args_text : key == "metadata" ? metadata_text : dump(value);
  }
  text += indent >= 0 ? "\n}" : "}";
  return text;
}

}  // namespace tenure::cli::admin
