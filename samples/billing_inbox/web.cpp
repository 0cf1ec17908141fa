// The web role: orders are written together with their charge job, in one transaction.
#include <charconv>
#include <variant>

#include <spdlog/spdlog.h>

#include "app.hpp"
#include "tenure/soci.hpp"

namespace billing {
namespace {

constexpr milliseconds k_request_pool_wait{5'000};
constexpr std::int64_t k_max_amount_cents = 100'000'000;  // one million, in cents
constexpr std::size_t k_max_customer = 100;

/// A validated POST /orders body, or the 400 to answer.
struct order_input {
  std::string customer;
  std::int64_t amount_cents = 0;
};

std::variant<order_input, response> parse_order(const std::string& body) {
  auto bad = [](std::string_view why) { return error_response(http::status::bad_request, why); };
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("body is not valid JSON");
  if (!j.is_object()) return bad("body must be a JSON object like {\"customer\":\"ada\",\"amount_cents\":1250}");
  order_input in;
  const auto c = j.find("customer");
  if (c == j.end() || !c->is_string()) return bad("customer (a string) is required");
  in.customer = c->get<std::string>();
  const auto first = in.customer.find_first_not_of(" \t");
  in.customer = first == std::string::npos ? "" : in.customer.substr(first, in.customer.find_last_not_of(" \t") - first + 1);
  if (in.customer.empty()) return bad("customer must not be empty");
  if (in.customer.size() > k_max_customer) return bad("customer is longer than 100 bytes");
  for (unsigned char ch : in.customer)
    if (ch < 0x20 || ch == 0x7f) return bad("customer must not contain control characters");
  const auto a = j.find("amount_cents");
  if (a == j.end()) return bad("amount_cents (an integer) is required");
  if (!a->is_number_integer()) return bad("amount_cents must be an integer number of cents");
  // nlohmann keeps non-negative integers unsigned and negative ones signed.
  const bool in_range = a->is_number_unsigned()
                            ? a->get<std::uint64_t>() >= 1 && a->get<std::uint64_t>() <= std::uint64_t{k_max_amount_cents}
                            : a->get<std::int64_t>() >= 1 && a->get<std::int64_t>() <= k_max_amount_cents;
  if (!in_range) return bad("amount_cents must be between 1 and 100000000");
  in.amount_cents = a->get<std::int64_t>();
  return in;
}

response unavailable(std::string_view why) {
  spdlog::warn("web: database unavailable: {}", why);
  return error_response(http::status::service_unavailable, "database unavailable, try again");
}

/// 405 with the Allow header HTTP requires.
response not_allowed(std::string_view allow, std::string_view message) {
  auto res = error_response(http::status::method_not_allowed, message);
  res.set(http::field::allow, std::string{allow});
  return res;
}

/// A statement that gave up waiting (statement_timeout 57014, lock_timeout 55P03) or lost a
/// serialization race (40001, 40P01): the transaction rolled back, nothing was written, and the
/// same request may simply be sent again.
bool gave_up_waiting(const std::exception& e) {
  const auto state = sqlstate_of(e);
  return state == "57014" || state == "55P03" || state == "40001" || state == "40P01";
}

/// "SQLSTATE xxxxx: message" of a database exception, for logs.
std::string db_error_text(const std::exception& e) { return "SQLSTATE " + sqlstate_of(e) + ": " + e.what(); }

response busy(std::string_view what, std::string_view why) {
  spdlog::warn("web: {} gave up waiting for the database ({}); answered 503, nothing written", what, why);
  auto res = error_response(http::status::service_unavailable, "database busy, nothing was written: try again");
  res.set(http::field::retry_after, "1");
  return res;
}

/// POST /orders: the order row and its `charge` job commit together, or neither exists.
response create_order(const config& cfg, session_pool& pool, const request& req) {
  auto parsed = parse_order(req.body());
  if (auto* res = std::get_if<response>(&parsed)) {
    ++stats().orders_rejected;
    return std::move(*res);
  }
  const auto& in = std::get<order_input>(parsed);
  std::string why;
  auto db = pool.acquire(k_request_pool_wait, &why);
  if (!db) return unavailable(why);
  const std::string orders = cfg.app_schema + ".orders";
  try {
    soci::transaction tx{**db};
    long long order_id = 0;
    std::string customer = in.customer;
    long long amount = in.amount_cents;
    **db << "INSERT INTO " + orders + " (customer, amount_cents) VALUES (:c, :a) RETURNING id", soci::use(customer),
        soci::use(amount), soci::into(order_id);
    // Transactional enqueue: the job is written by this session, inside this transaction.
    auto job = tenure::enqueue(**db, {.kind = "charge", .args = {{"order_id", order_id}}}, {.schema = cfg.schema});
    if (!job) {
      tx.rollback();
      if (job.error() == tenure::errc::database_unavailable) return unavailable(job.error().message());
      if (job.error() == tenure::errc::transient_conflict) return busy("POST /orders", job.error().message());
      spdlog::error("web: enqueue failed: {}", job.error().message());
      return error_response(http::status::internal_server_error, "could not enqueue the charge");
    }
    long long job_id = job.value();
    **db << "UPDATE " + orders + " SET charge_job_id = :j WHERE id = :id", soci::use(job_id), soci::use(order_id);
    // A check that runs after the insert (think of a fraud rule reading the stored order): when
    // it refuses, ROLLBACK removes the order *and* its job; nothing was ever visible.
    std::string reason;
    soci::indicator ind = soci::i_null;
    **db << "SELECT b.reason FROM " + orders + " o JOIN " + cfg.app_schema +
                ".blocked_customers b ON b.customer = lower(o.customer) WHERE o.id = :id",
        soci::use(order_id), soci::into(reason, ind);
    if ((**db).got_data() && ind == soci::i_ok) {
      tx.rollback();
      ++stats().orders_rejected;
      spdlog::info("web: order for '{}' refused after insert ({}): rolled back order {} and job {}", in.customer,
                   reason, order_id, job_id);
      return error_response(http::status::unprocessable_entity, "customer is blocked: " + reason);
    }
    try {
      tx.commit();
    } catch (const std::exception& e) {
      // The server refused the COMMIT on a live session (e.g. a deferred constraint, 23xxx, or a
      // serialization failure, 40001): it rolled back for certain, nothing was written.
      if (connection_ok(**db) && !sqlstate_of(e).empty()) {
        if (gave_up_waiting(e)) return busy("POST /orders (COMMIT)", db_error_text(e));
        spdlog::warn("web: COMMIT of order {} refused ({}); nothing written", order_id, db_error_text(e));
        return error_response(http::status::conflict,
                              "the database refused the order at COMMIT (SQLSTATE " + sqlstate_of(e) +
                                  "): nothing was written");
      }
      // The COMMIT was sent but its answer lost: the order and its job exist together or not at
      // all, and only the database knows which. Say so instead of inviting a blind retry.
      spdlog::warn("web: COMMIT of order {} in doubt: {}", order_id, e.what());
      return json_response(http::status::service_unavailable,
                           {{"error", "the database connection broke during COMMIT: check GET /orders/" +
                                          std::to_string(order_id) + " before retrying"},
                            {"order_id", order_id}});
    }
    ++stats().orders_created;
    spdlog::info("web: order {} ({} cents for {}) stored with charge job {} in one transaction", order_id,
                 in.amount_cents, in.customer, job_id);
    auto res = json_response(http::status::created, {{"order_id", order_id}, {"job_id", job_id}});
    res.set(http::field::location, "/orders/" + std::to_string(order_id));
    return res;
  } catch (const std::exception& e) {
    if (!connection_ok(**db)) return unavailable(e.what());
    if (gave_up_waiting(e)) return busy("POST /orders", db_error_text(e));
    spdlog::error("web: POST /orders failed: {}", e.what());
    return error_response(http::status::internal_server_error, "could not store the order");
  }
}

/// GET /orders/{id}: the order and its jobs as the tenure.jobs view shows them.
response get_order(const config& cfg, session_pool& pool, std::string_view id_text) {
  long long id = 0;
  const auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
  if (ec != std::errc{} || end != id_text.data() + id_text.size() || id <= 0)
    return error_response(http::status::bad_request, "order id must be a positive integer");
  std::string why;
  auto db = pool.acquire(k_request_pool_wait, &why);
  if (!db) return unavailable(why);
  try {
    std::string body;
    soci::indicator ind = soci::i_null;
    const auto job_json = [&](const char* alias) {
      return std::string{"CASE WHEN "} + alias + ".id IS NULL THEN NULL ELSE json_build_object('id', " + alias +
             ".id, 'kind', " + alias + ".kind, 'state', " + alias + ".state, 'attempt', " + alias +
             ".attempt, 'run_lease', " + alias + ".run_lease, 'finalized_at', " + alias + ".finalized_at, 'last_error', " +
             alias + ".last_error) END";
    };
    **db << "SELECT json_build_object('order_id', o.id, 'customer', o.customer, 'amount_cents', o.amount_cents, "
            "'state', o.state, 'charge_id', o.charge_id, 'created_at', o.created_at, 'paid_at', o.paid_at, "
            "'paid_run_lease', o.paid_run_lease, 'charge_job', " +
                job_json("c") + ", 'receipt_job', " + job_json("r") + ")::text FROM " + cfg.app_schema +
                ".orders o LEFT JOIN " + cfg.schema + ".jobs c ON c.id = o.charge_job_id LEFT JOIN " + cfg.schema +
                ".jobs r ON r.id = o.receipt_job_id WHERE o.id = :id",
        soci::use(id), soci::into(body, ind);
    if (!(**db).got_data() || ind != soci::i_ok) return error_response(http::status::not_found, "no such order");
    return json_response(http::status::ok, nlohmann::json::parse(body));
  } catch (const std::exception& e) {
    if (!connection_ok(**db)) return unavailable(e.what());
    if (gave_up_waiting(e)) return busy("GET /orders/" + std::to_string(id), db_error_text(e));
    spdlog::error("web: GET /orders/{} failed: {}", id, e.what());
    return error_response(http::status::internal_server_error, "could not read the order");
  }
}

}  // namespace

response healthz(session_pool& pool) {
  std::string why;
  auto db = pool.acquire(milliseconds{2'000}, &why);
  if (db) {
    try {
      int one = 0;
      **db << "SELECT 1", soci::into(one);
      if (one == 1) return text_response(http::status::ok, "ok\n");
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  return text_response(http::status::service_unavailable, "database unavailable: " + why + "\n");
}

http_server::handler make_status_handler(std::shared_ptr<session_pool> pool, std::function<std::string()> extra_metrics) {
  return [pool = std::move(pool), extra = std::move(extra_metrics)](const request& req) -> response {
    ++stats().http_requests;
    if (req.target() == "/healthz" && req.method() == http::verb::get) return healthz(*pool);
    if (req.target() == "/metrics" && req.method() == http::verb::get)
      return text_response(http::status::ok, counters_text() + (extra ? extra() : std::string{}),
                           "text/plain; version=0.0.4");
    return error_response(http::status::not_found, "no such endpoint");
  };
}

http_server::handler make_web_handler(const config& cfg, std::shared_ptr<session_pool> pool,
                                      std::function<std::string()> extra_metrics) {
  auto status = make_status_handler(pool, std::move(extra_metrics));
  return [cfg, pool, status = std::move(status)](const request& req) -> response {
    const std::string_view target{req.target().data(), req.target().size()};
    if (target == "/orders") {
      ++stats().http_requests;
      if (req.method() != http::verb::post) return not_allowed("POST", "use POST /orders");
      return create_order(cfg, *pool, req);
    }
    constexpr std::string_view prefix = "/orders/";
    if (target.substr(0, prefix.size()) == prefix) {
      ++stats().http_requests;
      if (req.method() != http::verb::get) return not_allowed("GET", "use GET /orders/{id}");
      return get_order(cfg, *pool, target.substr(prefix.size()));
    }
    return status(req);
  };
}

}  // namespace billing
