#!/usr/bin/env bash
# Runs `scripts/demo --once` against the test database in fresh schemas, with the built sample
# binary (no setup, no build). The demo checks its own narrative against the database and prints
# "billing_inbox demo: ok" only when every check passed.
set -euo pipefail
bin=$1
demo=$2
: "${TENURE_TEST_DSN:?TENURE_TEST_DSN is not set (run scripts/test)}"
schema=demo_$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
trap 'psql "$TENURE_TEST_DSN" -qc "DROP SCHEMA IF EXISTS ${schema}_app CASCADE; DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true' EXIT
TENURE_DEMO_BINARY=$bin DATABASE_URL=$TENURE_TEST_DSN TENURE_DEMO_SCHEMA=$schema timeout 170 "$demo" --once
