#!/usr/bin/env bash
# Cross-region fan-out, one command (needs root): brings up the emulated WAN
# (tools/wan/wan.sh) per configuration, runs tern (chain, relay-only
# dissemination, full) and the baselines (a) full-checkpoint star over HTTP
# and (d) store-pull of XOR+zstd deltas (nginx serving, curl fetching) on
# the same testbed and versions, then tern_sim on the same configurations,
# and prints a table (markdown; --out DIR also writes results.json and
# results.md). Exit status 1 when a member or island does not hold or serve
# a version bit for bit. Every testbed is torn down.
#
#   bench/fanout/run.sh [--shapes "chain relay"] [--members "8 16 32"] [--rtt-scales "1"] [--rate-scale 1]
#       [--params 20M] [--lr 2e-7] [--versions 4] [--fp8 fp8-e4m3-block128] [--baselines "a c d"]
#       [--gap-s 2] [--no-tls] [--out DIR] [--tern PATH] [--agent PATH] [--fwd PATH] [--sim PATH]
#   bench/fanout/run.sh --help      (every flag, from bench/fanout/fanout.py)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
args=() tern="" agent="" fwd="" sim="" relay_blob=""
while (($#)); do
  case $1 in
    --tern) tern=$2; shift 2 ;; --agent) agent=$2; shift 2 ;;
    --fwd) fwd=$2; shift 2 ;; --sim) sim=$2; shift 2 ;; --relay-blob) relay_blob=$2; shift 2 ;;
    -h | --help) exec python3 "$here/bench/fanout/fanout.py" --help --tern - --agent - --fwd - ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "run.sh: needs root (the WAN testbed uses network namespaces and a TUN device); run it with sudo" >&2
  exit 1
fi
for t in nginx curl zstd ip; do
  command -v "$t" >/dev/null || { echo "run.sh: $t missing: run scripts/install-deps.sh" >&2; exit 1; }
done
# The binaries: build/release first, then any other build, a sanitizer's
# (build/asan, build/tsan, build/fuzz: several times slower, which skews
# every time measured) only when no other has it, and said so.
for b in tern:tools/tern agent:tools/tern-agent fwd:tools/wan/tern-wan-fwd sim:bench/sim/tern_sim \
  relay_blob:bench/tern_relay_blob; do
  var=${b%%:*}
  [ -n "${!var}" ] && continue
  sanitized=""
  for f in "$here"/build/release/"${b#*:}" "$here"/build*/"${b#*:}" "$here"/build/*/"${b#*:}"; do
    [ -x "$f" ] || continue
    case $f in
      "$here"/build/asan/* | "$here"/build/tsan/* | "$here"/build/fuzz/*) : "${sanitized:=$f}" ;;
      *) printf -v "$var" %s "$f"; break ;;
    esac
  done
  if [ -z "${!var}" ] && [ -n "$sanitized" ]; then
    echo "run.sh: only a sanitizer build has ${b#*:} ($sanitized): times will be slow; build/release is better" >&2
    printf -v "$var" %s "$sanitized"
  fi
  [ -n "${!var}" ] || [ "$var" = sim ] || [ "$var" = relay_blob ] ||
    { echo "run.sh: ${b#*:} not found: build it or pass --$var" >&2; exit 1; }
done
[ -n "$sim" ] || echo "run.sh: no tern_sim built: no simulated column" >&2
exec python3 "$here/bench/fanout/fanout.py" --tern "$tern" --agent "$agent" --fwd "$fwd" --sim "$sim" \
  --relay-blob "$relay_blob" "${args[@]}"
