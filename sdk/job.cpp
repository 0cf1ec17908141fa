#include "tenure/job.hpp"

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

bool has_control_chars(std::string_view s) noexcept {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

/// Characters, not bytes, as PostgreSQL's length() counts them (UTF-8 continuation bytes skipped).
std::size_t char_count(std::string_view s) noexcept {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
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

result<void> validate(const new_job& job) noexcept {
  if (job.kind.empty() || char_count(job.kind) > k_max_kind_size || has_control_chars(job.kind)) {
    return errc::invalid_argument;
  }
  if (job.queue.empty() || char_count(job.queue) > k_max_queue_size || has_control_chars(job.queue)) {
    return errc::invalid_argument;
  }
  if (job.priority < k_min_priority || job.priority > k_max_priority) return errc::invalid_argument;
  if (job.max_attempts < 1) return errc::invalid_argument;
  if (job.args.is_discarded()) return errc::invalid_argument;
  return success();
}

}  // namespace tenure
