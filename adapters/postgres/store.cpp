#include "tenure/postgres/store.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "connection.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/sql_text.hpp"

namespace tenure::postgres {

using detail::connection;
using detail::effect;
using detail::epoch_us;
using detail::param;
using detail::statement;

namespace {

/// Every statement the store runs, named for logs. Built once per schema.
struct statements {
  explicit statements(const std::string& s)
      : enqueue{"tenure_enqueue",
                "SELECT " + s + ".enqueue($1, $2::jsonb, $3, $4::int, $5::timestamptz, $6::int, $7::jsonb)"},
        enqueue_batch{"tenure_enqueue_batch",
                      "SELECT job_id, inserted FROM " + s +
                          ".enqueue_batch($1::text[], $2::jsonb[], $3::text[], $4::int[], "
                          "$5::timestamptz[], $6::int[], $7::jsonb[], $8::text[]) ORDER BY ord"},
        claim{"tenure_claim", "SELECT job_id, run_lease, kind, args::text, attempt, max_attempts, " +
                                  epoch_us("deadline_at") + ", encode(uuid_send(secret), 'hex'), metadata::text, " +
                                  epoch_us("available_at") + ", resume_payload::text FROM " + s +
                                  ".claim_attempts($1, $2::int, $3, $4)"},
        heartbeat{"tenure_heartbeat", "SELECT job_id, run_lease FROM " + s +
                                          ".heartbeat_batch($1::bigint[], $2::bigint[], $3::jsonb[])"},
        complete{"tenure_complete", "SELECT job_id, run_lease, " + epoch_us("completed_at") + " FROM " +
                                        s + ".complete_batch($1::bigint[], $2::bigint[], $3::jsonb[], $4::uuid[])"},
        fail{"tenure_fail",
             "SELECT " + s + ".fail_attempt($1::bigint, $2::bigint, $3, $4::boolean, $5::interval)"},
        snooze{"tenure_snooze", "SELECT " + s + ".snooze_attempt($1::bigint, $2::bigint, $3::interval)"},
        cancel_attempt{"tenure_cancel_attempt",
                       "SELECT " + s + ".cancel_attempt($1::bigint, $2::bigint, $3)"},
        checkpoint{"tenure_checkpoint",
                   "SELECT progress::text FROM " + s + ".attempt_checkpoint($1::bigint, $2::bigint)"},
        register_callback{"tenure_register_callback",
                          "SELECT " + s + ".register_callback($1::bigint, $2::bigint, $3::interval)::text"},
        await_callback{"tenure_await_callback", "SELECT status, payload::text FROM " + s +
                                                    ".await_callback($1::bigint, $2::bigint, $3::uuid)"},
        park_callback{"tenure_park_callback",
                      "SELECT " + s + ".park_callback($1::bigint, $2::bigint, $3::uuid)"},
        resume_callback{"tenure_resume_callback", "SELECT " + s + ".resume_callback($1::uuid, $2::jsonb)"},
        extend_callback{"tenure_extend_callback", "SELECT " + s + ".extend_callback($1::uuid, $2::interval)"},
        complete_callback{"tenure_complete_callback",
                          "SELECT " + s + ".complete_callback($1::uuid, $2::jsonb)"},
        fail_callback{"tenure_fail_callback", "SELECT " + s + ".fail_callback($1::uuid, $2, $3::boolean)"},
        cancel_job{"tenure_cancel_job", "SELECT " + s + ".cancel_job($1::bigint)"},
        retry_job{"tenure_retry_job", "SELECT " + s + ".retry_job($1::bigint)"},
        read_job{"tenure_read_job",
                 "SELECT id, queue, kind, args::text, state, priority, attempt, max_attempts, run_lease, " +
                     epoch_us("run_at") + ", " + epoch_us("created_at") + ", " + epoch_us("finalized_at") +
                     ", last_error, progress::text, dead_lettered, metadata::text, unique_key FROM " + s +
                     ".jobs WHERE id = $1::bigint"},
        rescue{"tenure_rescue",
               "SELECT job_id, run_lease, queue, new_state FROM " + s + ".rescue_attempts($1::interval)"},
        promote{"tenure_promote", "SELECT " + s + ".promote_due(NULL, 10000)"},
        maintain{"tenure_maintain", "SELECT job_id, run_lease, queue, new_state FROM " + s +
                                        ".maintain($1, $2::bigint, $3::interval)"},
        evidence{"tenure_evidence", "SELECT " + s + ".attempt_evidence($1::bigint, $2::bigint)"},
        evidence_batch{"tenure_evidence_batch",
                       "SELECT evidence FROM " + s + ".attempt_evidence_batch($1::bigint[], $2::bigint[]) ORDER BY ord"},
        version{"tenure_schema_version", "SELECT coalesce(max(version), 0) FROM " + s + ".schema_version"},
        configure_queue{"tenure_configure_queue",
                        "INSERT INTO " + s +
                            ".queues (name, dead_letter, hard_deadline, backoff_base, backoff_cap) "
                            "VALUES ($1, $2::boolean, $3::interval, $4::interval, $5::interval) "
                            "ON CONFLICT (name) DO UPDATE SET dead_letter = excluded.dead_letter, "
                            "hard_deadline = excluded.hard_deadline, backoff_base = excluded.backoff_base, "
                            "backoff_cap = excluded.backoff_cap"},
        pause_queue{"tenure_pause_queue", "SELECT " + s + ".pause_queue($1)"},
        resume_queue{"tenure_resume_queue", "SELECT " + s + ".resume_queue($1)"},
        update_queue{"tenure_update_queue", "SELECT " + s + ".configure_queue($1, $2::jsonb)"},
        // The claim path's tables with at least $2 dead rows, and whether this role may VACUUM
        // them (owner, member of the owner or of the database's owner, or superuser).
        dead_rows{"tenure_dead_rows",
                  "SELECT s.relname, pg_has_role(c.relowner, 'USAGE') OR r.rolsuper "
                  "OR pg_has_role((SELECT d.datdba FROM pg_database d WHERE d.datname = current_database()), 'USAGE') "
                  "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
                  "CROSS JOIN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) r "
                  "WHERE s.schemaname = $1 AND s.relname IN ('ready', 'receipts') AND s.n_dead_tup >= $2::bigint "
                  "ORDER BY s.relname"},
        copy_stage{"tenure_enqueue_copy_stage", "SELECT " + s + ".enqueue_copy_stage()"},
        copy_move{"tenure_enqueue_copied", "SELECT " + s + ".enqueue_copied()"},
        queue_depths{"tenure_queue_depths", "SELECT queue, available, scheduled, retryable, running, waiting_external, " +
                                                epoch_us("oldest_available") + " FROM " + s + ".queue_depths()"} {}

