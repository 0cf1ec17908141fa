// The statements of the PostgreSQL store (store_impl.hpp), built once per schema.
#include "store_impl.hpp"

namespace tenure::postgres::detail {

statements::statements(const std::string& s)
    : enqueue{"tenure_enqueue",
              "SELECT " + s + ".enqueue($1, $2::jsonb, $3, $4::int, $5::timestamptz, $6::int, $7::jsonb)"},
      enqueue_batch{"tenure_enqueue_batch",
                    "SELECT job_id, inserted FROM " + s +
                        ".enqueue_batch($1::text[], $2::jsonb[], $3::text[], $4::int[], "
                        "$5::timestamptz[], $6::int[], $7::jsonb[], $8::text[]) ORDER BY ord"},
      claim{"tenure_claim", "SELECT job_id, run_lease, kind, args::text, attempt, max_attempts, " +
                                epoch_us("deadline_at") + ", encode(uuid_send(secret), 'hex'), metadata::text, " +
                                epoch_us("available_at") + ", resume_payload::text FROM " + s +
                                ".claim_attempts($1, $2::int, $3, $4)"},
      heartbeat{"tenure_heartbeat", "SELECT job_id, run_lease FROM " + s +
                                        ".heartbeat_batch($1::bigint[], $2::bigint[], $3::jsonb[])"},
      complete{"tenure_complete", "SELECT job_id, run_lease, " + epoch_us("completed_at") + " FROM " +
                                      s + ".complete_batch($1::bigint[], $2::bigint[], $3::jsonb[], $4::uuid[])"},
      fail{"tenure_fail",
           "SELECT " + s + ".fail_attempt($1::bigint, $2::bigint, $3, $4::boolean, $5::interval)"},
      snooze{"tenure_snooze", "SELECT " + s + ".snooze_attempt($1::bigint, $2::bigint, $3::interval)"},
      cancel_attempt{"tenure_cancel_attempt",
                     "SELECT " + s + ".cancel_attempt($1::bigint, $2::bigint, $3)"},
      checkpoint{"tenure_checkpoint",
                 "SELECT progress::text FROM " + s + ".attempt_checkpoint($1::bigint, $2::bigint)"},
      register_callback{"tenure_register_callback",
                        "SELECT " + s + ".register_callback($1::bigint, $2::bigint, $3::interval)::text"},
      await_callback{"tenure_await_callback", "SELECT status, payload::text FROM " + s +
                                                  ".await_callback($1::bigint, $2::bigint, $3::uuid)"},
      park_callback{"tenure_park_callback",
                    "SELECT " + s + ".park_callback($1::bigint, $2::bigint, $3::uuid)"},
      resume_callback{"tenure_resume_callback", "SELECT " + s + ".resume_callback($1::uuid, $2::jsonb)"},
      extend_callback{"tenure_extend_callback", "SELECT " + s + ".extend_callback($1::uuid, $2::interval)"},
      complete_callback{"tenure_complete_callback",
                        "SELECT " + s + ".complete_callback($1::uuid, $2::jsonb)"},
      fail_callback{"tenure_fail_callback", "SELECT " + s + ".fail_callback($1::uuid, $2, $3::boolean)"},
      cancel_job{"tenure_cancel_job", "SELECT " + s + ".cancel_job($1::bigint)"},
      retry_job{"tenure_retry_job", "SELECT " + s + ".retry_job($1::bigint)"},
      read_job{"tenure_read_job",
               "SELECT id, queue, kind, args::text, state, priority, attempt, max_attempts, run_lease, " +
                   epoch_us("run_at") + ", " + epoch_us("created_at") + ", " + epoch_us("finalized_at") +
                   ", last_error, progress::text, dead_lettered, metadata::text, unique_key FROM " + s +
                   ".jobs WHERE id = $1::bigint"},
      rescue{"tenure_rescue",
             "SELECT job_id, run_lease, queue, new_state FROM " + s + ".rescue_attempts($1::interval)"},
      promote{"tenure_promote", "SELECT " + s + ".promote_due(NULL, 10000)"},
      maintain{"tenure_maintain", "SELECT job_id, run_lease, queue, new_state FROM " + s +
                                      ".maintain($1, $2::bigint, $3::interval)"},
      evidence{"tenure_evidence", "SELECT " + s + ".attempt_evidence($1::bigint, $2::bigint)"},
      evidence_batch{"tenure_evidence_batch",
                     "SELECT evidence FROM " + s + ".attempt_evidence_batch($1::bigint[], $2::bigint[]) ORDER BY ord"},
      version{"tenure_schema_version", "SELECT coalesce(max(version), 0) FROM " + s + ".schema_version"},
      configure_queue{"tenure_configure_queue",
                      "INSERT INTO " + s +
                          ".queues (name, dead_letter, hard_deadline, backoff_base, backoff_cap) "
                          "VALUES ($1, $2::boolean, $3::interval, $4::interval, $5::interval) "
                          "ON CONFLICT (name) DO UPDATE SET dead_letter = excluded.dead_letter, "
                          "hard_deadline = excluded.hard_deadline, backoff_base = excluded.backoff_base, "
                          "backoff_cap = excluded.backoff_cap"},
      pause_queue{"tenure_pause_queue", "SELECT " + s + ".pause_queue($1)"},
      resume_queue{"tenure_resume_queue", "SELECT " + s + ".resume_queue($1)"},
      update_queue{"tenure_update_queue", "SELECT " + s + ".configure_queue($1, $2::jsonb)"},
      // The claim path's tables with at least $2 dead rows, and whether this role may VACUUM
      // them (owner, member of the owner or of the database's owner, or superuser).
      dead_rows{"tenure_dead_rows",
                "SELECT s.relname, pg_has_role(c.relowner, 'USAGE') OR r.rolsuper "
                "OR pg_has_role((SELECT d.datdba FROM pg_database d WHERE d.datname = current_database()), 'USAGE') "
                "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
                "CROSS JOIN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) r "
                "WHERE s.schemaname = $1 AND s.relname IN ('ready', 'open_claims', 'runs') AND s.n_dead_tup >= $2::bigint "
                "ORDER BY s.relname"},
      copy_target{"tenure_enqueue_copy_target", "SELECT " + s + ".enqueue_copy_target($1::boolean)"},
      copy_move{"tenure_enqueue_copied", "SELECT " + s + ".enqueue_copied()"},
      copy_ready_ids{"tenure_enqueue_copied_ready", "SELECT " + s + ".enqueue_copied_ready($1::int)"},
      queue_depths{"tenure_queue_depths", "SELECT queue, available, scheduled, retryable, running, waiting_external, " +
                                              epoch_us("oldest_available") + " FROM " + s + ".queue_depths()"} {}

}  // namespace tenure::postgres::detail
