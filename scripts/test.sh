#!/usr/bin/env bash
# Builds and runs every test: the release build's full suite (unit, golden,
# fuzz-corpus, CLI, Python reference and conformance tests), every fuzz
# target for TERN_FUZZ_SECONDS (20 by default) with new inputs
# (scripts/fuzz.sh), an ASan+UBSan build of the unit tests, Clang's
# thread-safety analysis of the annotated lock rules
# (scripts/check_thread_safety.py) and a ThreadSanitizer build of the tests
# whose code starts threads (TERN_TSAN_TESTS=0 leaves it out, and says so).
# Installs what it needs first, including the engine test environment (vLLM's CPU build,
# ~6 GB, cached outside the tree: scripts/install-engine-env.sh); if that
# cannot be installed the run fails. TERN_ENGINE_TESTS=0 leaves the engine
# tests out, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

./scripts/install-deps.sh
engine=ON
if [ "${TERN_ENGINE_TESTS:-1}" = 0 ]; then
  engine=OFF
  echo "== engine tests (vLLM) LEFT OUT: TERN_ENGINE_TESTS=0"
else
  echo "== engine test environment"
  ./scripts/install-engine-env.sh >/dev/null
fi

echo "== release build"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTERN_ENGINE_TESTS=$engine >/dev/null
cmake --build build/release -j"$jobs"
./scripts/install-python.sh build/release  # the Python module into .venv
(cd build/release && ctest --output-on-failure -j"$jobs" --timeout 900)

echo "== fuzzers"
./scripts/fuzz.sh "${TERN_FUZZ_SECONDS:-20}"

echo "== asan+ubsan build (unit tests)"
# No kernels here: the release build compiled and linked them (nvcc, ~4 CPU
# minutes cold), the sanitizers see host code only, and gpu/'s logic tests
# (gpu_ops_test) build without nvcc.
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DTERN_SANITIZE=ON -DTERN_BUILD_BENCH=OFF \
  -DTERN_CUDA=OFF >/dev/null
cmake --build build/asan -j"$jobs"
(cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" --timeout 900 -LE 'slow|system')

echo "== thread-safety analysis (clang -Wthread-safety, annotated rooms)"
python3 scripts/check_thread_safety.py build/release -j"$jobs"

if [ "${TERN_TSAN_TESTS:-1}" = 0 ]; then
  echo "== tsan build LEFT OUT: TERN_TSAN_TESTS=0"
  exit 0
fi
echo "== tsan build (tests that start threads)"
# The test binaries are TERN_TSAN_TESTS (CMakeLists.txt): agent (system tests
# included), relay, view store, admin HTTP, etcd, the sidecar, publish jobs,
# transport, xfer, the patch codec's parallel paths, the thread pool's and
# the C API's (capi_test).
# Any report fails its test (halt_on_error). UCX_MEM_EVENTS=no: libucm's
# madvise hook crashes TSan in exiting threads. tsan.supp names each entry's
# reason; none is for tern's own code.
cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTERN_TSAN=ON -DTERN_BUILD_BENCH=OFF \
  -DTERN_CUDA=OFF -DTERN_ENGINE_TESTS=OFF >/dev/null
cmake --build build/tsan -j"$jobs" --target tsan_tests
(cd build/tsan && UCX_MEM_EVENTS=no \
   TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/../../scripts/tsan.supp" \
   ctest --output-on-failure -j"$jobs" --timeout 900 -L tsan -LE 'slow')
