// The smallest tenure program: a business write and its job in one transaction, then a worker.
// DATABASE_URL names the database; TENURE_SCHEMA (default "tenure") where tenure lives.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include <soci/postgresql/soci-postgresql.h>
#include <soci/soci.h>

#include "tenure/postgres/runtime.hpp"
#include "tenure/postgres/schema.hpp"
#include "tenure/soci.hpp"

int main(int argc, char** argv) {
  const char* url = std::getenv("DATABASE_URL");
  const char* env_schema = std::getenv("TENURE_SCHEMA");
  const std::string schema = env_schema ? env_schema : "tenure";
  const std::string email = argc > 1 ? argv[1] : "ada@example.com";
  if (!url) return std::cerr << "set DATABASE_URL\n", 2;

  // Idempotent; the error names what is wrong and how to fix it.
  if (auto m = tenure::postgres::migrate(url, schema); !m) return std::cerr << m.error().message() << "\n", 1;

  // [snippet:enqueue]
  // 1. Transactional enqueue: COMMIT makes the signup and its job exist together.
  soci::session db(soci::postgresql, tenure::soci_connect_string(url).value());
  db << "CREATE TABLE IF NOT EXISTS signups (id bigserial PRIMARY KEY, email text NOT NULL)";
  std::int64_t job_id = 0;
  {
    soci::transaction tx(db);
    db << "INSERT INTO signups (email) VALUES (:email)", soci::use(email);
    auto job = tenure::enqueue(db, {.kind = "welcome_email", .args = {{"email", email}}}, {.schema = schema});
    if (!job) return std::cerr << "enqueue: " << job.error().message() << "\n", 1;  // tx rolls back
    tx.commit();
    job_id = job.value();
    std::cout << "signup stored with job " << job_id << "\n";
  }
  // [/snippet:enqueue]

  // [snippet:worker]
  // 2. A worker: an ordinary handler; its completion is flushed in a batch after it returns.
  // Other welcome_email jobs may be waiting too (earlier runs): they are sent as well, and the
  // program stops once this signup's email went out (a job may also run more than once).
  std::atomic<bool> sent{false};
  auto rt = tenure::postgres::make_runtime({.dsn = url, .schema = schema});
  if (!rt) return std::cerr << rt.error().message() << "\n", 1;
  rt.value()->handle("welcome_email", [&](tenure::job_context& ctx) {
    std::cout << "welcome email sent to " << ctx.args().at("email").get<std::string>() << "\n";
    if (ctx.job_id() == job_id) {
      sent = true;
      sent.notify_all();
    }
    return tenure::job_outcome::completed();
  });
  if (!rt.value()->start()) return 1;
  sent.wait(false);
  rt.value()->stop();  // stops claiming, lets handlers finish, flushes every completion
  // [/snippet:worker]
  return 0;
}
