// The soak's producers (producer.hpp).
#include "soak/producer.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "tenure/libpq.hpp"

namespace tenure::soak {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

/// The workload's kinds, with their share of the enqueues.
struct kind_share {
  const char* kind;
  int weight;
};
constexpr kind_share k_kinds[] = {
    {"complete", 30}, {"fail", 5},           {"retry", 8},          {"snooze", 8},          {"deadline", 3},
    {"park", 8},      {"park_timeout", 4},   {"cancel_running", 4}, {"cancel_waiting", 4},  {"caller_owned", 16},
};
constexpr int k_rollback_percent = 10;

}  // namespace

void rolled_back_jobs::add(std::int64_t job_id) {
  std::lock_guard lock{mu_};
  ids_.push_back(job_id);
}

std::vector<std::int64_t> rolled_back_jobs::all() {
  std::lock_guard lock{mu_};
  return ids_;
}

void produce(const options& opts, const names& n, producer_share share, const std::atomic<bool>& producing,
             std::atomic<long>& errors, rolled_back_jobs& rolled_back) {
  const int index = share.index;
  std::mt19937_64 rng{opts.seed * 1'000'003 + static_cast<std::uint64_t>(index)};
  int total_weight = 0;
  for (const auto& k : k_kinds) total_weight += k.weight;
  const auto gap = std::chrono::duration<double>(share.producers / std::max(0.1, opts.rate));
  auto next = clock::now();
  PGconn* conn = nullptr;
  const std::string order_sql = "INSERT INTO " + n.rec + ".orders (job_id, kind, caller_owned) VALUES ($1, $2, $3)";
  const auto ok = [](PGresult* r) {
    const bool good = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return good;
  };
  while (producing) {
    next += std::chrono::duration_cast<clock::duration>(gap);
    std::this_thread::sleep_until(next);
    if (clock::now() - next > 2s) next = clock::now();  // after an outage, do not burst
    if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
      if (conn) PQfinish(conn);
      const char* keys[] = {"dbname", "application_name", nullptr};
      const char* vals[] = {opts.dsn.c_str(), "soak-producer", nullptr};
      conn = PQconnectdbParams(keys, vals, 1);
      if (PQstatus(conn) != CONNECTION_OK) {
        ++errors;
        std::this_thread::sleep_for(200ms);
        continue;
      }
    }
    int pick = static_cast<int>(rng() % static_cast<std::uint64_t>(total_weight));
    const char* kind = k_kinds[0].kind;
    for (const auto& k : k_kinds) {
      if ((pick -= k.weight) < 0) {
        kind = k.kind;
        break;
      }
    }
    const bool rollback = static_cast<int>(rng() % 100) < k_rollback_percent;
    const std::string kind_text = kind;
    const bool caller_owned = kind_text == "caller_owned";
    if (!ok(PQexec(conn, "BEGIN"))) {
      ++errors;
      continue;
    }
    auto id = tenure::enqueue(conn,
                              {.kind = kind_text,
                               .args = {{"producer", index}},
                               .queue = kind_text == "deadline" ? "soak_deadline" : "soak"},
                              {.schema = n.tenure});
    if (!id) {
      ++errors;
      PQclear(PQexec(conn, "ROLLBACK"));
      continue;
    }
    const std::string id_text = std::to_string(id.value());
    const char* params[] = {id_text.c_str(), kind, caller_owned ? "true" : "false"};
    if (!ok(PQexecParams(conn, order_sql.c_str(), 3, nullptr, params, nullptr, nullptr, 0))) {
      ++errors;
      PQclear(PQexec(conn, "ROLLBACK"));
      rolled_back.add(id.value());  // COMMIT was never sent: the job never existed
      continue;
    }
    if (rollback) {
      PQclear(PQexec(conn, "ROLLBACK"));
      rolled_back.add(id.value());
      continue;
    }
    // A COMMIT whose reply is lost is in doubt: the order row says whether it committed.
    if (!ok(PQexec(conn, "COMMIT"))) ++errors;
  }
  if (conn) PQfinish(conn);
}

}  // namespace tenure::soak
