// tenure::sqlite::store: opening a store, producers and workers (the storage port over SQLite).
#include "rows.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include "sdk/runtime/storable.hpp"

namespace tenure::sqlite {

using namespace detail;  // the store's private helpers (rows.hpp)

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
      auto r = take(s, table::ready, id);
      if (!r) continue;  // cannot happen under the write lock; be safe anyway
      const opt<std::string> resume_payload = to_boost(r->resume_payload);
      r->run_lease += 1;  // every claim is a new attempt, the continuation of a parked one too
      if (!resume_payload) r->attempt += 1;  // a continuation keeps its attempt number
      const opt<std::string> last_error = to_boost(r->last_error), progress = to_boost(r->progress);
      const attempt_secret secret = draw_secret(state_->secrets);
      const std::string secret_text = secret.to_string();
      s << "INSERT INTO receipts (job_id, run_lease, queue, kind, args, priority, attempt,"
           " max_attempts, run_at, created_at, claimed_at, deadline_at, worker, last_error,"
           " progress, secret, metadata, resume_payload) VALUES (:id, :run_lease, :queue, :kind, :args,"
           " :priority, :attempt, :max_attempts, :run_at, :created_at, :now, :deadline, :worker,"
           " :last_error, :progress, :secret, :metadata, :resume_payload)",
          soci::use(r->id, "id"), soci::use(r->run_lease, "run_lease"),
          soci::use(r->queue, "queue"), soci::use(r->kind, "kind"), soci::use(r->args, "args"),
          soci::use(r->priority, "priority"), soci::use(r->attempt, "attempt"),
          soci::use(r->max_attempts, "max_attempts"), soci::use(r->run_at, "run_at"),
          soci::use(r->created_at, "created_at"), soci::use(now, "now"),
          soci::use(deadline, "deadline"), soci::use(worker_name, "worker"),
          soci::use(last_error, "last_error"), soci::use(progress, "progress"),
          soci::use(secret_text, "secret"), soci::use(r->metadata, "metadata"),
          soci::use(resume_payload, "resume_payload");
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
      // As migration 29: a parked attempt keeps its heartbeat_at (its progress is still kept).
      const int parked = is_parked(s, a) ? 1 : 0;
      const opt<std::string> new_progress = to_boost(p);
      s << "INSERT INTO attempt_state (job_id, run_lease, heartbeat_at, progress)"
           " VALUES (:job_id, :run_lease, :now, :progress)"
           " ON CONFLICT (job_id, run_lease) DO UPDATE SET"
           " heartbeat_at = CASE WHEN :parked THEN attempt_state.heartbeat_at ELSE excluded.heartbeat_at END,"
           " progress = coalesce(excluded.progress, attempt_state.progress)",
          soci::use(a.job_id, "job_id"), soci::use(a.run_lease, "run_lease"),
          soci::use(now, "now"), soci::use(new_progress, "progress"), soci::use(parked, "parked");
      if (!parked) live.push_back(a);
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
    if (!r->resume_payload) r->attempt -= 1;  // the attempt is given back (a continuation keeps its own)
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

}  // namespace tenure::sqlite
