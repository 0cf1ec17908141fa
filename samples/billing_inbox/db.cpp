#include "db.hpp"

#include <libpq-fe.h>
#include <soci/postgresql/soci-postgresql.h>

namespace billing {

session_pool::session_pool(std::string connect, std::size_t size)
    : connect_(std::move(connect)), sessions_(size), busy_(size, false) {}

session_pool::lease::~lease() {
  if (pool_) pool_->release(slot_);
}

std::optional<session_pool::lease> session_pool::acquire(std::chrono::milliseconds timeout, std::string* error) {
  std::size_t slot = 0;
  {
    std::unique_lock lock{mu_};
    const bool got = cv_.wait_for(lock, timeout, [&] {
      for (slot = 0; slot < busy_.size(); ++slot)
        if (!busy_[slot]) return true;
      return false;
    });
    if (!got) {
      if (error) *error = "no database connection free within " + std::to_string(timeout.count()) + " ms";
      return std::nullopt;
    }
    busy_[slot] = true;
  }
  lease l{this, slot};  // gives the slot back on every path below
  auto& s = sessions_[slot];
  if (s && !connection_ok(*s)) s.reset();
  if (!s) {
    try {
      s = std::make_unique<soci::session>(soci::postgresql, connect_);
    } catch (const std::exception& e) {
      if (error) *error = std::string{"cannot connect to the database: "} + e.what();
      return std::nullopt;
    }
  }
  return l;
}

void session_pool::release(std::size_t slot) {
  {
    std::lock_guard lock{mu_};
    busy_[slot] = false;
  }
  cv_.notify_one();
}

bool connection_ok(soci::session& s) {
  if (s.get_backend() == nullptr) return false;
  // SOCI's PostgreSQL backend exports no typeinfo, so no dynamic_cast: the name tells.
  if (s.get_backend_name() != "postgresql") return true;
  auto* be = static_cast<soci::postgresql_session_backend*>(s.get_backend());
  return be->conn_ != nullptr && PQstatus(be->conn_) == CONNECTION_OK;
}

std::string sqlstate_of(const std::exception& e) {
  if (const auto* pe = dynamic_cast<const soci::postgresql_soci_error*>(&e)) return pe->sqlstate();
  return {};
}

void ensure_tables(soci::session& s, const std::string& app) {
  soci::transaction tx{s};
  // Concurrent starts (web, worker and provider at once) would race on CREATE ... IF NOT EXISTS.
  s << "SELECT pg_advisory_xact_lock(hashtext('billing_inbox:' || :schema))", soci::use(app);
  s << "CREATE SCHEMA IF NOT EXISTS " + app;
  s << "CREATE TABLE IF NOT EXISTS " + app + R"(.orders (
        id             bigserial PRIMARY KEY,
        customer       text NOT NULL CHECK (customer <> ''),
        amount_cents   bigint NOT NULL CHECK (amount_cents > 0),
        state          text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'paid')),
        charge_job_id  bigint,           -- the charge job enqueued with the order
        charge_id      text,             -- the provider's charge, once paid
        paid_run_lease bigint,           -- the attempt of the charge job that paid it
        receipt_job_id bigint,           -- the receipt_email job enqueued with the payment
        created_at     timestamptz NOT NULL DEFAULT now(),
        paid_at        timestamptz)      -- now() of the paying transaction = the job's finalized_at
      )";
  s << "CREATE TABLE IF NOT EXISTS " + app + R"(.blocked_customers (
        customer text PRIMARY KEY,       -- lower case
        reason   text NOT NULL)
      )";
  s << "INSERT INTO " + app + ".blocked_customers VALUES ('mallory', 'chargeback fraud') ON CONFLICT DO NOTHING";
  // What charge attempts did, for people and tests to read. 'finalized' is written inside the
  // paying transaction; the other events are written on their own (best effort).
  s << "CREATE TABLE IF NOT EXISTS " + app + R"(.charge_log (
        id        bigserial PRIMARY KEY,
        order_id  bigint NOT NULL,
        job_id    bigint NOT NULL,
        run_lease bigint NOT NULL,
        worker    text NOT NULL,
        event     text NOT NULL,         -- provider_call, provider_answered, finalized, stale_rejected, failed
        detail    text,
        at        timestamptz NOT NULL DEFAULT clock_timestamp())
      )";
  s << "CREATE TABLE IF NOT EXISTS " + app + R"(.receipts_sent (
        order_id  bigint PRIMARY KEY,    -- one receipt per order, whatever retries happen
        job_id    bigint NOT NULL,
        run_lease bigint NOT NULL,
        customer  text NOT NULL,
        amount_cents bigint NOT NULL,
        sent_at   timestamptz NOT NULL DEFAULT now())
      )";
  // The fake payment provider's own table: conceptually another system's database.
  s << "CREATE TABLE IF NOT EXISTS " + app + R"(.provider_charges (
        idempotency_key text PRIMARY KEY,
        charge_id       text NOT NULL UNIQUE,
        amount_cents    bigint NOT NULL,
        calls           int NOT NULL DEFAULT 1,   -- requests seen with this key; one charge
        created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
        last_call_at    timestamptz NOT NULL DEFAULT clock_timestamp())
      )";
  tx.commit();
}

}  // namespace billing
