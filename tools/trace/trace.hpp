#pragma once
/// \file
/// Traces of real runs, checked against the properties of models/caller_finalization.pml.
///
/// The recorder (recorder.sql, installed by `install`) is opt-in: row-level triggers on tenure's
/// state tables that append every committed change of a job's row to `<schema>.trace_events`, with
/// a commit-order number per transaction. Nothing of it exists until it is installed, and
/// `remove` takes all of it away. The checker replays the events in commit order, derives each
/// job's state transitions and checks them (`check`):
///
///   1. no stale finalization: an attempt's outcome (completed, failed, retried, rescued, ...) is
///      recorded for (job, lease) only while that lease is the job's live running attempt;
///   2. one terminal outcome: a job leaves a terminal state only through an admin retry (or
///      retention); each attempt ends at most once; a job lives in one table at a time;
///   3. run leases only grow: a claim (a parked attempt's continuation too) opens a run lease above
///      every earlier one of the job, and no other transition changes it;
///   4. no business write without its attempt's completion: a row of a watched business table for
///      (job, lease) commits in the transaction that completed that attempt, and (when business
///      tables are watched) a caller's token completion (`complete_job`) commits with its row.
/// Property 0 is the trace's own consistency (a transition the protocol has no path for, a row
/// deleted that the trace never saw inserted).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tenure/result.hpp"

namespace tenure::trace {

/// One recorded row change, as stored in `<schema>.trace_events` joined with its commit order.
struct event {
  std::int64_t commit_seq = 0;  ///< commit order of its transaction
  std::int64_t seq = 0;         ///< order of the event (within a transaction: execution order)
  std::string xid;              ///< the transaction
  std::string tbl;              ///< ready, deferred, receipts, done, dead_letter, attempt_state, business
  char op = 'I';                ///< 'I' insert, 'D' delete, 'W' attempt_state.waiting changed
  std::int64_t job_id = 0;
  std::int64_t run_lease = 0;
  std::string state;            ///< the row's job state (business: the table)
  bool flag = false;            ///< ready: the row is a parked attempt's continuation
  std::string who;              ///< tenure functions on the stack, outermost first, '>' between
  std::string app;              ///< application_name of the session
};

/// A job's state at one point: "none" (before enqueue), available, scheduled, retryable, running,
/// waiting_external, completed, failed, cancelled, "gone" (deleted by retention).
struct point {
  std::string state = "none";
  std::int64_t lease = 0;
  bool continuation = false;  ///< available: the continuation of a parked attempt (same lease)
  bool operator==(const point&) const = default;
};

struct transition {
  std::int64_t commit_seq = 0;
  std::int64_t seq = 0;
  std::string xid;
  std::int64_t job_id = 0;
  point from;
  point to;
  std::string who;
  std::string app;
};

/// A row inserted into a watched business table, naming the attempt (job, lease) it belongs to.
struct business_write {
  std::int64_t commit_seq = 0;
  std::int64_t seq = 0;
  std::string xid;
  std::int64_t job_id = 0;
  std::int64_t run_lease = 0;
  std::string table;
  std::string who;
  std::string app;
};

struct violation {
  int property = 0;  ///< 1..4 as listed above; 0: the trace contradicts itself
  std::string rule;  ///< short name, e.g. "stale_finalization"
  std::string message;
  std::vector<transition> transitions;  ///< the violating one last, the job's previous one before it
  std::vector<business_write> business;
};

/// Transitions derived from events, in commit order.
struct trace {
  std::vector<transition> transitions;
  std::vector<business_write> business;
  bool business_watched = false;     ///< business tables are watched: property 4's second half applies
  std::vector<violation> problems;   ///< found while deriving (a job in two tables at a commit, ...)
  std::size_t events = 0;
  std::size_t transactions = 0;
};

struct report {
  std::vector<violation> violations;
  std::size_t events = 0;
  std::size_t transactions = 0;
  std::size_t transitions = 0;
  std::size_t jobs = 0;
  std::size_t business_writes = 0;
  nlohmann::json by_transition = nlohmann::json::object();  ///< "from->to": count
  nlohmann::json by_who = nlohmann::json::object();         ///< who category: count
  bool ok() const noexcept { return violations.empty(); }
};

/// The category of a `who` chain: claim, worker, caller (complete_job, the caller's own
/// transaction), callback, rescue, cancel, admin_retry, promote, enqueue, schedule, prune, direct
/// (no tenure function: SQL run by hand), or other.
std::string who_category(std::string_view who);

/// Replays events (ordered by commit_seq, then seq) into transitions. `business_watched`: whether
/// business tables are watched.
trace derive(const std::vector<event>& events, bool business_watched = false);

/// Checks the properties over a trace's transitions and business writes.
report check(const trace& t);

/// The summary `tenure trace check` prints: counts, and the first `max_violations` violations.
nlohmann::json to_json(const report& r, std::size_t max_violations = 20);
nlohmann::json to_json(const transition& t);

/// A business table whose rows are an attempt's effect: each row names its (job, run lease).
struct business_table {
  std::string name;  ///< table name, optionally schema-qualified
  std::string job_column = "job_id";
  std::string lease_column = "run_lease";
};

/// Installs the recorder into `schema` (idempotent) and watches each business table. The role
/// must own tenure's tables (and the business tables).
result<void> install(const std::string& dsn, const std::string& schema,
                     const std::vector<business_table>& business = {});
/// Removes the recorder and everything it recorded (idempotent).
result<void> remove(const std::string& dsn, const std::string& schema);
/// Reads the committed events in commit order; errc::invalid_argument when no recorder is installed.
result<std::vector<event>> load(const std::string& dsn, const std::string& schema, bool* business_watched = nullptr);
/// load + derive + check.
result<report> check_database(const std::string& dsn, const std::string& schema);

/// The recorder's SQL for `schema` (for tests and the curious).
std::string recorder_sql(const std::string& schema);

}  // namespace tenure::trace
