// Caller-owned handlers against real PostgreSQL: the runtime reconciles every exit against the
// attempt's durable evidence before it releases the in-flight entry or the permit; a receipt whose
// COMMIT the bridge saw answered is that evidence (docs/design.md 6).
#include <atomic>
#include <mutex>

#include "runtime/runtime_fixture.hpp"
#include "support/fault_proxy.hpp"
#include "tenure/libpq.hpp"

namespace tenure::test {
namespace {

class caller_owned : public runtime_pg {
 protected:
  void SetUp() override { db_.exec("CREATE TABLE " + s("orders") + " (job_id bigint, run_lease bigint)"); }

  /// The typical caller-owned transaction: a business row and complete_in_tx, then COMMIT (or
  /// ROLLBACK when `commit` is false). Returns complete_in_tx's answer.
  result<finalization_receipt> business_tx(caller_owned_context& ctx, bool commit = true) {
    pg conn{schema_.dsn()};
    conn.exec("BEGIN");
    conn.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)",
              {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())});
    auto receipt = ctx.complete_in_tx(conn.native());
    conn.query(commit && receipt ? "COMMIT" : "ROLLBACK");
    return receipt;
  }
  long orders(const std::string& where = "true") {
    return std::stol(db_.scalar("SELECT count(*) FROM " + s("orders") + " WHERE " + where));
  }
  std::string job(const std::string& id, const std::string& cols = "state || ' ' || attempt") {
    return db_.scalar("SELECT " + cols + " FROM " + s("jobs") + " WHERE id = $1", {id});
  }
  /// fast_config() with a 1 ms retry backoff.
  static runtime_config quick_retries() {
    auto c = fast_config();
    c.queues[0].backoff_base = 1ms;
    c.queues[0].backoff_cap = 1ms;
    return c;
  }
  /// Case 1 after a handler that reported an error: completed once by lease 1, one business
  /// row, no retry, one protocol warning.
  void expect_completed_once_with_one_warning(runtime& rt, const std::string& id) {
    EXPECT_EQ(job(id), "completed 1");
    EXPECT_EQ(orders(), 1);
    const auto m = rt.metrics();
    EXPECT_EQ(m.retried, 0u);
    EXPECT_EQ(m.stale_rejected, 0u);
    EXPECT_EQ(m.completed, 1u);
    EXPECT_EQ(m.protocol_warnings, 1u);
  }
  bool finished(const std::string& id) {
    return eventually([&] {
      const auto st = state_of(id);
      return st == "completed" || st == "failed" || st == "cancelled";
    });
  }
};

TEST_F(caller_owned, receipt_after_commit_is_accepted_after_reconciliation) {
  auto rt = make();
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) { return business_tx(ctx); });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  EXPECT_EQ(job(id), "completed 1");
  EXPECT_EQ(orders(), 1);
  ASSERT_TRUE(rt->wait_idle(5s));
  const auto m = rt->metrics();
  EXPECT_EQ(m.completed, 1u);
  EXPECT_GE(m.reconciliations, 1u) << "the receipt alone is not trusted";
  EXPECT_EQ(m.protocol_warnings, 0u);
  EXPECT_EQ(m.in_flight, 0);
  EXPECT_EQ(m.permits_held, 0);
  EXPECT_EQ(m.flushes, 0u) << "caller-owned completions bypass the batcher";
}

