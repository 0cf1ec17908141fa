// The trace checker: derives each job's transitions from recorded row events, then checks them
// against the properties of models/caller_finalization.pml (see trace.hpp).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "trace/trace.hpp"

namespace tenure::trace {
namespace {

bool terminal(const std::string& s) { return s == "completed" || s == "failed" || s == "cancelled"; }
bool live(const std::string& s) { return s == "running" || s == "waiting_external"; }
bool waiting_to_run(const std::string& s) { return s == "available" || s == "scheduled" || s == "retryable"; }

std::string text(const point& p) {
  std::string out = p.state;
  if (p.state != "none") out += "(" + std::to_string(p.lease) + (p.continuation ? ", continuation" : "") + ")";
  return out;
}

std::string text(const transition& t) {
  return "job " + std::to_string(t.job_id) + ": " + text(t.from) + " -> " + text(t.to) + " by " +
         (t.who.empty() ? std::string{"direct SQL"} : t.who) + (t.app.empty() ? "" : " [" + t.app + "]");
}

// ---- derive ------------------------------------------------------------------------------------

struct row {
  std::string tbl;
  std::int64_t lease = 0;
  std::string state;
  bool flag = false;
};

struct job_rows {
  std::vector<row> rows;
  point last;
  bool seen = false;
  const event* last_event = nullptr;
};

point point_of(const row& r) { return {r.state, r.lease, r.tbl == "ready" && r.flag}; }

class deriver {
 public:
  explicit deriver(trace& out) : out_(out) {}

  void run(const std::vector<event>& events) {
    seed_rows_from_before_the_trace(events);
    std::size_t i = 0;
    while (i < events.size()) {
      std::size_t j = i;
      std::vector<std::int64_t> touched;
      while (j < events.size() && events[j].commit_seq == events[i].commit_seq && events[j].xid == events[i].xid) {
        apply(events[j], touched);
        ++j;
      }
      end_of_transaction(touched, events[j - 1]);
      ++out_.transactions;
      i = j;
    }
    out_.events = events.size();
  }

 private:
  /// A row deleted that no event inserted existed before the recorder (the trace starts mid-life):
  /// its job starts from it, whatever order the statement's row events come in.
  void seed_rows_from_before_the_trace(const std::vector<event>& events) {
    std::set<std::tuple<std::int64_t, std::string, std::int64_t>> inserted;
    for (const auto& e : events) {
      if (e.tbl == "business" || e.tbl == "attempt_state") continue;
      const auto key = std::make_tuple(e.job_id, e.tbl, e.run_lease);
      if (e.op == 'I') {
        inserted.insert(key);
      } else if (e.op == 'D' && !inserted.count(key)) {
        auto& j = jobs_[e.job_id];
        if (j.seen) continue;  // only the first: a job holds one row at a time
        j.seen = true;
        j.rows.push_back({e.tbl, e.run_lease, e.state, e.flag});
        j.last = point_of(j.rows.back());
        inserted.insert(key);
      }
    }
  }

  void emit(job_rows& j, const point& to, const event& e) {
    if (to == j.last) return;
    out_.transitions.push_back({e.commit_seq, e.seq, e.xid, e.job_id, j.last, to, e.who, e.app});
    j.last = to;
  }

  void problem(int property, std::string rule, std::string message, const event& e) {
    violation v{property, std::move(rule), std::move(message), {}, {}};
    v.transitions.push_back({e.commit_seq, e.seq, e.xid, e.job_id, {}, {e.state, e.run_lease, e.flag}, e.who, e.app});
    out_.problems.push_back(std::move(v));
  }

