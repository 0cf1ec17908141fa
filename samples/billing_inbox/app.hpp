#pragma once
// billing_inbox: what the roles share. See README.md next to this file.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "db.hpp"
#include "http.hpp"

namespace tenure {
class runtime;
}

namespace billing {

using std::chrono::milliseconds;

/// Command-line settings (main.cpp parses them; --help lists them).
struct config {
  std::string role;          ///< web | worker | provider | all | client
  std::string database_url;  ///< --database-url or DATABASE_URL
  std::string schema = "tenure";       ///< tenure's schema (--schema or TENURE_SCHEMA)
  std::string app_schema = "billing";  ///< the sample's tables (--app-schema)
  std::string listen;                  ///< host:port of this role's HTTP server
  std::string provider_listen = "127.0.0.1:0";  ///< role all: the provider's address
  std::string provider_url;            ///< worker: where the payment provider is
  milliseconds provider_delay{0};      ///< provider: wait this long before answering a charge
  milliseconds provider_timeout{10'000};  ///< worker: deadline of one provider call
  milliseconds heartbeat{1'000};
  std::optional<milliseconds> staleness;  ///< default 3 x heartbeat
  bool maintenance = true;             ///< worker: take part in promotion and rescue
  int concurrency = 4;                 ///< worker: charges (and receipts) at once
  std::string worker_name;             ///< worker: runtime worker id (default billing-<host>:<pid>)
  milliseconds commit_delay{0};        ///< worker fault injection: pause between provider and transaction
  std::size_t max_body = 16 * 1024;    ///< web: larger request bodies get 413
  /// Every statement of the sample's own sessions: a request or a charge blocked behind a lock
  /// or a slow query fails within these (503 / a retried attempt) instead of hanging forever.
  milliseconds db_statement_timeout{10'000};
  milliseconds db_lock_timeout{2'000};
  // client role
  std::string url;
  std::string method = "GET";
  std::string data;
  milliseconds timeout{10'000};
};

/// Counters exported on /metrics next to the runtime's.
struct counters {
  std::atomic<std::uint64_t> http_requests{0};
  std::atomic<std::uint64_t> orders_created{0};
  std::atomic<std::uint64_t> orders_rejected{0};   ///< 4xx answers to POST /orders
  std::atomic<std::uint64_t> charges_finalized{0};  ///< committed with complete_in_tx
  std::atomic<std::uint64_t> charges_stale{0};      ///< complete_in_tx raised TN001: rolled back
  std::atomic<std::uint64_t> charge_errors{0};      ///< provider or database errors (retried)
  std::atomic<std::uint64_t> receipts_sent{0};
  std::atomic<std::uint64_t> provider_charges{0};   ///< provider: new charges
  std::atomic<std::uint64_t> provider_replays{0};   ///< provider: repeated idempotency keys
};
counters& stats();
/// The sample's counters in Prometheus text format.
std::string counters_text();

/// The web role: POST /orders, GET /orders/{id}, GET /healthz, GET /metrics. `worker`, when the
/// process also runs one, adds the runtime's metrics.
http_server::handler make_web_handler(const config& cfg, std::shared_ptr<session_pool> pool,
                                      std::function<std::string()> extra_metrics);
/// The fake payment provider: POST /charges (idempotent by Idempotency-Key), GET /charges,
/// GET /healthz.
http_server::handler make_provider_handler(const config& cfg, std::shared_ptr<session_pool> pool);
/// A worker runtime with the `charge` (caller-owned) and `receipt_email` handlers registered,
/// not started. nullptr with `error` set when it cannot be made.
std::unique_ptr<tenure::runtime> make_worker(const config& cfg, std::shared_ptr<session_pool> pool,
                                             std::string* error);
/// GET /healthz and GET /metrics only (a worker's own HTTP endpoint).
http_server::handler make_status_handler(std::shared_ptr<session_pool> pool,
                                         std::function<std::string()> extra_metrics);
/// GET /healthz: 200 "ok" when the database answers, 503 otherwise.
response healthz(session_pool& pool);

}  // namespace billing
