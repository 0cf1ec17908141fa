#!/usr/bin/env bash
# Model-checks models/caller_finalization.pml with SPIN (exhaustive, safety properties).
#
#   models/check.sh [--mutant] [workdir]
#
# Default: exits 0 only when the full state space was searched with 0 errors, no "max search
# depth too small" warning, and every statement of the model was reached (no vacuous branches).
# --mutant: builds the model with -DMUTANT (complete_job without its guard) and exits 0 only when
# SPIN finds an assertion violation; prints the (shortest found) counterexample trail.
# workdir: where spin/cc/pan run (created if missing, kept); default a temporary directory.
set -euo pipefail

mutant=0
workdir=""
for arg in "$@"; do
  case "$arg" in
    --mutant) mutant=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "check.sh: unknown option $arg" >&2; exit 2 ;;
    *)
      if [[ -n "$workdir" ]]; then echo "check.sh: more than one workdir given" >&2; exit 2; fi
      workdir="$arg" ;;
  esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model="caller_finalization.pml"
label="model caller_finalization"
(( mutant )) && label="$label (MUTANT)"

fail() { echo "$label: FAIL: $*" >&2; exit 1; }

command -v spin >/dev/null 2>&1 \
  || fail "'spin' not found on PATH; install the Debian package 'spin' (scripts/setup does, as root)"
cc_bin="${CC:-cc}"
command -v "$cc_bin" >/dev/null 2>&1 || fail "C compiler '$cc_bin' not found"

if [[ -z "$workdir" ]]; then
  workdir="$(mktemp -d "${TMPDIR:-/tmp}/tenure-spin.XXXXXX")"
  trap 'rm -rf "$workdir"' EXIT
else
  mkdir -p "$workdir"
fi
cd "$workdir"
rm -f pan pan.* ./*.trail pan.out "$model"
cp "$here/$model" .

start_ns=$(date +%s%N)
spin_defs=()
cc_defs=(-DSAFETY)
pan_opts=(-m10000 -w20)
if (( mutant )); then
  spin_defs=(-DMUTANT)
  cc_defs+=(-DREACH)     # with -i: iteratively shorten the counterexample
  pan_opts+=(-i)
fi

spin "${spin_defs[@]}" -a "$model" >spin.out 2>&1 || { cat spin.out >&2; fail "spin -a failed"; }
"$cc_bin" -O2 "${cc_defs[@]}" -o pan pan.c >cc.out 2>&1 || { cat cc.out >&2; fail "cc failed"; }
set +e
./pan "${pan_opts[@]}" >pan.out 2>&1
pan_rc=$?
set -e
elapsed=$(( ($(date +%s%N) - start_ns) / 1000000 ))

errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.out | tail -n 1)
stored=$(sed -n 's/^ *\([0-9][0-9.e+]*\) states, stored.*/\1/p' pan.out | tail -n 1)
depth=$(sed -n 's/.*depth reached \([0-9][0-9]*\).*/\1/p' pan.out | tail -n 1)
[[ -n "$errors" && -n "$stored" ]] || { cat pan.out >&2; fail "could not parse pan output (rc $pan_rc)"; }

if (( mutant )); then
  if (( errors == 0 )); then
    cat pan.out >&2
    fail "the mutant was NOT caught: 0 errors in $stored states"
  fi
  grep -q 'assertion violated' pan.out || { cat pan.out >&2; fail "errors reported, but no assertion violation"; }
  [[ -f "$model.trail" ]] || fail "no trail file written"
  echo "$label: caught as expected: errors: $errors, $stored states stored, ${elapsed} ms"
  grep -m1 'assertion violated' pan.out
  echo "--- counterexample (spin -t -p; observer processes omitted) ---"
  spin "${spin_defs[@]}" -t -p "$model" 2>&1 \
    | sed '/trail ends/q' \
    | grep -E '^ *[0-9]+:[[:space:]]+proc|assertion violated|text of failed|trail ends' \
    | grep -vE '\((invariants|quiescence|:init:)' \
    | head -n 60 || true
  exit 0
fi

problems=()
(( errors == 0 )) || problems+=("errors: $errors")
grep -q 'max search depth too small' pan.out && problems+=("max search depth too small")
grep -q 'Search not completed' pan.out && problems+=("search not completed")
grep -qi 'out of memory' pan.out && problems+=("out of memory")
grep -q 'Full statespace search' pan.out || problems+=("no full state space search reported")
# Non-vacuity: every statement except a process's closing "-end-" must be reachable.
unreached=$(grep -E '^[[:space:]]+[^[:space:]]+:[0-9]+, state [0-9]+, ' pan.out | grep -v '"-end-"' || true)
[[ -z "$unreached" ]] || problems+=("unreached statements:"$'\n'"$unreached")

if (( ${#problems[@]} )); then
  cat pan.out >&2
  printf '%s\n' "${problems[@]}" >&2
  fail "see above"
fi
echo "$label: OK: errors: 0, $stored states stored, depth $depth, full search, ${elapsed} ms"
