#include "tenure/soci.hpp"

#include "tenure/libpq.hpp"

#include <soci/postgresql/soci-postgresql.h>

#include <spdlog/spdlog.h>

#include "tenure/log.hpp"

#include "tenure/postgres/sql_text.hpp"
#include "tenure/postgres/schema.hpp"

namespace tenure {
namespace {

using postgres::errc_from_sqlstate;

/// Runs `fn`, turning SOCI exceptions into tenure error codes.
template <class Fn>
auto guarded(soci::session& session, const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const soci::postgresql_soci_error& e) {
    const auto code = errc_from_sqlstate(e.sqlstate());
    if (code == errc::database_error) tenure::logger()->error("tenure.soci: {} failed: {}", what, e.what());
    return code;
  } catch (const soci::soci_error& e) {
    // SOCI's PostgreSQL backend exports no typeinfo, so check the name and cast statically.
    if (session.get_backend() == nullptr || session.get_backend_name() != "postgresql") {
      tenure::logger()->error("tenure.soci: {} needs a PostgreSQL session: {}", what, e.what());
      return errc::invalid_argument;
    }
    auto* be = static_cast<soci::postgresql_session_backend*>(session.get_backend());
    if (be->conn_ == nullptr || PQstatus(be->conn_) != CONNECTION_OK) return errc::database_unavailable;
    tenure::logger()->error("tenure.soci: {} failed: {}", what, e.what());
    return errc::database_error;
  } catch (const std::exception& e) {
    tenure::logger()->error("tenure.soci: {} failed: {}", what, e.what());
    return errc::database_error;
  }
}

/// JSON text of a job's args or metadata (null: `{}`); nullopt when they cannot be serialized
/// (e.g. invalid UTF-8).
std::optional<std::string> json_text(const nlohmann::json& v) {
  if (v.is_null()) return "{}";
  try {
    return v.dump();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
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

result<std::int64_t> enqueue(soci::session& session, const new_job& job, const sql_options& options) {
  TENURE_TRYV(validate(job));
  if (!postgres::valid_schema_name(options.schema)) return errc::invalid_argument;
  return guarded(session, "enqueue", [&]() -> result<std::int64_t> {
    long long id = 0;
    auto maybe_args = json_text(job.args);
    auto maybe_metadata = json_text(job.metadata);
    if (!maybe_args || !maybe_metadata) return errc::invalid_argument;
    std::string kind = job.kind, args = *maybe_args, queue = job.queue, metadata = *maybe_metadata;
    std::string run_at = job.run_at ? postgres::timestamp_text(*job.run_at) : std::string{};
    soci::indicator run_at_ind = job.run_at ? soci::i_ok : soci::i_null;
    int priority = job.priority, max_attempts = job.max_attempts;
    session << "SELECT " + options.schema +
                   ".enqueue(:kind, CAST(:args AS jsonb), :queue, :priority, CAST(:run_at AS timestamptz), "
                   ":max_attempts, CAST(:metadata AS jsonb))",
        soci::use(kind), soci::use(args), soci::use(queue), soci::use(priority), soci::use(run_at, run_at_ind),
        soci::use(max_attempts), soci::use(metadata), soci::into(id);
    return static_cast<std::int64_t>(id);
  });
}

result<std::vector<std::int64_t>> enqueue_batch(soci::session& session, std::span<const new_job> jobs,
                                                const sql_options& options) {
  if (jobs.empty()) return std::vector<std::int64_t>{};
  if (!postgres::valid_schema_name(options.schema)) return errc::invalid_argument;
  std::vector<std::optional<std::string>> kinds, args, queues, run_ats, metadatas;
  std::vector<std::int64_t> priorities, max_attempts;
  for (const auto& j : jobs) {
    TENURE_TRYV(validate(j));
    kinds.emplace_back(j.kind);
    args.emplace_back(json_text(j.args));
    metadatas.emplace_back(json_text(j.metadata));
    if (!args.back() || !metadatas.back()) return errc::invalid_argument;
    queues.emplace_back(j.queue);
    run_ats.push_back(j.run_at ? std::optional{postgres::timestamp_text(*j.run_at)} : std::nullopt);
    priorities.push_back(j.priority);
    max_attempts.push_back(j.max_attempts);
  }
  return guarded(session, "enqueue_batch", [&]() -> result<std::vector<std::int64_t>> {
    using postgres::int_array;
    using postgres::text_array;
    std::string k = text_array(kinds), a = text_array(args), q = text_array(queues), r = text_array(run_ats),
                p = int_array(priorities), m = int_array(max_attempts), d = text_array(metadatas);
    // One statement for the whole batch; the id column comes back as one array in input order.
    std::string ids_text;
    session << "SELECT array_agg(job_id ORDER BY ord)::text FROM " + options.schema +
                   ".enqueue_batch(CAST(:k AS text[]), CAST(:a AS jsonb[]), CAST(:q AS text[]), "
                   "CAST(:p AS int[]), CAST(:r AS timestamptz[]), CAST(:m AS int[]), CAST(:d AS jsonb[]))",
        soci::use(k), soci::use(a), soci::use(q), soci::use(p), soci::use(r), soci::use(m), soci::use(d),
        soci::into(ids_text);
    std::vector<std::int64_t> ids;
    ids.reserve(jobs.size());
    std::int64_t cur = 0;
    bool in_number = false;
    for (char c : ids_text) {
      if (c >= '0' && c <= '9') {
        cur = cur * 10 + (c - '0');
        in_number = true;
      } else if (in_number) {
        ids.push_back(cur);
        cur = 0;
        in_number = false;
      }
    }
    if (ids.size() != jobs.size()) return errc::protocol_error;
    return ids;
  });
}

result<finalization_receipt> complete_in_tx(soci::session& session, const finalization_token& token,
                                            const finalize_options& options) {
  if (session.get_backend() == nullptr || session.get_backend_name() != "postgresql") {
    tenure::logger()->error("tenure.soci: complete_in_tx needs a connected PostgreSQL session");
    return errc::protocol_error;
  }
  // The same statement on the same connection SOCI holds, so it joins the caller's transaction.
  auto* be = static_cast<soci::postgresql_session_backend*>(session.get_backend());
  return complete_in_tx(be->conn_, token, options);
}

}  // namespace tenure
