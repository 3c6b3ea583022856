#!/usr/bin/env bash
# System test of the emulated WAN (needs root, iperf3): builds a three-region
# testbed, checks that ping RTT, iperf3 throughput and UDP loss match the
# configuration within 10% (loss: within its binomial noise), and that
# `down` -- also after a failed `up` -- leaves no namespace, process or state.
# Usage: testbed_test.sh WAN_SH TERN_WAN_FWD
set -euo pipefail
WAN=$1
export TERN_WAN_FWD=$2
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root"; exit 77; }
command -v iperf3 >/dev/null || { echo "SKIP: iperf3 missing"; exit 77; }
[ -c /dev/net/tun ] || { echo "SKIP: no /dev/net/tun"; exit 77; }

work=$(mktemp -d)
prefix=tw-t$$
cleanup() { "$WAN" down "$prefix" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat >"$work/wan.conf" <<'CONF'
# us-eu: 50 ms RTT, 100 Mb/s; us-ap: 100 ms RTT, 200 Mb/s, 0.01% loss;
# us-sa: 1% loss, unshaped, to measure loss.
region us hosts=1
region eu hosts=1
region ap hosts=1
region sa hosts=1
link us eu delay_ms=25 rate_mbit=100
link us ap delay_ms=50 rate_mbit=200 loss_pct=0.01
link us sa delay_ms=5 loss_pct=1
CONF

# A failed `up` must leave nothing behind.
if "$WAN" up "$work/wan.conf" --prefix "$prefix" --fwd /bin/false 2>/dev/null; then
  fail "up with a missing forwarder succeeded"
fi
[ -z "$(ip netns list | grep "^$prefix-" || true)" ] || fail "failed up left namespaces"
[ ! -e "/run/tern-wan/$prefix" ] || fail "failed up left state"

"$WAN" up "$work/wan.conf" --prefix "$prefix" >/dev/null
for h in eu-1 ap-1 sa-1; do "$WAN" exec "$prefix" "$h" iperf3 -s -D; done
sleep 0.3

within() {  # within MEASURED EXPECTED TOLERANCE_FRACTION
  python3 -c "import sys; m,e,t=map(float,sys.argv[1:]); sys.exit(0 if abs(m-e)<=t*e else 1)" "$@"
}

# The forwarder is a user-space process: on a loaded CI machine (ctest -j2
# on 2 cores) one measurement can come out slow although the emulation is
# right. A check passes when one of up to 3 measurements is within bounds;
# a link that is wrong fails all of them.
check_rtt() {  # check_rtt HOST DST_ADDR RTT_MS
  local avg try
  # The first packets wait for ARP; measure after them.
  "$WAN" exec "$prefix" us-1 ping -q -c 2 -i 0.2 "$2" >/dev/null
  for try in 1 2 3; do
    avg=$("$WAN" exec "$prefix" us-1 ping -q -c 10 -i 0.2 "$2" | awk -F/ '/^rtt/ {print $5}')
    echo "rtt us-1 -> $1: configured $3 ms, measured avg $avg ms (try $try)"
    within "$avg" "$3" 0.10 && return 0
  done
  fail "rtt to $1: $avg ms, want $3 ms +-10%"
}
check_rtt eu-1 "$("$WAN" ip "$prefix" eu-1)" 50
check_rtt ap-1 "$("$WAN" ip "$prefix" ap-1)" 100

# Configured rates count IP bytes; TCP goodput is at most 1448/1500 of that.
check_rate() {  # check_rate HOST RATE_MBIT (up to 3 measurements, as check_rtt)
  local mbit want try
  want=$(python3 -c "print($2 * 1448 / 1500)")
  for try in 1 2 3; do
    mbit=$("$WAN" exec "$prefix" us-1 iperf3 -J -c "$("$WAN" ip "$prefix" "$1")" -t 5 -O 1 -C bbr |
      python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e6)")
    echo "throughput us-1 -> $1 (bbr, 1 stream): configured $2 Mb/s (goodput $want), measured $mbit Mb/s (try $try)"
    within "$mbit" "$want" 0.10 && return 0
  done
  fail "throughput to $1: $mbit Mb/s, want $want +-10%"
}
check_rate eu-1 100
check_rate ap-1 200
# Segments the forwarder cut out of super-packets around random losses must
# arrive intact (a bad checksum would be dropped silently and hide as loss).
csum_errors=$("$WAN" exec "$prefix" ap-1 nstat -az TcpInCsumErrors IpInHdrErrors | awk 'NR > 1 {s += $2} END {print s + 0}')
[ "$csum_errors" -eq 0 ] || fail "$csum_errors checksum/header errors at ap-1"
"$WAN" stats "$prefix" | tee "$work/stats"
grep -q ' malformed=0 .* write_errors=0$' "$work/stats" || fail "forwarder saw malformed packets or write errors"

# 1% loss per direction on 5000 UDP datagrams one way: the forwarder's own
# count must be within binomial noise (sigma ~0.14%); the end-to-end count
# can only be higher (a busy machine also drops in socket buffers), so it
# gets a lower bound only.
lost=$("$WAN" exec "$prefix" us-1 iperf3 -J -u -c "$("$WAN" ip "$prefix" sa-1)" -b 20M -l 1000 -t 2 -w 4M |
  python3 -c "import json,sys; s=json.load(sys.stdin)['end']['sum']; print(s['lost_packets'], s['packets'])")
read -r n_lost n_sent <<<"$lost"
fwd=$("$WAN" stats "$prefix" | awk '/^link 1->4 / {for (i = 3; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}; print v["lost"], v["offered"]}')
read -r f_lost f_offered <<<"$fwd"
echo "loss us-1 -> sa-1: configured 1%, iperf3 lost $n_lost of $n_sent datagrams, forwarder dropped $f_lost of $f_offered"
python3 -c "import sys; l,n=map(int,sys.argv[1:]); sys.exit(0 if n>=4000 and 0.5<=100*l/n<=1.5 else 1)" \
  "$f_lost" "$f_offered" || fail "forwarder loss $f_lost/$f_offered, want 1%"
python3 -c "import sys; l,n=map(int,sys.argv[1:]); sys.exit(0 if n>=4000 and 100*l/n>=0.5 else 1)" \
  "$n_lost" "$n_sent" || fail "end-to-end loss $n_lost/$n_sent, want >= ~1%"

fwd_pid=$(cat "/run/tern-wan/$prefix/fwd.pid")
"$WAN" down "$prefix"
"$WAN" down "$prefix"  # idempotent
[ -z "$(ip netns list | grep "^$prefix-" || true)" ] || fail "down left namespaces"
! kill -0 "$fwd_pid" 2>/dev/null || fail "down left the forwarder running"
[ ! -e "/run/tern-wan/$prefix" ] || fail "down left state"
echo "PASS"
