#!/usr/bin/env bash
# Measures how closely the emulated WAN (tools/wan/wan.sh) reproduces its
# configuration: ping RTT, single-stream TCP goodput (iperf3, BBR, so that
# the random loss does not limit the window) and the loss the forwarder
# applied, per setting. Prints a markdown table. Needs root.
#
#   bench/wan/verify.sh [--points "RTT_MS:RATE_MBIT:LOSS_PCT ..."] [--seconds S]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
WAN=$here/tools/wan/wan.sh
points="50:100:0 100:200:0.01 200:500:0.1 100:1000:0.01 0:0:0"
seconds=8
while (($#)); do
  case $1 in
    --points) points=$2; shift 2 ;; --seconds) seconds=$2; shift 2 ;;
    *) echo "verify.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
prefix=""
trap '[ -n "$prefix" ] && "$WAN" down "$prefix"; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

echo "| RTT ms | rate Mb/s | loss % | ping avg ms (err) | goodput Mb/s | of rate x 1448/1500 | loss applied % (lost/offered) |"
echo "|---|---|---|---|---|---|---|"
for p in $points; do
  IFS=: read -r rtt rate loss <<<"$p"
  printf 'region us hosts=1\nregion eu hosts=1\nlink us eu delay_ms=%s rate_mbit=%s loss_pct=%s\n' \
    "$(python3 -c "print($rtt / 2)")" "$rate" "$loss" >"$work/wan.conf"
  prefix=$("$WAN" up "$work/wan.conf")
  "$WAN" exec "$prefix" eu-1 iperf3 -s -D
  "$WAN" exec "$prefix" us-1 ping -q -c 2 -i 0.2 10.2.1.2 >/dev/null
  ping=$("$WAN" exec "$prefix" us-1 ping -q -c 20 -i 0.1 10.2.1.2 | awk -F/ '/^rtt/ {print $5}')
  # -O: steady state, after slow start.
  mbit=$("$WAN" exec "$prefix" us-1 iperf3 -J -c 10.2.1.2 -C bbr -t "$seconds" -O 3 |
    python3 -c "import json,sys; print('%.1f' % (json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e6))")
  read -r lost offered <<<"$("$WAN" stats "$prefix" | awk '/^link 1->2 / {for (i = 3; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}; print v["lost"], v["offered"]}')"
  python3 - "$rtt" "$rate" "$loss" "$ping" "$mbit" "$lost" "$offered" <<'PY'
import sys
rtt, rate, loss, ping, mbit, lost, offered = sys.argv[1:]
rtt, rate, ping, mbit = float(rtt), float(rate), float(ping), float(mbit)
err = '%+.1f%%' % (100 * (ping - rtt) / rtt) if rtt > 0 else 'n/a'
share = '%.1f%%' % (100 * mbit / (rate * 1448 / 1500)) if rate > 0 else 'unlimited'
applied = 100 * int(lost) / max(1, int(offered))
print(f"| {rtt:g} | {rate:g} | {sys.argv[3]} | {ping:.2f} ({err}) | {mbit} | {share} | {applied:.4f} ({lost}/{offered}) |")
PY
  "$WAN" down "$prefix"; prefix=""
done
