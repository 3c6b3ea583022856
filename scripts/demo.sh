#!/usr/bin/env bash
# The main job: installs what it needs, builds tern, and runs `tern demo`: a
# root agent and 12 members in 3 regions on this machine keeping a generated
# RL trace in sync, every member checked bit for bit (docs/agent.md).
#
# Run as root, it then runs the same on the emulated WAN: a root and 17
# members as separate processes in network namespaces of three regions with
# real one-way delays (40/75/90 ms) and 1 Gbit/s between regions, mutual TLS,
# `tern publish` per version (bench/agent_wan/run.sh, docs/wan.md). Without
# root, or where network namespaces or /dev/net/tun are not available, it
# says so and skips that part.
#
#   ./scripts/demo.sh [tern demo flags]   e.g. --members 16 --versions 6
#   ./scripts/demo.sh --codec             the codec alone (no agents, no WAN)
#   ./scripts/demo.sh --no-wan            the loopback demo only
#   ./scripts/demo.sh --wan-only          the WAN part only (root)
set -euo pipefail
cd "$(dirname "$0")/.."

wan=auto local_part=1
args=()
for a in "$@"; do
  case $a in
    --no-wan) wan=no ;;
    --wan-only) wan=yes local_part=0 ;;
    --codec | -h | --help) wan=no; args+=("$a") ;;
    *) args+=("$a") ;;
  esac
done

./scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=(tern)
[ "$wan" = no ] || targets+=(tern-agent tern-wan-fwd)
cmake --build build/release -j"$(nproc)" --target "${targets[@]}"

if ((local_part)); then
  build/release/tools/tern demo "${args[@]}"
fi
[ "$wan" = no ] && exit 0

# The WAN part needs root, a TUN device and network namespaces.
why=""
if [ "$(id -u)" -ne 0 ]; then
  why="not root (the testbed uses network namespaces and a TUN device)"
elif [ ! -c /dev/net/tun ]; then
  why="no /dev/net/tun"
elif ! ip netns add "tern-demo-probe-$$" 2>/dev/null; then
  why="cannot create network namespaces here"
else
  ip netns del "tern-demo-probe-$$"
fi
if [ -n "$why" ]; then
  echo
  echo "demo: the emulated-WAN part is skipped: $why."
  [ "$wan" = yes ] && exit 1
  exit 0
fi

echo
echo "== the same on the emulated WAN: a root in us and 17 members in us/eu/ap as separate processes,"
echo "   one-way 40/75/90 ms and 1 Gbit/s between regions, mutual TLS, \`tern publish\` per version"
exec bench/agent_wan/run.sh --params 20M --steps 4 --lr 1e-6 --deadline-s 120 \
  --tern build/release/tools/tern --agent build/release/tools/tern-agent \
  --fwd build/release/tools/wan/tern-wan-fwd
