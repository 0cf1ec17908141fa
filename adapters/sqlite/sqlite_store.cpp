#include "tenure/sqlite/store.hpp"

#include "sdk/runtime/storable.hpp"

#include <soci/boost-optional.h>
#include <soci/soci.h>
#include <soci/sqlite3/soci-sqlite3.h>  // declares SQLite's C API inside namespace sqlite_api

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure::sqlite {
namespace detail {

/// Everything behind one handle. `mutex` guards all of it.
struct store_state {
  store_state(const clock_port& c, std::uint64_t seed) : clock(c), rng(seed) {}
  std::mutex mutex;
  soci::session session;
  const clock_port& clock;
  std::mt19937_64 rng;  ///< backoff jitter
  std::random_device secrets;  ///< attempt secrets: the OS's random source, never the seeded rng
};

}  // namespace detail

namespace {

using std::chrono::microseconds;
using detail::store_state;
template <class T>
using opt = boost::optional<T>;  // SOCI 4.0 binds boost::optional as a nullable value

constexpr int k_schema_version = 5;  // 2: receipts.secret; 3: metadata; 4: job_keys; 5: callbacks
constexpr int k_max_claim = 10000;           // tenure.claim's bound
constexpr long long k_claim_promote_batch = 1000;  // what tenure.claim_attempts promotes
constexpr long long k_promote_batch = 10000;        // what the port's promote_due moves
constexpr std::size_t k_max_error_chars = 65536;

// Each statement runs on its own: SQLite prepares only the first statement of a string.
const std::vector<std::string>& schema_statements() {
  static const std::vector<std::string> statements = {
      // Durations and timestamps are int64 microseconds (timestamps from the injected clock).
      "CREATE TABLE queues ("
      " name TEXT PRIMARY KEY, dead_letter INTEGER NOT NULL DEFAULT 0, hard_deadline INTEGER,"
      " backoff_base INTEGER NOT NULL DEFAULT 1000000,"
      " backoff_cap INTEGER NOT NULL DEFAULT 3600000000,"
      " CHECK (hard_deadline IS NULL OR hard_deadline > 0),"
      " CHECK (backoff_base >= 0 AND backoff_cap >= backoff_base))",
      // PostgreSQL's job_id_seq. Unlike a sequence it rolls back with its transaction; ids are
      // still never handed out twice.
      "CREATE TABLE job_id_seq (last_value INTEGER NOT NULL)",
      "INSERT INTO job_id_seq (last_value) VALUES (0)",
      "CREATE TABLE ready ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " last_error TEXT, progress TEXT, metadata TEXT NOT NULL DEFAULT '{}',"
      " resume_payload TEXT)",  // set: the continuation of a parked attempt (same lease)
      "CREATE INDEX ready_claim_idx ON ready (queue, priority, id)",
      "CREATE TABLE deferred ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " last_error TEXT, progress TEXT, metadata TEXT NOT NULL DEFAULT '{}',"
      " state TEXT NOT NULL CHECK (state IN ('scheduled', 'retryable')))",
      "CREATE INDEX deferred_queue_due_idx ON deferred (queue, run_at)",
      "CREATE INDEX deferred_due_idx ON deferred (run_at)",
      "CREATE TABLE receipts ("
      " job_id INTEGER NOT NULL, run_lease INTEGER NOT NULL, queue TEXT NOT NULL,"
      " kind TEXT NOT NULL, args TEXT NOT NULL, priority INTEGER NOT NULL,"
      " attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL, run_at INTEGER NOT NULL,"
      " created_at INTEGER NOT NULL, claimed_at INTEGER NOT NULL, deadline_at INTEGER,"
      " worker TEXT, last_error TEXT, progress TEXT,"
      " secret TEXT NOT NULL,"  // the attempt's secret, 32 hex digits
      " metadata TEXT NOT NULL DEFAULT '{}',"
      " PRIMARY KEY (job_id, run_lease))",
      // No foreign key, as in the SQL; this fake deletes an attempt's row when it closes.
      "CREATE TABLE attempt_state ("
      " job_id INTEGER NOT NULL, run_lease INTEGER NOT NULL, heartbeat_at INTEGER NOT NULL,"
      " progress TEXT, PRIMARY KEY (job_id, run_lease))",
      // An open attempt's callback (PostgreSQL keeps it in attempt_state); times in microseconds.
      "CREATE TABLE callbacks ("
      " callback_id TEXT PRIMARY KEY, job_id INTEGER NOT NULL, run_lease INTEGER NOT NULL,"
      " timeout INTEGER NOT NULL, deadline INTEGER, waiting INTEGER NOT NULL DEFAULT 0,"
      " parked INTEGER NOT NULL DEFAULT 0, resumed INTEGER NOT NULL DEFAULT 0, payload TEXT,"
      " UNIQUE (job_id, run_lease))",
      "CREATE TABLE done ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " state TEXT NOT NULL CHECK (state IN ('completed', 'failed', 'cancelled')),"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " finalized_at INTEGER NOT NULL, last_error TEXT, progress TEXT,"
      " metadata TEXT NOT NULL DEFAULT '{}')",
      "CREATE TABLE dead_letter ("
      " id INTEGER PRIMARY KEY, queue TEXT NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,"
      " priority INTEGER NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
      " run_lease INTEGER NOT NULL, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
      " finalized_at INTEGER NOT NULL, last_error TEXT, progress TEXT,"
      " metadata TEXT NOT NULL DEFAULT '{}')",
      // Each keyed job's unique key. The job of (queue, unique_key) that is live holds it: this
      // fake serializes its writers, so no lock table is needed.
      "CREATE TABLE job_keys ("
      " job_id INTEGER PRIMARY KEY, queue TEXT NOT NULL, unique_key TEXT NOT NULL)",
      "CREATE INDEX job_keys_key_idx ON job_keys (queue, unique_key)",
      "CREATE VIEW jobs AS"
      " SELECT id, queue, kind, args, 'available' AS state, priority, attempt, max_attempts,"
      "        run_lease, run_at, created_at, NULL AS finalized_at, last_error, progress,"
      "        0 AS dead_lettered, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = ready.id) AS unique_key FROM ready"
      " UNION ALL"
      " SELECT id, queue, kind, args, state, priority, attempt, max_attempts, run_lease, run_at,"
      "        created_at, NULL, last_error, progress, 0, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = deferred.id) FROM deferred"
      " UNION ALL"
      " SELECT r.job_id, r.queue, r.kind, r.args,"
      "        CASE WHEN EXISTS (SELECT 1 FROM callbacks c WHERE c.job_id = r.job_id"
      "                            AND c.run_lease = r.run_lease AND c.waiting)"
      "             THEN 'waiting_external' ELSE 'running' END, r.priority, r.attempt,"
      "        r.max_attempts, r.run_lease, r.run_at, r.created_at, NULL, r.last_error,"
      "        coalesce(s.progress, r.progress), 0, r.metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = r.job_id)"
      "   FROM receipts r LEFT JOIN attempt_state s"
      "     ON s.job_id = r.job_id AND s.run_lease = r.run_lease"
      " UNION ALL"
      " SELECT id, queue, kind, args, state, priority, attempt, max_attempts, run_lease, run_at,"
      "        created_at, finalized_at, last_error, progress, 0, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = done.id) FROM done"
      " UNION ALL"
      " SELECT id, queue, kind, args, 'failed', priority, attempt, max_attempts, run_lease,"
      "        run_at, created_at, finalized_at, last_error, progress, 1, metadata,"
      "        (SELECT k.unique_key FROM job_keys k WHERE k.job_id = dead_letter.id) FROM dead_letter",
      "PRAGMA user_version = " + std::to_string(k_schema_version),
  };
  return statements;
}

// ---- values ---------------------------------------------------------------------------------

std::int64_t to_us(time_point t) noexcept {
  return std::chrono::floor<microseconds>(t.time_since_epoch()).count();
}
time_point from_us(std::int64_t us) noexcept { return time_point{microseconds{us}}; }

std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    using limits = std::numeric_limits<std::int64_t>;
    return b > 0 ? limits::max() : limits::min();
  }
  return r;
}

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
std::string bound_error(std::string_view error) {
  std::size_t chars = 0;
  std::size_t cut = error.size();
  for (std::size_t i = 0; i < error.size(); ++i) {
    if ((static_cast<unsigned char>(error[i]) & 0xC0) == 0x80) continue;  // continuation byte
    if (chars == k_max_error_chars) cut = i;
    ++chars;
  }
  if (chars <= k_max_error_chars) return std::string(error);
  return std::string(error.substr(0, cut)) + " ... [truncated " +
         std::to_string(chars - k_max_error_chars) + " characters]";
}

