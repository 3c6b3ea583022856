#!/usr/bin/env bash
# Publish latency on the root, one command (docs/benchmarks.md, "Publish
# latency"): datagen traces (BF16, ~1.5-2% changed per version), a root and
# one member on loopback, V publishes per build, the root's stage spans,
# `tern diff` of the same versions alone, and offered / diff-alone. No root
# privileges, no namespaces: the latency measured is the root's, before any
# byte moves.
#
#   bench/publish_latency/run.sh [--agent LABEL=PATH ...] [--params 20M,300M]
#       [--versions 6] [--rounds 2] [--json FILE] [--tern PATH]
#
# Without --agent: this tree's build/*/tools/tern-agent. Several --agent
# builds (e.g. before=... after=...) alternate round by round in one run.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
args=() tern="" agents=0
while (($#)); do
  case $1 in
    --tern) tern=$2; shift 2 ;;
    --agent) agents=1; args+=("$1" "$2"); shift 2 ;;
    -h | --help) exec python3 "$here/bench/publish_latency/measure.py" --help ;;
    *) args+=("$1"); shift ;;
  esac
done
find_bin() {
  for f in "$here"/build*/"$1" "$here"/build/*/"$1"; do [ -x "$f" ] && { echo "$f"; return; }; done
  echo "run.sh: $1 not found: build it or pass its path" >&2
  exit 1
}
[ -n "$tern" ] || tern=$(find_bin tools/tern)
((agents)) || args+=(--agent "this=$(find_bin tools/tern-agent)")
exec python3 "$here/bench/publish_latency/measure.py" --tern "$tern" "${args[@]}"