  statement enqueue, enqueue_batch, claim, heartbeat, complete, fail, snooze, cancel_attempt, checkpoint, register_callback,
      await_callback, park_callback, resume_callback, extend_callback, complete_callback, fail_callback, cancel_job,
      retry_job, read_job, rescue, promote, maintain, evidence, evidence_batch, version, configure_queue,
      pause_queue, resume_queue, update_queue, dead_rows, copy_stage, copy_move, queue_depths;
};

param text(std::string_view s) { return std::string{s}; }

/// JSON text of a job's args or metadata (null: `{}`); nullopt when they cannot be serialized
/// (e.g. invalid UTF-8).
std::optional<std::string> args_json(const nlohmann::json& args) {
  if (args.is_null()) return "{}";
  try {
    return args.dump();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}
param number(std::int64_t v) { return std::to_string(v); }

}  // namespace

struct store::impl {
  store_options opt;
  statements st;
  std::mutex mu;
  std::condition_variable freed;
  std::vector<std::unique_ptr<connection>> idle;
  int borrowed = 0;

  explicit impl(store_options o) : opt(std::move(o)), st(opt.schema) {}

  /// Borrows a connection (reopening a broken one), runs `fn(connection&)`, returns it.
  template <class Fn>
  auto with_connection(Fn&& fn) -> decltype(fn(std::declval<connection&>())) {
    std::unique_ptr<connection> c;
    {
      std::unique_lock lock(mu);
      if (!freed.wait_for(lock, opt.acquire_timeout, [&] {
            return !idle.empty() || borrowed + static_cast<int>(idle.size()) < opt.pool_size;
          })) {
        tenure::logger()->warn("tenure.pg: no free connection after {} ms (pool size {})",
                     opt.acquire_timeout.count(), opt.pool_size);
        return errc::database_unavailable;
      }
      if (!idle.empty()) {
        c = std::move(idle.back());
        idle.pop_back();
      }
      ++borrowed;
    }
    auto give_back = [&](std::unique_ptr<connection> conn) {
      std::lock_guard lock(mu);
      --borrowed;
      if (conn && conn->ok()) idle.push_back(std::move(conn));
      freed.notify_one();
    };
    if (!c || !c->ok()) {
      auto opened = open_connection();
      if (!opened) {
        tenure::logger()->warn("tenure.pg: {}", opened.error().message());
        give_back(nullptr);
        return opened.error();
      }
      c = std::move(opened).value();
    }
    auto r = fn(*c);
    c->reset_transaction();
    give_back(std::move(c));
    return r;
  }