/// PostgreSQL's text form of a non-negative interval of microseconds ("00:00:30", "01:30:00.5").
std::string interval_text(microseconds d) {
  const auto total = static_cast<unsigned long long>(d.count());
  const unsigned long long us = total % 1'000'000, s = total / 1'000'000;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%02llu:%02llu:%02llu", s / 3600, s / 60 % 60, s % 60);
  std::string text = buf;
  if (us != 0) {
    std::snprintf(buf, sizeof buf, ".%06llu", us);
    std::string frac = buf;
    while (frac.back() == '0') frac.pop_back();
    text += frac;
  }
  return text;
}

/// JSON text jsonb would accept: well-formed, and no \u0000 or invalid UTF-8 in its strings.
bool valid_json(const std::optional<std::string>& text) {
  if (!text) return true;
  const auto parsed = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  return !parsed.is_discarded() && tenure::detail::is_storable_json(parsed);
}

/// Args as stored. nlohmann throws for strings that are not UTF-8; PostgreSQL rejects those too.
result<std::string> args_text(const new_job& job) noexcept {
  try {
    return job.args.is_null() ? std::string("{}") : job.args.dump();
  } catch (...) {
    return errc::invalid_argument;
  }
}

// ---- errors ---------------------------------------------------------------------------------

std::error_code map_sqlite_code(int code) noexcept {
  switch (code & 0xff) {  // the primary result code
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return errc::transient_conflict;
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
      // A failed SQLite transaction is rolled back whole: nothing is known to be written.
      return errc::database_unavailable;
    default:
      return errc::database_error;
  }
}

/// `ec` with `message` as its detail (just `ec` should the text not fit in memory).
error with_detail(std::error_code ec, std::string_view message) noexcept {
  try {
    return error{ec, std::string{message}};
  } catch (...) {
    return ec;
  }
}

/// Maps the exception in flight. SOCI reports every failure by throwing; nothing escapes a call.
/// SOCI's message only: its context names the statement's bound values, secrets among them.
error map_current_exception() noexcept {
  try {
    throw;
  } catch (const soci::sqlite3_soci_error& e) {
    const auto ec = map_sqlite_code(e.result());
    try {
      const std::string message = e.get_error_message();
      if (ec != errc::transient_conflict) tenure::logger()->warn("tenure.sqlite: {}", message);
      return with_detail(ec, message);
    } catch (...) {
      return ec;
    }
  } catch (const soci::soci_error& e) {
    try {
      const std::string message = e.get_error_message();
      tenure::logger()->warn("tenure.sqlite: {}", message);
      return with_detail(errc::database_error, message);
    } catch (...) {
      return errc::database_error;
    }
  } catch (const std::exception& e) {
    tenure::logger()->warn("tenure.sqlite: {}", e.what());
    return with_detail(errc::database_error, e.what());
  } catch (...) {
    return errc::database_error;
  }
}

void rollback_quietly(soci::session& s) noexcept {
  try {
    s << "ROLLBACK";
  } catch (...) {  // no transaction left to roll back: SQLite already did
  }
}

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
};

constexpr const char* k_job_columns =
    "id, queue, kind, args, priority, attempt, max_attempts, run_lease, run_at, created_at, "
    "last_error, progress, metadata";

enum class table { ready, deferred, done, dead_letter };

const char* name_of(table t) noexcept {
  switch (t) {
    case table::ready: return "ready";
    case table::deferred: return "deferred";
    case table::done: return "done";
    case table::dead_letter: return "dead_letter";
  }
  return "";
}

/// Reads one row by id from ready, deferred, done or dead_letter.
std::optional<job_row> load(soci::session& s, table t, std::int64_t id) {
  job_row r;
  opt<std::string> last_error, progress;
  s << "SELECT " << k_job_columns << " FROM " << name_of(t) << " WHERE id = :id",
      soci::into(r.id), soci::into(r.queue), soci::into(r.kind), soci::into(r.args),
      soci::into(r.priority), soci::into(r.attempt), soci::into(r.max_attempts),
      soci::into(r.run_lease), soci::into(r.run_at), soci::into(r.created_at),
      soci::into(last_error), soci::into(progress), soci::into(r.metadata), soci::use(id);
  if (!s.got_data()) return std::nullopt;
  r.last_error = to_std(last_error);
  r.progress = to_std(progress);
  return r;
}

/// Removes and returns one row by id.
std::optional<job_row> take(soci::session& s, table t, std::int64_t id) {
  auto r = load(s, t, id);
  if (r) s << "DELETE FROM " << name_of(t) << " WHERE id = :id", soci::use(id);
  return r;
}

