#include "tenure/soci.hpp"

#include "tenure/libpq.hpp"

#include <soci/postgresql/soci-postgresql.h>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

namespace tenure {
namespace {

/// The libpq connection under a connected PostgreSQL session, or nullptr.
PGconn* native(soci::session& session) {
  if (session.get_backend() == nullptr || session.get_backend_name() != "postgresql") return nullptr;
  // SOCI's PostgreSQL backend exports no typeinfo, so the name is checked and the cast is static.
  return static_cast<soci::postgresql_session_backend*>(session.get_backend())->conn_;
}

}  // namespace

result<std::string> soci_connect_string(std::string_view dsn) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(std::string{dsn}.c_str(), &err);
  if (opts == nullptr) {
    if (err) PQfreemem(err);
    return errc::invalid_argument;
  }
  std::string out;
  for (auto* o = opts; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    std::string v = o->val;
    // SOCI splits on spaces and '='; quote only when a value needs it (libpq reads the quotes).
    if (v.empty() || v.find_first_of(" '\\=") != std::string::npos) {
      std::string q = "'";
      for (char c : v) {
        if (c == '\'' || c == '\\') q += '\\';
        q += c;
      }
      v = q + "'";
    }
    if (!out.empty()) out += ' ';
    out += std::string{o->keyword} + "=" + v;
  }
  PQconninfoFree(opts);
  return out;
}

// The same statements on the connection SOCI holds, so they join the caller's transaction.
result<std::int64_t> enqueue(soci::session& session, const new_job& job, const sql_options& options) {
  return enqueue(native(session), job, options);
}

result<std::vector<std::int64_t>> enqueue_batch(soci::session& session, std::span<const new_job> jobs,
                                                const sql_options& options) {
  return enqueue_batch(native(session), jobs, options);
}

result<enqueue_result> try_enqueue(soci::session& session, const new_job& job, const sql_options& options) {
  return try_enqueue(native(session), job, options);
}

result<std::vector<enqueue_result>> try_enqueue_batch(soci::session& session, std::span<const new_job> jobs,
                                                      const sql_options& options) {
  return try_enqueue_batch(native(session), jobs, options);
}

result<finalization_receipt> complete_in_tx(soci::session& session, const finalization_token& token,
                                            const finalize_options& options) {
  PGconn* conn = native(session);
  if (conn == nullptr) {
    tenure::logger()->error("tenure.soci: complete_in_tx needs a connected PostgreSQL session");
    return errc::protocol_error;
  }
  return complete_in_tx(conn, token, options);
}

}  // namespace tenure