  result<std::unique_ptr<connection>> open_connection() {
    return connection::open(opt.dsn, opt.application_name, opt.lock_timeout,
                            opt.pool_mode == pool_mode::session ? detail::session_use::keep
                                                                : detail::session_use::none);
  }

  result<detail::rows> run(const statement& s, std::vector<param> params, effect e) {
    return with_connection([&](connection& c) { return c.exec(s, params, e); });
  }
};

store::store(std::unique_ptr<impl> p) noexcept : impl_(std::move(p)) {}
store::~store() = default;

const store_options& store::options() const noexcept { return impl_->opt; }

result<std::unique_ptr<store>> store::open(store_options options) {
  if (options.logger) set_logger(options.logger);
  if (!valid_schema_name(options.schema)) {
    return error{errc::invalid_argument, "invalid schema name '" + options.schema +
                                             "' (use [a-z_][a-z0-9_]*, at most 54 characters)"};
  }
  if (options.pool_size < 1) options.pool_size = 1;
  auto p = std::make_unique<impl>(std::move(options));
  const bool detect = p->opt.pool_mode == pool_mode::detect;
  if (detect) p->opt.pool_mode = pool_mode::transaction;  // nothing left on a session until known
  auto c = p->open_connection();
  if (!c) return c.error();
  if (detect) {
    auto pooled = c.value()->behind_pooler();
    if (!pooled) return pooled.error();
    if (!pooled.value()) {
      p->opt.pool_mode = pool_mode::session;
      if (auto kept = c.value()->keep_session(); !kept) return kept.error();
    }
    tenure::logger()->debug("tenure.pg: store for schema {}: {}", p->opt.schema,
                  pooled.value() ? "a pooler sits between, so no named statement or session setting is used"
                                 : "a direct session, statements prepared by name");
  }
  auto v = c.value()->exec(p->st.version, {}, effect::read);
  if (!v) {
    if (v.error() == errc::schema_mismatch) {
      return error{errc::schema_mismatch, "tenure schema '" + p->opt.schema + "' is not installed (run tenure migrate)",
                   v.error().sqlstate()};
    }
    return v.error();
  }
  const auto version = v.value().int64(0, 0);
  if (version != known_schema_version()) {
    return error{errc::schema_mismatch, "tenure schema '" + p->opt.schema + "' is at version " +
                                            std::to_string(version) + " but this binary expects " +
                                            std::to_string(known_schema_version()) +
                                            (version < known_schema_version() ? " (run tenure migrate)" : " (upgrade tenure)")};
  }
  p->idle.push_back(std::move(c).value());
  // Open the whole pool now: a connection opened on demand under load can take a second, and a
  // heartbeat waiting for one is how a live attempt ends up rescued.
  for (int i = 1; i < p->opt.pool_size; ++i) {
    auto more = p->open_connection();
    if (!more) return more.error();
    p->idle.push_back(std::move(more).value());
  }
  return std::unique_ptr<store>(new store(std::move(p)));
}

result<enqueue_result> store::try_enqueue(const new_job& job) {
  // A keyed job goes through enqueue_batch, the call that says whether it inserted; a keyless
  // one runs the one-job statement, which always inserts.
  if (job.unique_key) {
    TENURE_TRY(auto out, try_enqueue_batch(std::span<const new_job>(&job, 1)));
    return out.front();
  }
  TENURE_TRYV(validate(job));
  auto args = args_json(job.args);
  auto metadata = args_json(job.metadata);
  if (!args || !metadata) return errc::invalid_argument;
  std::vector<param> params{text(job.kind), std::move(args), text(job.queue),
                            number(job.priority),
                            job.run_at ? param{detail::timestamp_text(*job.run_at)} : std::nullopt,
                            number(job.max_attempts), std::move(metadata)};
  TENURE_TRY(auto rows, impl_->run(impl_->st.enqueue, std::move(params), effect::write));
  return enqueue_result{.id = rows.int64(0, 0), .inserted = true};
}

namespace {

/// The ids enqueue_copied() answered ('{41,42}'), in input order; errc::protocol_error unless
/// there are exactly `n`.
result<std::vector<enqueue_result>> copied_ids(std::string_view text, std::size_t n) {
  const auto ids = int_array_values(text);
  if (ids.size() != n) {
    tenure::logger()->error("tenure.pg: enqueue_copied answered {} ids for {} jobs", ids.size(), n);
    return errc::protocol_error;
  }
  std::vector<enqueue_result> out;
  out.reserve(n);
  for (const auto id : ids) out.push_back({.id = id, .inserted = true});
  return out;
}

}  // namespace

/// Many keyless jobs in one transaction of the store's: COPY into the session's stage, then one
/// move (schema migration 22). The commit is the write: lost there, errc::commit_in_doubt.
/// nullopt, with nothing written, when the server offers no stage or the session is not UTF-8.
result<std::optional<std::vector<enqueue_result>>> store::copy_enqueue(std::span<const new_job> jobs) {
  TENURE_TRY(auto data, enqueue_copy_rows(jobs));
  return impl_->with_connection([&](connection& c) -> result<std::optional<std::vector<enqueue_result>>> {
    // COPY's text format is escaped byte by byte: only on a UTF-8 session (a client-only multibyte
    // encoding such as SJIS would break it).
    if (std::string_view{pg_encoding_to_char(PQclientEncoding(c.native()))} != "UTF8") {
      return std::optional<std::vector<enqueue_result>>{};
    }
    TENURE_TRY(auto begun, c.exec_script("BEGIN", effect::read));
    (void)begun;
    TENURE_TRY(auto stage, c.exec(impl_->st.copy_stage, {}, effect::read));
    // No stage (the schema's owner may not create temporary tables here): the caller sends arrays
    // after all. The empty transaction ends when the connection goes back to the pool.
    if (stage.size() == 1 && stage.is_null(0, 0)) return std::optional<std::vector<enqueue_result>>{};
    TENURE_TRY(auto copy_sql, enqueue_copy_statement(stage.size() == 1 ? std::optional<std::string_view>{stage.text(0, 0)}
                                                                       : std::nullopt));
    TENURE_TRYV(c.copy_in(copy_sql, data, effect::read));
    TENURE_TRY(auto moved, c.exec(impl_->st.copy_move, {}, effect::read));
    if (moved.size() != 1 || moved.is_null(0, 0)) return errc::protocol_error;
    TENURE_TRY(auto out, copied_ids(moved.text(0, 0), jobs.size()));
    TENURE_TRY(auto committed, c.exec_script("COMMIT", effect::write));
    (void)committed;
    return std::optional{std::move(out)};
  });
}

result<std::vector<enqueue_result>> store::try_enqueue_batch(std::span<const new_job> jobs) {
  if (jobs.empty()) return std::vector<enqueue_result>{};
  const auto threshold = impl_->opt.copy_threshold;
  if (threshold > 0 && jobs.size() >= threshold &&
      std::none_of(jobs.begin(), jobs.end(), [](const new_job& j) { return j.unique_key.has_value(); })) {
    TENURE_TRY(auto copied, copy_enqueue(jobs));
    if (copied) return std::move(*copied);
  }
  std::vector<std::optional<std::string>> kinds, args, queues, run_ats, metadatas, keys;
  std::vector<std::int64_t> priorities, max_attempts;
  bool keyed = false;
  for (const auto& j : jobs) {
    TENURE_TRYV(validate(j));
    kinds.emplace_back(j.kind);
    args.emplace_back(args_json(j.args));
    metadatas.emplace_back(args_json(j.metadata));
    if (!args.back() || !metadatas.back()) return errc::invalid_argument;
    queues.emplace_back(j.queue);
    priorities.push_back(j.priority);
    max_attempts.push_back(j.max_attempts);
    run_ats.push_back(j.run_at ? std::optional{detail::timestamp_text(*j.run_at)} : std::nullopt);
    keys.push_back(j.unique_key);
    keyed = keyed || j.unique_key.has_value();
  }
  TENURE_TRY(auto rows, impl_->run(impl_->st.enqueue_batch,
                                   {detail::text_array(kinds), detail::text_array(args),
                                    detail::text_array(queues), detail::int_array(priorities),
                                    detail::text_array(run_ats), detail::int_array(max_attempts),
                                    detail::text_array(metadatas),
                                    keyed ? param{detail::text_array(keys)} : param{}},
                                   effect::write));
  std::vector<enqueue_result> out;
  out.reserve(static_cast<std::size_t>(rows.size()));
  for (int i = 0; i < rows.size(); ++i) out.push_back({.id = rows.int64(i, 0), .inserted = rows.boolean(i, 1)});
  if (out.size() != jobs.size()) return errc::protocol_error;
  return out;
}

result<std::vector<claimed_attempt>> store::claim(std::string_view queue, int max_jobs,
                                                  std::string_view worker) {
  return claim(queue, max_jobs, worker, false);
}

result<std::vector<claimed_attempt>> store::claim(std::string_view queue, int max_jobs, std::string_view worker,
                                                  bool going_to_sleep) {
  if (max_jobs < 1) return errc::invalid_argument;
  // idle_mode: NULL = no bookkeeping (anonymous claim), 'poll' = leave the waiters on a
  // non-empty claim, 'sleep' = also join them on an empty one.
  param mode = worker.empty() ? param{} : param{going_to_sleep ? "sleep" : "poll"};
  TENURE_TRY(auto rows, impl_->run(impl_->st.claim,
                                   {text(queue), number(max_jobs), worker.empty() ? std::nullopt : text(worker),
                                    std::move(mode)},
                                   effect::write));
  std::vector<claimed_attempt> out;
  out.reserve(static_cast<std::size_t>(rows.size()));
  for (int i = 0; i < rows.size(); ++i) {
    claimed_attempt a;
    a.attempt = {rows.int64(i, 0), rows.int64(i, 1)};
    a.queue = std::string{queue};
    a.kind = std::string{rows.text(i, 2)};
    a.args = std::string{rows.text(i, 3)};
    a.attempt_number = static_cast<int>(rows.int64(i, 4));
    a.max_attempts = static_cast<int>(rows.int64(i, 5));
    if (!rows.is_null(i, 6)) a.deadline = detail::from_epoch_us(rows.int64(i, 6));
    // The attempt's secret, drawn by the server in the claim itself (no extra round trip).
    auto secret = rows.is_null(i, 7) ? result<attempt_secret>{errc::protocol_error}
                                     : attempt_secret::parse(rows.text(i, 7));
    if (!secret) {
      tenure::logger()->error("tenure: claim: job {} lease {} came back without a valid attempt secret", a.attempt.job_id,
                    a.attempt.run_lease);
      return errc::protocol_error;
    }
    a.secret = secret.value();
    a.metadata = std::string{rows.text(i, 8)};
    if (!rows.is_null(i, 9)) a.available_at = detail::from_epoch_us(rows.int64(i, 9));
    a.resumed_with = rows.opt_text(i, 10);  // set only for the continuation of a parked attempt
    out.push_back(std::move(a));
  }
  return out;
}

result<std::vector<attempt_id>> store::heartbeat(std::span<const attempt_id> attempts,
                                                 std::span<const std::optional<std::string>> progress) {
  if (attempts.empty()) return std::vector<attempt_id>{};
  if (!progress.empty() && progress.size() != attempts.size()) return errc::invalid_argument;
  std::vector<std::int64_t> ids, leases;
  for (const auto& a : attempts) {
    ids.push_back(a.job_id);
    leases.push_back(a.run_lease);
  }
  param progress_param;
  if (!progress.empty()) {
    progress_param = detail::text_array({progress.begin(), progress.end()});
  }
  TENURE_TRY(auto rows, impl_->run(impl_->st.heartbeat,
                                   {detail::int_array(ids), detail::int_array(leases), progress_param},
                                   effect::write));
  std::vector<attempt_id> live;
  for (int i = 0; i < rows.size(); ++i) live.push_back({rows.int64(i, 0), rows.int64(i, 1)});
  return live;
}

result<std::vector<completion_result>> store::complete(std::span<const completion> batch) {
  std::vector<completion_result> out;
  if (batch.empty()) return out;
  std::vector<std::int64_t> ids, leases;
  std::vector<std::optional<std::string>> progress, secrets;
  bool any_progress = false, any_secret = false;
  for (const auto& c : batch) {
    ids.push_back(c.attempt.job_id);
    leases.push_back(c.attempt.run_lease);
    progress.push_back(c.progress);
    any_progress = any_progress || c.progress.has_value();
    // The secret makes the item name this attempt, not only its (job_id, run_lease) (migration 18).
    const bool known = !(c.secret == attempt_secret{});
    secrets.push_back(known ? std::optional<std::string>{c.secret.to_string()} : std::nullopt);
    any_secret = any_secret || known;
  }
  TENURE_TRY(auto rows, impl_->run(impl_->st.complete,
                                   {detail::int_array(ids), detail::int_array(leases),
                                    any_progress ? param{detail::text_array(progress)} : std::nullopt,
                                    any_secret ? param{detail::text_array(secrets)} : std::nullopt},
                                   effect::write));
  out.reserve(batch.size());
  for (const auto& c : batch) out.push_back({c.attempt, false, std::nullopt});
  for (int i = 0; i < rows.size(); ++i) {
    const attempt_id a{rows.int64(i, 0), rows.int64(i, 1)};
    // The first matching input item is the applied one; a duplicate in the batch stays stale.
    for (auto& r : out) {
      if (r.attempt == a && !r.applied) {
        r.applied = true;
        r.completed_at = detail::from_epoch_us(rows.int64(i, 2));
        break;
      }
    }
  }
  return out;
}

result<job_state> store::fail(attempt_id attempt, std::string_view error, fail_disposition disposition,
                              std::optional<std::chrono::microseconds> retry_after) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.fail,
                                   {number(attempt.job_id), number(attempt.run_lease), text(error),
                                    disposition == fail_disposition::permanent ? "true" : "false",
                                    retry_after ? param{detail::interval_text(*retry_after)} : std::nullopt},
                                   effect::write));
  if (rows.is_null(0, 0)) return errc::stale_attempt;
  return parse_job_state(rows.text(0, 0));
}

