#!/usr/bin/env bash
# Runs bench/run_rows_prototype small against the test cluster and checks that every phase has a
# positive time and WAL, that the rates are the times' rates, that a run row per batch writes less
# WAL than a ready row per job, and that its schema is gone afterwards. The script itself fails
# when a drain leaves a job behind, claims one twice, or the mixed drain takes them out of order.
set -euo pipefail
script=$1 tenure=$2
: "${TENURE_TEST_DSN:?the DSN of the test cluster}"
count='SELECT count(*) FROM pg_namespace WHERE nspname LIKE $$runproto\_%$$'
before=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
line=$("$script" --tenure "$tenure" --database-url "$TENURE_TEST_DSN" --jobs 600 --batch 300 --claim 100 --rounds 1)
echo "$line"
after=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
python3 - "$line" "$before" "$after" <<'PY'
import json, sys
d, before, after = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
assert (d["jobs"], d["batch"], d["claim"], d["rounds"]) == (600, 300, 100, 1), d
for k in ("rows_enqueue", "runs_enqueue", "rows_claim", "runs_claim", "runs_merged_claim", "mixed_enqueue", "mixed_claim"):
    assert d[k + "_ms"] > 0 and d[k + "_wal_bytes_per_job"] > 0, (k, d)
    assert abs(d[k + "_jobs_per_s"] - 600 / (d[k + "_ms"] / 1000)) <= 1, (k, d)
assert d["runs_enqueue_wal_bytes_per_job"] < d["rows_enqueue_wal_bytes_per_job"], d
assert d["runs_claim_wal_bytes_per_job"] < d["rows_claim_wal_bytes_per_job"], d
assert abs(d["runs_vs_rows_claim"] - d["rows_claim_ms"] / d["runs_claim_ms"]) < 0.01, d
assert d["runs_merged_claim_wal_bytes_per_job"] < d["rows_claim_wal_bytes_per_job"], d
assert after == before, f"runproto schemas: {before} before, {after} after"
print("run_rows_prototype: figures consistent")
PY