/// Inserts a row. `state` is the deferred/done state; `finalized_at` is set for done and
/// dead_letter rows.
void insert(soci::session& s, table t, const job_row& r, const char* state = nullptr,
            std::optional<std::int64_t> finalized_at = std::nullopt) {
  const opt<std::string> last_error = to_boost(r.last_error), progress = to_boost(r.progress);
  std::string columns = k_job_columns;
  std::string values =
      ":id, :queue, :kind, :args, :priority, :attempt, :max_attempts, :run_lease, :run_at, "
      ":created_at, :last_error, :progress, :metadata";
  // Statements with a variable set of bindings use SOCI's explicit exchange API.
  soci::statement st(s);
  st.exchange(soci::use(r.id, "id"));
  st.exchange(soci::use(r.queue, "queue"));
  st.exchange(soci::use(r.kind, "kind"));
  st.exchange(soci::use(r.args, "args"));
  st.exchange(soci::use(r.priority, "priority"));
  st.exchange(soci::use(r.attempt, "attempt"));
  st.exchange(soci::use(r.max_attempts, "max_attempts"));
  st.exchange(soci::use(r.run_lease, "run_lease"));
  st.exchange(soci::use(r.run_at, "run_at"));
  st.exchange(soci::use(r.created_at, "created_at"));
  st.exchange(soci::use(last_error, "last_error"));
  st.exchange(soci::use(progress, "progress"));
  st.exchange(soci::use(r.metadata, "metadata"));
  const std::string state_text = state ? state : "";
  if (state) {
    columns += ", state";
    values += ", :state";
    st.exchange(soci::use(state_text, "state"));
  }
  const std::int64_t finalized = finalized_at.value_or(0);
  if (finalized_at) {
    columns += ", finalized_at";
    values += ", :finalized_at";
    st.exchange(soci::use(finalized, "finalized_at"));
  }
  st.alloc();
  st.prepare(std::string("INSERT INTO ") + name_of(t) + " (" + columns + ") VALUES (" + values +
             ")");
  st.define_and_bind();
  st.execute(true);
}

/// Removes an open attempt (receipt and materialized lease) and returns it as a job row whose
/// progress is the attempt's live progress, else the progress it carried in.
std::optional<job_row> take_receipt(soci::session& s, attempt_id a) {
  job_row r;
  opt<std::string> last_error, progress;
  s << "SELECT r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt, r.max_attempts,"
       "       r.run_lease, r.run_at, r.created_at, r.last_error, coalesce(s.progress, r.progress),"
       "       r.metadata"
       "  FROM receipts r LEFT JOIN attempt_state s"
       "    ON s.job_id = r.job_id AND s.run_lease = r.run_lease"
       " WHERE r.job_id = :job_id AND r.run_lease = :run_lease",
      soci::into(r.id), soci::into(r.queue), soci::into(r.kind), soci::into(r.args),
      soci::into(r.priority), soci::into(r.attempt), soci::into(r.max_attempts),
      soci::into(r.run_lease), soci::into(r.run_at), soci::into(r.created_at),
      soci::into(last_error), soci::into(progress), soci::into(r.metadata), soci::use(a.job_id, "job_id"),
      soci::use(a.run_lease, "run_lease");
  if (!s.got_data()) return std::nullopt;
  r.last_error = to_std(last_error);
  r.progress = to_std(progress);
  s << "DELETE FROM attempt_state WHERE job_id = :job_id AND run_lease = :run_lease",
      soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  s << "DELETE FROM callbacks WHERE job_id = :job_id AND run_lease = :run_lease",
      soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  s << "DELETE FROM receipts WHERE job_id = :job_id AND run_lease = :run_lease",
      soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  return r;
}

bool receipt_exists(soci::session& s, attempt_id a) {
  int n = 0;
  s << "SELECT count(*) FROM receipts WHERE job_id = :job_id AND run_lease = :run_lease",
      soci::into(n), soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  return n > 0;
}

bool job_exists(soci::session& s, std::int64_t id) {
  int n = 0;
  s << "SELECT count(*) FROM jobs WHERE id = :id", soci::into(n), soci::use(id);
  return n > 0;
}

struct queue_policy {
  bool dead_letter = false;
  std::optional<std::int64_t> hard_deadline;
  std::int64_t backoff_base = 1'000'000;
  std::int64_t backoff_cap = 3'600'000'000;
};

/// The queue's row, or the defaults of the schema when it has none.
queue_policy policy_of(soci::session& s, const std::string& queue) {
  queue_policy p;
  int dead_letter = 0;
  opt<std::int64_t> hard_deadline;
  std::int64_t base = 0, cap = 0;
  s << "SELECT dead_letter, hard_deadline, backoff_base, backoff_cap FROM queues"
       " WHERE name = :name",
      soci::into(dead_letter), soci::into(hard_deadline), soci::into(base), soci::into(cap),
      soci::use(queue);
  if (s.got_data()) p = {dead_letter != 0, to_std(hard_deadline), base, cap};
  return p;
}

/// tenure.backoff: equal jitter, d/2 + rand * d/2 with d = min(cap, base * 2^(attempt - 1)).
/// A fresh attempt secret shaped as PostgreSQL's gen_random_uuid() makes it: a version-4 UUID,
/// 122 random bits, so it is never all zero.
attempt_secret draw_secret(std::random_device& source) {
  attempt_secret::bytes_type b{};
  for (std::size_t i = 0; i < b.size(); i += 4) {
    const std::uint32_t word = source();
    for (std::size_t j = 0; j < 4; ++j) b[i + j] = static_cast<std::uint8_t>(word >> (8 * j));
  }
  b[6] = static_cast<std::uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<std::uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return attempt_secret{b};
}

std::int64_t backoff_us(const queue_policy& p, int attempt, std::mt19937_64& rng) {
  const int shift = std::min(std::max(attempt, 1) - 1, 40);
  const std::int64_t d =
      p.backoff_base > (p.backoff_cap >> shift) ? p.backoff_cap : p.backoff_base << shift;
  const double jitter = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return d / 2 + static_cast<std::int64_t>(static_cast<double>(d / 2) * jitter);
}

/// tenure.promote_due: due deferred rows of `queue` (every queue when empty) to ready, oldest
/// run_at first, at most `max_jobs`. Returns how many moved.
std::int64_t promote(soci::session& s, std::int64_t now, const opt<std::string>& queue,
                     long long max_jobs) {
  // The picking subquery is evaluated twice; it gives the same ids both times because the
  // transaction holds the write lock and the INSERT does not touch `deferred`.
  const std::string due =
      "SELECT id FROM deferred WHERE (:queue IS NULL OR queue = :queue) AND run_at <= :now"
      " ORDER BY run_at, id LIMIT :max_jobs";
  s << "INSERT INTO ready (" << k_job_columns << ") SELECT " << k_job_columns
    << " FROM deferred WHERE id IN (" << due << ")",
      soci::use(queue, "queue"), soci::use(now, "now"), soci::use(max_jobs, "max_jobs");
  soci::statement del = (s.prepare << "DELETE FROM deferred WHERE id IN (" + due + ")",
                         soci::use(queue, "queue"), soci::use(now, "now"),
                         soci::use(max_jobs, "max_jobs"));
  del.execute(true);
  return del.get_affected_rows();
}

