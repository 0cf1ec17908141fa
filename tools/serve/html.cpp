#include "serve/html.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "cli/time_text.hpp"

namespace tenure::serve {
namespace {

using cli::admin::k_state_keys;

/// The page around a body: the navigation, and the token box (or the notice that actions are off).
std::string layout(std::string_view title, const std::string& body, bool actions) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>" + escape(title) + " - tenure</title>"
      "<link rel=\"stylesheet\" href=\"/assets/style.css\"><script src=\"/assets/app.js\" defer></script>"
      "</head><body><header><a class=\"brand\" href=\"/\">tenure</a><nav><a href=\"/\">Queues</a>"
      "<a href=\"/jobs\">Jobs</a><a href=\"/metrics\">Metrics</a></nav>";
  if (actions) {
    out += "<form id=\"token-form\" class=\"token\"><label for=\"token\">Token</label>"
           "<input type=\"password\" id=\"token\" autocomplete=\"off\" placeholder=\"bearer token for actions\">"
           "<button type=\"submit\">Use</button><span id=\"token-state\"></span></form>";
  } else {
    out += "<p class=\"notice\" id=\"actions-disabled\">Actions are disabled: this dashboard is read-only.</p>";
  }
  out += "</header><main><p id=\"message\" role=\"status\"></p>" + body + "</main></body></html>\n";
  return out;
}

/// A button the page script sends as POST (with the token) to `url`.
std::string action_button(const std::string& url, std::string_view label, std::string_view id) {
  return "<button type=\"button\" class=\"action\" id=\"" + escape(id) + "\" data-url=\"" + escape(url) + "\">" +
         escape(label) + "</button>";
}

std::string jobs_link(const cli::admin::job_filter& f, int limit, std::int64_t after_id) {
  std::string q;
  auto add = [&](std::string_view key, const std::string& value) {
    if (value.empty()) return;
    q += (q.empty() ? "?" : "&") + std::string{key} + "=" + url_encode(value);
  };
  add("state", f.state);
  add("queue", f.queue);
  add("kind", f.kind);
  if (limit != 50) add("limit", std::to_string(limit));
  if (after_id > 0) add("after_id", std::to_string(after_id));
  return "/jobs" + q;
}

std::string short_text(const std::string& text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  return text.substr(0, cut) + "…";
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string url_encode(std::string_view text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string render_chart(const std::vector<cli::admin::minute_count>& minutes) {
  constexpr int width = 720, height = 180, top = 16, bottom = 24, left = 40;
  std::int64_t peak = 1;
  std::int64_t completed = 0, failed = 0;
  for (const auto& m : minutes) {
    peak = std::max(peak, m.completed + m.failed);
    completed += m.completed;
    failed += m.failed;
  }
  const double plot_h = height - top - bottom;
  const double slot = minutes.empty() ? 0 : double(width - left - 8) / double(minutes.size());
  char buf[256];
  std::string svg = "<svg id=\"chart\" class=\"chart\" viewBox=\"0 0 " + std::to_string(width) + " " +
                    std::to_string(height) + "\" role=\"img\" aria-label=\"Finished jobs per minute, last hour: " +
                    std::to_string(completed) + " completed, " + std::to_string(failed) + " failed\">";
  std::snprintf(buf, sizeof buf,
                "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>"
                "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"end\">%lld</text>"
                "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>",
                left, height - bottom, width - 8, height - bottom, left - 6, top + 4, static_cast<long long>(peak),
                left - 6, height - bottom);
  svg += buf;
  for (std::size_t i = 0; i < minutes.size(); ++i) {
    const auto& m = minutes[i];
    const double x = left + slot * double(i) + 1;
    const double ok_h = plot_h * double(m.completed) / double(peak);
    const double bad_h = plot_h * double(m.failed) / double(peak);
    const double base = height - bottom;
    svg += "<g><title>" + escape(m.minute) + ": " + std::to_string(m.completed) + " completed, " +
           std::to_string(m.failed) + " failed</title>";
    std::snprintf(buf, sizeof buf,
                  "<rect class=\"ok\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>"
                  "<rect class=\"bad\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>",
                  x, base - ok_h, std::max(slot - 2, 1.0), ok_h, x, base - ok_h - bad_h, std::max(slot - 2, 1.0),
                  bad_h);
    svg += buf;
    svg += "</g>";
  }
  std::snprintf(buf, sizeof buf,
                "<text class=\"label\" x=\"%d\" y=\"%d\">60 min ago</text>"
                "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"end\">now (UTC minutes)</text>",
                left, height - 6, width - 8, height - 6);
  svg += buf;
  svg += "</svg>";
  return "<figure><figcaption>Finished jobs per minute, last hour: <span class=\"key ok\">" + std::to_string(completed) +
         " completed</span> <span class=\"key bad\">" + std::to_string(failed) + " failed</span></figcaption>" + svg +
         "</figure>";
}

std::string render_overview(const std::vector<cli::admin::queue_row>& queues,
                            const std::vector<cli::admin::minute_count>& minutes, bool actions) {
  std::string body = "<h1>Queues</h1>";
  if (queues.empty()) {
    body += "<p>No queues yet.</p>";
  } else {
    body += "<table id=\"queues\"><thead><tr><th>Queue</th><th>Status</th>";
    for (const char* s : k_state_keys) body += "<th>" + escape(s) + "</th>";
    if (actions) body += "<th></th>";
    body += "</tr></thead><tbody>";
    for (const auto& q : queues) {
      const std::string link = "/jobs?queue=" + url_encode(q.name);
      body += "<tr data-queue=\"" + escape(q.name) + "\"><td><a href=\"" + escape(link) + "\">" + escape(q.name) +
              "</a></td><td class=\"" + (q.paused ? "paused\">paused" : "running\">running") + "</td>";
      for (const char* s : k_state_keys) {
        const auto n = q.counts.contains(s) ? q.counts[s].dump() : "0";
        body += "<td class=\"count\" data-state=\"" + std::string{s} + "\"><a href=\"" +
                escape(link + "&state=" + s) + "\">" + escape(n) + "</a></td>";
      }
      if (actions) {
        const std::string base = "/api/queues/" + url_encode(q.name);
        body += "<td>" + (q.paused ? action_button(base + "/resume", "Resume", "resume-" + q.name)
                                   : action_button(base + "/pause", "Pause", "pause-" + q.name)) + "</td>";
      }
      body += "</tr>";
    }
    body += "</tbody></table>";
  }
  body += render_chart(minutes);
  return layout("Queues", body, actions);
}

std::string render_jobs(const cli::admin::job_page& page, const cli::admin::job_filter& filter, int limit,
                        std::int64_t after_id, bool actions) {
  std::string body = "<h1>Jobs</h1><form id=\"filters\" method=\"get\" action=\"/jobs\" class=\"filters\">"
                     "<label>State <select name=\"state\" id=\"state\"><option value=\"\">any</option>";
  for (const char* s : k_state_keys) {
    body += std::string{"<option value=\""} + s + "\"" + (filter.state == s ? " selected" : "") + ">" + s + "</option>";
  }
  body += "</select></label><label>Queue <input name=\"queue\" id=\"queue\" value=\"" + escape(filter.queue) +
          "\"></label><label>Kind <input name=\"kind\" id=\"kind\" value=\"" + escape(filter.kind) +
          "\"></label><label>Per page <input name=\"limit\" type=\"number\" min=\"1\" max=\"500\" value=\"" +
          std::to_string(limit) + "\"></label><button type=\"submit\" id=\"apply\">Filter</button></form>";
  if (page.jobs.empty()) {
    body += "<p id=\"no-jobs\">No jobs match.</p>";
  } else {
    body += "<table id=\"jobs\"><thead><tr><th>Id</th><th>State</th><th>Queue</th><th>Kind</th><th>Attempt</th>"
            "<th>Created</th><th>Finalized</th><th>Last error</th></tr></thead><tbody>";
    for (const auto& j : page.jobs) {
      const std::string id = std::to_string(j.id);
      body += "<tr data-id=\"" + id + "\"><td><a href=\"/jobs/" + id + "\">" + id + "</a></td><td class=\"state " +
              escape(j.state) + "\">" + escape(j.state) + (j.dead_lettered ? " (dead-lettered)" : "") + "</td><td>" +
              escape(j.queue) + "</td><td>" + escape(j.kind) + "</td><td>" + std::to_string(j.attempt) + "/" +
              std::to_string(j.max_attempts) + "</td><td>" + escape(j.created_at) + "</td><td>" +
              escape(j.finalized_at.value_or("")) + "</td><td>" + escape(short_text(j.last_error.value_or(""), 120)) +
              "</td></tr>";
    }
    body += "</tbody></table>";
  }
  body += "<p class=\"pages\">";
  if (after_id > 0) body += "<a id=\"newest\" href=\"" + escape(jobs_link(filter, limit, 0)) + "\">Newest</a> ";
  if (page.next_after_id) {
    body += "<a id=\"older\" href=\"" + escape(jobs_link(filter, limit, *page.next_after_id)) + "\">Older</a>";
  }
  body += "</p>";
  return layout("Jobs", body, actions);
}

std::string render_job(const job_info& j, const cli::admin::attempt_info& attempt, bool actions) {
  const std::string id = std::to_string(j.id);
  const std::string none = "-";
  std::string body = "<h1>Job " + id + "</h1>";
  if (actions) {
    body += "<p class=\"actions\">" + action_button("/api/jobs/" + id + "/retry", "Retry", "retry") + " " +
            action_button("/api/jobs/" + id + "/cancel", "Cancel", "cancel") + "</p>";
  }
  body += "<dl id=\"job\">";
  auto field = [&](std::string_view name, std::string_view key, const std::string& value, bool pre = false) {
    body += "<dt>" + escape(name) + "</dt><dd id=\"" + escape(key) + "\">" + (pre ? "<pre>" : "") + escape(value) +
            (pre ? "</pre>" : "") + "</dd>";
  };
  field("Kind", "kind", j.kind);
  field("Queue", "queue", j.queue);
  field("State", "state", std::string{to_string(j.state)} + (j.dead_lettered ? " (dead-lettered)" : ""));
  field("Args", "args", j.args, true);
  field("Metadata", "metadata", j.metadata, true);
  field("Unique key", "unique_key", j.unique_key.value_or(none));
  field("Attempt", "attempt", std::to_string(j.attempt) + " of " + std::to_string(j.max_attempts));
  field("Run lease", "run_lease", std::to_string(j.run_lease));
  field("Priority", "priority", std::to_string(j.priority));
  field("Progress", "progress", j.progress.value_or(none), true);
  field("Last error", "last_error", j.last_error.value_or(none), true);
  field("Worker", "worker", attempt.worker.value_or(none));
  field("Claimed at", "claimed_at", attempt.claimed_at.value_or(none));
  field("Heartbeat at", "heartbeat_at", attempt.heartbeat_at.value_or(none));
  field("Created at", "created_at", cli::format_iso8601(j.created_at));
  field("Run at", "run_at", cli::format_iso8601(j.run_at));
  field("Finalized at", "finalized_at", j.finalized_at ? cli::format_iso8601(*j.finalized_at) : none);
  body += "</dl>";
  return layout("Job " + id, body, actions);
}

std::string render_error(unsigned status, std::string_view message, bool actions) {
  return layout("Error", "<h1>Error " + std::to_string(status) + "</h1><p id=\"error\">" + escape(message) + "</p>",
                actions);
}

}  // namespace tenure::serve
