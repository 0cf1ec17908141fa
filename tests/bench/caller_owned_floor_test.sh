#!/usr/bin/env bash
# Runs bench/caller_owned_floor small against the test cluster (two rounds, so that complete_direct
# claims its attempts twice; claims of 8) and checks that every transaction ran, that complete_job
# really closed attempts (through the token table and with the tokens the clients wrote
# themselves) and the plain and range closures were written, and that its schema is gone
# afterwards.
set -euo pipefail
script=$1 tenure=$2
: "${TENURE_TEST_DSN:?the DSN of the test cluster}"
count='SELECT count(*) FROM pg_namespace WHERE nspname LIKE $$cof\_%$$'
before=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
line=$("$script" --tenure "$tenure" --database-url "$TENURE_TEST_DSN" --clients 4 --seconds 1 --rounds 2 --claim-size 8)
echo "$line"
after=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
python3 - "$line" "$before" "$after" <<'PY'
import json, sys
d, before, after = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
assert d["clients"] == 4 and d["rounds"] == 2 and d["seconds"] == 1, d
assert d["bare_vs_bare"] == 1, d
for k in ("lookup", "second_row", "closure", "closure_range", "complete", "call_direct", "complete_direct"):
    assert 0 < d[k + "_vs_bare"] < 5, (k, d)
assert d["claim_size"] == 8, d
assert d["completed"] > d["direct_completed"] > 0 and d["plain_closures"] > 0 and d["range_closures"] > 0, d
assert after == before, f"cof schemas: {before} before, {after} after"
print("caller_owned_floor: figures consistent")
PY
