#include "tenure/error.hpp"

#include <string>

namespace tenure {
namespace {

class errc_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "tenure"; }

  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::stale_attempt:
        return "stale attempt: the attempt is no longer live (rescued, cancelled, re-claimed or finished)";
      case errc::malformed_token: return "malformed finalization token";
      case errc::job_not_found: return "job not found";
      case errc::database_unavailable: return "database unavailable";
      case errc::commit_in_doubt: return "commit outcome unknown (acknowledgement lost)";
      case errc::invalid_argument: return "invalid argument";
      case errc::schema_mismatch: return "database schema version mismatch";
      case errc::database_error: return "unexpected database error";
      case errc::transient_conflict: return "transient conflict (deadlock or serialization failure)";
      case errc::protocol_error: return "protocol error";
      case errc::shutting_down: return "shutting down";
      case errc::permission_denied: return "permission denied";
      case errc::leadership_lost: return "maintenance leadership lost (lease expired or taken over)";
      case errc::unsupported: return "not supported by this store";
    }
    return "unknown tenure error " + std::to_string(ev);
  }

  std::error_condition default_error_condition(int ev) const noexcept override {
    switch (static_cast<errc>(ev)) {
      case errc::database_unavailable:
      case errc::transient_conflict:
      case errc::shutting_down:
        return make_error_condition(condition::retryable);
      case errc::commit_in_doubt:
        return make_error_condition(condition::in_doubt);
      case errc::stale_attempt:
      case errc::leadership_lost:
      case errc::job_not_found:
      case errc::database_error:
      case errc::protocol_error:
        return make_error_condition(condition::permanent);
      case errc::malformed_token:
      case errc::invalid_argument:
      case errc::schema_mismatch:
      case errc::permission_denied:
      case errc::unsupported:
        return make_error_condition(condition::usage_error);
    }
    return std::error_condition(ev, *this);
  }
};

class cond_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "tenure.condition"; }
  std::string message(int ev) const override {
    switch (static_cast<condition>(ev)) {
      case condition::retryable: return "retryable";
      case condition::in_doubt: return "in doubt";
      case condition::permanent: return "permanent";
      case condition::usage_error: return "usage error";
    }
    return "unknown condition";
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const errc_category c;
  return c;
}
const std::error_category& condition_category() noexcept {
  static const cond_category c;
  return c;
}
std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}
std::error_condition make_error_condition(condition c) noexcept {
  return {static_cast<int>(c), condition_category()};
}

}  // namespace tenure

namespace tenure {

error::error(std::error_code code, std::string detail, std::string sqlstate) : std::error_code(code) {
  if (!detail.empty() || !sqlstate.empty()) info_ = std::make_shared<const info>(info{std::move(detail), std::move(sqlstate)});
}

const std::string& error::detail() const noexcept {
  static const std::string none;
  return info_ ? info_->detail : none;
}

const std::string& error::sqlstate() const noexcept {
  static const std::string none;
  return info_ ? info_->sqlstate : none;
}

std::string error::message() const {
  std::string out = std::error_code::message();
  if (!info_) return out;
  if (!info_->detail.empty()) out += ": " + info_->detail;
  if (!info_->sqlstate.empty()) out += " [SQLSTATE " + info_->sqlstate + "]";
  return out;
}

void outcome_throw_as_system_error_with_payload(const error& e) {
  throw std::system_error(e.code(), e.detail());
}

}  // namespace tenure
