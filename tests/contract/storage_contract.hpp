#pragma once
/// \file
/// The storage contract: one gtest suite, `storage_contract`, that every storage_port adapter
/// passes. It checks outcomes through the port only (no SQL, no adapter internals).
///
/// To run it against an adapter, implement `backend` and instantiate the suite in the adapter's
/// test file, which links the `tenure_contract_suite` object library:
///
///     using tenure::contract::storage_contract;  // INSTANTIATE needs the bare fixture name
///     INSTANTIATE_TEST_SUITE_P(sqlite, storage_contract,
///                              ::testing::Values(tenure::contract::backend_factory{
///                                  "sqlite", [] { return std::make_unique<my_backend>(); }}));
///
/// The factory is called once per test; each test gets a fresh, empty database and destroys the
/// backend at its end. Tests never sleep on the wall clock: time moves only through
/// `pass_time()` and `make_attempts_stale()`, so a backend whose clock is real (PostgreSQL's
/// now()) implements them by rewriting the stored timestamps. Queue settings (dead-lettering,
/// hard deadline, backoff) go through the port's own configure_queue.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tenure/storage_port.hpp"
#include "tenure/job.hpp"
#include "tenure/result.hpp"

namespace tenure::contract {

/// One database under test. Called from the test thread only, except `another_connection()`'s
/// results, which the concurrency tests use from several threads (one handle per thread).
struct backend {
  virtual ~backend() = default;

  /// The store under test: fresh and empty when the backend is made. Lives as long as the backend.
  virtual storage_port& store() = 0;

  /// A new, independent handle (own connection) on the same database, for races. The test
  /// destroys it before it destroys the backend.
  virtual std::unique_ptr<storage_port> another_connection() = 0;

  /// The database's current time: what `enqueue` compares run_at with. Tests compute future
  /// run_at values from it (e.g. `now() + 1h`), never from the test machine's clock directly.
  virtual time_point now() const = 0;

  /// Makes whatever is due within `d` of now() due now: scheduled and retryable run_at values,
  /// hard deadlines, callback deadlines. (SQLite fake: advances its manual clock. PostgreSQL: moves the stored
  /// timestamps back by `d`.) Whether claim and heartbeat times age too is backend-specific:
  /// tests do not depend on it, and a test that later calls rescue_stale with its "never stale"
  /// limit of one day passes far less time than that.
  virtual void pass_time(std::chrono::microseconds d) = 0;

  /// After this, `rescue_stale(stale_after())` closes every attempt open at the time of the call.
  /// Whether it also closes attempts that heartbeat after this call is backend-specific (with
  /// PostgreSQL, stale_after() is 0 and this is a no-op), so tests do not depend on it. It may
  /// move the backend's time forward by up to stale_after() (at most one minute), so tests keep
  /// jobs meant to stay scheduled at least an hour away.
  virtual void make_attempts_stale() = 0;
  virtual std::chrono::microseconds stale_after() const = 0;
};

/// Makes a fresh backend; the parameter of the value-parameterized suite.
struct backend_factory {
  std::string name;  ///< shown in test names, e.g. "sqlite"
  std::function<std::unique_ptr<backend>()> make;
};
inline void PrintTo(const backend_factory& f, std::ostream* os) { *os << f.name; }

/// The fixture of the suite (the tests are in storage_contract.cpp). Its helpers fail the test
/// at the caller's line, and abort it, when the store returns an unexpected error.
class storage_contract : public ::testing::TestWithParam<backend_factory> {
 protected:
  void SetUp() override;
  void TearDown() override;

  backend& be() { return *backend_; }
  storage_port& db() { return backend_->store(); }

  /// A valid job of `kind` in `queue`; the other fields keep their defaults.
  static new_job make_job(std::string kind = "k", std::string queue = "default");
  std::int64_t add(const new_job& job);
  std::int64_t add_at(new_job job, std::chrono::microseconds from_now);  ///< scheduled job
  std::vector<claimed_attempt> claim(std::string_view queue = "default", int max_jobs = 100);
  claimed_attempt claim_one(std::string_view queue = "default");  ///< exactly one, or fails
  job_info read(std::int64_t job_id);
  /// Completes one attempt; true when applied, false when stale.
  bool complete(attempt_id attempt, std::optional<std::string> progress = std::nullopt);
  /// make_attempts_stale() then rescue_stale(stale_after()).
  std::vector<rescued_attempt> rescue_all();
  /// db().configure_queue(queue, settings), which must succeed.
  void configure(std::string_view queue, const queue_settings& settings);

 private:
  std::unique_ptr<backend> backend_;
};

}  // namespace tenure::contract

// gtest printers, so failures show values rather than bytes.
namespace tenure {
inline void PrintTo(const attempt_id& a, std::ostream* os) {
  *os << "(job " << a.job_id << ", lease " << a.run_lease << ")";
}
inline void PrintTo(job_state s, std::ostream* os) { *os << to_string(s); }
inline void PrintTo(const enqueue_result& r, std::ostream* os) {
  *os << "(id " << r.id << (r.inserted ? ", inserted)" : ", not inserted)");
}
}  // namespace tenure
namespace tenure {
inline void PrintTo(attempt_evidence e, std::ostream* os) {
  switch (e) {
    case attempt_evidence::open: *os << "open"; return;
    case attempt_evidence::completed_by_this: *os << "completed_by_this"; return;
    case attempt_evidence::closed_by_other: *os << "closed_by_other"; return;
    case attempt_evidence::unknown_job: *os << "unknown_job"; return;
  }
  *os << "attempt_evidence(" << static_cast<int>(e) << ")";
}
}  // namespace tenure