  void apply(const event& e, std::vector<std::int64_t>& touched) {
    if (e.tbl == "business") {
      out_.business.push_back({e.commit_seq, e.seq, e.xid, e.job_id, e.run_lease, e.state, e.who, e.app});
      return;
    }
    auto& j = jobs_[e.job_id];
    if (std::find(touched.begin(), touched.end(), e.job_id) == touched.end()) touched.push_back(e.job_id);
    j.last_event = &e;
    if (e.op == 'I') {
      j.rows.push_back({e.tbl, e.run_lease, e.state, e.flag});
      j.seen = true;
      if (j.rows.size() == 1) emit(j, point_of(j.rows.front()), e);
      return;
    }
    if (e.op == 'D') {
      auto it = std::find_if(j.rows.begin(), j.rows.end(),
                             [&](const row& r) { return r.tbl == e.tbl && r.lease == e.run_lease; });
      if (it == j.rows.end()) {
        if (!j.seen) {  // the job existed before the recorder: its history starts here
          j.seen = true;
          j.last = {e.state, e.run_lease, e.tbl == "ready" && e.flag};
        } else {
          problem(0, "unknown_row",
                  "job " + std::to_string(e.job_id) + ": a " + e.tbl + " row of run lease " +
                      std::to_string(e.run_lease) + " was deleted that the trace never saw",
                  e);
        }
      } else {
        j.rows.erase(it);
      }
      if (j.rows.size() == 1) emit(j, point_of(j.rows.front()), e);
      return;
    }
    // 'W': attempt_state.waiting of (job, lease) changed.
    if (j.rows.size() == 1 && j.rows.front().tbl == "receipts" && j.rows.front().lease == e.run_lease) {
      emit(j, {e.state, e.run_lease, false}, e);
    } else if (!j.seen) {
      j.seen = true;
      j.last = {e.state, e.run_lease, false};
    } else {
      problem(1, "stale_callback_write",
              "job " + std::to_string(e.job_id) + ": the callback state of run lease " + std::to_string(e.run_lease) +
                  " changed to " + e.state + " while that lease was not the live attempt (" + text(j.last) + ")",
              e);
    }
  }

  void end_of_transaction(const std::vector<std::int64_t>& touched, const event& last) {
    for (auto id : touched) {
      auto& j = jobs_[id];
      if (j.rows.size() > 1) {
        std::string where;
        for (const auto& r : j.rows) where += (where.empty() ? "" : ", ") + r.tbl + "(" + std::to_string(r.lease) + ")";
        problem(2, "one_location", "job " + std::to_string(id) + " committed in two places at once: " + where,
                *j.last_event);
      } else if (j.rows.empty() && j.last.state != "gone") {
        const event& e = j.last_event != nullptr ? *j.last_event : last;
        emit(j, {"gone", j.last.lease, false}, e);
      }
    }
  }

  trace& out_;
  std::unordered_map<std::int64_t, job_rows> jobs_;
};

// ---- check -------------------------------------------------------------------------------------

struct job_state {
  point cur;
  std::int64_t max_lease = 0;
  bool known = false;
  const transition* prev = nullptr;
  std::set<std::int64_t> ended;  // leases whose attempt reached a terminal outcome
};

bool allowed(const point& from, const point& to) {
  const auto& f = from.state;
  const auto& t = to.state;
  if (f == "none") return t == "available" || t == "scheduled";
  if (f == "available") return t == "running" || t == "cancelled";
  if (f == "scheduled" || f == "retryable") return t == "available" || t == "cancelled";
  if (live(f)) {
    return terminal(t) || waiting_to_run(t) || (live(t) && t != f);
  }
  if (terminal(f)) return t == "available" || t == "gone";
  return false;
}

void bump(nlohmann::json& counts, const std::string& key) { counts[key] = counts.value(key, 0) + 1; }

class checker {
 public:
  explicit checker(report& r) : r_(r) {}

  void run(const trace& t) {
    for (const auto& v : t.problems) r_.violations.push_back(v);
    // Business writes of each transaction, and its completions.
    std::map<std::string, std::vector<const business_write*>> business_by_tx;
    for (const auto& b : t.business) business_by_tx[b.xid].push_back(&b);
    std::map<std::string, std::set<std::pair<std::int64_t, std::int64_t>>> completed_by_tx;
    for (const auto& tr : t.transitions) {
      step(tr);
      bump(r_.by_transition, tr.from.state + "->" + tr.to.state);
      bump(r_.by_who, who_category(tr.who));
      if (live(tr.from.state) && tr.to.state == "completed" && tr.to.lease == tr.from.lease) {
        completed_by_tx[tr.xid].insert({tr.job_id, tr.to.lease});
      }
    }
    // Property 4.
    for (const auto& b : t.business) {
      const auto it = completed_by_tx.find(b.xid);
      if (it == completed_by_tx.end() || !it->second.count({b.job_id, b.run_lease})) {
        violation v{4, "business_without_completion",
                    "a row of " + b.table + " for job " + std::to_string(b.job_id) + " run lease " +
                        std::to_string(b.run_lease) + " committed in a transaction that did not complete that attempt",
                    {}, {b}};
        r_.violations.push_back(std::move(v));
      }
    }
    if (t.business_watched) {
      for (const auto& tr : t.transitions) {
        if (!(live(tr.from.state) && tr.to.state == "completed" && who_category(tr.who) == "caller")) continue;
        bool found = false;
        if (auto it = business_by_tx.find(tr.xid); it != business_by_tx.end()) {
          for (const auto* b : it->second) found = found || (b->job_id == tr.job_id && b->run_lease == tr.to.lease);
        }
        if (!found) {
          r_.violations.push_back({4, "completion_without_business",
                                   "the caller's completion of job " + std::to_string(tr.job_id) + " run lease " +
                                       std::to_string(tr.to.lease) + " committed without its business row",
                                   {tr}, {}});
        }
      }
    }
    r_.jobs = jobs_.size();
    r_.transitions = t.transitions.size();
    r_.business_writes = t.business.size();
    r_.events = t.events;
    r_.transactions = t.transactions;
    std::stable_sort(r_.violations.begin(), r_.violations.end(), [](const violation& a, const violation& b) {
      const auto key = [](const violation& v) {
        if (!v.transitions.empty()) return std::make_pair(v.transitions.back().commit_seq, v.transitions.back().seq);
        if (!v.business.empty()) return std::make_pair(v.business.front().commit_seq, v.business.front().seq);
        return std::make_pair(std::int64_t{0}, std::int64_t{0});
      };
      return key(a) < key(b);
    });
  }

