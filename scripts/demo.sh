#!/usr/bin/env bash
# The main job: installs what it needs, builds tern, and runs `tern demo`: a
# root agent and 12 members in 3 regions on this machine keeping a generated
# RL trace in sync, every member checked bit for bit (docs/agent.md).
# `./scripts/demo.sh --codec` runs the codec alone.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/release -j"$(nproc)" --target tern
exec build/release/tools/tern demo "$@"