result<void> store::snooze(attempt_id attempt, std::chrono::microseconds delay) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.snooze,
                                   {number(attempt.job_id), number(attempt.run_lease),
                                    detail::interval_text(delay)},
                                   effect::write));
  if (!rows.boolean(0, 0)) return errc::stale_attempt;
  return success();
}

result<void> store::cancel_attempt(attempt_id attempt, std::string_view reason) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.cancel_attempt,
                                   {number(attempt.job_id), number(attempt.run_lease),
                                    reason.empty() ? std::nullopt : text(reason)},
                                   effect::write));
  if (!rows.boolean(0, 0)) return errc::stale_attempt;
  return success();
}

result<std::optional<std::string>> store::checkpoint(attempt_id attempt) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.checkpoint, {number(attempt.job_id), number(attempt.run_lease)},
                                   effect::read));
  if (rows.size() == 0) return errc::stale_attempt;
  return rows.opt_text(0, 0);
}

namespace {
/// A callback id must be a UUID: anything else is unknown (false), never a database error.
bool uuid_text(std::string_view s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
      return false;
    }
  }
  return true;
}
}  // namespace

result<std::string> store::register_callback(attempt_id attempt, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return errc::invalid_argument;
  TENURE_TRY(auto rows, impl_->run(impl_->st.register_callback,
                                   {number(attempt.job_id), number(attempt.run_lease),
                                    detail::interval_text(timeout)},
                                   effect::write));
  if (rows.is_null(0, 0)) return errc::stale_attempt;
  return std::string{rows.text(0, 0)};
}

