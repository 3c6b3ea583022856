#!/usr/bin/env bash
# Every cross-region figure in docs/benchmarks.md ("Cross-region fan-out")
# and docs/scale.md, tables and plots, from one command on a fresh machine
# (root: the testbed uses network namespaces and a TUN device). It installs
# what it needs (scripts/install-deps.sh), builds the release binaries, and
# runs, each on a fresh emulated WAN with the same 20M-parameter trace:
#   1. the testbed's own rates: chain (BF16 and FP8), relay-only N=8/16/32/64,
#      full N=8, against baselines (a), (c) and (d);
#   2. every delay doubled: chain and relay N=16;
#   3. every WAN rate at 1/20 (bandwidth-bound): chain and relay N=8/16/32/64
#      against (c) and (d), where the bytes and the store's one uplink show;
# then draws the measured figures (bench/fanout/plot.py) and runs the scale
# simulator's sweeps (bench/sim/scale.py: docs/scale.md and its plots).
#
#   sudo bench/fanout/reproduce.sh [--out DIR] [--versions 6] [--quick] [--skip-build] [--no-scale]
#
# DIR (default docs/fanout) gets run-1..3/ (each run's results.json and
# results.md), results.md (all three tables), and fanout_*.png. About 35
# minutes on a 2-core VM (2026-12-05, with the build up to date; --quick:
# 3 versions, N=8/16 only, the FP8 chain left out; not timed).
# Memory: N=64's 65 agents took the work tmpfs (an 8 GB ceiling) to 3.2 GB
# and the machine's used memory to 5.8 GB (2026-12-05).
# The work directories go on a tmpfs it mounts (agents' disks at memory
# speed, as the recorded figures were taken) and unmounts. Exit status 1
# when any run had a member or island not holding or serving a version bit
# for bit.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=$here/docs/fanout versions=6 quick=0 build=1 scale=1
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --versions) versions=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --skip-build) build=0; shift ;;
    --no-scale) scale=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "reproduce.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "reproduce.sh: needs root (the WAN testbed uses network namespaces and a TUN device); run it with sudo" >&2
  exit 1
fi
cd "$here"
started=$(date -u +%Y-%m-%dT%H:%MZ)
if ((build)); then
  ./scripts/install-deps.sh
  cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build/release -j"$(nproc)" --target tern tern-agent tern-wan-fwd tern_sim tern_relay_blob
fi
members="8 16 32 64" fp8=fp8-e4m3-block128
if ((quick)); then
  members="8 16" versions=3 fp8=""
fi
work=$(mktemp -d /tmp/tern-reproduce.XXXXXX)
cleanup() {
  if mountpoint -q "$work"; then umount "$work" || echo "reproduce.sh: could not unmount $work" >&2; fi
  rmdir "$work" 2>/dev/null || true
}
trap cleanup EXIT
mount -t tmpfs -o size=8g tmpfs "$work"
mkdir -p "$out"
rc=0
run() { # run N ARGS...: one bench/fanout invocation into $out/run-N
  local n=$1
  shift
  echo "== reproduce run $n: bench/fanout/run.sh $*"
  bench/fanout/run.sh "$@" --versions "$versions" --work-root "$work" --out "$out/run-$n" || rc=1
}
run 1 --shapes "chain relay full" --members "$members" --full-members 8 --baselines "a c d" --fp8 "$fp8"
run 2 --shapes "chain relay" --members 16 --rtt-scales 2 --baselines "" --fp8 ""
run 3 --shapes "chain relay" --members "$members" --baselines "c d" --fp8 "" --rate-scale 0.05
results=()
for n in 1 2 3; do
  [ -f "$out/run-$n/results.json" ] && results+=("$out/run-$n/results.json")
done
{
  echo "# Cross-region fan-out, reproduced"
  echo
  echo "\`bench/fanout/reproduce.sh\` from $started (its install and build included) to $(date -u +%Y-%m-%dT%H:%MZ) (its last run's end); plots: fanout_*.png beside this file."
  for n in 1 2 3; do
    [ -f "$out/run-$n/results.md" ] || continue
    echo
    sed '1s/^# .*/## Run '"$n"'/' "$out/run-$n/results.md"
  done
} >"$out/results.md"
# One set of plots over the three runs (each run drew its own as well).
rm -f "$out"/run-*/fanout_*.png
if ((${#results[@]})); then
  python3 bench/fanout/plot.py --out "$out" "${results[@]}" || rc=1
fi
if ((scale)); then
  python3 bench/sim/scale.py --sim build/release/bench/sim/tern_sim $( ((quick)) && echo --quick) || rc=1
fi
echo "reproduce.sh: tables in $out/results.md, plots in $out/fanout_*.png$( ((scale)) && echo ", docs/scale.md and docs/scale/*.png"); exit status $rc"
exit $rc