TEST_F(caller_owned, complete_and_commit_receipt_is_settled_from_its_commit_without_an_evidence_read) {
  auto rt = make();
  std::atomic<int> completed_events{0};
  rt->on_event([&](const job_event& e) {
    if (e.event == lifecycle_event::completed) ++completed_events;
  });
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    pg conn{schema_.dsn()};
    conn.exec("BEGIN");
    conn.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)",
              {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())});
    return ctx.complete_and_commit(conn.native(), nlohmann::json{{"done", true}});
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  EXPECT_EQ(job(id), "completed 1");
  EXPECT_EQ(job(id, "progress::text"), "{\"done\": true}");
  EXPECT_EQ(orders(), 1);
  ASSERT_TRUE(rt->wait_idle(5s));
  const auto m = rt->metrics();
  EXPECT_EQ(m.completed, 1u);
  EXPECT_EQ(completed_events.load(), 1);
  EXPECT_EQ(m.reconciliations, 0u) << "the server's answer to the COMMIT is the evidence";
  EXPECT_EQ(m.reconcile_reads, 0u);
  EXPECT_EQ(m.protocol_warnings, 0u);
  EXPECT_EQ(m.in_flight, 0);
  EXPECT_EQ(m.permits_held, 0);
}

TEST_F(caller_owned, many_complete_and_commit_exits_free_their_permits_with_no_evidence_read) {
  auto cfg = fast_config();
  cfg.queues[0].max_concurrency = 8;
  auto rt = make(cfg);
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    pg conn{schema_.dsn()};
    conn.exec("BEGIN");
    conn.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)",
              {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())});
    return ctx.complete_and_commit(conn.native());
  });
  enqueue_many(60, "charge");
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state = 'completed'") == 60; }));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(orders(), 60);
  const auto m = rt->metrics();
  EXPECT_EQ(m.completed, 60u);
  EXPECT_EQ(m.reconciliations, 0u);
  EXPECT_EQ(m.reconcile_reads, 0u);
  EXPECT_EQ(m.retried, 0u);
  EXPECT_EQ(m.permits_held, 0);
  EXPECT_EQ(m.in_flight, 0);
}

TEST_F(caller_owned, a_committed_receipt_for_another_attempt_is_not_taken_as_this_ones_evidence) {
  // Attempt 1 of the charge completes and commits an attempt of another job (claimed here, outside
  // the runtime) and returns that receipt: committed, but it says nothing about attempt 1, whose
  // evidence is read (still open), so it is retried.
  auto rt = make(quick_retries());
  const auto other = enqueue("side", "{}", "side_queue");
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    if (ctx.attempt() > 1) return business_tx(ctx);
    pg side{schema_.dsn()};
    const auto token_text = side.scalar("SELECT " + s("make_token") + "(job_id, run_lease, secret) FROM " +
                                        s("claim_attempts") + "('side_queue', 1, 'test', NULL)");
    auto token = finalization_token::parse(token_text);
    if (!token) return token.error();
    pg conn{schema_.dsn()};
    conn.exec("BEGIN");
    return complete_and_commit(conn.native(), token.value(), {.schema = schema_.name()});
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(eventually([&] { return job(id) == "completed 2"; }));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(job(other), "completed 1") << "the other job's attempt was completed and committed";
  EXPECT_EQ(orders(), 1);
  const auto m = rt->metrics();
  EXPECT_GE(m.reconciliations, 1u) << "attempt 1's evidence was read";
  EXPECT_EQ(m.protocol_warnings, 1u);
  EXPECT_EQ(m.retried, 1u);
}

TEST_F(caller_owned, complete_and_commit_of_a_cancelled_attempt_is_stale_and_writes_nothing) {
  auto rt = make();
  std::atomic<int> stale{0};
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    // An operator cancels the job while the handler works.
    pg op{schema_.dsn()};
    op.exec("SELECT " + s("cancel_job") + "($1)", {std::to_string(ctx.job_id())});
    pg conn{schema_.dsn()};
    conn.exec("BEGIN");
    conn.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)",
              {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())});
    auto r = ctx.complete_and_commit(conn.native());
    if (!r && r.error() == errc::stale_attempt) ++stale;
    EXPECT_EQ(PQtransactionStatus(conn.native()), PQTRANS_IDLE);
    return r;
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(stale.load(), 1);
  EXPECT_EQ(job(id, "state"), "cancelled");
  EXPECT_EQ(orders(), 0);
}

