// The row operations and conversions shared by the SQLite store's files (rows.hpp).
#include "rows.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "sdk/runtime/storable.hpp"
#include "tenure/log.hpp"

namespace tenure::sqlite::detail {

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

bool valid_json(const std::optional<std::string>& text) {
  if (!text) return true;
  const auto parsed = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  return !parsed.is_discarded() && tenure::detail::is_storable_json(parsed);
}

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

error with_detail(std::error_code ec, std::string_view message) noexcept {
  try {
    return error{ec, std::string{message}};
  } catch (...) {
    return ec;
  }
}

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

const char* name_of(table t) noexcept {
  switch (t) {
    case table::ready: return "ready";
    case table::deferred: return "deferred";
    case table::done: return "done";
    case table::dead_letter: return "dead_letter";
  }
  return "";
}

namespace {

/// Whether rows of `t` keep a continuation's resume payload (the waiting tables do; finished
/// ones do not).
bool keeps_resume_payload(table t) noexcept { return t == table::ready || t == table::deferred; }

}  // namespace

std::optional<job_row> load(soci::session& s, table t, std::int64_t id) {
  job_row r;
  opt<std::string> last_error, progress, resume_payload;
  s << "SELECT " << k_job_columns << (keeps_resume_payload(t) ? ", resume_payload" : ", NULL") << " FROM "
    << name_of(t) << " WHERE id = :id",
      soci::into(r.id), soci::into(r.queue), soci::into(r.kind), soci::into(r.args),
      soci::into(r.priority), soci::into(r.attempt), soci::into(r.max_attempts),
      soci::into(r.run_lease), soci::into(r.run_at), soci::into(r.created_at),
      soci::into(last_error), soci::into(progress), soci::into(r.metadata), soci::into(resume_payload), soci::use(id);
  if (!s.got_data()) return std::nullopt;
  r.last_error = to_std(last_error);
  r.progress = to_std(progress);
  r.resume_payload = to_std(resume_payload);
  return r;
}

std::optional<job_row> take(soci::session& s, table t, std::int64_t id) {
  auto r = load(s, t, id);
  if (r) s << "DELETE FROM " << name_of(t) << " WHERE id = :id", soci::use(id);
  return r;
}

void insert(soci::session& s, table t, const job_row& r, const char* state,
            std::optional<std::int64_t> finalized_at) {
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
  const opt<std::string> resume_payload = to_boost(r.resume_payload);
  if (keeps_resume_payload(t)) {
    columns += ", resume_payload";
    values += ", :resume_payload";
    st.exchange(soci::use(resume_payload, "resume_payload"));
  }
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

std::optional<job_row> take_receipt(soci::session& s, attempt_id a) {
  job_row r;
  opt<std::string> last_error, progress, resume_payload;
  s << "SELECT r.job_id, r.queue, r.kind, r.args, r.priority, r.attempt, r.max_attempts,"
       "       r.run_lease, r.run_at, r.created_at, r.last_error, coalesce(s.progress, r.progress),"
       "       r.metadata, r.resume_payload"
       "  FROM receipts r LEFT JOIN attempt_state s"
       "    ON s.job_id = r.job_id AND s.run_lease = r.run_lease"
       " WHERE r.job_id = :job_id AND r.run_lease = :run_lease",
      soci::into(r.id), soci::into(r.queue), soci::into(r.kind), soci::into(r.args),
      soci::into(r.priority), soci::into(r.attempt), soci::into(r.max_attempts),
      soci::into(r.run_lease), soci::into(r.run_at), soci::into(r.created_at),
      soci::into(last_error), soci::into(progress), soci::into(r.metadata), soci::into(resume_payload),
      soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  if (!s.got_data()) return std::nullopt;
  r.last_error = to_std(last_error);
  r.progress = to_std(progress);
  r.resume_payload = to_std(resume_payload);
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

std::int64_t promote(soci::session& s, std::int64_t now, const opt<std::string>& queue,
                     long long max_jobs) {
  // The picking subquery is evaluated twice; it gives the same ids both times because the
  // transaction holds the write lock and the INSERT does not touch `deferred`.
  const std::string due =
      "SELECT id FROM deferred WHERE (:queue IS NULL OR queue = :queue) AND run_at <= :now"
      " ORDER BY run_at, id LIMIT :max_jobs";
  s << "INSERT INTO ready (" << k_job_columns << ", resume_payload) SELECT " << k_job_columns
    << ", resume_payload FROM deferred WHERE id IN (" << due << ")",
      soci::use(queue, "queue"), soci::use(now, "now"), soci::use(max_jobs, "max_jobs");
  soci::statement del = (s.prepare << "DELETE FROM deferred WHERE id IN (" + due + ")",
                         soci::use(queue, "queue"), soci::use(now, "now"),
                         soci::use(max_jobs, "max_jobs"));
  del.execute(true);
  return del.get_affected_rows();
}

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

std::optional<std::int64_t> key_holder(soci::session& s, const std::string& queue, const std::string& key) {
  opt<std::int64_t> holder;
  s << "SELECT k.job_id FROM job_keys k WHERE k.queue = :queue AND k.unique_key = :key"
       " AND (EXISTS (SELECT 1 FROM ready x WHERE x.id = k.job_id)"
       "      OR EXISTS (SELECT 1 FROM deferred x WHERE x.id = k.job_id)"
       "      OR EXISTS (SELECT 1 FROM receipts x WHERE x.job_id = k.job_id))",
      soci::into(holder), soci::use(queue, "queue"), soci::use(key, "key");
  return to_std(holder);
}

std::int64_t next_ids(soci::session& s, std::int64_t n) {
  std::int64_t last = 0;
  s << "UPDATE job_id_seq SET last_value = last_value + :n", soci::use(n);
  s << "SELECT last_value FROM job_id_seq", soci::into(last);
  return last - n + 1;
}

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

bool cancel_attempt_in_tx(soci::session& s, attempt_id a, std::string_view reason,
                          std::int64_t now) {
  auto r = take_receipt(s, a);
  if (!r) return false;
  if (!reason.empty()) r->last_error = bound_error(reason);  // no reason keeps the last error
  insert(s, table::done, *r, "cancelled", now);
  return true;
}

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
    // A failed continuation is retried as the same continuation, as the next attempt.
    if (r->resume_payload) r->attempt += 1;
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

// ---- external callbacks (0002_callbacks.sql, 0014_parked_callbacks.sql) ---------------------

bool is_waiting(soci::session& s, attempt_id a) {
  int n = 0;
  s << "SELECT count(*) FROM callbacks WHERE job_id = :job_id AND run_lease = :run_lease AND waiting",
      soci::into(n), soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  return n > 0;
}

bool is_parked(soci::session& s, attempt_id a) {
  int n = 0;
  s << "SELECT count(*) FROM callbacks WHERE job_id = :job_id AND run_lease = :run_lease AND parked",
      soci::into(n), soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease");
  return n > 0;
}

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

void continue_parked(soci::session& s, attempt_id a, const std::string& payload, std::int64_t now) {
  auto r = take_receipt(s, a);
  if (!r) return;
  r->run_at = now;
  r->resume_payload = payload;
  insert(s, table::ready, *r);
}

std::string draw_callback_id(std::random_device& source) {
  const auto hex = draw_secret(source).to_string();  // 32 hex digits
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" +
         hex.substr(20);
}

}  // namespace tenure::sqlite::detail
