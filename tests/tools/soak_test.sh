#!/usr/bin/env bash
# soak_test.sh TENURE SOURCE_DIR PG_DIR: `tenure soak` for 30 s against a private cluster in
# PG_DIR (its own: the soak restarts the server), stopped at the end, also on failure.
set -euo pipefail
tenure=$1 src=$2
export TENURE_PG_DIR=$3
trap '"$src/scripts/pg" stop >/dev/null 2>&1 || true' EXIT
url=$("$src/scripts/pg" start)
"$tenure" soak --minutes 0.5 --workers 3 --seed 7 --database-url "$url" \
  --restart-command "TENURE_PG_DIR='$TENURE_PG_DIR' '$src/scripts/pg' restart"