TEST_F(caller_owned, error_after_a_durable_commit_is_accepted_with_one_protocol_warning) {
  auto rt = make();
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    auto r = business_tx(ctx);
    if (!r) return r.error();
    return make_error_code(errc::database_unavailable);  // what a lost COMMIT reply looks like
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(job(id), "completed 1") << "durable state wins: no retry";
  EXPECT_EQ(orders(), 1);
  EXPECT_EQ(rt->metrics().protocol_warnings, 1u);
  EXPECT_EQ(rt->metrics().retried, 0u);
  EXPECT_EQ(rt->metrics().completed, 1u);
}

TEST_F(caller_owned, exception_after_a_durable_commit_is_accepted_with_one_protocol_warning) {
  auto rt = make();
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    auto r = business_tx(ctx);
    if (r) throw std::runtime_error("mail server down after commit");
    return r;
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(job(id), "completed 1");
  EXPECT_EQ(rt->metrics().protocol_warnings, 1u);
  EXPECT_EQ(rt->metrics().retried, 0u);
}

TEST_F(caller_owned, rolled_back_attempt_is_retried_through_the_policy_then_completes_once) {
  auto rt = make(quick_retries());
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    if (ctx.attempt() == 1) {
      auto r = business_tx(ctx, /*commit=*/false);
      EXPECT_TRUE(r) << "complete_in_tx itself succeeded; the caller rolled back";
      ctx.note_failure("provider timed out");
      return make_error_code(errc::database_unavailable);
    }
    return business_tx(ctx);
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(job(id), "completed 2");
  EXPECT_EQ(orders(), 1);
  EXPECT_EQ(orders("run_lease = (SELECT j.run_lease FROM " + s("jobs") + " j WHERE j.id = job_id)"), 1) << "only the attempt that completed left a business row";
  EXPECT_EQ(rt->metrics().retried, 1u);
  EXPECT_EQ(rt->metrics().protocol_warnings, 0u);
  EXPECT_EQ(job(id, "last_error"), "provider timed out");
}

TEST_F(caller_owned, receipt_without_a_durable_completion_is_a_protocol_error_and_retried) {
  auto rt = make(quick_retries());
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    // Attempt 1 claims success but rolls back: the database says the attempt is still open.
    return business_tx(ctx, /*commit=*/ctx.attempt() > 1);
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(job(id), "completed 2");
  EXPECT_EQ(orders(), 1);
  EXPECT_EQ(rt->metrics().protocol_warnings, 1u);
  EXPECT_EQ(rt->metrics().retried, 1u);
}

TEST_F(caller_owned, lost_commit_acknowledgement_reconciles_to_completed_once_with_one_protocol_warning) {
  // The caller's connection goes through a loopback proxy that forwards COMMIT, waits for the
  // server's reply, drops it and resets the connection: the server committed, the handler saw
  // an error. Reconciliation must find case 1: completed once, no retry, one protocol warning.
  fault_proxy proxy{schema_.dsn()};
  auto rt = make();
  std::atomic<int> runs{0};
  std::atomic<bool> commit_failed{false};
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    ++runs;
    std::unique_ptr<PGconn, decltype(&PQfinish)> conn{PQconnectdb(proxy.dsn(schema_.dsn()).c_str()), &PQfinish};
    if (PQstatus(conn.get()) != CONNECTION_OK) return make_error_code(errc::database_unavailable);
    auto run = [&](const std::string& sql) {
      std::unique_ptr<PGresult, decltype(&PQclear)> r{PQexec(conn.get(), sql.c_str()), &PQclear};
      return PQresultStatus(r.get()) == PGRES_COMMAND_OK || PQresultStatus(r.get()) == PGRES_TUPLES_OK;
    };
    run("BEGIN");
    run("INSERT INTO " + s("orders") + " VALUES (" + std::to_string(ctx.job_id()) + ", " +
        std::to_string(ctx.run_lease()) + ")");
    auto receipt = ctx.complete_in_tx(conn.get());
    if (!receipt) return receipt.error();
    proxy.arm_drop_commit_reply();
    if (run("COMMIT")) return receipt;
    commit_failed = true;  // what the application sees: the connection broke during COMMIT
    ctx.note_failure("COMMIT failed: " + std::string{PQerrorMessage(conn.get())});
    return make_error_code(errc::commit_in_doubt);
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  ASSERT_TRUE(rt->wait_idle(5s));
  EXPECT_EQ(proxy.fired(), 1);
  EXPECT_TRUE(commit_failed.load()) << "the handler saw an error";
  EXPECT_EQ(runs.load(), 1) << "no retry";
  expect_completed_once_with_one_warning(*rt, id);  // the server committed
}

