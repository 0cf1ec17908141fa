#pragma once
/// \file
/// The job model shared by the public API, the engine and the storage adapters.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tenure/result.hpp"
#include "tenure/token.hpp"

namespace tenure {

using clock_type = std::chrono::system_clock;
using time_point = clock_type::time_point;

/// Every state a job can be in, as shown by the `tenure.jobs` view.
enum class job_state {
  scheduled,         ///< waiting for a future run_at (first run or snooze)
  available,         ///< ready to be claimed
  running,           ///< an attempt is open (claimed and not closed yet)
  waiting_external,  ///< the open attempt is parked on an external callback
  retryable,         ///< failed an attempt; waiting for its backoff before the next one
  completed,
  failed,
  cancelled,
};

std::string_view to_string(job_state s) noexcept;
/// Parses the names above; errc::invalid_argument for anything else.
result<job_state> parse_job_state(std::string_view s) noexcept;
/// True for completed, failed and cancelled.
constexpr bool is_terminal(job_state s) noexcept {
  return s == job_state::completed || s == job_state::failed || s == job_state::cancelled;
}

inline constexpr int k_min_priority = 1;  ///< highest
inline constexpr int k_max_priority = 4;  ///< lowest
inline constexpr int k_default_priority = 2;
inline constexpr int k_default_max_attempts = 25;
inline constexpr std::size_t k_max_kind_size = 255;
inline constexpr std::size_t k_max_queue_size = 128;
/// Most bytes a job's metadata may take as JSON text, as PostgreSQL prints it (`metadata::text`:
/// a space after each `:` and `,` of the compact form).
inline constexpr std::size_t k_max_metadata_size = 8192;
/// Most bytes a job's unique key may take.
inline constexpr std::size_t k_max_unique_key_size = 255;

/// A job to enqueue. Validate with `validate()`; every enqueue path does.
struct new_job {
  std::string kind;
  nlohmann::json args = nlohmann::json::object();
  std::string queue = "default";
  int priority = k_default_priority;
  std::optional<time_point> run_at;  ///< empty = now
  int max_attempts = k_default_max_attempts;
  /// Data about the job rather than for its handler, e.g. a W3C trace context
  /// (`{"traceparent": "00-<trace-id>-<span-id>-01"}`), a tenant or a request id: a JSON object of
  /// at most k_max_metadata_size bytes (JSON null is stored as `{}`). Handlers and middleware read
  /// it from job_context::metadata(); tenure itself never looks inside.
  nlohmann::json metadata = nlohmann::json::object();
  /// At most one live job (scheduled, available, running, waiting_external, retryable) of the
  /// queue holds a key: while one does, enqueueing another job with the key inserts nothing and
  /// answers the holder's id (try_enqueue says which happened). Once the holder is completed,
  /// failed or cancelled, the next enqueue with the key inserts a new job. 1..k_max_unique_key_size
  /// bytes of valid UTF-8 without control characters; unset (the default): no key.
  std::optional<std::string> unique_key;
};

/// What an enqueue did, as std::map::try_emplace tells it: the id of the job inserted, or, when
/// the job's unique key is held by a live job of its queue, that job's id and `inserted` false.
struct enqueue_result {
  std::int64_t id = 0;
  bool inserted = true;
  friend bool operator==(const enqueue_result&, const enqueue_result&) = default;
};

/// errc::invalid_argument, naming the field and what is wrong with it as the error's detail (e.g.
/// "priority 7 outside 1..4"), when a field is out of range: empty or oversized kind or queue, a kind
/// or queue with control characters (C0, DEL or C1) or invalid UTF-8, priority outside 1..4,
/// max_attempts < 1, args that are not a JSON object (a scalar, an array, or a discarded parse;
/// JSON null args are stored as `{}`), or args that hold a NUL character or invalid UTF-8 in a
/// string or key (jsonb cannot store them); metadata that is not a JSON object (null is stored
/// as `{}`), is longer than k_max_metadata_size, or holds what jsonb cannot store (the detail
/// starts with "metadata"); a unique_key that is empty, longer than k_max_unique_key_size bytes,
/// not valid UTF-8 or holds a control character (the detail starts with "unique_key"). run_at needs no check: a time_point cannot name a
/// time past 2262-04-11, the last one the SQL enqueue functions accept.
result<void> validate(const new_job& job);

/// One attempt handed to a worker by a claim.
struct claimed_attempt {
  attempt_id attempt;
  std::string queue;
  std::string kind;
  /// JSON text, as stored. Parse it, never compare it as text: PostgreSQL's jsonb normalises
  /// spacing and key order ({"n": 3, "to": "a"}), the SQLite fake does not.
  std::string args;
  /// The job's metadata as JSON text (parse it, as args); empty means `{}`.
  std::string metadata;
  int attempt_number = 0;  ///< executions so far, this one included (retry budget only)
  int max_attempts = 0;
  std::optional<time_point> deadline;  ///< hard deadline of this attempt, if the queue has one
  /// When the job became claimable, by the store's clock: its run_at, or its created_at when
  /// later (pickup latency counts from here). Unset when the store does not say.
  std::optional<time_point> available_at;
  attempt_secret secret;  ///< drawn by the store at claim time; what makes the token unguessable
  /// Set when this claim continues a parked attempt that an external system resumed: the resume
  /// payload (JSON text). The continuation keeps the attempt number under a new run lease and a
  /// new secret (the parked attempt was closed by the resume).
  std::optional<std::string> resumed_with;
  finalization_token token() const noexcept { return finalization_token{attempt, secret}; }
};

/// Everything known about one job, whatever table holds it.
struct job_info {
  std::int64_t id = 0;
  std::string queue;
  std::string kind;
  std::string args;  ///< JSON text
  std::string metadata = "{}";  ///< JSON text (an object)
  job_state state = job_state::available;
  int priority = k_default_priority;
  int attempt = 0;
  int max_attempts = k_default_max_attempts;
  std::int64_t run_lease = 0;
  time_point run_at;
  time_point created_at;
  std::optional<time_point> finalized_at;
  std::optional<std::string> last_error;
  std::optional<std::string> progress;  ///< JSON text
  bool dead_lettered = false;
  std::optional<std::string> unique_key;  ///< the key the job was enqueued with, if any
};

}  // namespace tenure
