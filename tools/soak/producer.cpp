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
/// About one transaction in 100 is a bulk batch of k_bulk_jobs jobs of the same mix, sent over
/// COPY (copy_threshold k_bulk_jobs): the jobs wait in run rows, which claims take apart.
constexpr int k_bulk_per_100 = 1;
constexpr int k_bulk_jobs = 40;

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
             std::atomic<long>& errors, rolled_back_jobs& rolled_back, std::atomic<long>& bulk_batches) {
  const int index = share.index;
  std::mt19937_64 rng{opts.seed * 1'000'003 + static_cast<std::uint64_t>(index)};
  int total_weight = 0;
  for (const auto& k : k_kinds) total_weight += k.weight;
  const auto gap = std::chrono::duration<double>(share.producers / std::max(0.1, opts.rate));
  auto next = clock::now();
  PGconn* conn = nullptr;
  const std::string order_sql = "INSERT INTO " + n.rec + ".orders (job_id, kind, caller_owned) VALUES ($1, $2, $3)";
  const std::string orders_sql = "INSERT INTO " + n.rec + ".orders (job_id, kind, caller_owned) "
                                 "SELECT * FROM unnest($1::bigint[], $2::text[], $3::boolean[])";
  const auto pick_kind = [&] {
    int pick = static_cast<int>(rng() % static_cast<std::uint64_t>(total_weight));
    for (const auto& k : k_kinds) {
      if ((pick -= k.weight) < 0) return std::string{k.kind};
    }
    return std::string{k_kinds[0].kind};
  };
  const auto job_of = [&](const std::string& kind) {
    return new_job{.kind = kind, .args = {{"producer", index}}, .queue = kind == "deadline" ? "soak_deadline" : "soak"};
  };
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
    if (static_cast<int>(rng() % 100) < k_bulk_per_100) {
      // A bulk batch: its jobs and their order rows in one transaction, over COPY.
      std::vector<new_job> jobs;
      std::string kinds = "{", owned = "{";
      for (int j = 0; j < k_bulk_jobs; ++j) {
        const auto kind = pick_kind();
        jobs.push_back(job_of(kind));
        kinds += (j ? "," : "") + kind;
        owned += (j ? "," : "") + std::string{kind == "caller_owned" ? "t" : "f"};
      }
      kinds += "}";
      owned += "}";
      const bool rollback = static_cast<int>(rng() % 100) < k_rollback_percent;
      next += std::chrono::duration_cast<clock::duration>(gap * (k_bulk_jobs - 1));  // the batch's share of the rate
      if (!ok(PQexec(conn, "BEGIN"))) {
        ++errors;
        continue;
      }
      auto ids = tenure::enqueue_batch(conn, jobs, {.schema = n.tenure, .copy_threshold = k_bulk_jobs});
      if (!ids) {
        ++errors;
        PQclear(PQexec(conn, "ROLLBACK"));
        continue;
      }
      std::string id_list = "{";
      for (std::size_t j = 0; j < ids.value().size(); ++j) id_list += (j ? "," : "") + std::to_string(ids.value()[j]);
      id_list += "}";
      const char* params[] = {id_list.c_str(), kinds.c_str(), owned.c_str()};
      const bool written = ok(PQexecParams(conn, orders_sql.c_str(), 3, nullptr, params, nullptr, nullptr, 0));
      if (!written || rollback) {
        if (!written) ++errors;
        PQclear(PQexec(conn, "ROLLBACK"));
        for (const auto id : ids.value()) rolled_back.add(id);
        continue;
      }
      if (ok(PQexec(conn, "COMMIT"))) {
        ++bulk_batches;
      } else {
        ++errors;  // in doubt: the order rows say whether it committed
      }
      continue;
    }
    const std::string kind_text = pick_kind();
    const char* kind = kind_text.c_str();
    const bool rollback = static_cast<int>(rng() % 100) < k_rollback_percent;
    const bool caller_owned = kind_text == "caller_owned";
    if (!ok(PQexec(conn, "BEGIN"))) {
      ++errors;
      continue;
    }
    auto id = tenure::enqueue(conn, job_of(kind_text), {.schema = n.tenure});
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