TEST_F(caller_owned, exits_are_reconciled_in_set_based_batches_not_one_read_each) {
  auto cfg = fast_config();
  cfg.queues[0].max_concurrency = 200;
  cfg.claim_batch = 200;
  cfg.flush_delay = 50ms;  // exits arriving within 50 ms share one evidence statement
  auto rt = make(cfg);
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    ctx.note_failure("declined");
    return make_error_code(errc::invalid_argument);  // never finalized: evidence says open
  });
  enqueue_many(200, "charge");
  ASSERT_TRUE(rt->start());
  ASSERT_TRUE(eventually([&] { return count("state = 'failed'") == 200; }));
  ASSERT_TRUE(rt->wait_idle(5s));
  const auto m = rt->metrics();
  EXPECT_EQ(m.reconciliations, 200u);
  EXPECT_LE(m.reconcile_reads, 20u) << "200 exits need a handful of set-based reads";
  EXPECT_EQ(m.failed, 200u);
}

TEST_F(caller_owned, caller_transaction_left_open_then_committed_is_accepted_not_retried) {
  // The handler returns an error while its transaction, which already ran complete_job, is
  // still open on the server (a pooled connection not yet cleaned up). Evidence says "open";
  // the retry write waits on the caller's row lock and times out (lock_timeout), is retried,
  // and once the caller's COMMIT lands it is stale: the evidence is read again and says
  // completed by this attempt. Completed once, no retry, one protocol warning.
  auto made = postgres::make_runtime({.dsn = schema_.dsn(),
                                      .schema = schema_.name(),
                                      .lock_timeout = 200ms,
                                      .runtime = fast_config()});
  ASSERT_TRUE(made) << made.error().message();
  auto rt = std::move(made).value();
  auto kept = std::make_shared<pg>(schema_.dsn());
  std::atomic<bool> returned{false};
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    kept->exec("BEGIN");
    kept->exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)",
               {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())});
    auto r = ctx.complete_in_tx(kept->native());
    EXPECT_TRUE(r);
    returned = true;
    return make_error_code(errc::database_unavailable);  // the transaction stays open
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(eventually([&] { return returned.load(); }));
  ASSERT_TRUE(eventually([&] { return rt->metrics().database_errors >= 2; }, 10s))
      << "the retry write must time out on the caller's lock, not wait forever";
  EXPECT_EQ(state_of(id), "running");
  kept->exec("COMMIT");
  ASSERT_TRUE(finished(id));
  ASSERT_TRUE(rt->wait_idle(10s));
  expect_completed_once_with_one_warning(*rt, id);
}

TEST_F(caller_owned, invalid_argument_error_fails_the_job_for_good) {
  auto rt = make();
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    ctx.note_failure("card number is not a number");
    return make_error_code(errc::invalid_argument);
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(finished(id));
  EXPECT_EQ(job(id), "failed 1");
  EXPECT_EQ(job(id, "last_error"), "card number is not a number");
  EXPECT_EQ(orders(), 0);
}

struct order_args {
  std::int64_t order_id = 0;
};
void from_json(const nlohmann::json& j, order_args& a) { j.at("order_id").get_to(a.order_id); }

