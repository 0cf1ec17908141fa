// tenure::postgres::store: opening a store, producers (enqueue, the COPY path) and workers
// (claim to checkpoint).
#include "store_impl.hpp"

#include <algorithm>

#include "tenure/postgres/schema.hpp"
#include "tenure/postgres/sql_text.hpp"

namespace tenure::postgres {

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
  auto args = json_text(job.args);
  auto metadata = json_text(job.metadata);
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

/// Many keyless jobs in one transaction of the store's: COPY straight into `ready` when none is
/// scheduled (schema migration 23), else into the session's stage and one move (migration 22).
/// The commit is the write: lost there, errc::commit_in_doubt. nullopt, with nothing written, when
/// the server offers nowhere to COPY or the session is not UTF-8.
result<std::optional<std::vector<enqueue_result>>> store::copy_enqueue(std::span<const new_job> jobs) {
  const bool scheduled = any_scheduled(jobs);
  TENURE_TRYV(check_copy_rows(jobs, scheduled));
  return impl_->with_connection([&](connection& c) -> result<std::optional<std::vector<enqueue_result>>> {
    // COPY's text format is escaped byte by byte: only on a UTF-8 session (a client-only multibyte
    // encoding such as SJIS would break it).
    if (std::string_view{pg_encoding_to_char(PQclientEncoding(c.native()))} != "UTF8") {
      return std::optional<std::vector<enqueue_result>>{};
    }
    TENURE_TRY(auto begun, c.exec_script("BEGIN", effect::read));
    (void)begun;
    TENURE_TRY(auto target, c.exec(impl_->st.copy_target, {param{scheduled ? "true" : "false"}}, effect::read));
    // Nowhere to COPY (no stage: the schema's owner may not create temporary tables here): the
    // caller sends arrays after all. The empty transaction ends when the connection goes back to
    // the pool.
    if (target.size() == 1 && target.is_null(0, 0)) return std::optional<std::vector<enqueue_result>>{};
    if (target.size() != 1) return errc::protocol_error;
    TENURE_TRY(auto into, enqueue_copy_into(target.text(0, 0), impl_->opt.schema, scheduled));
    // The rows for where it goes (the stage's, when not offered `specs`).
    TENURE_TRYV(c.copy_in(into.sql, jobs, !into.ready, effect::read));
    const auto n = number(static_cast<std::int64_t>(jobs.size()));
    TENURE_TRY(auto moved, into.ready ? c.exec(impl_->st.copy_ready_ids, {n}, effect::read)
                                      : c.exec(impl_->st.copy_move, {}, effect::read));
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
    args.emplace_back(json_text(j.args));
    metadatas.emplace_back(json_text(j.metadata));
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

}  // namespace tenure::postgres