/// Inserts a validated job whose args are already serialized (tenure.enqueue).
void insert_new(soci::session& s, std::int64_t id, const new_job& job, std::string args,
                std::int64_t now) {
  job_row r{.id = id,
            .queue = job.queue,
            .kind = job.kind,
            .args = std::move(args),
            .priority = job.priority,
            .attempt = 0,
            .max_attempts = job.max_attempts,
            .run_lease = 0,
            .run_at = now,
            .created_at = now,
            .metadata = job.metadata.is_null() ? std::string("{}") : job.metadata.dump()};
  if (!job.run_at || to_us(*job.run_at) <= now) {
    insert(s, table::ready, r);
  } else {
    r.run_at = to_us(*job.run_at);
    insert(s, table::deferred, r, "scheduled");
  }
}

/// The live job (ready, deferred or receipts) of `queue` that holds `key`, if any.
std::optional<std::int64_t> key_holder(soci::session& s, const std::string& queue, const std::string& key) {
  opt<std::int64_t> holder;
  s << "SELECT k.job_id FROM job_keys k WHERE k.queue = :queue AND k.unique_key = :key"
       " AND (EXISTS (SELECT 1 FROM ready x WHERE x.id = k.job_id)"
       "      OR EXISTS (SELECT 1 FROM deferred x WHERE x.id = k.job_id)"
       "      OR EXISTS (SELECT 1 FROM receipts x WHERE x.job_id = k.job_id))",
      soci::into(holder), soci::use(queue, "queue"), soci::use(key, "key");
  return to_std(holder);
}

/// Reserves `n` consecutive job ids; returns the first.
std::int64_t next_ids(soci::session& s, std::int64_t n) {
  std::int64_t last = 0;
  s << "UPDATE job_id_seq SET last_value = last_value + :n", soci::use(n);
  s << "SELECT last_value FROM job_id_seq", soci::into(last);
  return last - n + 1;
}

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
enqueue_result enqueue_one(soci::session& s, const new_job& job, std::string args, std::int64_t now) {
  if (job.unique_key) {
    if (auto holder = key_holder(s, job.queue, *job.unique_key)) return {.id = *holder, .inserted = false};
  }
  const std::int64_t id = next_ids(s, 1);
  insert_new(s, id, job, std::move(args), now);
  if (job.unique_key) {
    s << "INSERT INTO job_keys (job_id, queue, unique_key) VALUES (:id, :queue, :key)", soci::use(id, "id"),
        soci::use(job.queue, "queue"), soci::use(*job.unique_key, "key");
  }
  return {.id = id, .inserted = true};
}

/// cancel_attempt's body (also the running branch of cancel_job). false when stale.
bool cancel_attempt_in_tx(soci::session& s, attempt_id a, std::string_view reason,
                          std::int64_t now) {
  auto r = take_receipt(s, a);
  if (!r) return false;
  if (!reason.empty()) r->last_error = bound_error(reason);  // no reason keeps the last error
  insert(s, table::done, *r, "cancelled", now);
  return true;
}

/// Fails the attempt in the caller's transaction (store::fail and fail_callback).
result<job_state> fail_in_tx(soci::session& s, std::mt19937_64& rng, attempt_id attempt, std::string_view error,
                             fail_disposition disposition,
                             std::optional<std::chrono::microseconds> retry_after, std::int64_t now) {
  auto r = take_receipt(s, attempt);
  if (!r) return result<job_state>(errc::stale_attempt);
  r->last_error = bound_error(error);
  const auto policy = policy_of(s, r->queue);
  if (disposition == fail_disposition::retry && r->attempt < r->max_attempts) {
    const std::int64_t delay = retry_after ? std::max<std::int64_t>(retry_after->count(), 0)
                                           : backoff_us(policy, r->attempt, rng);
    r->run_at = saturating_add(now, delay);
    insert(s, table::deferred, *r, "retryable");
    return result<job_state>(job_state::retryable);
  }
  if (policy.dead_letter) {
    insert(s, table::dead_letter, *r, nullptr, now);
  } else {
    insert(s, table::done, *r, "failed", now);
  }
  return result<job_state>(job_state::failed);
}

// ---- external callbacks (0002_callbacks.sql, 0011_parked_callbacks.sql) ---------------------

/// The attempt is parked on its callback (a blocking waiter or a parked one).
bool is_waiting(soci::session& s, attempt_id a) {
  int n = 0;
  s << "SELECT count(*) FROM callbacks WHERE job_id = :job_id AND run_lease = :run_lease AND waiting",
      soci::into(n), soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  return n > 0;
}

/// One callback row as read by its id.
struct callback_row {
  attempt_id attempt;
  std::int64_t timeout = 0;
  opt<std::int64_t> deadline;
  bool waiting = false, parked = false, resumed = false;
  opt<std::string> payload;
};

/// The callback `id` of a live attempt (its receipt open), or nothing.
std::optional<callback_row> live_callback(soci::session& s, const std::string& id) {
  callback_row c;
  int waiting = 0, parked = 0, resumed = 0;
  s << "SELECT c.job_id, c.run_lease, c.timeout, c.deadline, c.waiting, c.parked, c.resumed, c.payload"
       "  FROM callbacks c JOIN receipts r ON r.job_id = c.job_id AND r.run_lease = c.run_lease"
       " WHERE c.callback_id = :id",
      soci::into(c.attempt.job_id), soci::into(c.attempt.run_lease), soci::into(c.timeout), soci::into(c.deadline),
      soci::into(waiting), soci::into(parked), soci::into(resumed), soci::into(c.payload), soci::use(id);
  if (!s.got_data()) return std::nullopt;
  c.waiting = waiting != 0;
  c.parked = parked != 0;
  c.resumed = resumed != 0;
  return c;
}

/// tenure.continue_parked: the parked attempt goes back to ready with its run lease, attempt
/// count and latest progress, and the resume payload (its callback goes with the receipt).
void continue_parked(soci::session& s, attempt_id a, const std::string& payload, std::int64_t now) {
  auto r = take_receipt(s, a);
  if (!r) return;
  r->run_at = now;
  insert(s, table::ready, *r);
  s << "UPDATE ready SET resume_payload = :payload WHERE id = :id", soci::use(payload, "payload"),
      soci::use(r->id, "id");
}

/// A fresh callback id shaped as gen_random_uuid() prints it.
std::string draw_callback_id(std::random_device& source) {
  const auto hex = draw_secret(source).to_string();  // 32 hex digits
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" +
         hex.substr(20);
}

}  // namespace

// ---- lifecycle ------------------------------------------------------------------------------

store::store(std::unique_ptr<detail::store_state> state) noexcept : state_(std::move(state)) {}
store::~store() = default;

