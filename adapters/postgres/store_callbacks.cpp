// tenure::postgres::store: external callbacks.
#include "store_impl.hpp"

namespace tenure::postgres {

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
  return impl_->yes_no(impl_->st.resume_callback,
                       {text(callback_id), payload_json.empty() ? text("{}") : text(payload_json)});
}

result<bool> store::extend_callback(std::string_view callback_id, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return errc::invalid_argument;
  if (!uuid_text(callback_id)) return false;
  return impl_->yes_no(impl_->st.extend_callback, {text(callback_id), detail::interval_text(timeout)});
}

result<bool> store::complete_callback(std::string_view callback_id, std::optional<std::string> progress_json) {
  if (!uuid_text(callback_id)) return false;
  return impl_->yes_no(impl_->st.complete_callback,
                       {text(callback_id), progress_json ? param{*progress_json} : std::nullopt});
}

result<bool> store::fail_callback(std::string_view callback_id, std::string_view error, bool retry) {
  if (!uuid_text(callback_id)) return false;
  return impl_->yes_no(impl_->st.fail_callback, {text(callback_id), text(error), retry ? "true" : "false"});
}

}  // namespace tenure::postgres
