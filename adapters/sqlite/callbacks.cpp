// tenure::sqlite::store: external callbacks (0002_callbacks.sql, 0014_parked_callbacks.sql).
#include "rows.hpp"

#include <utility>

#include "sdk/runtime/storable.hpp"

namespace tenure::sqlite {

using namespace detail;  // the store's private helpers (rows.hpp)

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

}  // namespace tenure::sqlite