result<std::unique_ptr<store>> store::open(std::string path, const clock_port& clock,
                                           options opts) {
  if (path.find('"') != std::string::npos) {  // SOCI quotes with "
    return error{errc::invalid_argument, "a database path may not contain a double quote"};
  }
  try {
    auto st = std::make_unique<detail::store_state>(clock, opts.seed);
    st->session.open(soci::sqlite3, "db=\"" + path + "\"");
    auto* backend = static_cast<soci::sqlite3_session_backend*>(st->session.get_backend());
    sqlite_api::sqlite3_busy_timeout(backend->conn_, static_cast<int>(opts.busy_timeout.count()));
    std::string journal_mode;
    // WAL lets several handles on one file read while one writes (":memory:" stays "memory").
    st->session << "PRAGMA journal_mode = WAL", soci::into(journal_mode);
    st->session << "PRAGMA synchronous = NORMAL";

    auto migrated = transact<void>(*st, tx_mode::write, [](soci::session& s, std::int64_t) {
      int version = 0;
      s << "PRAGMA user_version", soci::into(version);
      if (version == k_schema_version) return result<void>(success());
      if (version != 0) return result<void>(errc::schema_mismatch);
      for (const auto& statement : schema_statements()) s << statement;
      return result<void>(success());
    });
    if (!migrated) return migrated.error();
    return std::unique_ptr<store>(new store(std::move(st)));
  } catch (...) {
    return map_current_exception();
  }
}

result<void> store::configure_queue(std::string_view queue_name,
                                    const queue_settings& settings) {
  const auto& hard_deadline = settings.hard_deadline;
  if ((hard_deadline && hard_deadline->count() <= 0) || settings.backoff_base.count() < 0 ||
      settings.backoff_cap < settings.backoff_base) {
    return error{errc::invalid_argument, "queue settings: the hard deadline must be positive, the backoff base "
                                         "not negative, and the backoff cap at least the base"};
  }
  return transact<void>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t) {
    const std::string queue(queue_name);
    const int dlq = settings.dead_letter ? 1 : 0;
    const opt<std::int64_t> deadline =
        hard_deadline ? opt<std::int64_t>(hard_deadline->count()) : opt<std::int64_t>();
    const std::int64_t base = settings.backoff_base.count(), cap = settings.backoff_cap.count();
    s << "INSERT INTO queues (name, dead_letter, hard_deadline, backoff_base, backoff_cap)"
         " VALUES (:name, :dead_letter, :hard_deadline, :base, :cap)"
         " ON CONFLICT (name) DO UPDATE SET dead_letter = excluded.dead_letter,"
         " hard_deadline = excluded.hard_deadline, backoff_base = excluded.backoff_base,"
         " backoff_cap = excluded.backoff_cap",
        soci::use(queue, "name"), soci::use(dlq, "dead_letter"),
        soci::use(deadline, "hard_deadline"), soci::use(base, "base"), soci::use(cap, "cap");
    return result<void>(success());
  });
}

// ---- producers ------------------------------------------------------------------------------

result<enqueue_result> store::try_enqueue(const new_job& job) {
  TENURE_TRYV(validate(job));
  TENURE_TRY(auto args, args_text(job));
  return transact<enqueue_result>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    return result<enqueue_result>(enqueue_one(s, job, std::move(args), now));
  });
}

result<std::vector<enqueue_result>> store::try_enqueue_batch(std::span<const new_job> jobs) {
  // All or nothing: every job is checked before anything is written.
  std::vector<std::string> args;
  args.reserve(jobs.size());
  bool keyed = false;
  for (const auto& job : jobs) {
    TENURE_TRYV(validate(job));
    TENURE_TRY(auto text, args_text(job));
    args.push_back(std::move(text));
    keyed = keyed || job.unique_key.has_value();
  }
  using out_t = std::vector<enqueue_result>;
  return transact<out_t>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    out_t out;
    if (jobs.empty()) return result<out_t>(out);
    if (keyed) {
      // One job at a time, in input order: a key repeated in the batch finds its first job.
      for (std::size_t i = 0; i < jobs.size(); ++i) out.push_back(enqueue_one(s, jobs[i], std::move(args[i]), now));
      return result<out_t>(std::move(out));
    }
    const std::int64_t first = next_ids(s, static_cast<std::int64_t>(jobs.size()));
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      out.push_back({.id = first + static_cast<std::int64_t>(i), .inserted = true});
      insert_new(s, out.back().id, jobs[i], std::move(args[i]), now);
    }
    return result<out_t>(std::move(out));
  });
}

// ---- workers --------------------------------------------------------------------------------

result<std::vector<claimed_attempt>> store::claim(std::string_view queue, int max_jobs,
                                                  std::string_view worker) {
  if (max_jobs < 1 || max_jobs > k_max_claim) return errc::invalid_argument;
  using out_t = std::vector<claimed_attempt>;
  return transact<out_t>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    const std::string q(queue);
    promote(s, now, opt<std::string>(q), k_claim_promote_batch);

    std::vector<std::int64_t> ids;
    {
      std::int64_t id = 0;
      soci::statement pick = (s.prepare << "SELECT id FROM ready WHERE queue = :queue"
                                           " ORDER BY priority, id LIMIT :max_jobs",
                              soci::into(id), soci::use(q, "queue"),
                              soci::use(max_jobs, "max_jobs"));
      pick.execute();
      while (pick.fetch()) ids.push_back(id);
    }

    const auto policy = policy_of(s, q);
    const opt<std::int64_t> deadline =
        policy.hard_deadline ? opt<std::int64_t>(saturating_add(now, *policy.hard_deadline))
                             : opt<std::int64_t>();
    const opt<std::string> worker_name =
        worker.empty() ? opt<std::string>() : opt<std::string>(std::string(worker));

    out_t claimed;
    claimed.reserve(ids.size());
    for (std::int64_t id : ids) {
      opt<std::string> resume_payload;
      s << "SELECT resume_payload FROM ready WHERE id = :id", soci::into(resume_payload), soci::use(id);
      auto r = take(s, table::ready, id);
      if (!r) continue;  // cannot happen under the write lock; be safe anyway
      if (!resume_payload) {  // the continuation of a parked attempt keeps its lease and attempt
        r->run_lease += 1;
        r->attempt += 1;
      }
      const opt<std::string> last_error = to_boost(r->last_error), progress = to_boost(r->progress);
      const attempt_secret secret = draw_secret(state_->secrets);
      const std::string secret_text = secret.to_string();
      s << "INSERT INTO receipts (job_id, run_lease, queue, kind, args, priority, attempt,"
           " max_attempts, run_at, created_at, claimed_at, deadline_at, worker, last_error,"
           " progress, secret, metadata) VALUES (:id, :run_lease, :queue, :kind, :args, :priority,"
           " :attempt, :max_attempts, :run_at, :created_at, :now, :deadline, :worker, :last_error,"
           " :progress, :secret, :metadata)",
          soci::use(r->id, "id"), soci::use(r->run_lease, "run_lease"),
          soci::use(r->queue, "queue"), soci::use(r->kind, "kind"), soci::use(r->args, "args"),
          soci::use(r->priority, "priority"), soci::use(r->attempt, "attempt"),
          soci::use(r->max_attempts, "max_attempts"), soci::use(r->run_at, "run_at"),
          soci::use(r->created_at, "created_at"), soci::use(now, "now"),
          soci::use(deadline, "deadline"), soci::use(worker_name, "worker"),
          soci::use(last_error, "last_error"), soci::use(progress, "progress"),
          soci::use(secret_text, "secret"), soci::use(r->metadata, "metadata");
      claimed.push_back(claimed_attempt{
          .attempt = {r->id, r->run_lease},
          .queue = r->queue,
          .kind = r->kind,
          .args = r->args,
          .metadata = r->metadata,
          .attempt_number = r->attempt,
          .max_attempts = r->max_attempts,
          .deadline = deadline ? std::optional<time_point>(from_us(*deadline)) : std::nullopt,
          .available_at = from_us(std::max(r->run_at, r->created_at)),
          .secret = secret,
          .resumed_with = to_std(resume_payload),
      });
    }
    return result<out_t>(std::move(claimed));
  });
}

