// The handler snippets of README.md, compiled with the samples (never run): scripts/readme-snippets
// keeps each README block identical to its [snippet:NAME] region here. The stubs above the
// regions stand for the application's own code.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include <nlohmann/json.hpp>
#include <soci/soci.h>
#include <spdlog/spdlog.h>

#include "tenure/libpq.hpp"
#include "tenure/runtime.hpp"
#include "tenure/soci.hpp"

namespace snippets {

// ---- the application's own code, stubbed -------------------------------------------------------
constexpr int total = 100'000;
inline void import_row(int) {}
inline void send_email(const std::string&, const std::string&) {}

struct payment_provider {
  void start_payment(const nlohmann::json&, const std::string& /*callback_ref*/) {}
  bool charge(long long /*order_id*/, long long /*amount_cents*/) { return true; }
};
inline payment_provider provider;

/// The application's own pool of libpq connections.
struct libpq_pool {
  PGconn* acquire() { return nullptr; }
};

struct welcome_args {
  std::string email;
  std::string name;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(welcome_args, email, name)

/// A tracing library's span, as far as the snippet needs one.
struct span {
  void set(const char*, std::int64_t) {}
  void end(std::string_view /*outcome*/, const std::string& /*error*/, std::chrono::nanoseconds) {}
};
struct tracer_stub {
  std::string current_traceparent() const { return "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; }
  /// Starts a span under the remote parent and makes it the calling thread's current span.
  span start_span(const std::string& /*name*/, const std::string& /*traceparent*/) { return {}; }
};
inline tracer_stub tracer;

struct charge_args {
  long long order_id = 0;
  long long amount_cents = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(charge_args, order_id, amount_cents)

// ---- the snippets --------------------------------------------------------------------------------
void typed_handler_and_events(std::unique_ptr<tenure::runtime>& rt) {
  // [snippet:typed]
  // Typed args: converted with nlohmann-json's from_json; args that do not convert fail the job
  // for good (they never will).
  rt->handle<welcome_args>("welcome_email", [](const welcome_args& a, tenure::job_context&) {
    send_email(a.email, "Welcome, " + a.name);
    return tenure::job_outcome::completed();
  });
  // Reported only after the transition is durable; runs on the control thread: keep it short.
  rt->on_event([](const tenure::job_event& e) {
    if (e.event == tenure::lifecycle_event::failed)
      spdlog::error("job {} ({}) failed for good: {}", e.attempt.job_id, e.kind, e.message);
  });
  // [/snippet:typed]
}

void progress_checkpoint(std::unique_ptr<tenure::runtime>& rt) {
  // [snippet:progress]
  rt->handle("import", [](tenure::job_context& ctx) {
    auto prev = ctx.previous_progress();                 // result<optional<json>>
    int row = prev && prev.value() ? prev.value()->at("metadata").at("row").get<int>() : 0;
    for (; row < total; ++row) {
      import_row(row);
      if (row % 1000 == 0) ctx.set_progress(row * 100 / total, "importing", {{"row", row}});
    }
    return tenure::job_outcome::completed();
  });
  // [/snippet:progress]
}

void external_callback(std::unique_ptr<tenure::runtime>& rt) {
  // [snippet:callback]
  rt->handle("payment", [](tenure::job_context& ctx) {
    auto id = ctx.register_callback(std::chrono::hours{1});
    if (!id) return tenure::job_outcome::retry(id.error().message());
    provider.start_payment(ctx.args(), /*callback_ref=*/id.value());   // idempotent on its side
    auto payload = ctx.wait_for_callback(id.value());
    if (!payload) return tenure::job_outcome::retry(payload.error().message());  // stale: discarded
    return tenure::job_outcome::completed(payload.value());
  });
  // [/snippet:callback]
}

void parked_callback(std::unique_ptr<tenure::runtime>& rt) {
  // [snippet:parked_callback]
  rt->handle("payment", [](tenure::job_context& ctx) {
    if (auto payload = ctx.resumed_with()) return tenure::job_outcome::completed(*payload);
    auto id = ctx.register_callback(std::chrono::hours{1});
    if (!id) return tenure::job_outcome::retry(id.error().message());
    provider.start_payment(ctx.args(), /*callback_ref=*/id.value());   // idempotent on its side
    return tenure::job_outcome::park(id.value());  // thread and permit freed until resumed
  });
  // [/snippet:parked_callback]
}

void caller_owned(std::unique_ptr<tenure::runtime>& rt, soci::connection_pool& pool) {
  // [snippet:caller_owned]
  rt->handle_caller_owned<charge_args>("charge", [&pool](const charge_args& a, tenure::caller_owned_context& ctx)
                                                     -> tenure::result<tenure::finalization_receipt> {
    // 1. The provider, outside any transaction; the order id is the idempotency key.
    if (!provider.charge(a.order_id, a.amount_cents)) {
      ctx.note_failure("provider unreachable");          // the error recorded with the retry
      return std::make_error_code(std::errc::io_error);  // retried with the queue's backoff
    }
    // 2. One short transaction on one of the application's own connections: the order is paid,
    //    the receipt job is enqueued (outbox) and this attempt is completed, all or nothing.
    soci::session db{pool};
    soci::transaction tx{db};
    db << "UPDATE orders SET state = 'paid' WHERE id = :id", soci::use(a.order_id);
    auto receipt_job = tenure::enqueue(db, {.kind = "receipt_email", .args = {{"order_id", a.order_id}}},
                                       {.schema = ctx.sql_schema()});
    if (!receipt_job) return receipt_job.error();  // tx rolls back
    auto receipt = ctx.complete_in_tx(db);         // <schema>.complete_job(token), guarded by (job_id, run_lease)
    if (!receipt) return receipt.error();          // stale: TN001 aborted the transaction; tx rolls back
    tx.commit();  // a lost reply throws: the runtime reconciles with the database either way
    return receipt;
  });
  // [/snippet:caller_owned]
}

void caller_owned_one_round_trip(std::unique_ptr<tenure::runtime>& rt, libpq_pool& my_pool) {
  rt->handle_caller_owned<charge_args>("charge", [&my_pool](const charge_args& a, tenure::caller_owned_context& ctx)
                                                     -> tenure::result<tenure::finalization_receipt> {
    const std::string id = std::to_string(a.order_id);
    const char* params[1] = {id.c_str()};
    // [snippet:complete_and_commit]
    PGconn* c = my_pool.acquire();  // one of the application's own connections
    const auto ok = [](PGresult* r) {
      const bool done = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
      return done;
    };
    if (!ok(PQexec(c, "BEGIN")) ||
        !ok(PQexecParams(c, "UPDATE orders SET state = 'paid' WHERE id = $1", 1, nullptr, params, nullptr, nullptr, 0))) {
      ctx.note_failure(PQerrorMessage(c));  // the error recorded with the retry
      PQclear(PQexec(c, "ROLLBACK"));
      return tenure::errc::database_error;  // retried with the queue's backoff
    }
    return ctx.complete_and_commit(c);  // complete_job + COMMIT in one send; the transaction is over
    // [/snippet:complete_and_commit]
  });
}

void tracing(std::unique_ptr<tenure::runtime>& rt, soci::session& db) {
  // [snippet:tracing]
  // Producer: the trace context travels with the job, in its metadata.
  auto job = tenure::enqueue(db, {.kind = "welcome_email", .args = {{"email", "a@example.com"}},
                                  .metadata = {{"traceparent", tracer.current_traceparent()}}});
  // Worker: one span per attempt, a child of the producer's. Added before start(); the first
  // middleware added is the outermost. It runs on the handler's thread, so the span is current
  // while the handler runs.
  rt->use([](tenure::job_context& ctx, tenure::attempt_next& next) {
    auto s = tracer.start_span(ctx.kind(), ctx.metadata().value("traceparent", ""));
    s.set("job.id", ctx.job_id());
    s.set("job.attempt", ctx.attempt());
    const tenure::attempt_report& r = next();  // runs the handler; r says what it decided
    s.end(tenure::to_string(r.outcome), r.message, r.duration);
  });
  // [/snippet:tracing]
  (void)job;
}

}  // namespace snippets
