#!/usr/bin/env bash
# soak_crash_test.sh TENURE: a 15 s `tenure soak` on the test cluster (TENURE_TEST_DSN; no server
# restarts) while this script sends SIGSEGV to worker w2's first process, as a crash would. The
# soak must report it (worker_crashes, worker_exits), start the worker again, lose nothing, and
# fail the run (exit 1).
set -uo pipefail
tenure=$1
: "${TENURE_TEST_DSN:?the DSN of the test cluster}"
(
  for _ in $(seq 1 200); do
    pid=$(pgrep -f -- "soak --worker w2-1 " | head -n 1)
    if [[ -n "$pid" ]]; then
      sleep 3
      kill -SEGV "$pid"
      exit 0
    fi
    sleep 0.05
  done
) &
crasher=$!
line=$("$tenure" soak --minutes 0.25 --workers 2 --seed 11 --database-url "$TENURE_TEST_DSN")
rc=$?
wait "$crasher"
echo "$line"
# A failed run keeps its schemas and logs for a post-mortem; this one failed on purpose.
schema=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["schema"])' "$line")
logs=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("logs", ""))' "$line")
[[ "$schema" =~ ^soak_[0-9a-f]+$ ]] &&
  psql -X -q "$TENURE_TEST_DSN" -c "DROP SCHEMA IF EXISTS ${schema}_rec CASCADE; DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null
[[ "$logs" == /tmp/tenure-soak-* ]] && rm -rf "$logs"
python3 - "$line" "$rc" <<'PY'
import json, sys
d, rc = json.loads(sys.argv[1]), int(sys.argv[2])
assert rc == 1 and d["ok"] is False, (rc, d["ok"])
assert d["worker_crashes"] == 1, d["worker_exits"]
# The soak also terminates backends; one that hits a worker while it starts makes that worker
# exit 1 (database unavailable), which the soak tolerates and restarts. Only the crash is a signal.
exits = [e for e in d["worker_exits"] if e["how"].startswith("signal ")]
assert len(exits) == 1 and exits[0]["worker"] == "w2-1" and exits[0]["how"] == "signal 11", d["worker_exits"]
others = [e for e in d["worker_exits"] if not e["how"].startswith("signal ")]
assert all(e["how"] == "exit 1" and "database unavailable" in e["log_tail"] for e in others), others
# Started again, the worker and its peer drained the run; nothing was lost or finalized twice.
assert d["drained"] is True and d["lost"] == 0 and d["finalized_twice"] == 0, d
assert d["trace_violations"] == 0, d["trace"]
print("soak: the crash of", exits[0]["worker"], "was reported and the run failed")
PY
