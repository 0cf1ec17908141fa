#pragma once
// The caller's side of a transaction over each bridge (libpq, SOCI, libpqxx), for the bridge
// tests: one interface, so that every behaviour is tested on all three alike.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <soci/postgresql/soci-postgresql.h>

#include "support/pg.hpp"
#include "tenure/libpq.hpp"
#include "tenure/postgres/store.hpp"
#include "tenure/pqxx.hpp"
#include "tenure/soci.hpp"

namespace tenure::test {

/// The caller's side of one transaction, over one bridge.
class caller_tx {
 public:
  virtual ~caller_tx() = default;
  virtual void begin() = 0;
  virtual void exec(const std::string& sql) = 0;  ///< throws on error
  virtual result<finalization_receipt> complete(const finalization_token& t, const finalize_options& o) = 0;
  /// No transaction block: each statement commits on its own (a pqxx::nontransaction).
  virtual void begin_autocommit() {}
  virtual result<std::int64_t> enqueue(const new_job& job, const sql_options& o) = 0;
  virtual result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs, const sql_options& o) = 0;
  virtual result<enqueue_result> try_enqueue(const new_job& job, const sql_options& o) = 0;
  virtual result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs,
                                                                const sql_options& o) = 0;
  virtual std::string scalar(const std::string& sql) = 0;  ///< the first cell; throws on error
  virtual bool commit() = 0;  ///< false when the server refused (e.g. the transaction was aborted)
  virtual void rollback() = 0;
  virtual int backend_pid() = 0;  ///< the server process behind the caller's connection
  virtual int socket() = 0;       ///< the client end of the caller's connection
};

class libpq_tx final : public caller_tx {
 public:
  explicit libpq_tx(const std::string& dsn, bool session_settings = true) : db_(dsn, session_settings) {}
  void begin() override { db_.exec("BEGIN"); }
  void exec(const std::string& sql) override { db_.exec(sql); }
  result<finalization_receipt> complete(const finalization_token& t, const finalize_options& o) override {
    return tenure::complete_in_tx(db_.native(), t, o);
  }
  result<std::int64_t> enqueue(const new_job& job, const sql_options& o) override {
    return tenure::enqueue(db_.native(), job, o);
  }
  result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs, const sql_options& o) override {
    return tenure::enqueue_batch(db_.native(), jobs, o);
  }
  result<enqueue_result> try_enqueue(const new_job& job, const sql_options& o) override {
    return tenure::try_enqueue(db_.native(), job, o);
  }
  result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs, const sql_options& o) override {
    return tenure::try_enqueue_batch(db_.native(), jobs, o);
  }
  std::string scalar(const std::string& sql) override { return db_.scalar(sql); }
  bool commit() override {
    // COMMIT of an aborted transaction succeeds with the command tag ROLLBACK.
    PGresult* r = PQexec(db_.native(), "COMMIT");
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK && std::string{PQcmdStatus(r)} == "COMMIT";
    PQclear(r);
    return ok;
  }
  void rollback() override { db_.query("ROLLBACK"); }
  int backend_pid() override { return PQbackendPID(db_.native()); }
  int socket() override { return PQsocket(db_.native()); }
  PGconn* native() { return db_.native(); }

 private:
  pg db_;
};

class soci_tx final : public caller_tx {
 public:
  explicit soci_tx(const std::string& dsn) : session_(soci::postgresql, tenure::test::keyword_dsn(dsn)) {}
  void begin() override { tx_.emplace(session_); }
  void exec(const std::string& sql) override { session_ << sql; }
  result<finalization_receipt> complete(const finalization_token& t, const finalize_options& o) override {
    return tenure::complete_in_tx(session_, t, o);
  }
  result<std::int64_t> enqueue(const new_job& job, const sql_options& o) override {
    return tenure::enqueue(session_, job, o);
  }
  result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs, const sql_options& o) override {
    return tenure::enqueue_batch(session_, jobs, o);
  }
  result<enqueue_result> try_enqueue(const new_job& job, const sql_options& o) override {
    return tenure::try_enqueue(session_, job, o);
  }
  result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs, const sql_options& o) override {
    return tenure::try_enqueue_batch(session_, jobs, o);
  }
  std::string scalar(const std::string& sql) override {
    std::string out;
    session_ << sql, soci::into(out);
    return out;
  }
  bool commit() override {
    // SOCI's commit does not report that the server rolled back an aborted transaction.
    auto* be = static_cast<soci::postgresql_session_backend*>(session_.get_backend());
    const bool aborted = PQtransactionStatus(be->conn_) == PQTRANS_INERROR;
    try {
      tx_->commit();
      return !aborted;
    } catch (const soci::soci_error&) {
      return false;
    }
  }
  void rollback() override {
    if (tx_) tx_->rollback();
  }
  int backend_pid() override { return PQbackendPID(native()); }
  int socket() override { return PQsocket(native()); }
  PGconn* native() { return static_cast<soci::postgresql_session_backend*>(session_.get_backend())->conn_; }
  soci::session& session() { return session_; }

 private:
  soci::session session_;
  std::optional<soci::transaction> tx_;
};

