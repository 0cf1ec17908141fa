#!/usr/bin/env bash
# Runs bench/enqueue_floor small against the test cluster and checks that every phase has a
# positive time, that the ratios are those times' ratios, and that its schema is gone afterwards.
set -euo pipefail
script=$1 tenure=$2
: "${TENURE_TEST_DSN:?the DSN of the test cluster}"
count='SELECT count(*) FROM pg_namespace WHERE nspname LIKE $$enqfloor\_%$$'
before=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
line=$("$script" --tenure "$tenure" --database-url "$TENURE_TEST_DSN" --jobs 300 --rounds 1)
echo "$line"
after=$(psql -X -qAt "$TENURE_TEST_DSN" -c "$count")
python3 - "$line" "$before" "$after" <<'PY'
import json, sys
d, before, after = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
assert d["jobs"] == 300 and d["rounds"] == 1, d
for k in ("array_batch", "copy_staged", "copy_temp", "insert_floor", "copy_direct", "copy_specs_only", "copy_layout_floor"):
    assert d[k + "_ms"] > 0, (k, d)
for k in ("copy_staged", "copy_temp", "insert_floor", "copy_direct", "copy_specs_only", "copy_layout_floor"):
    assert abs(d[k + "_speedup_over_array"] - d["array_batch_ms"] / d[k + "_ms"]) < 0.01, (k, d)
assert after == before, f"enqfloor schemas: {before} before, {after} after"
print("enqueue_floor: figures consistent")
PY
