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