class pqxx_tx final : public caller_tx {
 public:
  explicit pqxx_tx(const std::string& dsn) : conn_(dsn) {}
  void begin() override {
    work_.reset();  // one transaction object per connection at a time
    work_ = std::make_unique<pqxx::work>(conn_);
  }
  void begin_autocommit() override {
    work_.reset();
    work_ = std::make_unique<pqxx::nontransaction>(conn_);
  }
  void exec(const std::string& sql) override { work_->exec(sql); }
  result<finalization_receipt> complete(const finalization_token& t, const finalize_options& o) override {
    return tenure::complete_in_tx(*work_, t, o);
  }
  result<std::int64_t> enqueue(const new_job& job, const sql_options& o) override {
    return tenure::enqueue(*work_, job, o);
  }
  result<std::vector<std::int64_t>> enqueue_batch(std::span<const new_job> jobs, const sql_options& o) override {
    return tenure::enqueue_batch(*work_, jobs, o);
  }
  result<enqueue_result> try_enqueue(const new_job& job, const sql_options& o) override {
    return tenure::try_enqueue(*work_, job, o);
  }
  result<std::vector<enqueue_result>> try_enqueue_batch(std::span<const new_job> jobs, const sql_options& o) override {
    return tenure::try_enqueue_batch(*work_, jobs, o);
  }
  std::string scalar(const std::string& sql) override { return work_->exec1(sql)[0].c_str(); }
  bool commit() override {
    try {
      // pqxx 6 commits an aborted transaction without complaint (the server answers ROLLBACK):
      // ask the server first; in an aborted transaction any statement fails with 25P02.
      work_->exec("SELECT 1");
      work_->commit();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  void rollback() override { work_->abort(); }
  int backend_pid() override { return conn_.backendpid(); }
  int socket() override { return conn_.sock(); }

 private:
  pqxx::connection conn_;
  std::unique_ptr<pqxx::transaction_base> work_;
};

enum class bridge { libpq, soci, pqxx };

/// A connection to `dsn` over `b`. `session_settings`: whether the libpq test connection sets
/// anything on its server session (not through a transaction pooler).
inline std::unique_ptr<caller_tx> open_caller_tx(bridge b, const std::string& dsn, bool session_settings = true) {
  switch (b) {
    case bridge::libpq: return std::make_unique<libpq_tx>(dsn, session_settings);
    case bridge::soci: return std::make_unique<soci_tx>(dsn);
    case bridge::pqxx: return std::make_unique<pqxx_tx>(dsn);
  }
  return nullptr;
}

/// Test names: the bridge's name.
inline std::string bridge_name(const ::testing::TestParamInfo<bridge>& info) {
  switch (info.param) {
    case bridge::libpq: return "libpq";
    case bridge::soci: return "soci";
    case bridge::pqxx: return "pqxx";
  }
  return "unknown";
}

/// A fresh schema with an `orders` table and a store, for the completion tests: one claimed
/// attempt at a time, the caller's business row for it, and what the database then says.
class claimed_attempts : public ::testing::Test {
 protected:
  explicit claimed_attempts(const char* prefix) : schema_{prefix} {}
  void SetUp() override {
    check_.exec("CREATE TABLE " + s("orders") + " (id serial PRIMARY KEY, job_id bigint, run_lease bigint)");
    auto st = tenure::postgres::store::open({.dsn = schema_.dsn(), .schema = schema_.name()});
    ASSERT_TRUE(st) << st.error().message();
    store_ = std::move(st).value();
    opts_.schema = schema_.name();
  }
  std::string s(const std::string& n) const { return schema_.name() + "." + n; }
  /// Enqueues and claims one job; returns the claimed attempt.
  claimed_attempt claim_one() {
    EXPECT_TRUE(store_->enqueue({.kind = "charge", .queue = "q"}));
    auto got = store_->claim("q", 1, "test");
    EXPECT_TRUE(got && got.value().size() == 1);
    return got.value().at(0);
  }
  /// The caller's business row for the attempt.
  std::string insert_order(const claimed_attempt& c) {
    return "INSERT INTO " + s("orders") + " (job_id, run_lease) VALUES (" + std::to_string(c.attempt.job_id) + ", " +
           std::to_string(c.attempt.run_lease) + ")";
  }
  long orders() { return std::stol(check_.scalar("SELECT count(*) FROM " + s("orders"))); }
  /// "<state> <attempt>" of the job.
  std::string job(std::int64_t id) {
    return check_.scalar("SELECT state || ' ' || attempt FROM " + s("jobs") + " WHERE id = $1", {std::to_string(id)});
  }

  scoped_schema schema_;
  pg check_{schema_.dsn()};
  std::unique_ptr<postgres::store> store_;
  finalize_options opts_;
};

}  // namespace tenure::test
