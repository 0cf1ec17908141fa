// The worker role: the `charge` handler finishes its job inside the application's own
// transaction (caller-owned finalization); `receipt_email` is an ordinary handler.
#include <thread>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "app.hpp"
#include "tenure/postgres/runtime.hpp"
#include "tenure/soci.hpp"

namespace billing {
namespace {

constexpr milliseconds k_job_pool_wait{10'000};

struct charge_args {
  std::int64_t order_id = 0;
};
void from_json(const nlohmann::json& j, charge_args& a) { j.at("order_id").get_to(a.order_id); }
using receipt_args = charge_args;

/// A retryable failure that is not the database's: the provider could not be reached or failed.
std::error_code provider_failed() { return std::make_error_code(std::errc::io_error); }

class charge_handler {
 public:
  charge_handler(config cfg, std::shared_ptr<session_pool> pool, std::string worker)
      : cfg_(std::move(cfg)), pool_(std::move(pool)), worker_(std::move(worker)) {}

  tenure::result<tenure::finalization_receipt> operator()(const charge_args& a, tenure::caller_owned_context& ctx) const {
    const long long order_id = a.order_id;
    std::string why;
    // 0. What to charge (a plain read; no connection is held during the provider call).
    long long amount = 0;
    {
      auto db = pool_->acquire(k_job_pool_wait, &why);
      if (!db) return fail_retry(ctx, why, tenure::errc::database_unavailable);
      try {
        **db << "SELECT amount_cents FROM " + table("orders") + " WHERE id = :id", soci::use(order_id), soci::into(amount);
        if (!(**db).got_data()) {
          ctx.note_failure("order " + std::to_string(order_id) + " does not exist");
          return tenure::errc::invalid_argument;  // can never succeed: fail the job for good
        }
        log_event(**db, order_id, ctx, "provider_call", std::to_string(amount) + " cents");
      } catch (const std::exception& e) {
        return fail_retry(ctx, e.what(), tenure::errc::database_unavailable);
      }
    }
    if (ctx.is_cancelled()) return tenure::errc::stale_attempt;  // rescued or cancelled already

    // 1. The provider, outside any transaction. The order id is the idempotency key: however
    //    often this attempt (or a later one) repeats the call, the customer is charged once.
    spdlog::info("charge: order {} (job {} lease {}): calling the provider for {} cents", order_id, ctx.job_id(),
                 ctx.run_lease(), amount);
    const auto reply = http_call(cfg_.provider_url + "/charges", http::verb::post,
                                 nlohmann::json{{"amount_cents", amount}}.dump(),
                                 {{"Idempotency-Key", std::to_string(order_id)}}, cfg_.provider_timeout, &why);
    if (!reply) return fail_retry(ctx, "provider unreachable: " + why, provider_failed());
    std::string charge_id;
    if (reply->status == 200 || reply->status == 201) {
      const auto j = nlohmann::json::parse(reply->body, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("charge_id") && j["charge_id"].is_string())
        charge_id = j["charge_id"].get<std::string>();
    }
    if (charge_id.empty()) {
      const auto text = "provider answered " + std::to_string(reply->status) + ": " + reply->body.substr(0, 200);
      // Only an answer that says the request itself is wrong fails the job for good: retrying
      // the same charge cannot help. Any other status (404 from a mistyped --provider-url, 408,
      // 429, 5xx, ...) may clear once the cause is fixed, so the attempt is retried.
      if (reply->status == 400 || reply->status == 409 || reply->status == 422) {
        ctx.note_failure(text);
        return tenure::errc::invalid_argument;
      }
      return fail_retry(ctx, text, provider_failed());
    }
    with_session([&](soci::session& s) { log_event(s, order_id, ctx, "provider_answered", charge_id); });
    if (cfg_.commit_delay.count() > 0) std::this_thread::sleep_for(cfg_.commit_delay);  // fault injection

    // 2. One short transaction on the application's own connection: the order is paid, the
    //    receipt job is enqueued (outbox) and this attempt is completed, all or nothing.
    auto db = pool_->acquire(k_job_pool_wait, &why);
    if (!db) return fail_retry(ctx, why, tenure::errc::database_unavailable);
    try {
      soci::transaction tx{**db};
      auto receipt_job = tenure::enqueue(**db, {.kind = "receipt_email", .args = {{"order_id", order_id}}},
                                         {.schema = cfg_.schema});
      if (!receipt_job) return rollback(tx, ctx, receipt_job.error(), "enqueue receipt_email");
      long long receipt_job_id = receipt_job.value(), lease = ctx.run_lease();
      // No "AND state = 'pending'" needed for safety: if this attempt is stale, complete_in_tx
      // below raises TN001 and this update rolls back with everything else.
      **db << "UPDATE " + table("orders") +
                  " SET state = 'paid', charge_id = :c, paid_at = now(), paid_run_lease = :l, receipt_job_id = :r "
                  "WHERE id = :id",
          soci::use(charge_id), soci::use(lease), soci::use(receipt_job_id), soci::use(order_id);
      log_event(**db, order_id, ctx, "finalized", charge_id, /*swallow=*/false);
      auto receipt = ctx.complete_in_tx(**db);
      if (!receipt) {
        if (receipt.error() == tenure::errc::stale_attempt) {
          safe_rollback(tx);
          ++stats().charges_stale;
          spdlog::warn("charge: order {} (job {} lease {}): complete_in_tx rejected: stale attempt (SQLSTATE TN001); "
                       "rolled back the order update and the receipt job",
                       order_id, ctx.job_id(), ctx.run_lease());
          log_event(**db, order_id, ctx, "stale_rejected", "TN001: rolled back");
          return receipt.error();
        }
        return rollback(tx, ctx, receipt.error(), "complete_in_tx");
      }
      try {
        tx.commit();
      } catch (const std::exception& e) {
        // The server may have committed: say so, and let the runtime reconcile with the database.
        ctx.note_failure(std::string{"commit: "} + e.what());
        ++stats().charge_errors;
        return tenure::errc::commit_in_doubt;
      }
      ++stats().charges_finalized;
      spdlog::info("charge: order {} paid with {} (job {} lease {} completed in the same transaction, receipt job {})",
                   order_id, charge_id, ctx.job_id(), ctx.run_lease(), receipt_job_id);
      return receipt;
    } catch (const std::exception& e) {
      return fail_retry(ctx, std::string{"charge transaction: "} + e.what(),
                        connection_ok(**db) ? tenure::make_error_code(tenure::errc::database_error)
                                            : tenure::make_error_code(tenure::errc::database_unavailable));
    }
  }

 private:
  std::string table(const char* name) const { return cfg_.app_schema + "." + name; }

  std::error_code fail_retry(tenure::caller_owned_context& ctx, const std::string& why, std::error_code code) const {
    ++stats().charge_errors;
    spdlog::warn("charge: job {} lease {}: {} (will be retried)", ctx.job_id(), ctx.run_lease(), why);
    ctx.note_failure(why);
    return code;
  }
  std::error_code fail_retry(tenure::caller_owned_context& ctx, const std::string& why, tenure::errc code) const {
    return fail_retry(ctx, why, tenure::make_error_code(code));
  }

  static void safe_rollback(soci::transaction& tx) {
    try {
      tx.rollback();
    } catch (const std::exception&) {  // a broken connection has no transaction left
    }
  }
  std::error_code rollback(soci::transaction& tx, tenure::caller_owned_context& ctx, std::error_code code,
                           const char* what) const {
    safe_rollback(tx);
    return fail_retry(ctx, std::string{what} + ": " + code.message(), code);
  }

  template <class Fn>
  void with_session(Fn&& fn) const {
    std::string why;
    if (auto db = pool_->acquire(k_job_pool_wait, &why)) fn(**db);
  }

  /// One row of charge_log. Best effort outside a transaction; inside one (swallow = false) a
  /// failure aborts the transaction like any business write.
  void log_event(soci::session& s, long long order_id, const tenure::caller_owned_context& ctx, const std::string& event,
                 const std::string& detail, bool swallow = true) const {
    long long job = ctx.job_id(), lease = ctx.run_lease();
    try {
      s << "INSERT INTO " + table("charge_log") +
               " (order_id, job_id, run_lease, worker, event, detail) VALUES (:o, :j, :l, :w, :e, :d)",
          soci::use(order_id), soci::use(job), soci::use(lease), soci::use(worker_), soci::use(event), soci::use(detail);
    } catch (const std::exception& e) {
      if (!swallow) throw;
      spdlog::warn("charge: could not log {} for order {}: {}", event, order_id, e.what());
    }
  }

  config cfg_;
  std::shared_ptr<session_pool> pool_;
  std::string worker_;
};

/// An ordinary handler: "sends" the receipt (a log line and a row) and returns; the runtime
/// flushes its completion in a batch. At-least-once: the row's primary key keeps it to one.
tenure::job_outcome send_receipt(const config& cfg, session_pool& pool, const receipt_args& a, tenure::job_context& ctx) {
  std::string why;
  auto db = pool.acquire(k_job_pool_wait, &why);
  if (!db) return tenure::job_outcome::retry(why);
  long long order_id = a.order_id, job = ctx.job_id(), lease = ctx.run_lease();
  std::string customer;
  long long amount = 0;
  soci::indicator ind = soci::i_null;
  **db << "INSERT INTO " + cfg.app_schema +
              ".receipts_sent (order_id, job_id, run_lease, customer, amount_cents) "
              "SELECT id, :j, :l, customer, amount_cents FROM " +
              cfg.app_schema + ".orders WHERE id = :o ON CONFLICT (order_id) DO NOTHING RETURNING customer, amount_cents",
      soci::use(job), soci::use(lease), soci::use(order_id), soci::into(customer, ind), soci::into(amount);
  if (!(**db).got_data()) {
    spdlog::info("receipt_email: order {}: already sent", order_id);
  } else {
    ++stats().receipts_sent;
    spdlog::info("receipt_email: order {}: receipt for {} cents sent to {}", order_id, amount, customer);
  }
  return tenure::job_outcome::completed();
}

}  // namespace

std::unique_ptr<tenure::runtime> make_worker(const config& cfg, std::shared_ptr<session_pool> pool, std::string* error) {
  tenure::postgres::runtime_options opts{.dsn = cfg.database_url, .schema = cfg.schema};
  opts.application_name = "billing_inbox worker";
  auto& rc = opts.runtime;
  rc.queues = {{.name = "default", .max_concurrency = cfg.concurrency}};
  rc.heartbeat_interval = cfg.heartbeat;
  rc.staleness = cfg.staleness;
  rc.maintenance = cfg.maintenance;
  rc.maintenance_interval = std::min(milliseconds{1'000}, cfg.heartbeat);
  rc.shutdown_timeout = milliseconds{15'000};
  rc.max_caller_owned = cfg.concurrency;  // each holds one of `pool`'s connections at a time
  rc.worker_id = cfg.worker_name.empty() ? "billing-worker:" + std::to_string(::getpid()) : cfg.worker_name;
  auto made = tenure::postgres::make_runtime(std::move(opts));
  if (!made) {
    if (error) *error = made.error().message();
    return nullptr;
  }
  auto rt = std::move(made.value());
  rt->handle_caller_owned<charge_args>("charge", charge_handler{cfg, pool, rt->config().worker_id});
  rt->handle<receipt_args>("receipt_email", [cfg, pool](const receipt_args& a, tenure::job_context& ctx) {
    return send_receipt(cfg, *pool, a, ctx);
  });
  rt->on_event([](const tenure::job_event& e) {
    if (e.event == tenure::lifecycle_event::rescued)
      spdlog::warn("worker: rescued job {} lease {} ({}): its worker stopped heartbeating", e.attempt.job_id,
                   e.attempt.run_lease, e.kind);
  });
  return rt;
}

}  // namespace billing
