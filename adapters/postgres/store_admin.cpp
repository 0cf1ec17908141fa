// tenure::postgres::store: administration (cancel, retry, read), maintenance (rescue, promotion,
// evidence), queues, their depths and the claim path's dead rows.
#include "store_impl.hpp"

#include <algorithm>
#include <cmath>

namespace tenure::postgres {

result<bool> store::cancel_job(std::int64_t job_id) {
  return impl_->yes_no(impl_->st.cancel_job, {number(job_id)});
}

result<bool> store::retry_job(std::int64_t job_id) {
  return impl_->yes_no(impl_->st.retry_job, {number(job_id)});
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
  return impl_->yes_no(impl_->st.pause_queue, {text(queue)});
}

result<bool> store::resume_queue(std::string_view queue) {
  return impl_->yes_no(impl_->st.resume_queue, {text(queue)});
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
