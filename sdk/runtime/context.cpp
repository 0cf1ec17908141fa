// What a handler sees: job_outcome, job_context and caller_owned_context. Everything here runs
// on handler threads; the attempt's shared state lives in attempt_entry (thread-safe).
#include <algorithm>
#include <chrono>

#include "sdk/runtime/attempt_entry.hpp"
#include "tenure/runtime.hpp"

namespace tenure {

using std::chrono::milliseconds;

// ---- job_outcome / job_context ---------------------------------------------------------------

job_outcome job_outcome::completed(std::optional<nlohmann::json> progress) {
  job_outcome o;
  o.kind_ = kind::completed;
  o.progress_ = std::move(progress);
  return o;
}
job_outcome job_outcome::retry(std::string error) {
  job_outcome o;
  o.kind_ = kind::retry;
  o.message_ = std::move(error);
  return o;
}
job_outcome job_outcome::retry_after(milliseconds delay, std::string error) {
  job_outcome o = retry(std::move(error));
  o.delay_ = delay;
  return o;
}
job_outcome job_outcome::snooze(milliseconds delay) {
  job_outcome o;
  o.kind_ = kind::snooze;
  o.delay_ = delay;
  return o;
}
job_outcome job_outcome::fail(std::string error) {
  job_outcome o;
  o.kind_ = kind::fail;
  o.message_ = std::move(error);
  return o;
}
job_outcome job_outcome::cancel(std::string reason) {
  job_outcome o;
  o.kind_ = kind::cancel;
  o.message_ = std::move(reason);
  return o;
}

job_outcome job_outcome::park(std::string callback_id) {
  job_outcome o;
  o.kind_ = kind::park;
  o.callback_id_ = std::move(callback_id);
  return o;
}

job_context::job_context(std::shared_ptr<detail::attempt_entry> entry) : entry_(std::move(entry)) {}
std::int64_t job_context::job_id() const noexcept { return entry_->claim.attempt.job_id; }
std::int64_t job_context::run_lease() const noexcept { return entry_->claim.attempt.run_lease; }
int job_context::attempt() const noexcept { return entry_->claim.attempt_number; }
int job_context::max_attempts() const noexcept { return entry_->claim.max_attempts; }
const std::string& job_context::kind() const noexcept { return entry_->claim.kind; }
const std::string& job_context::queue() const noexcept { return entry_->claim.queue; }
const nlohmann::json& job_context::args() const { return entry_->args(); }
const nlohmann::json& job_context::metadata() const { return entry_->metadata(); }
finalization_token job_context::token() const noexcept { return entry_->claim.token(); }
std::optional<nlohmann::json> job_context::resumed_with() const {
  if (!entry_->claim.resumed_with) return std::nullopt;
  auto j = nlohmann::json::parse(*entry_->claim.resumed_with, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return nlohmann::json{};  // not JSON this process can read; never expected from jsonb
  return j;
}
bool job_context::is_cancelled() const noexcept { return entry_->is_cancelled(); }
bool job_context::wait_cancelled(milliseconds d) const {
  // wait_for(milliseconds::max()) would overflow the clock's deadline into the past and return
  // at once; anything past a century is "until cancelled".
  constexpr milliseconds k_forever = std::chrono::hours{24 * 365 * 100};
  std::unique_lock lock(entry_->mu);
  const auto until = [&] { return entry_->is_cancelled(); };
  if (d < k_forever) return entry_->cv.wait_for(lock, d, until);
  entry_->cv.wait(lock, until);
  return true;
}
void job_context::set_progress(int percent, std::string message, nlohmann::json metadata) {
  nlohmann::json p = {{"percent", percent}};
  if (!message.empty()) p["message"] = std::move(message);
  if (!metadata.is_null()) p["metadata"] = std::move(metadata);
  entry_->put_progress(entry_->storable_progress(p, "progress"));
}
result<bool> job_context::flush_progress() {
  const auto& a = entry_->claim.attempt;
  auto progress = entry_->take_progress();
  const std::optional<std::string> items[1] = {progress};
  auto r = entry_->with_store([&](storage_port& st) {
    return st.heartbeat(std::span<const attempt_id>{&a, 1}, progress ? std::span<const std::optional<std::string>>{items}
                                                                      : std::span<const std::optional<std::string>>{});
  });
  if (!r) {
    if (progress) entry_->restore_progress(*progress);
    return r.error();
  }
  for (const auto& live : r.value()) {
    if (live == a) return true;
  }
  entry_->cancel();  // rescued, cancelled or finished by someone else: the handler should stop
  return false;
}
result<std::string> job_context::register_callback(milliseconds timeout) {
  if (timeout.count() <= 0) return error{errc::invalid_argument, "callback timeout must be positive"};
  auto id = entry_->with_store(
      [&](storage_port& st) { return st.register_callback(entry_->claim.attempt, timeout); });
  if (!id && id.error() == errc::stale_attempt) entry_->cancel();
  return id;
}
result<nlohmann::json> job_context::wait_for_callback(const std::string& callback_id) {
  milliseconds backoff{20};
  constexpr milliseconds k_max_backoff{1'000};
  constexpr milliseconds k_min_poke_gap{100};
  for (;;) {
    const bool cancelled = entry_->is_cancelled();
    const auto pokes = entry_->pokes.load(std::memory_order_acquire);
    auto r = entry_->with_store(
        [&](storage_port& st) { return st.await_callback(entry_->claim.attempt, callback_id); });
    if (cancelled) {
      // One last look tells why: the attempt is gone (stale), was resumed just now, or is still
      // parked and this runtime is giving up on it (shutting down; it stays open until its
      // callback is resumed or times out).
      if (r && r.value().resumed) {
        entry_->delivered(callback_id);
        auto j = nlohmann::json::parse(r.value().payload, nullptr, /*allow_exceptions=*/false);
        if (!j.is_discarded()) return j;
      }
      if (!r) return r.error();
      return make_error_code(errc::shutting_down);
    }
    if (r && r.value().resumed) {
      entry_->delivered(callback_id);
      auto j = nlohmann::json::parse(r.value().payload, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return make_error_code(errc::protocol_error);
      return j;
    }
    if (!r) {
      if (r.error() == errc::stale_attempt) {
        entry_->cancel();  // rescued, cancelled, finished from outside, or the id was rotated
        return r.error();
      }
      // The store has no callbacks, or refused the id for good.
      if (r.error() == errc::unsupported || r.error() == errc::invalid_argument) return r.error();
      // A database error: keep waiting and ask again (the attempt stays parked or open).
    }
    // Sleep until the resume NOTIFY pokes us, the attempt is cancelled, or the backoff passes.
    // A poke is only a hint (any role can send the NOTIFY): polls it brings forward are at
    // least k_min_poke_gap apart, so a flood of them costs a bounded number of polls.
    const auto polled_at = entry_->time().steady_now();
    std::unique_lock lock(entry_->mu);
    const bool poked = entry_->cv.wait_for(lock, backoff, [&] {
      return entry_->is_cancelled() || entry_->pokes.load(std::memory_order_acquire) != pokes;
    });
    if (poked) {
      const auto since = entry_->time().steady_now() - polled_at;
      if (since < k_min_poke_gap) {
        entry_->cv.wait_for(lock, k_min_poke_gap - since, [&] { return entry_->is_cancelled(); });
      }
    }
    backoff = std::min(backoff * 2, k_max_backoff);
  }
}
result<std::optional<nlohmann::json>> job_context::previous_progress() {
  std::optional<std::string> text;
  bool read = false;
  {
    std::lock_guard lock(entry_->mu);
    read = entry_->checkpoint_read;
    text = entry_->checkpoint;
  }
  if (!read) {
    TENURE_TRY(text, entry_->with_store([&](storage_port& st) { return st.checkpoint(entry_->claim.attempt); }));
    std::lock_guard lock(entry_->mu);
    entry_->checkpoint_read = true;
    entry_->checkpoint = text;
  }
  if (!text) return std::optional<nlohmann::json>{};
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error_code(errc::protocol_error);
  return std::optional<nlohmann::json>{std::move(j)};
}

caller_owned_context::caller_owned_context(std::shared_ptr<detail::attempt_entry> entry, std::string sql_schema)
    : job_context(std::move(entry)), schema_(std::move(sql_schema)) {}

void caller_owned_context::note_failure(std::string why) {
  std::lock_guard lock(entry_->mu);
  entry_->failure_note = std::move(why);
}

finalize_options caller_owned_context::finalize_options_for(std::optional<nlohmann::json> progress) {
  finalize_options o;
  o.schema = schema_;
  if (progress) {
    o.progress = std::move(progress);
  } else if (auto buffered = entry_->peek_progress()) {
    // Progress set but not flushed yet becomes the final progress, in the same statement. It
    // stays buffered too: if this transaction rolls back, the next heartbeat still keeps it.
    auto j = nlohmann::json::parse(*buffered, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) o.progress = std::move(j);
  }
  return o;
}

std::string_view to_string(lifecycle_event e) noexcept {
  switch (e) {
    case lifecycle_event::started: return "started";
    case lifecycle_event::completed: return "completed";
    case lifecycle_event::retried: return "retried";
    case lifecycle_event::failed: return "failed";
    case lifecycle_event::cancelled: return "cancelled";
    case lifecycle_event::snoozed: return "snoozed";
    case lifecycle_event::rescued: return "rescued";
    case lifecycle_event::parked: return "parked";
  }
  return "unknown";
}

}  // namespace tenure