result<callback_poll> store::await_callback(attempt_id attempt, std::string_view callback_id) {
  if (!uuid_text(callback_id)) return errc::stale_attempt;
  TENURE_TRY(auto rows, impl_->run(impl_->st.await_callback,
                                   {number(attempt.job_id), number(attempt.run_lease), text(callback_id)},
                                   effect::write));
  if (rows.size() == 0) return errc::stale_attempt;
  callback_poll p;
  p.resumed = rows.text(0, 0) == "resumed";
  if (p.resumed) p.payload = rows.opt_text(0, 1).value_or(std::string{"{}"});
  return p;
}

result<park_result> store::park_callback(attempt_id attempt, std::string_view callback_id) {
  if (!uuid_text(callback_id)) return errc::stale_attempt;
  TENURE_TRY(auto rows, impl_->run(impl_->st.park_callback,
                                   {number(attempt.job_id), number(attempt.run_lease), text(callback_id)},
                                   effect::write));
  if (rows.is_null(0, 0)) return errc::stale_attempt;
  return rows.text(0, 0) == "resumed" ? park_result::resumed : park_result::parked;
}

result<bool> store::resume_callback(std::string_view callback_id, std::string_view payload_json) {
  if (!uuid_text(callback_id)) return false;
  TENURE_TRY(auto rows, impl_->run(impl_->st.resume_callback,
                                   {text(callback_id), payload_json.empty() ? text("{}") : text(payload_json)},
                                   effect::write));
  return rows.boolean(0, 0);
}

