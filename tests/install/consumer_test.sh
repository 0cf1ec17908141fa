#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, then builds consumers against it with
# find_package(tenure), as users would:
#   consumer          every component (no COMPONENTS)
#   consumer_libpq    COMPONENTS postgres libpq, with SOCI, SQLite3 and PkgConfig unfindable
#   consumer_sqlite   COMPONENTS sqlite testing, with PostgreSQL and PkgConfig unfindable
#   consumer_unknown  COMPONENTS postgres nonsense: configuring must fail, naming the component
set -euo pipefail
build=$1 src=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null

consume() {  # consume NAME [cmake args...]
  local name=$1; shift
  cmake -S "$src/tests/install/$name" -B "$scratch/$name" -DCMAKE_PREFIX_PATH="$scratch/prefix" "$@" \
    >"$scratch/$name.log" 2>&1 || { cat "$scratch/$name.log"; echo "$name: configure failed"; exit 1; }
  cmake --build "$scratch/$name" -j2 >>"$scratch/$name.log" 2>&1 || { cat "$scratch/$name.log"; echo "$name: build failed"; exit 1; }
  "$scratch/$name/$name"
}

consume consumer
consume consumer_libpq -DCMAKE_DISABLE_FIND_PACKAGE_SOCI=ON -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON
consume consumer_sqlite -DCMAKE_DISABLE_FIND_PACKAGE_PostgreSQL=ON -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON

if cmake -S "$src/tests/install/consumer_unknown" -B "$scratch/unknown" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
     >"$scratch/unknown.log" 2>&1; then
  echo "consumer_unknown: configuring with COMPONENTS nonsense succeeded"; exit 1
fi
if ! grep -q "tenure has no component 'nonsense'" "$scratch/unknown.log"; then
  cat "$scratch/unknown.log"; echo "consumer_unknown: the failure does not name the component"; exit 1
fi
echo "consumer_unknown ok: refused, naming the component"
echo "consumers ok"
