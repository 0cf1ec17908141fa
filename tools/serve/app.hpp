#pragma once
/// \file
/// What `tenure serve` answers: the routes of the pages, the JSON API, the assets and /metrics,
/// and the checks in front of the actions (POST only, same origin, bearer token).
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cli/pg_session.hpp"
#include "serve/http.hpp"
#include "serve/metrics.hpp"
#include "tenure/postgres/store.hpp"

namespace tenure::serve {

struct app_config {
  std::string dsn;
  std::string schema = "tenure";
  /// Empty: actions are off (no --token-file, or --read-only); every action answers 403.
  std::string token;
  /// Listening on loopback: only requests whose Host names a loopback address (127.x.y.z, [::1],
  /// localhost), with any port, are answered; another Host is a 421. A page of another site whose
  /// name was made to resolve to 127.0.0.1 (DNS rebinding) cannot read the dashboard.
  bool loopback_hosts_only = true;
  /// Every query of a request is cancelled by the server past this (lock waits included), so a
  /// locked table or a slow scan costs one 500 answer, never a thread held for ever.
  std::chrono::milliseconds statement_timeout{10000};
};

class app {
 public:
  app(app_config config, std::unique_ptr<postgres::store> store);
  ~app();

  /// Answers one request; never throws (a failure is a 4xx/5xx answer).
  response handle(const request& req);
  /// Counts an answer the server made before routing.
  void refused(unsigned status) { metrics_.refused(status); }

  bool actions_enabled() const noexcept { return !config_.token.empty(); }
  const app_config& config() const noexcept { return config_; }
  postgres::store& store() noexcept { return *store_; }
  metrics& stats() noexcept { return metrics_; }

  /// A connection to the database for one request: from the idle ones, or a new one.
  std::unique_ptr<cli::pg_session> take_session();
  /// Back to the idle ones (a session whose query failed is dropped instead, not returned).
  void give_back(std::unique_ptr<cli::pg_session> s);

 private:

  app_config config_;
  std::unique_ptr<postgres::store> store_;
  metrics metrics_;
  std::mutex sessions_mutex_;
  std::vector<std::unique_ptr<cli::pg_session>> idle_sessions_;
};

/// Compares two secrets in time that depends only on their lengths, never on where they differ.
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace tenure::serve