result<bool> store::extend_callback(std::string_view callback_id, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return errc::invalid_argument;
  if (!uuid_text(callback_id)) return false;
  TENURE_TRY(auto rows, impl_->run(impl_->st.extend_callback,
                                   {text(callback_id), detail::interval_text(timeout)}, effect::write));
  return rows.boolean(0, 0);
}

result<bool> store::complete_callback(std::string_view callback_id, std::optional<std::string> progress_json) {
  if (!uuid_text(callback_id)) return false;
  TENURE_TRY(auto rows, impl_->run(impl_->st.complete_callback,
                                   {text(callback_id), progress_json ? param{*progress_json} : std::nullopt},
                                   effect::write));
  return rows.boolean(0, 0);
}

result<bool> store::fail_callback(std::string_view callback_id, std::string_view error, bool retry) {
  if (!uuid_text(callback_id)) return false;
  TENURE_TRY(auto rows, impl_->run(impl_->st.fail_callback,
                                   {text(callback_id), text(error), retry ? "true" : "false"}, effect::write));
  return rows.boolean(0, 0);
}

result<bool> store::cancel_job(std::int64_t job_id) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.cancel_job, {number(job_id)}, effect::write));
  return rows.boolean(0, 0);
}

result<bool> store::retry_job(std::int64_t job_id) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.retry_job, {number(job_id)}, effect::write));
  return rows.boolean(0, 0);
}