TEST_F(caller_owned, typed_handler_gets_its_args_and_args_that_do_not_convert_fail_the_job) {
  auto rt = make();
  std::atomic<std::int64_t> seen{0};
  rt->handle_caller_owned<order_args>("charge", [&](const order_args& a, caller_owned_context& ctx) {
    seen = a.order_id;
    return business_tx(ctx);
  });
  ASSERT_TRUE(rt->start());
  const auto good = enqueue("charge", R"({"order_id": 42})");
  const auto bad = enqueue("charge", R"({"order": "x"})");
  ASSERT_TRUE(finished(good));
  ASSERT_TRUE(finished(bad));
  EXPECT_EQ(seen.load(), 42);
  EXPECT_EQ(state_of(good), "completed");
  EXPECT_EQ(job(bad, "state || ' ' || (last_error LIKE 'bad args:%')"), "failed true");
}

TEST_F(caller_owned, attempt_cancelled_first_is_stale_and_nothing_is_written) {
  auto rt = make();
  std::atomic<bool> started{false};
  std::atomic<int> stale{0};
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    started = true;
    ctx.wait_cancelled(20s);  // the admin cancel reaches the handler (NOTIFY)
    auto r = business_tx(ctx);  // too late: complete_in_tx raises TN001, the writes roll back
    if (!r && r.error() == errc::stale_attempt) ++stale;
    return r;
  });
  ASSERT_TRUE(rt->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  db_.exec("SELECT " + s("cancel_job") + "($1)", {id});
  ASSERT_TRUE(rt->wait_idle(20s));
  EXPECT_EQ(stale.load(), 1);
  EXPECT_EQ(job(id), "cancelled 1");
  EXPECT_EQ(orders(), 0) << "the business write never commits apart from the completion";
  const auto m = rt->metrics();
  EXPECT_EQ(m.stale_rejected, 1u);
  EXPECT_EQ(m.retried + m.failed + m.completed, 0u);
}

TEST_F(caller_owned, attempt_rescued_first_is_stale_and_the_new_attempt_completes) {
  // One runtime's handler stalls past staleness without heartbeats reaching the database (its
  // runtime is created with maintenance off and a long heartbeat interval); a second runtime
  // rescues and re-runs the job. The stalled attempt's late complete_in_tx is stale.
  auto slow_cfg = fast_config();
  slow_cfg.queues[0].max_concurrency = 1;
  slow_cfg.heartbeat_interval = 10s;
  slow_cfg.staleness = 20s;
  slow_cfg.maintenance = false;
  auto slow = make(slow_cfg);
  std::atomic<bool> stalled{false}, go{false};
  std::atomic<int> late_stale{0};
  slow->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    if (ctx.attempt() != 1) return business_tx(ctx);  // only the first attempt stalls
    stalled = true;
    while (!go) std::this_thread::sleep_for(2ms);
    auto r = business_tx(ctx);
    if (!r && r.error() == errc::stale_attempt) ++late_stale;
    return r;
  });
  ASSERT_TRUE(slow->start());
  const auto id = enqueue("charge");
  ASSERT_TRUE(eventually([&] { return stalled.load(); }));
  // The rescuer: staleness 400 ms, so lease 1 (no heartbeat since its claim) is rescued.
  auto fast_cfg = fast_config();
  fast_cfg.heartbeat_interval = 100ms;
  fast_cfg.staleness = 400ms;
  auto rescuer = make(fast_cfg);
  rescuer->handle_caller_owned("charge", [&](caller_owned_context& ctx) { return business_tx(ctx); });
  ASSERT_TRUE(rescuer->start());
  ASSERT_TRUE(eventually([&] { return job(id) == "completed 2"; }));
  EXPECT_TRUE(eventually([&] { return rescuer->metrics().completed == 1; }, 5s)) << "the rescuer ran lease 2";
  go = true;
  ASSERT_TRUE(slow->wait_idle(10s));
  EXPECT_EQ(late_stale.load(), 1);
  EXPECT_EQ(orders(), 1);
  EXPECT_EQ(orders("run_lease = (SELECT j.run_lease FROM " + s("jobs") + " j WHERE j.id = job_id)"), 1);
  EXPECT_EQ(slow->metrics().stale_rejected, 1u);
  EXPECT_EQ(slow->metrics().completed, 0u);
}

