#pragma once
/// \file
/// Private to tenure::sqlite: the handle's state, value and error conversions, the transaction
/// wrapper, and the row operations of the lifecycle tables that the store's files share (each
/// mirrors the PostgreSQL function it fakes, adapters/postgres/sql).
#include "tenure/sqlite/store.hpp"

#include <soci/boost-optional.h>
#include <soci/soci.h>
#include <soci/sqlite3/soci-sqlite3.h>  // declares SQLite's C API inside namespace sqlite_api

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tenure::sqlite::detail {

/// Everything behind one handle. `mutex` guards all of it.
struct store_state {
  store_state(const clock_port& c, std::uint64_t seed) : clock(c), rng(seed) {}
  std::mutex mutex;
  soci::session session;
  const clock_port& clock;
  std::mt19937_64 rng;  ///< backoff jitter
  std::random_device secrets;  ///< attempt secrets: the OS's random source, never the seeded rng
};

using microseconds = std::chrono::microseconds;
template <class T>
using opt = boost::optional<T>;  // SOCI 4.0 binds boost::optional as a nullable value

inline constexpr int k_schema_version = 5;  // 2: receipts.secret; 3: metadata; 4: job_keys; 5: callbacks
inline constexpr int k_max_claim = 10000;           // tenure.claim's bound
inline constexpr long long k_claim_promote_batch = 1000;  // what tenure.claim_attempts promotes
inline constexpr long long k_promote_batch = 10000;        // what the port's promote_due moves
inline constexpr std::size_t k_max_error_chars = 65536;

/// The statements that create the schema (schema.cpp), each run on its own: SQLite prepares only
/// the first statement of a string.
const std::vector<std::string>& schema_statements();

// ---- values ---------------------------------------------------------------------------------

std::int64_t to_us(time_point t) noexcept;

time_point from_us(std::int64_t us) noexcept;

std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept;

template <class T>
std::optional<T> to_std(const opt<T>& o) {
  return o ? std::optional<T>(*o) : std::nullopt;
}

template <class T>
opt<T> to_boost(const std::optional<T>& o) {
  return o ? opt<T>(*o) : opt<T>();
}

/// tenure.bound_error: at most 65536 characters (code points, as PostgreSQL's length() counts),
/// saying how much was cut.
std::string bound_error(std::string_view error);

/// PostgreSQL's text form of a non-negative interval of microseconds ("00:00:30", "01:30:00.5").
std::string interval_text(microseconds d);

/// JSON text jsonb would accept: well-formed, and no \u0000 or invalid UTF-8 in its strings.
bool valid_json(const std::optional<std::string>& text);

/// Args as stored. nlohmann throws for strings that are not UTF-8; PostgreSQL rejects those too.
result<std::string> args_text(const new_job& job) noexcept;

// ---- errors ---------------------------------------------------------------------------------

std::error_code map_sqlite_code(int code) noexcept;

/// `ec` with `message` as its detail (just `ec` should the text not fit in memory).
error with_detail(std::error_code ec, std::string_view message) noexcept;

/// Maps the exception in flight. SOCI reports every failure by throwing; nothing escapes a call.
/// SOCI's message only: its context names the statement's bound values, secrets among them.
error map_current_exception() noexcept;

void rollback_quietly(soci::session& s) noexcept;

enum class tx_mode { read, write };

/// Runs `body(session, now_us)` as one transaction under the handle's mutex: commits when it
/// returns a value, rolls back when it returns an error or throws. Writes take SQLite's write
/// lock up front (BEGIN IMMEDIATE) so a transaction never has to upgrade a read lock, which
/// SQLite could only refuse; pure reads use a deferred BEGIN (a consistent snapshot is enough).
/// `now` is read once, after BEGIN, like PostgreSQL's transaction-stable now().
template <class T, class Body>
result<T> transact(store_state& st, tx_mode mode, Body&& body) noexcept {
  std::lock_guard lock(st.mutex);
  try {
    st.session << (mode == tx_mode::write ? "BEGIN IMMEDIATE" : "BEGIN");
  } catch (...) {
    return map_current_exception();
  }
  try {
    const std::int64_t now = to_us(st.clock.now());
    result<T> r = body(st.session, now);
    if (!r) {
      rollback_quietly(st.session);
      return r;
    }
    st.session << "COMMIT";
    return r;
  } catch (...) {
    rollback_quietly(st.session);
    return map_current_exception();
  }
}

// ---- rows -----------------------------------------------------------------------------------

/// One job as the lifecycle tables hold it. A job's row moves between tables; its id and run
/// lease travel with it.
struct job_row {
  std::int64_t id = 0;
  std::string queue, kind, args;
  int priority = 0, attempt = 0, max_attempts = 0;
  std::int64_t run_lease = 0, run_at = 0, created_at = 0;
  std::optional<std::string> last_error, progress;
  std::string metadata = "{}";
  /// A parked attempt's continuation: the callback's payload, kept in ready, deferred and
  /// receipts (not in done or dead_letter) until the job ends.
  std::optional<std::string> resume_payload;
};

inline constexpr const char* k_job_columns =
    "id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at, "
    "last_error, progress, metadata";

enum class table { ready, deferred, done, dead_letter };

const char* name_of(table t) noexcept;

/// Reads one row by id from ready, deferred, done or dead_letter.
std::optional<job_row> load(soci::session& s, table t, std::int64_t id);

/// Removes and returns one row by id.
std::optional<job_row> take(soci::session& s, table t, std::int64_t id);

/// Inserts a row. `state` is the deferred/done state; `finalized_at` is set for done and
/// dead_letter rows.
void insert(soci::session& s, table t, const job_row& r, const char* state = nullptr,
            std::optional<std::int64_t> finalized_at = std::nullopt);

/// Removes an open attempt (receipt and materialized lease) and returns it as a job row whose
/// progress is the attempt's live progress, else the progress it carried in.
std::optional<job_row> take_receipt(soci::session& s, attempt_id a);

bool receipt_exists(soci::session& s, attempt_id a);

bool job_exists(soci::session& s, std::int64_t id);

struct queue_policy {
  bool dead_letter = false;
  std::optional<std::int64_t> hard_deadline;
  std::int64_t backoff_base = 1'000'000;
  std::int64_t backoff_cap = 3'600'000'000;
};

/// The queue's row, or the defaults of the schema when it has none.
queue_policy policy_of(soci::session& s, const std::string& queue);

/// A fresh attempt secret shaped as PostgreSQL's gen_random_uuid() makes it: a version-4 UUID,
/// 122 random bits, so it is never all zero.
attempt_secret draw_secret(std::random_device& source);

/// tenure.backoff: equal jitter, d/2 + rand * d/2 with d = min(cap, base * 2^(attempt - 1)).
std::int64_t backoff_us(const queue_policy& p, int attempt, std::mt19937_64& rng);

/// tenure.promote_due: due deferred rows of `queue` (every queue when empty) to ready, oldest
/// run_at first, at most `max_jobs`. Returns how many moved.
std::int64_t promote(soci::session& s, std::int64_t now, const opt<std::string>& queue,
                     long long max_jobs);

/// Inserts a validated job whose args are already serialized (tenure.enqueue).
void insert_new(soci::session& s, std::int64_t id, const new_job& job, std::string args,
                std::int64_t now);

/// The live job (ready, deferred or receipts) of `queue` that holds `key`, if any.
std::optional<std::int64_t> key_holder(soci::session& s, const std::string& queue, const std::string& key);

/// Reserves `n` consecutive job ids; returns the first.
std::int64_t next_ids(soci::session& s, std::int64_t n);

/// The first non-empty progress of every distinct attempt, ordered by (job_id, run_lease): the
/// `DISTINCT ON ... ORDER BY progress IS NULL` of heartbeat_batch and complete_batch.
template <class Item, class AttemptOf, class ProgressOf>
std::map<attempt_id, std::optional<std::string>> distinct_attempts(std::span<const Item> items,
                                                                   AttemptOf attempt_of,
                                                                   ProgressOf progress_of) {
  std::map<attempt_id, std::optional<std::string>> out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto& progress = progress_of(i);
    auto [it, inserted] = out.try_emplace(attempt_of(items[i]), progress);
    if (!inserted && !it->second && progress) it->second = progress;
  }
  return out;
}

