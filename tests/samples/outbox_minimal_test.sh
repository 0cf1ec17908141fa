#!/usr/bin/env bash
# Runs samples/outbox_minimal against the test database in a fresh schema and checks the outcome
# in the database: the signup row exists and its job completed. Then runs it again with several
# earlier welcome_email jobs waiting: it handles them too and still ends once its own job is done.
set -euo pipefail
bin=$1
: "${TENURE_TEST_DSN:?TENURE_TEST_DSN is not set (run scripts/test)}"
schema=sample_$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
email="test-$schema@example.com"
email2="test2-$schema@example.com"
trap 'psql "$TENURE_TEST_DSN" -qc "DROP SCHEMA IF EXISTS $schema CASCADE; DELETE FROM signups WHERE email IN ('"'"'$email'"'"', '"'"'$email2'"'"')" >/dev/null 2>&1 || true' EXIT
q() { psql "$TENURE_TEST_DSN" -XAtc "$1"; }

DATABASE_URL=$TENURE_TEST_DSN TENURE_SCHEMA=$schema timeout 60 "$bin" "$email"
state=$(q "SELECT state FROM $schema.jobs WHERE kind = 'welcome_email' AND args->>'email' = '$email'")
rows=$(q "SELECT count(*) FROM signups WHERE email = '$email'")
echo "job state: $state, signup rows: $rows"
[[ $state == completed && $rows == 1 ]] || { echo "first run: FAILED"; exit 1; }

# Several jobs waiting when the worker starts: every one of them reaches the handler.
q "SELECT count($schema.enqueue('welcome_email', jsonb_build_object('email', 'earlier-' || g || '@example.com'))) FROM generate_series(1, 12) g" >/dev/null
DATABASE_URL=$TENURE_TEST_DSN TENURE_SCHEMA=$schema timeout 60 "$bin" "$email2" ||
  { echo "second run (12 earlier jobs waiting) did not end cleanly: exit $?"; exit 1; }
state=$(q "SELECT state FROM $schema.jobs WHERE kind = 'welcome_email' AND args->>'email' = '$email2'")
stuck=$(q "SELECT count(*) FROM $schema.jobs WHERE state NOT IN ('completed', 'available')")
echo "job state with earlier jobs waiting: $state, jobs neither completed nor available: $stuck"
[[ $state == completed && $stuck == 0 ]] && echo "sample outbox_minimal: ok"
