// The README's enqueue snippets (the libpq and libpqxx bridges, unique jobs), compiled with the
// samples (never run): scripts/readme-snippets keeps each README block identical to its
// [snippet:NAME] region here.
#include <cstdint>
#include <string>
#include <vector>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include "tenure/libpq.hpp"
#include "tenure/log.hpp"
#include "tenure/pqxx.hpp"
#include "tenure/storage_port.hpp"

namespace snippets {

tenure::result<std::int64_t> enqueue_with_libpq(PGconn* conn, long long order_id) {
  // [snippet:enqueue_libpq]
  // libpq: the job joins the transaction open on the connection (BEGIN ... COMMIT).
  PQclear(PQexec(conn, "BEGIN"));
  const std::string id = std::to_string(order_id);
  const char* params[] = {id.c_str()};
  PQclear(PQexecParams(conn, "UPDATE orders SET state = 'paid' WHERE id = $1", 1, nullptr, params, nullptr,
                       nullptr, 0));
  auto job = tenure::enqueue(conn, {.kind = "receipt_email", .args = {{"order_id", order_id}}});
  PQclear(PQexec(conn, job ? "COMMIT" : "ROLLBACK"));  // a refused statement aborted the transaction
  // [/snippet:enqueue_libpq]
  return job;
}

tenure::result<std::vector<std::int64_t>> enqueue_with_pqxx(pqxx::connection& conn, long long order_id) {
  // [snippet:enqueue_pqxx]
  // libpqxx: one enqueue_batch statement for the whole batch, ids in input order.
  pqxx::work tx{conn};
  tx.exec_params("UPDATE orders SET state = 'paid' WHERE id = $1", order_id);
  const std::vector<tenure::new_job> jobs{{.kind = "receipt_email", .args = {{"order_id", order_id}}},
                                          {.kind = "ship", .args = {{"order_id", order_id}}, .queue = "warehouse"}};
  auto ids = tenure::enqueue_batch(tx, jobs, {.schema = "tenure"});
  if (ids) tx.commit();  // otherwise tx aborts when it goes out of scope
  // [/snippet:enqueue_pqxx]
  return ids;
}

void enqueue_unique(tenure::storage_port& store) {
  // [snippet:enqueue_unique]
  // At most one live job per key and queue: a second sync while one is pending enqueues nothing.
  auto r = store.try_enqueue({.kind = "sync_account", .args = {{"account", 42}}, .unique_key = "account:42"});
  if (r && !r.value().inserted) tenure::logger()->info("account 42 already has sync job {}", r.value().id);
  // [/snippet:enqueue_unique]
}

}  // namespace snippets
