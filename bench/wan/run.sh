#!/usr/bin/env bash
# Cross-region transfer benchmark on the emulated WAN (tools/wan/wan.sh; needs
# root). For each link setting and congestion control, side by side in one
# run: one TCP stream (iperf3 -P 1, tern xfer --streams 1), N streams
# (iperf3 -P N: the practical ceiling, tern xfer --streams N) and tern with
# TLS. Data flows server -> client (iperf3 -R) in every column.
#
# Fairness: each iperf3 run lasts --seconds; each tern run moves as many
# bytes as the matching iperf3 run did, so both include slow start alike.
# tern columns are skipped (with a note) when `tern xfer` is not built.
#
#   bench/wan/run.sh [--points "RTT_MS:RATE_MBIT:LOSS_PCT ..."] [--cc "cubic bbr"]
#                    [--streams N] [--seconds S] [--tern PATH] [--fwd PATH] [--out FILE]
#                    [--tern-args "ARGS"]   (extra flags for both tern xfer ends)
#                    [--get-args "ARGS"]    (extra flags for tern xfer get only)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
WAN=$here/tools/wan/wan.sh
points="50:100:0 100:1000:0.01 100:200:0.01 200:500:0.1"
ccs="cubic bbr"
streams=8
seconds=5
tern=""
out=""
tern_args=()
get_args=()
while (($#)); do
  case $1 in
    --points) points=$2; shift 2 ;; --cc) ccs=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;; --seconds) seconds=$2; shift 2 ;;
    --tern) tern=$2; shift 2 ;; --fwd) export TERN_WAN_FWD=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tern-args) read -r -a tern_args <<<"$2"; shift 2 ;;
    --get-args) read -r -a get_args <<<"$2"; shift 2 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root" >&2; exit 1; }