result<std::vector<attempt_id>> store::heartbeat(
    std::span<const attempt_id> attempts, std::span<const std::optional<std::string>> progress) {
  if (!progress.empty() && progress.size() != attempts.size()) return errc::invalid_argument;
  if (!std::all_of(progress.begin(), progress.end(), valid_json)) return errc::invalid_argument;
  static const std::optional<std::string> none;
  const auto input = distinct_attempts(
      attempts, [](const attempt_id& a) { return a; },
      [&](std::size_t i) -> const std::optional<std::string>& {
        return progress.empty() ? none : progress[i];
      });
  using out_t = std::vector<attempt_id>;
  return transact<out_t>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    out_t live;
    for (const auto& [a, p] : input) {
      if (!receipt_exists(s, a)) continue;  // stale
      const opt<std::string> new_progress = to_boost(p);
      s << "INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress)"
           " VALUES (:job_id, :run_lease, :now, :progress)"
           " ON CONFLICT (job_id, run_lease) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,"
           " progress = coalesce(excluded.progress, attempt_state.progress)",
          soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease"),
          soci::use(now, "now"), soci::use(new_progress, "progress");
      live.push_back(a);
    }
    return result<out_t>(std::move(live));
  });
}

result<std::vector<completion_result>> store::complete(
    std::span<const completion> batch) {
  for (const auto& c : batch) {
    if (!valid_json(c.progress)) return errc::invalid_argument;
  }
  const auto input = distinct_attempts(
      batch, [](const completion& c) { return c.attempt; },
      [&](std::size_t i) -> const std::optional<std::string>& { return batch[i].progress; });
  using out_t = std::vector<completion_result>;
  return transact<out_t>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    std::set<attempt_id> applied;
    for (const auto& [a, p] : input) {
      if (is_waiting(s, a)) continue;  // owned by its callback until resumed: stale to a token
      auto r = take_receipt(s, a);
      if (!r) continue;  // stale
      if (p) r->progress = p;  // coalesce(given, live, carried)
      insert(s, table::done, *r, "completed", now);
      applied.insert(a);
    }
    out_t results;
    results.reserve(batch.size());
    for (const auto& c : batch) {
      const bool first_copy = applied.erase(c.attempt) > 0;  // a repeat in the batch is stale
      results.push_back({c.attempt, first_copy,
                         first_copy ? std::optional<time_point>(from_us(now)) : std::nullopt});
    }
    return result<out_t>(std::move(results));
  });
}

result<job_state> store::fail(attempt_id attempt, std::string_view error,
                              fail_disposition disposition,
                              std::optional<std::chrono::microseconds> retry_after) {
  if (!tenure::detail::is_storable_text(error)) return errc::invalid_argument;  // as PostgreSQL refuses it
  return transact<job_state>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    return fail_in_tx(s, state_->rng, attempt, error, disposition, retry_after, now);
  });
}



result<void> store::snooze(attempt_id attempt, std::chrono::microseconds delay) {
  return transact<void>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    auto r = take_receipt(s, attempt);
    if (!r) return result<void>(errc::stale_attempt);
    r->attempt -= 1;  // the attempt is given back
    if (delay.count() <= 0) {
      r->run_at = now;
      insert(s, table::ready, *r);
    } else {
      r->run_at = saturating_add(now, delay.count());
      insert(s, table::deferred, *r, "scheduled");
    }
    return result<void>(success());
  });
}

result<void> store::cancel_attempt(attempt_id attempt, std::string_view reason) {
  if (!tenure::detail::is_storable_text(reason)) return errc::invalid_argument;
  return transact<void>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    if (!cancel_attempt_in_tx(s, attempt, reason, now)) return result<void>(errc::stale_attempt);
    return result<void>(success());
  });
}

result<std::optional<std::string>> store::checkpoint(attempt_id attempt) {
  using out_t = std::optional<std::string>;
  return transact<out_t>(*state_, tx_mode::read, [&](soci::session& s, std::int64_t) {
    if (!receipt_exists(s, attempt)) return result<out_t>(errc::stale_attempt);
    opt<std::string> progress;
    s << "SELECT progress FROM receipts WHERE job_id = :job_id AND run_lease = :run_lease",
        soci::into(progress), soci::use(attempt.job_id, "job_id"),
        soci::use(attempt.run_lease, "run_lease");
    return result<out_t>(to_std(progress));
  });
}

// ---- external callbacks ---------------------------------------------------------------------

result<std::string> store::register_callback(attempt_id attempt, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return errc::invalid_argument;
  return transact<std::string>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    if (!receipt_exists(s, attempt)) return result<std::string>(errc::stale_attempt);
    if (is_waiting(s, attempt)) {
      return result<std::string>(error{errc::invalid_argument, "the attempt is waiting for its callback"});
    }
    const std::string id = draw_callback_id(state_->secrets);
    const std::int64_t t = timeout.count();
    s << "DELETE FROM callbacks WHERE job_id = :job_id AND run_lease = :run_lease",
        soci::use(attempt.job_id, "job_id"), soci::use(attempt.run_lease, "run_lease");
    s << "INSERT INTO callbacks (callback_id, job_id, run_lease, timeout) VALUES (:id, :job_id, :run_lease, :t)",
        soci::use(id, "id"), soci::use(attempt.job_id, "job_id"), soci::use(attempt.run_lease, "run_lease"),
        soci::use(t, "t");
    // As register_callback materializes the lease row with a heartbeat.
    s << "INSERT INTO attempt_state (job_id, run_lease, heartbeat_at) VALUES (:job_id, :run_lease, :now)"
         " ON CONFLICT (job_id, run_lease) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
        soci::use(attempt.job_id, "job_id"), soci::use(attempt.run_lease, "run_lease"), soci::use(now, "now");
    return result<std::string>(id);
  });
}

