#include "tenure/job.hpp"
#include "tenure/schema_name.hpp"

#include "sdk/runtime/storable.hpp"

#include <array>
#include <utility>

namespace tenure {
namespace {

constexpr std::array<std::pair<job_state, std::string_view>, 8> k_state_names{{
    {job_state::scheduled, "scheduled"},
    {job_state::available, "available"},
    {job_state::running, "running"},
    {job_state::waiting_external, "waiting_external"},
    {job_state::retryable, "retryable"},
    {job_state::completed, "completed"},
    {job_state::failed, "failed"},
    {job_state::cancelled, "cancelled"},
}};

/// Control characters as PostgreSQL's [[:cntrl:]] sees them in UTF-8: C0, DEL and C1
/// (U+0080..U+009F, encoded C2 80..C2 9F).
bool has_control_chars(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return true;
    if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) <= 0x9F) return true;
  }
  return false;
}

/// Characters, not bytes, as PostgreSQL's length() counts them (UTF-8 continuation bytes skipped).
std::size_t char_count(std::string_view s) noexcept {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

/// Text PostgreSQL accepts for a kind or a queue: valid UTF-8, printable, 1..max characters.
bool valid_name(std::string_view s, std::size_t max) noexcept {
  return !s.empty() && detail::is_storable_text(s) && char_count(s) <= max && !has_control_chars(s);
}

/// Bytes of `v` as PostgreSQL prints jsonb (`::text`): the compact form plus one space after
/// each `:` and `,` that separates members and elements. Strings escape alike on both sides;
/// numbers are counted as this process prints them (the server has the last word on the rare
/// number it prints longer, such as 1e+100).
std::size_t pg_json_text_size(const nlohmann::json& v) {
  if (v.empty() && v.is_object()) return 2;  // {}: the common case, without printing it
  const std::string text = v.dump();
  std::size_t n = text.size();
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == ':' || c == ',') {
      ++n;
    }
  }
  return n;
}

}  // namespace

std::string_view to_string(job_state s) noexcept {
  for (const auto& [state, name] : k_state_names) {
    if (state == s) return name;
  }
  return "unknown";
}

result<job_state> parse_job_state(std::string_view s) noexcept {
  for (const auto& [state, name] : k_state_names) {
    if (name == s) return state;
  }
  return errc::invalid_argument;
}

/// Why `s` is not a valid kind or queue name (`what`), or an empty string.
static std::string name_problem(std::string_view what, std::string_view s, std::size_t max) {
  if (s.empty()) return std::string{what} + " is empty";
  if (!detail::is_storable_text(s)) return std::string{what} + " is not valid UTF-8 or contains a NUL character";
  if (char_count(s) > max) {
    return std::string{what} + " has " + std::to_string(char_count(s)) + " characters, more than " + std::to_string(max);
  }
  if (has_control_chars(s)) return std::string{what} + " contains a control character";
  return {};
}

result<void> validate(const new_job& job) {
  if (!valid_name(job.kind, k_max_kind_size)) {
    return error{errc::invalid_argument, name_problem("kind", job.kind, k_max_kind_size)};
  }
  if (!valid_name(job.queue, k_max_queue_size)) {
    return error{errc::invalid_argument, name_problem("queue", job.queue, k_max_queue_size)};
  }
  if (job.priority < k_min_priority || job.priority > k_max_priority) {
    return error{errc::invalid_argument, "priority " + std::to_string(job.priority) + " outside " +
                                             std::to_string(k_min_priority) + ".." + std::to_string(k_max_priority)};
  }
  if (job.max_attempts < 1) {
    return error{errc::invalid_argument, "max_attempts " + std::to_string(job.max_attempts) + " is less than 1"};
  }
  // args are a JSON object (null is stored as {}), as the SQL enqueue functions require.
  if (!job.args.is_object() && !job.args.is_null()) {
    return error{errc::invalid_argument, std::string{"args must be a JSON object, not "} + job.args.type_name()};
  }
  // jsonb refuses \u0000 and text that is not UTF-8: refused here, by every store alike.
  if (!detail::is_storable_json(job.args)) {
    return error{errc::invalid_argument, "args hold a NUL character (\\u0000) or text that is not valid UTF-8, "
                                         "which PostgreSQL's jsonb cannot store"};
  }
  // metadata likewise, and bounded: it travels with every claim of the job.
  if (!job.metadata.is_object() && !job.metadata.is_null()) {
    return error{errc::invalid_argument, std::string{"metadata must be a JSON object, not "} + job.metadata.type_name()};
  }
  if (!detail::is_storable_json(job.metadata)) {
    return error{errc::invalid_argument, "metadata holds a NUL character (\\u0000) or text that is not valid UTF-8, "
                                         "which PostgreSQL's jsonb cannot store"};
  }
  if (!job.metadata.is_null()) {
    if (const auto size = pg_json_text_size(job.metadata); size > k_max_metadata_size) {
      return error{errc::invalid_argument, "metadata is " + std::to_string(size) + " bytes as JSON text, more than " +
                                               std::to_string(k_max_metadata_size)};
    }
  }
  if (job.unique_key) {
    const std::string_view key = *job.unique_key;
    if (key.empty()) return error{errc::invalid_argument, "unique_key is empty (leave it unset for no key)"};
    if (key.size() > k_max_unique_key_size) {
      return error{errc::invalid_argument, "unique_key has " + std::to_string(key.size()) + " bytes, more than " +
                                               std::to_string(k_max_unique_key_size)};
    }
    if (!detail::is_storable_text(key)) {
      return error{errc::invalid_argument, "unique_key is not valid UTF-8 or contains a NUL character"};
    }
    if (has_control_chars(key)) return error{errc::invalid_argument, "unique_key contains a control character"};
  }
  return success();
}

}  // namespace tenure

namespace tenure {

bool valid_schema_name(std::string_view schema) noexcept {
  if (schema.empty() || schema.size() > max_schema_name_size) return false;
  for (std::size_t i = 0; i < schema.size(); ++i) {
    const char c = schema[i];
    const bool ok = (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

}  // namespace tenure