if [ -z "$tern" ]; then
  for f in "$here"/build*/tools/tern "$here"/build/*/tools/tern; do [ -x "$f" ] && { tern=$f; break; }; done
fi
have_tern=0
[ -n "$tern" ] && "$tern" xfer --help >/dev/null 2>&1 && have_tern=1

work=$(mktemp -d /dev/shm/tw-bench.XXXXXX)
prefix=""
allowed_cc=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
cleanup() {
  [ -n "$prefix" ] && "$WAN" down "$prefix" >/dev/null 2>&1
  echo "$allowed_cc" >/proc/sys/net/ipv4/tcp_allowed_congestion_control
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Namespaces may only default to allowed congestion controls: allow ours for
# the run (restored on exit).
echo "$allowed_cc $ccs" >/proc/sys/net/ipv4/tcp_allowed_congestion_control

if ((have_tern)); then
  # Mutual TLS: one CA, a server certificate for the server's address and a
  # client certificate.
  (cd "$work" &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=tw-ca \
      -keyout ca.key -out ca.pem 2>/dev/null &&
    for who in server client; do
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$who" \
        -keyout $who.key -out $who.csr 2>/dev/null
      printf 'subjectAltName=IP:10.2.1.2,IP:10.1.1.2,DNS:localhost\n' >ext.cnf
      openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -extfile ext.cnf -out $who.pem 2>/dev/null
    done)
fi

# iperf3 RATE_MBIT BYTES_OUT: runs "$@" and prints "Mb/s bytes" received.
iperf() {
  "$WAN" exec "$prefix" us-1 iperf3 -J -R -c 10.2.1.2 -t "$seconds" "$@" |
    python3 -c "import json,sys; e=json.load(sys.stdin)['end']['sum_received']; print('%.1f %d' % (e['bits_per_second']/1e6, e['bytes']))"
}

# tern_get BYTES STREAMS TLS(0/1): prints Mb/s (tern's own summary when it
# has one, else bytes over wall time). tern asks for BBR by default; here it
# uses the row's congestion control ($cc), like iperf3 beside it.
tern_get() {
  local bytes=$1 n=$2 tls=$3 tls_server=(--no-tls) tls_client=(--no-tls)
  if ((tls)); then
    tls_server=(--tls-cert "$work/server.pem" --tls-key "$work/server.key" --tls-ca "$work/ca.pem")
    tls_client=(--tls-cert "$work/client.pem" --tls-key "$work/client.key" --tls-ca "$work/ca.pem")
  fi
  rm -rf "$work/srv" "$work/out"; mkdir -p "$work/srv"
  head -c "$bytes" "$work/pool" >"$work/srv/blob"
  "$WAN" exec "$prefix" eu-1 "$tern" xfer serve --listen 10.2.1.2:7400 "${tls_server[@]}" \
    --congestion "$cc" "${tern_args[@]}" "$work/srv" >"$work/serve.log" 2>&1 &
  local spid=$! t
  for ((t = 0; t < 50; t++)); do
    "$WAN" exec "$prefix" eu-1 ss -ltn 2>/dev/null | grep -q ':7400 ' && break; sleep 0.1
  done
  sleep 0.2
  local t0 t1 line
  t0=$(date +%s.%N)
  line=$("$WAN" exec "$prefix" us-1 "$tern" xfer get 10.2.1.2:7400 blob -o "$work/out" \
    --streams "$n" --quiet --congestion "$cc" "${tern_args[@]}" "${get_args[@]}" "${tls_client[@]}" 2>&1 | grep -E 'bytes=|Gb/s' | tail -n 1) ||
    { echo "tern xfer get failed: $line; server: $(tail -n 2 "$work/serve.log")" >&2; line=""; }
  t1=$(date +%s.%N)
  kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true
  if [ -z "$line" ] || ! cmp -s "$work/srv/blob" "$work/out"; then echo "fail"; return; fi
  python3 - "$line" "$bytes" "$t0" "$t1" <<'PY'
import re, sys
line, size, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
m = re.search(r'gbps=([0-9.]+)', line) or re.search(r'([0-9.]+)\s*Gb/s', line)
print('%.1f' % (float(m.group(1)) * 1000 if m else size * 8 / (t1 - t0) / 1e6))
PY
}

ratio() { python3 -c "import sys; a,b=map(float,sys.argv[1:]); print('%.2f' % (a/b) if b > 0 else '-')" "$1" "$2" 2>/dev/null || echo "-"; }

if ((have_tern)); then
  # Random bytes, so that nothing on the path can compress them.
  max_mbit=0
  for p in $points; do IFS=: read -r _ r _ <<<"$p"; ((r > max_mbit)) && max_mbit=$r; done
  head -c $((max_mbit * 125000 * (seconds + 2))) /dev/urandom >"$work/pool"
fi

header="| RTT ms | rate Mb/s | loss % | cc | iperf3 -P1 | tern 1 | iperf3 -P$streams | tern $streams | tern $streams TLS | tern/iperf3 (N) | tern N / 1 stream | TLS cost |"
rows=()
echo "$header"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for p in $points; do
  IFS=: read -r rtt rate loss <<<"$p"
  conf=$work/wan.conf
  printf 'region us hosts=1\nregion eu hosts=1\nlink us eu delay_ms=%s rate_mbit=%s loss_pct=%s\n' \
    "$(python3 -c "print($rtt / 2)")" "$rate" "$loss" >"$conf"
  for cc in $ccs; do
    prefix=$("$WAN" up "$conf" --cc "$cc")
    "$WAN" exec "$prefix" eu-1 iperf3 -s -D
    sleep 0.3
    read -r i1 b1 <<<"$(iperf -P 1)"
    read -r iN bN <<<"$(iperf -P "$streams")"
    t1=- tN=- tT=-
    if ((have_tern)); then
      t1=$(tern_get "$b1" 1 0)
      tN=$(tern_get "$bN" "$streams" 0)
      tT=$(tern_get "$bN" "$streams" 1)
    fi
    tls_cost=$(python3 -c "import sys; a,b=sys.argv[1:]; print('%.0f%%' % (100*(1-float(b)/float(a))))" "$tN" "$tT" 2>/dev/null || echo -)
    row="| $rtt | $rate | $loss | $cc | $i1 | $t1 | $iN | $tN | $tT | $(ratio "$tN" "$iN") | $(ratio "$tN" "$i1") | $tls_cost |"
    echo "$row"
    rows+=("$row")
    "$WAN" down "$prefix"; prefix=""
  done
done
((have_tern)) || echo "(tern columns empty: no \`tern xfer\` found; pass --tern PATH)"
if [ -n "$out" ]; then
  { echo "$header"; echo "|---|---|---|---|---|---|---|---|---|---|---|---|"; printf '%s\n' "${rows[@]}"; } >"$out"
fi