result<callback_poll> store::await_callback(attempt_id attempt, std::string_view callback_id) {
  return transact<callback_poll>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    auto c = live_callback(s, std::string(callback_id));
    if (!c || !(c->attempt == attempt)) return result<callback_poll>(errc::stale_attempt);
    callback_poll p;
    if (c->resumed) {
      p.resumed = true;
      p.payload = c->payload.value_or("{}");
      return result<callback_poll>(std::move(p));
    }
    if (!c->waiting) {
      const std::int64_t deadline = saturating_add(now, c->timeout);
      const std::string id(callback_id);
      s << "UPDATE callbacks SET waiting = 1, deadline = :deadline WHERE callback_id = :id",
          soci::use(deadline, "deadline"), soci::use(id, "id");
    }
    return result<callback_poll>(std::move(p));
  });
}

result<park_result> store::park_callback(attempt_id attempt, std::string_view callback_id) {
  return transact<park_result>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    auto c = live_callback(s, std::string(callback_id));
    if (!c || !(c->attempt == attempt)) return result<park_result>(errc::stale_attempt);
    if (c->resumed) {
      continue_parked(s, attempt, c->payload.value_or("{}"), now);
      return result<park_result>(park_result::resumed);
    }
    const std::int64_t deadline = c->waiting && c->deadline ? *c->deadline : saturating_add(now, c->timeout);
    const std::string id(callback_id);
    s << "UPDATE callbacks SET waiting = 1, parked = 1, deadline = :deadline WHERE callback_id = :id",
        soci::use(deadline, "deadline"), soci::use(id, "id");
    return result<park_result>(park_result::parked);
  });
}

result<bool> store::resume_callback(std::string_view callback_id, std::string_view payload_json) {
  const std::string payload = payload_json.empty() ? std::string("{}") : std::string(payload_json);
  if (!valid_json(payload)) return errc::invalid_argument;
  return transact<bool>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    auto c = live_callback(s, std::string(callback_id));
    if (!c || c->resumed) return result<bool>(false);
    if (c->parked) {
      continue_parked(s, c->attempt, payload, now);
      return result<bool>(true);
    }
    const std::string id(callback_id);
    s << "UPDATE callbacks SET resumed = 1, payload = :payload, waiting = 0, deadline = NULL WHERE callback_id = :id",
        soci::use(payload, "payload"), soci::use(id, "id");
    s << "UPDATE attempt_state SET heartbeat_at = :now WHERE job_id = :job_id AND run_lease = :run_lease",
        soci::use(now, "now"), soci::use(c->attempt.job_id, "job_id"), soci::use(c->attempt.run_lease, "run_lease");
    return result<bool>(true);
  });
}

result<bool> store::extend_callback(std::string_view callback_id, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return errc::invalid_argument;
  return transact<bool>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    auto c = live_callback(s, std::string(callback_id));
    if (!c || c->resumed) return result<bool>(false);
    const std::int64_t t = timeout.count();
    const opt<std::int64_t> deadline = c->waiting ? opt<std::int64_t>(saturating_add(now, t)) : opt<std::int64_t>();
    const std::string id(callback_id);
    s << "UPDATE callbacks SET timeout = :t, deadline = :deadline WHERE callback_id = :id", soci::use(t, "t"),
        soci::use(deadline, "deadline"), soci::use(id, "id");
    return result<bool>(true);
  });
}

result<bool> store::complete_callback(std::string_view callback_id, std::optional<std::string> progress_json) {
  if (!valid_json(progress_json)) return errc::invalid_argument;
  return transact<bool>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    auto c = live_callback(s, std::string(callback_id));
    if (!c || c->resumed) return result<bool>(false);
    auto r = take_receipt(s, c->attempt);
    if (!r) return result<bool>(false);
    if (progress_json) r->progress = progress_json;
    insert(s, table::done, *r, "completed", now);
    return result<bool>(true);
  });
}

result<bool> store::fail_callback(std::string_view callback_id, std::string_view error, bool retry) {
  if (!tenure::detail::is_storable_text(error)) return errc::invalid_argument;
  return transact<bool>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    auto c = live_callback(s, std::string(callback_id));
    if (!c || c->resumed) return result<bool>(false);
    auto r = fail_in_tx(s, state_->rng, c->attempt, error,
                        retry ? fail_disposition::retry : fail_disposition::permanent, std::nullopt, now);
    if (!r) return result<bool>(r.error());
    return result<bool>(true);
  });
}

// ---- administration -------------------------------------------------------------------------

result<bool> store::cancel_job(std::int64_t job_id) {
  return transact<bool>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    for (table t : {table::ready, table::deferred}) {
      if (auto r = take(s, t, job_id)) {
        insert(s, table::done, *r, "cancelled", now);
        return result<bool>(true);
      }
    }
    std::int64_t lease = 0;
    s << "SELECT run_lease FROM receipts WHERE job_id = :id", soci::into(lease), soci::use(job_id);
    if (s.got_data()) {
      // The write lock makes the SQL's "the attempt closed under us" retry loop unnecessary.
      cancel_attempt_in_tx(s, {job_id, lease}, "cancelled by admin", now);
      return result<bool>(true);
    }
    if (job_exists(s, job_id)) return result<bool>(false);  // finished: done or dead_letter
    return result<bool>(errc::job_not_found);
  });
}

result<bool> store::retry_job(std::int64_t job_id) {
  return transact<bool>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    // A keyed job is refused while another live job of its queue holds its key.
    opt<std::string> queue, key;
    s << "SELECT queue, unique_key FROM job_keys WHERE job_id = :id", soci::into(queue), soci::into(key),
        soci::use(job_id);
    if (queue && key) {
      if (auto holder = key_holder(s, *queue, *key); holder && *holder != job_id) {
        return result<bool>(error{errc::invalid_argument, "job " + std::to_string(job_id) +
                                                              " cannot be retried: its unique_key " + *key +
                                                              " is held by live job " + std::to_string(*holder) +
                                                              " of queue " + *queue,
                                  "23505"});
      }
    }
    for (table t : {table::done, table::dead_letter}) {
      if (auto r = take(s, t, job_id)) {
        r->attempt = 0;  // a fresh budget; the run lease is kept and the next claim advances it
        r->run_at = now;
        insert(s, table::ready, *r);
        return result<bool>(true);
      }
    }
    if (job_exists(s, job_id)) return result<bool>(false);
    return result<bool>(errc::job_not_found);
  });
}

