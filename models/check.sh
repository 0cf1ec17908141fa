#!/usr/bin/env bash
# Model-checks a protocol model under models/ with SPIN (exhaustive, safety properties).
#
#   models/check.sh [--model NAME] [--mutant [NAME]] [workdir]
#   models/check.sh --list
#
# NAME is a model file models/NAME.pml (default: caller_finalization).
# Default: exits 0 only when the full state space was searched with 0 errors, no "max search
# depth too small" warning, and every statement of the model was reached (no vacuous branches).
# --mutant NAME: builds the mutant NAME declared in the model's header (a line
# "@mutant NAME -DDEFINE..."; without NAME, the first one) and exits 0 only when SPIN finds an
# assertion violation; prints the (shortest found) counterexample trail.
# --list: prints every model and its mutants.
# workdir: where spin/cc/pan run (created if missing, kept); default a temporary directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name="caller_finalization"
mutant=0
mutant_name=""
workdir=""

# "@mutant NAME -DX -DY" lines of a model -> "NAME -DX -DY"
mutants_of() { sed -n 's/^.*@mutant[[:space:]]\{1,\}\([A-Za-z0-9_]\{1,\}\)[[:space:]]\{1,\}\(.*[^[:space:]]\)[[:space:]]*$/\1 \2/p' "$1"; }

args=("$@")
i=0
while (( i < ${#args[@]} )); do
  arg="${args[$i]}"
  case "$arg" in
    --model)
      (( i + 1 < ${#args[@]} )) || { echo "check.sh: --model needs a NAME" >&2; exit 2; }
      i=$((i + 1)); name="${args[$i]}" ;;
    --model=*) name="${arg#--model=}" ;;
    --mutant)
      mutant=1
      # The next argument is the mutant's name unless it is an option or a path.
      if (( i + 1 < ${#args[@]} )) && [[ "${args[$((i + 1))]}" != -* && "${args[$((i + 1))]}" != */* ]]; then
        i=$((i + 1)); mutant_name="${args[$i]}"
      fi ;;
    --mutant=*) mutant=1; mutant_name="${arg#--mutant=}" ;;
    --list)
      for f in "$here"/*.pml; do
        echo "$(basename "$f" .pml)"
        mutants_of "$f" | sed 's/^/  --mutant /'
      done
      exit 0 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "check.sh: unknown option $arg" >&2; exit 2 ;;
    *)
      if [[ -n "$workdir" ]]; then echo "check.sh: more than one workdir given" >&2; exit 2; fi
      workdir="$arg" ;;
  esac
  i=$((i + 1))
done

[[ "$name" =~ ^[A-Za-z0-9_]+$ && -f "$here/$name.pml" ]] \
  || { echo "check.sh: no model models/$name.pml (see --list)" >&2; exit 2; }
model="$name.pml"
label="model $name"

spin_defs=()
if (( mutant )); then
  line=""
  if [[ -z "$mutant_name" ]]; then
    line="$(mutants_of "$here/$model" | head -n 1)"
  else
    line="$(mutants_of "$here/$model" | awk -v n="$mutant_name" '$1 == n' | head -n 1)"
  fi
  [[ -n "$line" ]] || { echo "check.sh: model $name declares no mutant '${mutant_name}' (see --list)" >&2; exit 2; }
  mutant_name="${line%% *}"
  read -r -a spin_defs <<<"${line#* }"
  label="$label (MUTANT $mutant_name)"
fi

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
cc_defs=(-DSAFETY)
pan_opts=(-m10000 -w24)
if (( mutant )); then
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
    | head -n 80 || true
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