result<job_info> store::read_job(std::int64_t job_id) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.read_job, {number(job_id)}, effect::read));
  if (rows.size() == 0) return errc::job_not_found;
  job_info j;
  j.id = rows.int64(0, 0);
  j.queue = rows.text(0, 1);
  j.kind = rows.text(0, 2);
  j.args = rows.text(0, 3);
  TENURE_TRY(j.state, parse_job_state(rows.text(0, 4)));
  j.priority = static_cast<int>(rows.int64(0, 5));
  j.attempt = static_cast<int>(rows.int64(0, 6));
  j.max_attempts = static_cast<int>(rows.int64(0, 7));
  j.run_lease = rows.int64(0, 8);
  j.run_at = detail::from_epoch_us(rows.int64(0, 9));
  j.created_at = detail::from_epoch_us(rows.int64(0, 10));
  if (!rows.is_null(0, 11)) j.finalized_at = detail::from_epoch_us(rows.int64(0, 11));
  j.last_error = rows.opt_text(0, 12);
  j.progress = rows.opt_text(0, 13);
  j.dead_lettered = rows.boolean(0, 14);
  j.metadata = rows.text(0, 15);
  j.unique_key = rows.opt_text(0, 16);
  return j;
}

namespace {
result<std::vector<rescued_attempt>> rescued_from(const detail::rows& rows) {
  std::vector<rescued_attempt> out;
  for (int i = 0; i < rows.size(); ++i) {
    rescued_attempt r;
    r.attempt = {rows.int64(i, 0), rows.int64(i, 1)};
    r.queue = rows.text(i, 2);
    TENURE_TRY(r.new_state, parse_job_state(rows.text(i, 3)));
    out.push_back(std::move(r));
  }
  return out;
}
}  // namespace

result<std::vector<rescued_attempt>> store::rescue_stale(std::chrono::microseconds stale_after) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.rescue, {detail::interval_text(stale_after)}, effect::write));
  return rescued_from(rows);
}

result<std::vector<rescued_attempt>> store::maintain(const leader_lease& lease,
                                                          std::chrono::microseconds stale_after) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.maintain,
                                   {text(lease.holder), number(lease.term), detail::interval_text(stale_after)},
                                   effect::write));
  return rescued_from(rows);
}

result<std::int64_t> store::promote_due() {
  TENURE_TRY(auto rows, impl_->run(impl_->st.promote, {}, effect::write));
  return rows.int64(0, 0);
}

namespace {
result<attempt_evidence> evidence_from(std::string_view e) {
  if (e == "open") return attempt_evidence::open;
  if (e == "completed") return attempt_evidence::completed_by_this;
  if (e == "closed_by_other") return attempt_evidence::closed_by_other;
  if (e == "unknown_job") return attempt_evidence::unknown_job;
  return errc::protocol_error;
}
}  // namespace

result<attempt_evidence> store::reconcile(attempt_id attempt) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.evidence,
                                   {number(attempt.job_id), number(attempt.run_lease)}, effect::read));
  return evidence_from(rows.text(0, 0));
}

result<std::vector<attempt_evidence>> store::reconcile(std::span<const attempt_id> attempts) {
  std::vector<attempt_evidence> out;
  if (attempts.empty()) return out;
  std::vector<std::int64_t> ids, leases;
  for (const auto& a : attempts) {
    ids.push_back(a.job_id);
    leases.push_back(a.run_lease);
  }
  TENURE_TRY(auto rows, impl_->run(impl_->st.evidence_batch, {detail::int_array(ids), detail::int_array(leases)},
                                   effect::read));
  if (rows.size() != static_cast<int>(attempts.size())) return errc::protocol_error;
  out.reserve(attempts.size());
  for (int i = 0; i < rows.size(); ++i) {
    TENURE_TRY(auto e, evidence_from(rows.text(i, 0)));
    out.push_back(e);
  }
  return out;
}

result<void> store::configure_queue(std::string_view queue, const queue_settings& s) {
  TENURE_TRYV(impl_->run(impl_->st.configure_queue,
                        {text(queue), s.dead_letter ? "true" : "false",
                         s.hard_deadline ? param{detail::interval_text(*s.hard_deadline)} : std::nullopt,
                         detail::interval_text(s.backoff_base), detail::interval_text(s.backoff_cap)},
                        effect::write));
  return success();
}

