#!/usr/bin/env bash
# Smoke test of bench/fanout on the emulated WAN (needs root, nginx, curl):
# a 4M-parameter BF16 trace, three versions, the chain shape (one serving
# member in each of ca/eu/ap) and the dissemination shape (6 relay-only
# members), each beside baseline (a), the full checkpoint from nginx to every
# island with curl on the same testbed. Fails if a member does not serve
# (chain) or hold (relay-only) every version bit for bit, if an island's
# download differs, or if tern's publish -> last member (median of the patch
# versions, timed from the patch being ready on the root) is not faster than
# (a)'s last island; and baseline (c), a PULSE patch through the same tree
# (tern_relay_blob), and baseline (d), the seed's store pull of XOR+zstd
# deltas, must reach every member verified. The run's plots
# (bench/fanout/plot.py) must be drawn where matplotlib is. ~1.5 min.
# Usage: fanout_smoke_test.sh RUN_SH TERN TERN_AGENT TERN_WAN_FWD TERN_RELAY_BLOB
set -euo pipefail
run=$1 tern=$2 agent=$3 fwd=$4 relay_blob=$5
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root"; exit 77; }
[ -c /dev/net/tun ] || { echo "SKIP: no /dev/net/tun"; exit 77; }
command -v nginx >/dev/null || { echo "SKIP: no nginx (scripts/install-deps.sh installs it)"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
before=$(ip netns list | grep -c '^tw-' || true)
rc=0
"$run" --shapes "chain relay" --members 6 --versions 3 --params 4M --fp8 "" --baselines "a c d" --gap-s 1 \
  --deadline-s 30 --tern "$tern" --agent "$agent" --fwd "$fwd" --relay-blob "$relay_blob" --out "$work/out" \
  --work-root "$work" |
  tee "$work/log" || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: run.sh exited $rc"; exit 1; }
python3 - "$work/out/results.json" <<'PY'
import json, sys
rs = json.load(open(sys.argv[1]))["results"]
bad = []
if sorted(r["shape"] for r in rs) != ["chain", "relay"]:
    bad.append("want one chain and one relay configuration, got %s" % [r["name"] for r in rs])
for r in rs:
    if not r["verified"]:
        bad.append("%s: a member does not hold or serve every version bit for bit" % r["name"])
    if r.get("c_verified") != r["members"]:
        bad.append("%s: baseline (c): %s of %d members verified (%s)" % (r["name"], r.get("c_verified"),
                                                                       r["members"], r.get("c_failed")))
    if r.get("d_verified") != r["members"]:
        bad.append("%s: baseline (d): %s of %d islands verified" % (r["name"], r.get("d_verified"), r["members"]))
    if r.get("a_verified") != r["members"]:
        bad.append("%s: baseline (a): %s of %d islands verified" % (r["name"], r.get("a_verified"), r["members"]))
    if not r["tern_last_s"] or not r.get("a_last_s") or r["tern_last_s"] >= r["a_last_s"]:
        bad.append("%s: tern %s s is not faster than baseline (a) %s s" % (r["name"], r["tern_last_s"],
                                                                            r.get("a_last_s")))
    print("%s: tern %.3f s, (a) %.3f s: %.1fx" % (r["name"], r["tern_last_s"] or -1, r.get("a_last_s") or -1,
                                                 (r.get("a_last_s") or 0) / (r["tern_last_s"] or 1)))
for b in bad:
    print("FAIL: " + b)
sys.exit(1 if bad else 0)
PY
if python3 -c "import matplotlib" 2>/dev/null; then
  for png in fanout_time fanout_members fanout_wan_bytes; do
    [ -s "$work/out/$png.png" ] || { echo "FAIL: run.sh drew no $png.png"; exit 1; }
  done
fi
after=$(ip netns list | grep -c '^tw-' || true)
[ "$after" -le "$before" ] || { echo "FAIL: the testbed's namespaces were left behind"; exit 1; }
[ -z "$(ls "$work" | grep tern-fanout || true)" ] || { echo "FAIL: run.sh left its work directory"; exit 1; }
echo PASS