 private:
  void fail(job_state& j, const transition& t, int property, std::string rule, std::string message) {
    violation v{property, std::move(rule), std::move(message) + " [" + text(t) + "]", {}, {}};
    if (j.prev != nullptr) v.transitions.push_back(*j.prev);
    v.transitions.push_back(t);
    r_.violations.push_back(std::move(v));
  }

  /// The first property the transition breaks, or none; then the job moves on to `to`.
  void step(const transition& t) {
    auto& j = jobs_[t.job_id];
    if (!j.known) {  // a job enqueued before the recorder starts where the trace first sees it
      j.known = true;
      j.cur = t.from;
      j.max_lease = t.from.lease;
    }
    check_one(j, t);
    j.cur = t.to;
    j.max_lease = std::max(j.max_lease, t.to.lease);
    j.prev = &t;
  }

  void check_one(job_state& j, const transition& t) {
    const auto& f = t.from;
    const auto& to = t.to;
    const std::string category = who_category(t.who);
    // 1. An attempt's outcome is recorded only while it is the live attempt, and for its own lease.
    if (live(f.state) && !(j.cur == f)) {
      return fail(j, t, 1, "stale_finalization",
                  "run lease " + std::to_string(f.lease) + " was closed while the job was " + text(j.cur));
    }
    if (live(f.state) && to.lease != f.lease) {
      return fail(j, t, 1, "stale_finalization",
                  "the live attempt " + std::to_string(f.lease) + " was closed with an outcome of run lease " +
                      std::to_string(to.lease));
    }
    if (f.state == "waiting_external" && to.state == "completed") {
      // complete_batch refuses an attempt waiting for its callback; complete_callback resolves the
      // wait first (waiting_external -> running -> completed in one transaction).
      return fail(j, t, 1, "completion_while_waiting", "an attempt waiting for its callback was completed as if it ran");
    }
    if ((to.state == "completed" || to.state == "failed") && !live(f.state) && !terminal(f.state)) {
      return fail(j, t, 1, "stale_finalization", "an outcome " + to.state + " was recorded with no live attempt");
    }
    // 2. One terminal outcome: out of a terminal state only by an admin retry or retention.
    if (f.state == "gone") return fail(j, t, 2, "pruned_job_reappeared", "a deleted job changed state again");
    if (terminal(f.state) && terminal(to.state)) {
      return fail(j, t, 2, "second_terminal_outcome", "a job already " + f.state + " was recorded " + to.state);
    }
    if (terminal(f.state) && to.state != "gone" && !(to.state == "available" && category == "admin_retry")) {
      return fail(j, t, 2, "reopened_without_retry", "a " + f.state + " job became " + to.state + " without an admin retry");
    }
    if (live(f.state) && terminal(to.state) && !j.ended.insert(f.lease).second) {
      return fail(j, t, 2, "second_terminal_outcome", "attempt " + std::to_string(f.lease) + " ended twice");
    }
    // 3. Run leases only grow: every claim (a parked attempt's continuation too) opens a lease
    // above every earlier one of the job; no other transition changes it.
    if (to.lease < j.max_lease || to.lease < f.lease) {
      return fail(j, t, 3, "lease_went_down",
                  "run lease " + std::to_string(to.lease) + " after " + std::to_string(std::max(j.max_lease, f.lease)));
    }
    if (f.state == "available" && to.state == "running") {
      const auto above = std::max(j.max_lease, f.lease);
      if (to.lease <= above) {
        return fail(j, t, 3, "claim_lease",
                    "a claim opened run lease " + std::to_string(to.lease) + ", not above " + std::to_string(above));
      }
    } else if (to.lease != f.lease && to.state != "gone") {
      return fail(j, t, 3, "lease_changed_without_claim",
                  "run lease " + std::to_string(f.lease) + " became " + std::to_string(to.lease) + " outside a claim");
    }
    // 0. The trace agrees with itself and the protocol has a path for the transition.
    if (!(j.cur == f)) {
      return fail(j, t, 0, "inconsistent", "the transition starts from " + text(f) + " but the job was " + text(j.cur));
    }
    if (!allowed(f, to)) return fail(j, t, 0, "illegal_transition", "no protocol path leads from " + f.state + " to " + to.state);
  }

