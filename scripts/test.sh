#!/usr/bin/env bash
# Builds and runs every test: the release build's full suite (unit, golden,
# fuzz-corpus, CLI, Python reference and conformance tests), every fuzz
# target for TERN_FUZZ_SECONDS (20 by default) with new inputs
# (scripts/fuzz.sh) and an ASan+UBSan build of the unit tests. Installs what
# it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

./scripts/install-deps.sh

echo "== release build"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/release -j"$jobs"
(cd build/release && ctest --output-on-failure -j"$jobs" --timeout 900)

echo "== fuzzers"
./scripts/fuzz.sh "${TERN_FUZZ_SECONDS:-20}"

echo "== asan+ubsan build (unit tests)"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DTERN_SANITIZE=ON -DTERN_BUILD_BENCH=OFF >/dev/null
cmake --build build/asan -j"$jobs"
(cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" --timeout 900 -LE 'slow|system')
