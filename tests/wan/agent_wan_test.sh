#!/usr/bin/env bash
# System test of the transfer agent on the emulated WAN (needs root): a root
# and 16 members in three regions (one-way delays 20-45 ms, 1 Gbit/s between
# regions), mutual TLS, ten versions (2 s apart) of a small datagen model published with
# `tern publish`. bench/agent_wan/run.sh fails unless every member serves
# every version, bit for bit the published checkpoint, within --deadline-s of
# `tern publish` returning; this also checks that the testbed is gone after.
# Usage: agent_wan_test.sh RUN_SH TERN TERN_AGENT TERN_WAN_FWD
set -euo pipefail
run=$1 tern=$2 agent=$3 fwd=$4
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root"; exit 77; }
[ -c /dev/net/tun ] || { echo "SKIP: no /dev/net/tun"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/wan.conf" <<'CONF'
region us hosts=6
region eu hosts=6
region ap hosts=5
link us eu delay_ms=20 rate_mbit=1000
link us ap delay_ms=35 rate_mbit=1000
link eu ap delay_ms=45 rate_mbit=1000
link us us delay_ms=0.5
link eu eu delay_ms=0.5
link ap ap delay_ms=0.5
CONF
before=$(ip netns list | grep -c '^tw-' || true)
# 20 s per version: ~100x what a quiet machine needs (0.1-0.3 s after the
# keyframe), room for ctest -j2 on two shared cores.
rc=0
"$run" --config "$work/wan.conf" --params 2M --steps 10 --gap-s 2 --lr 1e-5 --deadline-s 20 \
  --tern "$tern" --agent "$agent" --fwd "$fwd" --work-root "$work" | tee "$work/out" || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: run.sh exited $rc"; exit 1; }
for v in $(seq 1 10); do
  grep -qE "^version $v served by all 16 members .* 16/16 bitwise$" "$work/out" ||
    { echo "FAIL: version $v not served bit for bit by all 16 members"; exit 1; }
done
after=$(ip netns list | grep -c '^tw-' || true)
[ "$after" -le "$before" ] || { echo "FAIL: the testbed's namespaces were left behind"; exit 1; }
[ -z "$(ls "$work" | grep tern-agent-wan || true)" ] || { echo "FAIL: run.sh left its work directory"; exit 1; }
echo PASS