TEST_F(caller_owned, pool_reserve_caps_caller_owned_handlers_while_heartbeats_and_other_queues_run) {
  // 6 caller-owned handlers hold their own business transactions open and hammer the runtime's
  // pool with flush_progress; at most max_caller_owned run at once, their store calls never
  // exceed pool_size - reserved_connections, and meanwhile heartbeats keep every attempt alive
  // (short staleness: a starved heartbeat would get them rescued) and another queue drains.
  auto cfg = fast_config();
  cfg.queues = {{.name = "billing", .max_concurrency = 6}, {.name = "default", .max_concurrency = 4}};
  cfg.heartbeat_interval = 100ms;
  cfg.staleness = 600ms;
  cfg.max_caller_owned = 2;
  auto made = postgres::make_runtime(
      {.dsn = schema_.dsn(), .schema = schema_.name(), .pool_size = 3, .reserved_connections = 2, .runtime = cfg});
  ASSERT_TRUE(made) << made.error().message();
  auto rt = std::move(made).value();
  EXPECT_EQ(rt->config().handler_store_calls, 1);
  std::atomic<int> running{0}, peak{0};
  std::atomic<bool> release{false};
  rt->handle_caller_owned("charge", [&](caller_owned_context& ctx) -> result<finalization_receipt> {
    const int now = ++running;
    for (int p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
    }
    pg own{schema_.dsn()};  // the application's own connection, holding a transaction open
    own.exec("BEGIN");
    own.exec("INSERT INTO " + s("orders") + " VALUES ($1, $2)",
             {std::to_string(ctx.job_id()), std::to_string(ctx.run_lease())});
    int i = 0;
    while (!release) {
      ctx.set_progress(++i % 100);
      auto f = ctx.flush_progress();
      EXPECT_TRUE(f && f.value()) << "the attempt stays live";
    }
    auto r = ctx.complete_in_tx(own.native());
    own.query(r ? "COMMIT" : "ROLLBACK");
    --running;
    return r;
  });
  std::atomic<int> plain{0};
  rt->handle("noop", [&](job_context&) {
    ++plain;
    return job_outcome::completed();
  });
  ASSERT_TRUE(rt->start());
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(enqueue("charge", "{}", "billing"));
  ASSERT_TRUE(eventually([&] { return running.load() == 2; }));
  const auto heartbeats_before = rt->metrics().heartbeats;
  enqueue_many(300, "noop", "default");
  ASSERT_TRUE(eventually([&] { return count("kind = 'noop' AND state = 'completed'") == 300; }))
      << "the other queue drains while caller-owned handlers saturate";
  std::this_thread::sleep_for(1s);  // several staleness windows with both saturated
  EXPECT_GE(rt->metrics().heartbeats, heartbeats_before + 3) << "heartbeats keep running";
  EXPECT_EQ(count("kind = 'charge' AND state = 'running' AND attempt = 1"), 6)
      << "no saturated attempt was rescued: heartbeats had connections";
  EXPECT_EQ(rt->metrics().rescued, 0u);
  release = true;
  for (const auto& id : ids) ASSERT_TRUE(finished(id));
  EXPECT_EQ(peak.load(), 2) << "max_caller_owned caps the handlers running at once";
  EXPECT_EQ(count("kind = 'charge' AND state = 'completed' AND attempt = 1"), 6);
  EXPECT_EQ(orders(), 6);
}

TEST_F(caller_owned, pool_without_a_free_connection_beyond_the_reserve_is_refused) {
  auto r = postgres::make_runtime(
      {.dsn = schema_.dsn(), .schema = schema_.name(), .pool_size = 2, .reserved_connections = 2, .runtime = fast_config()});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_NE(r.error().message().find("reserved_connections"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace tenure::test
