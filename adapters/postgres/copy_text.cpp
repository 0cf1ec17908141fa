// The text the bulk enqueue over COPY sends: rows in COPY's text format and the COPY statement.
#include <algorithm>
#include <charconv>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "tenure/log.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/sql_text.hpp"

namespace tenure::postgres {
namespace {

/// `v` as one field of COPY's text format: backslash, tab, newline and carriage return escaped.
void append_field(std::string& out, std::string_view v) {
  std::size_t from = 0;  // the start of the run of bytes not yet appended
  for (std::size_t i = 0; i < v.size(); ++i) {
    const char* escaped = nullptr;
    switch (v[i]) {
      case '\\': escaped = "\\\\"; break;
      case '\t': escaped = "\\t"; break;
      case '\n': escaped = "\\n"; break;
      case '\r': escaped = "\\r"; break;
      default: continue;
    }
    out.append(v.data() + from, i - from);
    out += escaped;
    from = i + 1;
  }
  out.append(v.data() + from, v.size() - from);
}

/// A job's args or metadata as JSON text (null: `{}`); false when it cannot be serialized.
bool append_json(std::string& out, const nlohmann::json& v) {
  if (v.is_null() || (v.is_object() && v.empty())) {
    out += "{}";
    return true;
  }
  try {
    append_field(out, v.dump());
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

/// `v` in decimal, without a temporary string.
void append_int(std::string& out, long long v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// Appends the COPY text of jobs[from..] to `out`, whole rows, until `out` holds at least `bytes`
/// bytes or the jobs end; answers the index of the first job not written. For the stage, `ord`
/// (the job's place, from 1) first and run_at after priority; for `specs`, neither. The jobs
/// passed check_copy_rows().
result<std::size_t> append_copy_rows(std::string& out, std::span<const new_job> jobs, bool stage, std::size_t from,
                                     std::size_t bytes) {
  std::size_t i = from;
  for (; i < jobs.size() && out.size() < bytes; ++i) {
    const auto& j = jobs[i];
    if (stage) {
      append_int(out, static_cast<long long>(i + 1));
      out += '\t';
    }
    append_field(out, j.kind);
    out += '\t';
    if (!append_json(out, j.args)) return error{errc::invalid_argument, "args cannot be written as JSON text"};
    out += '\t';
    append_field(out, j.queue);
    out += '\t';
    append_int(out, j.priority);
    out += '\t';
    if (stage) {
      out += j.run_at ? timestamp_text(*j.run_at) : std::string{"\\N"};
      out += '\t';
    }
    append_int(out, j.max_attempts);
    out += '\t';
    if (!append_json(out, j.metadata)) return error{errc::invalid_argument, "metadata cannot be written as JSON text"};
    out += '\n';
  }
  return i;
}

/// The whole COPY text of `jobs` (checked here).
result<std::string> copy_rows(std::span<const new_job> jobs, bool stage) {
  TENURE_TRYV(check_copy_rows(jobs, stage));
  std::string out;
  out.reserve(jobs.size() * 48);
  TENURE_TRY(auto end, append_copy_rows(out, jobs, stage, 0, std::string::npos));
  (void)end;
  return out;
}

}  // namespace

result<void> check_copy_rows(std::span<const new_job> jobs, bool stage) {
  for (const auto& j : jobs) {
    TENURE_TRYV(validate(j));
    if (j.unique_key) return error{errc::invalid_argument, "a job with a unique_key cannot be enqueued over COPY"};
    if (!stage && j.run_at) return error{errc::invalid_argument, "a scheduled job cannot be copied straight into ready"};
  }
  return success();
}

result<bool> write_copy_rows(std::span<const new_job> jobs, bool stage,
                             const std::function<bool(std::string_view)>& put) {
  constexpr std::size_t piece_bytes = 64 * 1024;
  constexpr std::size_t chunk_bytes = 1 << 20;  // PQputCopyData takes an int length
  std::string piece;
  piece.reserve(piece_bytes + 512);
  for (std::size_t next = 0; next < jobs.size();) {
    piece.clear();
    TENURE_TRY(auto end, append_copy_rows(piece, jobs, stage, next, piece_bytes));
    next = end;
    // A piece ends at a row's end, so one large row can make it longer than a chunk.
    for (std::size_t at = 0; at < piece.size(); at += chunk_bytes) {
      if (!put(std::string_view{piece}.substr(at, chunk_bytes))) return false;
    }
  }
  return true;
}

result<std::string> enqueue_copy_rows(std::span<const new_job> jobs) { return copy_rows(jobs, true); }

result<std::string> enqueue_copy_ready_rows(std::span<const new_job> jobs) { return copy_rows(jobs, false); }

result<std::string> enqueue_copy_statement(std::optional<std::string_view> stage) {
  constexpr std::string_view prefix = "pg_temp.tenure_enqueue_";
  if (!stage || !stage->starts_with(prefix) || stage->size() == prefix.size() ||
      stage->find_first_not_of("0123456789", prefix.size()) != std::string_view::npos) {
    tenure::logger()->error("tenure: enqueue_copy_stage answered an unexpected stage name");
    return errc::protocol_error;
  }
  return "COPY " + std::string{*stage} + " (ord, kind, args, queue, priority, run_at, max_attempts, metadata) FROM STDIN";
}

result<copy_into> enqueue_copy_into(std::string_view answer, std::string_view schema, bool scheduled) {
  if (!valid_schema_name(schema)) return error{errc::invalid_argument, "invalid schema name '" + std::string{schema} + "'"};
  if (answer.size() == schema.size() + 6 && answer.starts_with(schema) && answer.ends_with(".specs")) {
    if (scheduled) {
      tenure::logger()->error("tenure: enqueue_copy_target answered specs for a batch with scheduled jobs");
      return errc::protocol_error;
    }
    return copy_into{.table = std::string{answer},
                     .sql = "COPY " + std::string{answer} +
                            " (kind, args, queue, priority, max_attempts, metadata) FROM STDIN",
                     .ready = true};
  }
  TENURE_TRY(auto sql, enqueue_copy_statement(answer));
  return copy_into{.table = std::string{answer}, .sql = std::move(sql), .ready = false};
}

bool any_scheduled(std::span<const new_job> jobs) noexcept {
  return std::any_of(jobs.begin(), jobs.end(), [](const new_job& j) { return j.run_at.has_value(); });
}

}  // namespace tenure::postgres
