#!/usr/bin/env bash
# Drives the SQL contract with psql alone against a fresh schema installed by `tenure migrate`.
set -euo pipefail
cli=$1 script=$2
: "${TENURE_TEST_DSN:?TENURE_TEST_DSN is not set (run scripts/test)}"
schema=psql_$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
trap 'psql "$TENURE_TEST_DSN" -qc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true' EXIT
"$cli" --database-url "$TENURE_TEST_DSN" --schema "$schema" migrate
psql "$TENURE_TEST_DSN" -X -v schema="$schema" -f "$script"
