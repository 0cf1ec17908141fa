#!/usr/bin/env bash
# Runs bench/wal_records small against the test cluster (scripts/pg's, whose WAL it reads) and
# checks each phase's split: one heap delete per job for a claim and for a completion, a heap
# insert per job in every phase, record bytes that add up to the phase's total, and no schema left;
# then the same for the append-only prototype (--layout compact): no delete, no row per job; and
# for the ledger prototype (--layout ledger): no job copied after enqueue, within 350 bytes.
set -euo pipefail
script=$1 tenure=$2
: "${TENURE_TEST_DSN:?the DSN of the test cluster}"
count='SELECT count(*) FROM pg_namespace WHERE nspname LIKE $$walrec\_%$$'
before=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
lines=$("$script" --tenure "$tenure" --jobs 400 --batch 100)
echo "$lines"
compact=$("$script" --tenure "$tenure" --jobs 400 --batch 100 --layout compact)
echo "$compact"
ledger=$("$script" --tenure "$tenure" --jobs 400 --batch 100 --layout ledger)
echo "$ledger"
after=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
python3 - "$lines" "$before" "$after" "$compact" "$ledger" <<'PY'
import json, sys
phases = [json.loads(l) for l in sys.argv[1].splitlines()]
before, after = int(sys.argv[2]), int(sys.argv[3])
compact = {p["phase"]: p for p in map(json.loads, sys.argv[4].splitlines())}
ledger = {p["phase"]: p for p in map(json.loads, sys.argv[5].splitlines())}
assert [p["phase"] for p in phases] == ["enqueue", "claim", "completion"], phases
assert all(p["layout"] == "shipped" for p in phases), phases
assert list(compact) == ["enqueue", "claim", "completion"], compact
# The append-only prototype deletes nothing when it claims or completes, writes the job's row
# only at enqueue, and its drain (claim + completion) stays within 150 bytes per job.
for name in ("claim", "completion"):
    c = compact[name]
    assert c["layout"] == "compact", c
    assert "Heap/DELETE" not in c["records"], c
    assert c["records"].get("Heap/INSERT", {}).get("records_per_job", 0) < 0.1, c
assert compact["claim"]["bytes_per_job"] + compact["completion"]["bytes_per_job"] <= 150, compact
shipped = {p["phase"]: p for p in phases}
# The ledger layout: a claim deletes the narrow ready row (one delete and one lock per job, as
# shipped) but copies no job; a completion deletes nothing and writes one narrow row per job; the
# drain stays within 350 bytes per job; enqueue writes the job and its ready row.
assert list(ledger) == ["enqueue", "claim", "completion"], ledger
assert all(p["layout"] == "ledger" for p in ledger.values()), ledger
assert 1.0 <= ledger["claim"]["records"]["Heap/DELETE"]["records_per_job"] <= 1.02, ledger["claim"]
assert ledger["claim"]["records"].get("Heap/INSERT", {}).get("records_per_job", 0) < 0.1, ledger["claim"]
assert "Heap/DELETE" not in ledger["completion"]["records"], ledger["completion"]
assert 0.99 <= ledger["completion"]["records"]["Heap/INSERT"]["records_per_job"] <= 1.02, ledger["completion"]
assert ledger["claim"]["bytes_per_job"] + ledger["completion"]["bytes_per_job"] <= 350, ledger
assert ledger["enqueue"]["records"]["Heap/INSERT"]["records_per_job"] >= 1.9, ledger["enqueue"]
assert compact["claim"]["bytes_per_job"] < shipped["claim"]["bytes_per_job"] / 2, (compact, shipped)
for p in phases:
    r = p["records"]
    assert p["jobs"] == 400 and p["bytes_per_job"] > 0, p
    inserts = sum(r.get(k, {}).get("records_per_job", 0) for k in ("Heap/INSERT", "Heap/INSERT+INIT"))
    assert inserts >= 1.0, (p["phase"], inserts)  # the job's row, written once more in each phase
    assert abs(sum(v["bytes_per_job"] for v in r.values()) - p["bytes_per_job"]) < 0.5 + 0.001 * p["bytes_per_job"], p
    assert 0 <= p["fpi_bytes_per_job"] <= p["bytes_per_job"], p
by = {p["phase"]: p["records"] for p in phases}
# Runs alone (RUN_SERIAL): only the server's own background work shares the ranges.
assert 1.0 <= by["claim"]["Heap/DELETE"]["records_per_job"] <= 1.02, by["claim"]            # out of ready
assert 1.0 <= by["completion"]["Heap/DELETE"]["records_per_job"] <= 1.02, by["completion"]  # out of receipts
assert "Heap/DELETE" not in by["enqueue"], by["enqueue"]
assert after == before, f"walrec schemas: {before} before, {after} after"
print("wal_records: figures consistent")
PY
