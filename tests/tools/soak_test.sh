#!/usr/bin/env bash
# soak_test.sh TENURE SOURCE_DIR PG_DIR: `tenure soak` for 30 s against a private cluster in
# PG_DIR (its own: the soak restarts the server), stopped at the end, also on failure.
set -euo pipefail
tenure=$1 src=$2
export TENURE_PG_DIR=$3
trap '"$src/scripts/pg" stop >/dev/null 2>&1 || true' EXIT
url=$("$src/scripts/pg" start)
line=$("$tenure" soak --minutes 0.5 --workers 3 --seed 7 --database-url "$url" \
  --restart-command "TENURE_PG_DIR='$TENURE_PG_DIR' '$src/scripts/pg' restart")
echo "$line"
# Exit 0 already says every must-be-0 figure is 0; the run must also have done real work under
# faults, and its transition trace must have been checked.
python3 - "$line" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert d["ok"] is True and d["drained"] is True, d
assert d["jobs_enqueued"] > 100 and d["completed"] > 50, d
assert d["bulk_batches"] >= 1, d  # jobs in run rows went through the same faults
assert d["faults"]["worker_kills"] >= 1 and d["faults"]["server_restarts"] >= 1, d["faults"]
assert d["trace_violations"] == 0, d["trace"]
assert d["trace"]["transitions"] > d["jobs_enqueued"], d["trace"]
assert d["trace"]["business_writes"] == d["caller_owned_completions"] > 0, (d["trace"], d["caller_owned_completions"])
print("soak: checked", d["trace"]["transitions"], "transitions")
PY
