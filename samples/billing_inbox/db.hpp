#pragma once
// The application's own database access: a small pool of SOCI sessions (separate from the
// tenure runtime's connections) and the sample's tables.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <soci/soci.h>

namespace billing {

/// A fixed number of SOCI sessions, connected lazily and reconnected when found broken.
class session_pool {
 public:
  /// `connect` is SOCI's keyword form (tenure::soci_connect_string).
  session_pool(std::string connect, std::size_t size);

  class lease {
   public:
    lease(session_pool* pool, std::size_t slot) : pool_(pool), slot_(slot) {}
    lease(lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), slot_(o.slot_) {}
    lease& operator=(lease&&) = delete;
    ~lease();
    soci::session& operator*() const { return *pool_->sessions_[slot_]; }
    soci::session* operator->() const { return pool_->sessions_[slot_].get(); }

   private:
    session_pool* pool_;
    std::size_t slot_;
  };

  /// Waits up to `timeout` for a free session and connects it if needed. nullopt with `error`
  /// set when none is free in time or the database cannot be reached.
  std::optional<lease> acquire(std::chrono::milliseconds timeout, std::string* error);

 private:
  void release(std::size_t slot);
  std::string connect_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<soci::session>> sessions_;
  std::vector<bool> busy_;
};

/// False when the session's PostgreSQL connection is gone.
bool connection_ok(soci::session& s);

/// The SQLSTATE of a SOCI PostgreSQL error, or "" for any other exception.
std::string sqlstate_of(const std::exception& e);

/// Creates the sample's schema and tables when missing (idempotent; concurrent callers
/// serialize on an advisory lock): orders, blocked_customers, charge_log, receipts_sent and the
/// fake provider's provider_charges.
void ensure_tables(soci::session& s, const std::string& app_schema);

}  // namespace billing
