#!/usr/bin/env bash
# Runs bench/sql_cost with few iterations and checks that it names the schema version the binary
# installs, that every figure is a positive count, and that the drain is claim plus complete.
set -euo pipefail
script=$1 tenure=$2
line=$("$script" --tenure "$tenure" --iterations 20 --batch 8)
echo "$line"
known=$("$tenure" --version | sed -E 's/.*schema version ([0-9]+).*/\1/')
python3 - "$line" "$known" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
known = int(sys.argv[2])
assert d["scenario"] == "sql-cost", d
assert d["schema_version"] == known, f"schema_version {d['schema_version']} != {known}"
assert d["batch"] == 8 and d["iterations"] == 20, d
for k in ("enqueue_instructions_per_job", "claim_instructions_per_job",
          "complete_instructions_per_job", "drain_instructions_per_job",
          "complete_in_tx_instructions_per_job"):
    assert isinstance(d[k], int) and d[k] > 1000, f"{k} = {d[k]}"
assert d["drain_instructions_per_job"] == d["claim_instructions_per_job"] + d["complete_instructions_per_job"], d
assert d["producer_tx_instructions"] > d["enqueue_instructions_per_job"], d
share = d["drain_instructions_per_job"] / (d["producer_tx_instructions"] + d["drain_instructions_per_job"])
assert abs(d["drain_share_of_producer_and_drain"] - share) < 0.001, d
print("sql_cost: figures consistent")
PY
