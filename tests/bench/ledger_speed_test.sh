#!/usr/bin/env bash
# Runs bench/ledger_speed small against the test cluster and checks its lines: one per scenario,
# every variant's rate positive and its ratios those rates' ratios, the ledger's drain and
# caller-owned completion writing less WAL per job than the shipped layout's, its enqueue more,
# and no schema left behind.
set -euo pipefail
script=$1 tenure=$2
: "${TENURE_TEST_DSN:?the DSN of the test cluster}"
count='SELECT count(*) FROM pg_namespace WHERE nspname LIKE $$ledgerspeed\_%$$'
before=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
# A checkpoint during a run adds full-page images to its WAL figures: such a run is done again.
checkpoints='SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter'
for attempt in 1 2 3; do
  c0=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$checkpoints")
  lines=$("$script" --tenure "$tenure" --database-url "$TENURE_TEST_DSN" --rounds 1 --clients 2 --drain-clients 2 --batch 8)
  c1=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$checkpoints")
  echo "$lines"
  [[ "$c0" == "$c1" ]] && break
  echo "a checkpoint ran during attempt $attempt"
done
after=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
python3 - "$lines" "$before" "$after" <<'PY'
import json, sys
lines = [json.loads(l) for l in sys.argv[1].splitlines()]
before, after = int(sys.argv[2]), int(sys.argv[3])
assert [d["scenario"] for d in lines] == ["enqueue", "drain", "caller_owned"], lines
for d in lines:
    for v in ("shipped", "shipped_rows", "ledger_rows"):
        assert d[v + "_jobs_per_s"] > 0, (v, d)
        assert d[v + "_wal_bytes_per_job"] > 0, (v, d)
    assert abs(d["ledger_vs_shipped_rows"] - d["ledger_rows_jobs_per_s"] / d["shipped_rows_jobs_per_s"]) < 0.01, d
    if d["scenario"] == "drain":
        assert "bare_tx_per_s" not in d, d  # a drain has no business transaction
    else:
        assert d["bare_tx_per_s"] > 0, d
        for v in ("shipped", "shipped_rows", "ledger_rows"):
            assert abs(d[v + "_vs_bare"] - d[v + "_jobs_per_s"] / d["bare_tx_per_s"]) < 0.01, (v, d)
by = {d["scenario"]: d for d in lines}
# What the layouts write (bench/wal_records splits it): the ledger copies no row after enqueue.
assert by["drain"]["ledger_rows_wal_bytes_per_job"] < 0.7 * by["drain"]["shipped_rows_wal_bytes_per_job"], by["drain"]
assert by["caller_owned"]["ledger_rows_wal_bytes_per_job"] < by["caller_owned"]["shipped_rows_wal_bytes_per_job"], by["caller_owned"]
assert by["enqueue"]["ledger_rows_wal_bytes_per_job"] > by["enqueue"]["shipped_rows_wal_bytes_per_job"], by["enqueue"]
assert after == before, f"ledgerspeed schemas: {before} before, {after} after"
print("ledger_speed: figures consistent")
PY
