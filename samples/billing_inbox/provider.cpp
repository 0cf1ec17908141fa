// The fake payment provider. Conceptually another company's system: it shares nothing with the
// shop but the HTTP API. It keeps its charges in its own table (in the same database only to
// keep the sample small) so that it survives restarts and a test can count what it saw.
//
// POST /charges {"amount_cents": N} with header Idempotency-Key: K
//   first call with K:  charges once, 201 {"charge_id": "ch_...", "amount_cents": N, "replayed": false}
//   later calls with K: no new charge, 200 with the same charge_id and "replayed": true
//   K reused with another amount: 409. No key: 400.
// The answer waits --provider-delay-ms *after* the charge is recorded: a worker killed during
// that wait has been charged without knowing it, which is what idempotency keys are for.
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "app.hpp"

namespace billing {
namespace {

std::string new_charge_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char hex[] = "0123456789abcdef";
  std::string id = "ch_";
  auto v = rng();
  for (int i = 0; i < 16; ++i, v >>= 4) id += hex[v & 15];
  return id;
}

response charge(const config& cfg, session_pool& pool, const request& req) {
  const std::string key{req["Idempotency-Key"]};
  if (key.empty() || key.size() > 200) return error_response(http::status::bad_request, "Idempotency-Key header is required");
  const auto j = nlohmann::json::parse(req.body(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("amount_cents") || !j["amount_cents"].is_number_integer() ||
      j["amount_cents"].get<std::int64_t>() <= 0)
    return error_response(http::status::bad_request, "body must be {\"amount_cents\": positive integer}");
  long long amount = j["amount_cents"].get<std::int64_t>();

  std::string why;
  auto db = pool.acquire(milliseconds{5'000}, &why);
  if (!db) return error_response(http::status::service_unavailable, "provider storage unavailable");
  std::string charge_id = new_charge_id(), stored_id;
  long long stored_amount = 0;
  int calls = 0;
  try {
    // One statement: the first call inserts the charge, later ones only count the call.
    **db << "INSERT INTO " + cfg.app_schema +
                ".provider_charges AS p (idempotency_key, charge_id, amount_cents) VALUES (:k, :c, :a) "
                "ON CONFLICT (idempotency_key) DO UPDATE SET calls = p.calls + 1, last_call_at = clock_timestamp() "
                "RETURNING charge_id, amount_cents, calls",
        soci::use(key), soci::use(charge_id), soci::use(amount), soci::into(stored_id), soci::into(stored_amount),
        soci::into(calls);
  } catch (const std::exception& e) {
    spdlog::error("provider: storing charge {} failed: {}", key, e.what());
    return error_response(http::status::service_unavailable, "provider storage unavailable");
  }
  db.reset();  // give the connection back before the artificial delay
  const bool replayed = calls > 1;
  if (replayed && stored_amount != amount) {
    spdlog::warn("provider: key {} reused with {} cents (charged {})", key, amount, stored_amount);
    return error_response(http::status::conflict, "Idempotency-Key reused with a different amount");
  }
  ++(replayed ? stats().provider_replays : stats().provider_charges);
  spdlog::info("provider: {} key={} charge={} amount={} (call {})", replayed ? "replayed" : "charged", key, stored_id,
               amount, calls);
  if (cfg.provider_delay.count() > 0) std::this_thread::sleep_for(cfg.provider_delay);
  return json_response(replayed ? http::status::ok : http::status::created,
                       {{"charge_id", stored_id}, {"amount_cents", stored_amount}, {"replayed", replayed}});
}

response list_charges(const config& cfg, session_pool& pool) {
  std::string why;
  auto db = pool.acquire(milliseconds{5'000}, &why);
  if (!db) return error_response(http::status::service_unavailable, "provider storage unavailable");
  try {
    std::string body;
    **db << "SELECT coalesce(json_agg(json_build_object('idempotency_key', idempotency_key, 'charge_id', charge_id, "
            "'amount_cents', amount_cents, 'calls', calls) ORDER BY created_at), '[]')::text FROM " +
                cfg.app_schema + ".provider_charges",
        soci::into(body);
    return json_response(http::status::ok, nlohmann::json::parse(body));
  } catch (const std::exception& e) {
    spdlog::error("provider: listing charges failed: {}", e.what());
    return error_response(http::status::service_unavailable, "provider storage unavailable");
  }
}

}  // namespace

http_server::handler make_provider_handler(const config& cfg, std::shared_ptr<session_pool> pool) {
  auto status = make_status_handler(pool, nullptr);
  return [cfg, pool, status = std::move(status)](const request& req) -> response {
    if (req.target() == "/charges") {
      ++stats().http_requests;
      if (req.method() == http::verb::post) return charge(cfg, *pool, req);
      if (req.method() == http::verb::get) return list_charges(cfg, *pool);
      auto res = error_response(http::status::method_not_allowed, "use POST or GET /charges");
      res.set(http::field::allow, "GET, POST");
      return res;
    }
    return status(req);
  };
}

}  // namespace billing
