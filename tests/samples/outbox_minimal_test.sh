#!/usr/bin/env bash
# Runs samples/outbox_minimal against the test database in a fresh schema and checks the outcome
# in the database: the signup row exists and its job completed.
set -euo pipefail
bin=$1
: "${TENURE_TEST_DSN:?TENURE_TEST_DSN is not set (run scripts/test)}"
schema=sample_$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
email="test-$schema@example.com"
trap 'psql "$TENURE_TEST_DSN" -qc "DROP SCHEMA IF EXISTS $schema CASCADE; DELETE FROM signups WHERE email = '"'"'$email'"'"'" >/dev/null 2>&1 || true' EXIT
DATABASE_URL=$TENURE_TEST_DSN TENURE_SCHEMA=$schema timeout 60 "$bin" "$email"
state=$(psql "$TENURE_TEST_DSN" -XAtc "SELECT state FROM $schema.jobs WHERE kind = 'welcome_email' AND args->>'email' = '$email'")
rows=$(psql "$TENURE_TEST_DSN" -XAtc "SELECT count(*) FROM signups WHERE email = '$email'")
echo "job state: $state, signup rows: $rows"
[[ $state == completed && $rows == 1 ]] && echo "sample outbox_minimal: ok"