result<job_info> store::read_job(std::int64_t job_id) {
  return transact<job_info>(*state_, tx_mode::read, [&](soci::session& s, std::int64_t) {
    job_info info;
    std::string state;
    std::int64_t run_at = 0, created_at = 0;
    opt<std::int64_t> finalized_at;
    opt<std::string> last_error, progress, unique_key;
    int dead_lettered = 0;
    s << "SELECT id, queue, kind, args, state, priority, attempt, max_attempts, run_lease,"
         " run_at, created_at, finalized_at, last_error, progress, dead_lettered, metadata, unique_key"
         " FROM jobs WHERE id = :id",
        soci::into(info.id), soci::into(info.queue), soci::into(info.kind), soci::into(info.args),
        soci::into(state), soci::into(info.priority), soci::into(info.attempt),
        soci::into(info.max_attempts), soci::into(info.run_lease), soci::into(run_at),
        soci::into(created_at), soci::into(finalized_at), soci::into(last_error),
        soci::into(progress), soci::into(dead_lettered), soci::into(info.metadata), soci::into(unique_key),
        soci::use(job_id);
    if (!s.got_data()) return result<job_info>(errc::job_not_found);
    const auto parsed = parse_job_state(state);
    if (!parsed) return result<job_info>(errc::database_error);  // not a state of the view
    info.state = parsed.value();
    info.run_at = from_us(run_at);
    info.created_at = from_us(created_at);
    if (finalized_at) info.finalized_at = from_us(*finalized_at);
    info.last_error = to_std(last_error);
    info.progress = to_std(progress);
    info.dead_lettered = dead_lettered != 0;
    info.unique_key = to_std(unique_key);
    return result<job_info>(std::move(info));
  });
}

// ---- maintenance ----------------------------------------------------------------------------

result<std::vector<rescued_attempt>> store::rescue_stale(std::chrono::microseconds stale_after) {
  if (stale_after.count() < 0) return errc::invalid_argument;
  using out_t = std::vector<rescued_attempt>;
  return transact<out_t>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    // coalesce(heartbeat_at, claimed_at) + stale_after <= now, without overflowing.
    const std::int64_t idle_since = saturating_add(now, -stale_after.count());
    struct stale {
      attempt_id attempt;
      int why;  // 0: no heartbeat, 1: hard deadline passed, 2: callback timed out
    };
    std::vector<stale> found;
    {
      std::int64_t job_id = 0, run_lease = 0;
      int deadline_passed = 0;
      soci::statement st =
          (s.prepare << "SELECT r.job_id, r.run_lease,"
                        "       CASE WHEN coalesce(c.waiting, 0) THEN 2"
                        "            ELSE coalesce(r.deadline_at <= :now, 0) END"
                        "  FROM receipts r LEFT JOIN attempt_state s"
                        "    ON s.job_id = r.job_id AND s.run_lease = r.run_lease"
                        "  LEFT JOIN callbacks c ON c.job_id = r.job_id AND c.run_lease = r.run_lease"
                        " WHERE (NOT coalesce(c.waiting, 0)"
                        "        AND (coalesce(s.heartbeat_at, r.claimed_at) <= :idle_since"
                        "             OR r.deadline_at <= :now))"
                        "    OR (c.waiting AND c.deadline <= :now)"
                        " ORDER BY r.job_id, r.run_lease",
           soci::into(job_id), soci::into(run_lease), soci::into(deadline_passed),
           soci::use(now, "now"), soci::use(idle_since, "idle_since"));
      st.execute();
      while (st.fetch()) found.push_back({{job_id, run_lease}, deadline_passed});
    }
    const std::string no_heartbeat = "rescued: no heartbeat for " + interval_text(stale_after);
    out_t rescued;
    for (const auto& f : found) {
      auto r = take_receipt(s, f.attempt);
      if (!r) continue;
      r->last_error = f.why == 2   ? std::string{"rescued: callback timed out"}
                      : f.why == 1 ? std::string{"rescued: hard deadline passed"}
                                   : no_heartbeat;
      job_state next = job_state::available;
      if (r->attempt < r->max_attempts) {  // available at once; the attempt counts
        r->run_at = now;
        insert(s, table::ready, *r);
      } else if (policy_of(s, r->queue).dead_letter) {
        insert(s, table::dead_letter, *r, nullptr, now);
        next = job_state::failed;
      } else {
        insert(s, table::done, *r, "failed", now);
        next = job_state::failed;
      }
      rescued.push_back({f.attempt, r->queue, next});
    }
    return result<out_t>(std::move(rescued));
  });
}

result<std::int64_t> store::promote_due() {
  return transact<std::int64_t>(*state_, tx_mode::write, [&](soci::session& s, std::int64_t now) {
    return result<std::int64_t>(promote(s, now, opt<std::string>(), k_promote_batch));
  });
}

result<attempt_evidence> store::reconcile(attempt_id attempt) {
  return transact<attempt_evidence>(*state_, tx_mode::read, [&](soci::session& s, std::int64_t) {
    if (receipt_exists(s, attempt)) return result<attempt_evidence>(attempt_evidence::open);
    int completed = 0;
    s << "SELECT count(*) FROM done WHERE id = :job_id AND run_lease = :run_lease"
         " AND state = 'completed'",
        soci::into(completed), soci::use(attempt.job_id, "job_id"),
        soci::use(attempt.run_lease, "run_lease");
    if (completed > 0) return result<attempt_evidence>(attempt_evidence::completed_by_this);
    return result<attempt_evidence>(job_exists(s, attempt.job_id)
                                        ? attempt_evidence::closed_by_other
                                        : attempt_evidence::unknown_job);
  });
}

// One statement, as tenure.queue_depths(): this fake has no callbacks, so waiting_external is 0.
result<std::vector<queue_depth>> store::queue_depths() {
  using out_t = std::vector<queue_depth>;
  return transact<out_t>(*state_, tx_mode::read, [&](soci::session& s, std::int64_t now) {
    out_t out;
    std::string queue;
    std::int64_t available = 0, scheduled = 0, retryable = 0, running = 0, oldest = 0;
    soci::statement st =
        (s.prepare << "SELECT queue, sum(available), sum(scheduled), sum(retryable), sum(running),"
                      "       CASE WHEN min(since) IS NULL THEN 0 ELSE max(:now - min(since), 0) END"
                      "  FROM (SELECT queue, 1 AS available, 0 AS scheduled, 0 AS retryable, 0 AS running,"
                      "               max(run_at, created_at) AS since FROM ready"
                      "        UNION ALL SELECT queue, 0, state = 'scheduled', state = 'retryable', 0, NULL FROM deferred"
                      "        UNION ALL SELECT queue, 0, 0, 0, 1, NULL FROM receipts"
                      "        UNION ALL SELECT name, 0, 0, 0, 0, NULL FROM queues)"
                      " GROUP BY queue ORDER BY queue",
         soci::into(queue), soci::into(available), soci::into(scheduled), soci::into(retryable),
         soci::into(running), soci::into(oldest), soci::use(now, "now"));
    st.execute();
    while (st.fetch()) {
      out.push_back({.queue = queue,
                     .available = available,
                     .scheduled = scheduled,
                     .retryable = retryable,
                     .running = running,
                     .oldest_available = microseconds{oldest}});
    }
    return result<out_t>(std::move(out));
  });
}

}  // namespace tenure::sqlite