result<bool> store::pause_queue(std::string_view queue) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.pause_queue, {text(queue)}, effect::write));
  return rows.boolean(0, 0);
}

result<bool> store::resume_queue(std::string_view queue) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.resume_queue, {text(queue)}, effect::write));
  return rows.boolean(0, 0);
}

result<void> store::update_queue(std::string_view queue, const queue_changes& c) {
  // Durations go as whole microseconds ("1500000us"), which configure_queue reads exactly.
  auto us = [](std::chrono::microseconds d) { return nlohmann::json(std::to_string(d.count()) + "us"); };
  nlohmann::json settings = nlohmann::json::object();
  if (c.dead_letter) settings["dead_letter"] = *c.dead_letter;
  if (c.hard_deadline) settings["hard_deadline"] = *c.hard_deadline ? us(**c.hard_deadline) : nlohmann::json();
  if (c.backoff_base) settings["backoff_base"] = us(*c.backoff_base);
  if (c.backoff_cap) settings["backoff_cap"] = us(*c.backoff_cap);
  if (c.retain_completed) settings["retain_completed"] = us(*c.retain_completed);
  if (c.retain_cancelled) settings["retain_cancelled"] = us(*c.retain_cancelled);
  if (c.retain_failed) settings["retain_failed"] = us(*c.retain_failed);
  auto or_null = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  // JSON has no NaN or infinity (nlohmann would write null, which clears the setting).
  for (const auto* x : {&c.rate_per_second, &c.rate_burst}) {
    if (*x && **x && !std::isfinite(***x)) {
      return error{errc::invalid_argument, x == &c.rate_per_second ? "rate_per_second must be a finite number"
                                                                  : "rate_burst must be a finite number"};
    }
  }
  if (c.max_running) settings["max_running"] = or_null(*c.max_running);
  if (c.rate_per_second) settings["rate_per_second"] = or_null(*c.rate_per_second);
  if (c.rate_burst) settings["rate_burst"] = or_null(*c.rate_burst);
  if (c.priority_aging) settings["priority_aging"] = *c.priority_aging ? us(**c.priority_aging) : nlohmann::json();
  TENURE_TRYV(impl_->run(impl_->st.update_queue, {text(queue), settings.dump()}, effect::write));
  return success();
}

result<std::vector<queue_depth>> store::queue_depths() {
  TENURE_TRY(auto rows, impl_->run(impl_->st.queue_depths, {}, effect::read));
  std::vector<queue_depth> out;
  out.reserve(static_cast<std::size_t>(rows.size()));
  for (int i = 0; i < rows.size(); ++i) {
    out.push_back({.queue = std::string{rows.text(i, 0)},
                   .available = rows.int64(i, 1),
                   .scheduled = rows.int64(i, 2),
                   .retryable = rows.int64(i, 3),
                   .running = rows.int64(i, 4),
                   .waiting_external = rows.int64(i, 5),
                   .oldest_available = std::chrono::microseconds{rows.int64(i, 6)}});
  }
  return out;
}

result<reclaim_result> store::reclaim_dead_rows(std::int64_t dead_rows) {
  TENURE_TRY(auto rows, impl_->run(impl_->st.dead_rows, {impl_->opt.schema, number(std::max<std::int64_t>(dead_rows, 1))},
                                    effect::read));
  reclaim_result out;
  std::string tables;  // the due tables this role may VACUUM; the others are autovacuum's work
  for (int i = 0; i < rows.size(); ++i) {
    ++out.due;
    if (!rows.boolean(i, 1)) continue;
    tables += (tables.empty() ? "" : ", ") + impl_->opt.schema + "." + std::string{rows.text(i, 0)};
    ++out.reclaimed;
  }
  if (tables.empty()) return out;
  // One VACUUM of the listed tables, outside a transaction block: a simple query of its own.
  // SKIP_LOCKED: a table autovacuum (or another leader) is cleaning now is not waited for.
  // INDEX_CLEANUP ON: the index entries are what claims step over, and VACUUM would skip them
  // below 2% of the heap (a drain beside a large backlog). TRUNCATE false: giving the table's
  // empty end back to the file system takes an exclusive lock that would stop every claim and
  // enqueue meanwhile.
  const std::string sql = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE false) " + tables;
  TENURE_TRYV(impl_->with_connection([&](connection& c) -> result<void> {
    TENURE_TRY(auto done, c.exec_script(sql, effect::read));
    (void)done;
    return success();
  }));
  return out;
}

}  // namespace tenure::postgres
