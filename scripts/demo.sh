#!/usr/bin/env bash
# The main job: installs what it needs, builds tern, and runs a codec session
# on a generated RL trace (datagen -> diff -> apply -> verify, per step).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/release -j"$(nproc)" --target tern
exec build/release/tools/tern demo "$@"
