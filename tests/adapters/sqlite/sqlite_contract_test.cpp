// Runs the storage contract suite against the SQLite fake.
#include <stdexcept>

#include "tenure/sqlite/store.hpp"
#include "temp_db.hpp"
#include "contract/storage_contract.hpp"

namespace {

using namespace std::chrono_literals;

/// One temporary database file per test (":memory:" could not be shared with
/// another_connection()), a manual clock shared by every handle on it.
class sqlite_backend final : public tenure::contract::backend {
 public:
  sqlite_backend() : store_(open()) {}
  ~sqlite_backend() override { store_.reset(); }  // close before temp_db removes the file

  tenure::storage_port& store() override { return *store_; }
  std::unique_ptr<tenure::storage_port> another_connection() override { return open(); }
  tenure::time_point now() const override { return clock_.now(); }
  void pass_time(std::chrono::microseconds d) override { clock_.advance(d); }
  // Ages every open attempt by moving the clock: rescue then applies its real comparison.
  void make_attempts_stale() override { clock_.advance(stale_after()); }
  std::chrono::microseconds stale_after() const override { return 30s; }

 private:
  std::unique_ptr<tenure::sqlite::store> open() {
    auto s = tenure::sqlite::store::open(db_.path(), clock_);
    if (!s) throw std::runtime_error("cannot open " + db_.path() + ": " + s.error().message());
    return std::move(s).value();
  }

  tenure::sqlite::test::temp_db db_;
  tenure::manual_clock clock_;
  std::unique_ptr<tenure::sqlite::store> store_;
};

}  // namespace

using tenure::contract::storage_contract;
INSTANTIATE_TEST_SUITE_P(sqlite, storage_contract,
                         ::testing::Values(tenure::contract::backend_factory{
                             "sqlite", [] { return std::make_unique<sqlite_backend>(); }}));