/// tenure.enqueue_one: inserts `job` unless a live job of its queue holds its unique key.
enqueue_result enqueue_one(soci::session& s, const new_job& job, std::string args, std::int64_t now);

/// cancel_attempt's body (also the running branch of cancel_job). false when stale.
bool cancel_attempt_in_tx(soci::session& s, attempt_id a, std::string_view reason,
                          std::int64_t now);

/// Fails the attempt in the caller's transaction (store::fail and fail_callback).
result<job_state> fail_in_tx(soci::session& s, std::mt19937_64& rng, attempt_id attempt, std::string_view error,
                             fail_disposition disposition,
                             std::optional<std::chrono::microseconds> retry_after, std::int64_t now);

// ---- external callbacks (0002_callbacks.sql, 0014_parked_callbacks.sql) ---------------------

/// The attempt is parked on its callback (a blocking waiter or a parked one).
bool is_waiting(soci::session& s, attempt_id a);
/// Parked on a callback: no handler holds it (a heartbeat neither keeps it nor answers it live).
bool is_parked(soci::session& s, attempt_id a);

/// One callback row as read by its id.
struct callback_row {
  attempt_id attempt;
  std::int64_t timeout = 0;
  opt<std::int64_t> deadline;
  bool waiting = false, parked = false, resumed = false;
  opt<std::string> payload;
};

/// The callback `id` of a live attempt (its receipt open), or nothing.
std::optional<callback_row> live_callback(soci::session& s, const std::string& id);

/// tenure.continue_parked: the parked attempt goes back to ready with its run lease, attempt
/// count and latest progress, and the resume payload (its callback goes with the receipt).
void continue_parked(soci::session& s, attempt_id a, const std::string& payload, std::int64_t now);

/// A fresh callback id shaped as gen_random_uuid() prints it.
std::string draw_callback_id(std::random_device& source);

}  // namespace tenure::sqlite::detail
