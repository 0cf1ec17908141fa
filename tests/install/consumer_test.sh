#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, builds tests/install/consumer against it with
# find_package(tenure), and runs the result.
set -euo pipefail
build=$1 src=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/build" -j2 >/dev/null
"$scratch/build/consumer"
