#!/usr/bin/env bash
# Compares two builds of tern on the codec and the loopback transport, in one
# run, alternating A and B (A B, B A, ...) so that load changes hit both
# alike; run it on an idle machine, since a busy one swamps any difference.
# Prints the measurements side by side with B/A ratios (docs/benchmarks.md
# records them).
#
#   bench/compare_builds.sh OLD_BUILD_DIR NEW_BUILD_DIR [ROUNDS]
#
# Each BUILD_DIR is a CMake build of tern (targets: codec_report, tern).
# Sizes are modest so that it finishes in a few minutes on 2 cores:
# codec_report on 32M synthetic BF16 elements (0.1/1/5%) and a 20M-parameter
# trace; `tern xfer get` of a 256 MiB file over 127.0.0.1 with 1 and 8
# streams, plain and TLS 1.3.
set -euo pipefail
if [[ $# -lt 2 || $1 == -h || $1 == --help ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-2}
for d in "$A" "$B"; do
  for t in bench/codec_report tools/tern; do
    [[ -x $d/$t ]] || { echo "compare_builds: $d/$t is missing (build it)" >&2; exit 2; }
  done
done
work=$(mktemp -d /tmp/tern-compare.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

echo "== codec_report (synthetic 32M elements, trace 20M params), $ROUNDS rounds each, alternating"
codec_args=(--source both --elements 32M --densities 0.001,0.01,0.05 --trace-params 20M
            --trace-lrs 1.6e-7 --trace-steps 2 --reps 3 --no-xdelta)
# A B, then B A, ...: neither build always runs first.
order() { if (( $1 % 2 )); then echo A B; else echo B A; fi; }
for r in $(seq "$ROUNDS"); do
  for side in $(order "$r"); do
    dir=$A; [[ $side == B ]] && dir=$B
    "$dir/bench/codec_report" "${codec_args[@]}" > "$work/codec_${side}_$r.txt"
  done
done
# Pull the speed table rows (workload, threads, memcpy, diff, diff/memcpy,
# apply, apply/memcpy) and report the median ratio per row over the rounds.
python3 - "$work" "$ROUNDS" <<'EOF'
import re, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def tables(path):
    speed, size = {}, {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) >= 11 and re.fullmatch(r'\d+', cells[1]):
            # workload, threads, memcpy, diff, diff/memcpy, apply, apply/memcpy, excl,
            # excl/memcpy, cpu diff/memcpy, cpu apply/memcpy
            speed[(cells[0], cells[1])] = [float(cells[i]) if cells[i] != '-' else None
                                           for i in (4, 6, 8, 9, 10)]
        elif len(cells) > 3 and cells[1].endswith('%'):
            size[cells[0]] = cells[2]
    return speed, size
runs = {s: [tables(f"{work}/codec_{s}_{r}.txt") for r in range(1, rounds + 1)] for s in "AB"}
names = ["diff/memcpy", "apply/memcpy", "exclusive apply/memcpy", "cpu diff/memcpy", "cpu apply/memcpy"]
print("Median over rounds; B/A < 1 means B is faster.")
print()
print("| workload | threads | measure | A | B | B/A |")
print("|---|---|---|---|---|---|")
for key in runs["A"][0][0]:
    for i, name in enumerate(names):
        va = [r[0][key][i] for r in runs["A"] if key in r[0] and r[0][key][i] is not None]
        vb = [r[0][key][i] for r in runs["B"] if key in r[0] and r[0][key][i] is not None]
        if not va or not vb:
            continue
        a, b = statistics.median(va), statistics.median(vb)
        print(f"| {key[0]} | {key[1]} | {name} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
same = all(r[1] == runs["A"][0][1] for s in "AB" for r in runs[s])
print()
print("patch sizes (tern MB per workload) identical in every run of A and B:", same)
EOF

echo
echo "== tern xfer get, 256 MiB over 127.0.0.1 (seconds, best of $ROUNDS)"
mkdir -p "$work/root"
head -c $((256 << 20)) /dev/urandom > "$work/root/big.bin"
# Throwaway CA and certificates naming 127.0.0.1 (an IP SAN, which a client
# that checks the server's identity requires).
(
  cd "$work"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=compare-ca -keyout ca.key -out ca.pem 2>/dev/null
  for who in srv cli; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
      -keyout $who.key -out $who.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > ext.cnf
    openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile ext.cnf -out $who.pem 2>/dev/null
  done
)
port=$((40000 + RANDOM % 10000))
declare -A plain_port tls_port
for side in A B; do
  dir=$A; [[ $side == B ]] && dir=$B
  plain_port[$side]=$port; tls_port[$side]=$((port + 1)); port=$((port + 2))
  "$dir/tools/tern" xfer serve --listen 127.0.0.1:${plain_port[$side]} --no-tls "$work/root" \
    > "$work/serve_plain_$side.log" 2>&1 & pids+=($!)
  "$dir/tools/tern" xfer serve --listen 127.0.0.1:${tls_port[$side]} --tls-cert "$work/srv.pem" \
    --tls-key "$work/srv.key" --tls-ca "$work/ca.pem" "$work/root" \
    > "$work/serve_tls_$side.log" 2>&1 & pids+=($!)
done
sleep 1
declare -A best
for r in $(seq "$ROUNDS"); do
  for streams in 1 8; do
    for mode in plain tls; do
      for side in $(order "$r"); do
        dir=$A; [[ $side == B ]] && dir=$B
        rm -f "$work/out.bin"
        if [[ $mode == plain ]]; then
          args=(127.0.0.1:${plain_port[$side]} big.bin -o "$work/out.bin" --no-tls)
        else
          args=(127.0.0.1:${tls_port[$side]} big.bin -o "$work/out.bin" --tls-cert "$work/cli.pem"
                --tls-key "$work/cli.key" --tls-ca "$work/ca.pem")
        fi
        t0=$(date +%s%N)
        "$dir/tools/tern" xfer get "${args[@]}" --streams $streams --quiet --no-resume \
          > "$work/get.log" 2>&1 || { cat "$work/get.log"; exit 1; }
        t=$(( $(date +%s%N) - t0 ))  # ns
        key="$streams $mode $side"
        if [[ -z ${best[$key]:-} ]] || (( t < best[$key] )); then best[$key]=$t; fi
      done
    done
  done
done
echo "| streams | mode | A s | B s | B/A |"
echo "|---|---|---|---|---|"
for streams in 1 8; do
  for mode in plain tls; do
    a=${best["$streams $mode A"]}; b=${best["$streams $mode B"]}
    awk -v s="$streams" -v m="$mode" -v a="$a" -v b="$b" \
      'BEGIN { printf "| %s | %s | %.2f | %.2f | %.2f |\n", s, m, a / 1e9, b / 1e9, b / a }'
  done
done