  report& r_;
  std::unordered_map<std::int64_t, job_state> jobs_;
};

}  // namespace

std::string who_category(std::string_view who) {
  const auto has = [&](std::string_view fn) {
    for (std::size_t p = who.find(fn); p != std::string_view::npos; p = who.find(fn, p + 1)) {
      const bool start = p == 0 || who[p - 1] == '>';
      const bool end = p + fn.size() == who.size() || who[p + fn.size()] == '>';
      if (start && end) return true;
    }
    return false;
  };
  if (who.empty()) return "direct";
  if (has("complete_job")) return "caller";
  for (auto fn : {"resume_callback", "complete_callback", "fail_callback", "park_callback", "await_callback",
                  "continue_parked"}) {
    if (has(fn)) return "callback";
  }
  if (has("retry_job")) return "admin_retry";
  if (has("cancel_job") || has("cancel_attempt")) return "cancel";
  if (has("rescue_attempts") || has("rescue_stale")) return "rescue";
  if (has("prune_expired")) return "prune";
  if (has("promote_due")) return "promote";
  if (has("enqueue_due_schedules")) return "schedule";
  if (has("enqueue") || has("enqueue_one") || has("enqueue_batch")) return "enqueue";
  if (has("claim_attempts")) return "claim";
  for (auto fn : {"complete_batch", "fail_attempt", "fail_job", "snooze_attempt"}) {
    if (has(fn)) return "worker";
  }
  return "other";
}

trace derive(const std::vector<event>& events, bool business_watched) {
  trace out;
  out.business_watched = business_watched;
  deriver{out}.run(events);
  return out;
}

report check(const trace& t) {
  report r;
  checker{r}.run(t);
  return r;
}

nlohmann::json to_json(const transition& t) {
  return {{"job_id", t.job_id},
          {"from", {{"state", t.from.state}, {"run_lease", t.from.lease}, {"continuation", t.from.continuation}}},
          {"to", {{"state", t.to.state}, {"run_lease", t.to.lease}, {"continuation", t.to.continuation}}},
          {"who", t.who},
          {"category", who_category(t.who)},
          {"application_name", t.app},
          {"xid", t.xid},
          {"commit_seq", t.commit_seq},
          {"seq", t.seq}};
}

nlohmann::json to_json(const report& r, std::size_t max_violations) {
  nlohmann::json violations = nlohmann::json::array();
  for (std::size_t i = 0; i < r.violations.size() && i < max_violations; ++i) {
    const auto& v = r.violations[i];
    nlohmann::json ts = nlohmann::json::array();
    for (const auto& t : v.transitions) ts.push_back(to_json(t));
    nlohmann::json bs = nlohmann::json::array();
    for (const auto& b : v.business) {
      bs.push_back({{"table", b.table}, {"job_id", b.job_id}, {"run_lease", b.run_lease}, {"who", b.who},
                    {"application_name", b.app}, {"xid", b.xid}, {"commit_seq", b.commit_seq}, {"seq", b.seq}});
    }
    violations.push_back({{"property", v.property}, {"rule", v.rule}, {"message", v.message}, {"transitions", ts},
                          {"business_writes", bs}});
  }
  return {{"ok", r.ok()},
          {"events", r.events},
          {"transactions", r.transactions},
          {"transitions", r.transitions},
          {"jobs", r.jobs},
          {"business_writes", r.business_writes},
          {"violation_count", r.violations.size()},
          {"violations", violations},
          {"by_transition", r.by_transition},
          {"by_who", r.by_who}};
}

}  // namespace tenure::trace
