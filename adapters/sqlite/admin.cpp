// tenure::sqlite::store: administration (cancel, retry, read) and maintenance (rescue, promotion,
// evidence, depths).
#include "rows.hpp"

#include <utility>

namespace tenure::sqlite {

using namespace detail;  // the store's private helpers (rows.hpp)

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
        if (r->resume_payload) r->attempt += 1;  // a continuation stays one, as the next attempt
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
