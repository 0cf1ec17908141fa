// Runs the storage contract suite (tests/contract) against the PostgreSQL store, each test in a
// fresh schema of the project's PostgreSQL.
#include <stdexcept>

#include "contract/storage_contract.hpp"
#include "support/pg.hpp"
#include "tenure/postgres/store.hpp"

namespace {

using namespace std::chrono_literals;

/// PostgreSQL's clock is real, so time "passes" by moving the stored timestamps back, and every
/// open attempt is stale for a staleness limit of zero.
class postgres_backend final : public tenure::contract::backend {
 public:
  postgres_backend() : store_(open()) {}

  tenure::storage_port& store() override { return *store_; }
  std::unique_ptr<tenure::storage_port> another_connection() override { return open(); }
  tenure::time_point now() const override {
    const auto us = std::stoll(admin_.scalar("SELECT floor(extract(epoch from now()) * 1000000)::bigint"));
    return tenure::time_point{std::chrono::microseconds{us}};
  }
  void pass_time(std::chrono::microseconds d) override {
    const std::string by = std::to_string(d.count()) + " microseconds";
    admin_.exec("UPDATE " + schema_.name() + ".deferred SET run_at = run_at - $1::interval", {by});
    admin_.exec("UPDATE " + schema_.name() + ".claims SET deadline_at = deadline_at - $1::interval", {by});
    admin_.exec("UPDATE " + schema_.name() + ".attempt_state SET callback_deadline = callback_deadline - $1::interval",
                {by});
  }
  void make_attempts_stale() override {}
  std::chrono::microseconds stale_after() const override { return 0us; }

 private:
  std::unique_ptr<tenure::postgres::store> open() {
    auto s = tenure::postgres::store::open({.dsn = schema_.dsn(), .schema = schema_.name(), .pool_size = 2});
    if (!s) throw std::runtime_error("cannot open the store: " + s.error().message());
    return std::move(s).value();
  }

  tenure::test::scoped_schema schema_{"contract"};
  mutable tenure::test::pg admin_{schema_.dsn()};
  std::unique_ptr<tenure::postgres::store> store_;
};

}  // namespace

using tenure::contract::storage_contract;
INSTANTIATE_TEST_SUITE_P(postgres, storage_contract,
                         ::testing::Values(tenure::contract::backend_factory{
                             "postgres", [] { return std::make_unique<postgres_backend>(); }}));
