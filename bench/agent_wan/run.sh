#!/usr/bin/env bash
# The transfer agent on the emulated WAN (tools/wan/wan.sh; needs root):
# brings a testbed up from CONFIG, runs `tern-agent --root` in its first host
# and a member in every other host (mutual TLS with a throwaway CA, or
# --no-tls), publishes a datagen trace version by version with `tern
# publish`, and prints per version the patch bytes, the publish time, when
# the first and the last member served it, the physical bound and the ratio
# to it, and whether every member's DIR/current is bit for bit the published
# checkpoint (bench/agent_wan/driver.py says how each figure is measured).
# Exit status 1 when a member is wrong or late (--deadline-s per version).
# The testbed is always torn down.
#
#   bench/agent_wan/run.sh [--config FILE] [--params 20M] [--steps 6] [--lr 1e-6]
#        [--deadline-s 120] [--poll-ms 20] [--gap-s 4] [--no-tls] [--agent-args "FLAGS"]
#        [--slow-start-after-idle 0|1] [--tern PATH] [--agent PATH] [--fwd PATH] [--work-root DIR] [--keep]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
WAN=$here/tools/wan/wan.sh
config=$here/bench/agent_wan/wan.conf
tern="" agent="" work_root=/var/tmp keep=0 ssai=""
driver_args=()
while (($#)); do
  case $1 in
    --config) config=$2; shift 2 ;;
    --params | --steps | --lr | --deadline-s | --poll-ms | --agent-args | --gap-s) driver_args+=("$1" "$2"); shift 2 ;;
    --no-tls) driver_args+=("$1"); shift ;;
    --tern) tern=$2; shift 2 ;; --agent) agent=$2; shift 2 ;;
    --fwd) export TERN_WAN_FWD=$2; shift 2 ;;
    --work-root) work_root=$2; shift 2 ;; --keep) keep=1; shift ;;
    --slow-start-after-idle) [[ $2 =~ ^[01]$ ]] || { echo "run.sh: --slow-start-after-idle 0|1" >&2; exit 2; }
      ssai=$2; shift 2 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "run.sh: needs root (the WAN testbed uses network namespaces and a TUN device); run it with sudo" >&2
  exit 1
fi
for b in tern:tools/tern agent:tools/tern-agent; do
  var=${b%%:*}
  [ -n "${!var}" ] && continue
  for f in "$here"/build*/"${b#*:}" "$here"/build/*/"${b#*:}"; do [ -x "$f" ] && { printf -v "$var" %s "$f"; break; }; done
  [ -n "${!var}" ] || { echo "run.sh: ${b#*:} not found: build it or pass --$var" >&2; exit 1; }
done

work=$(mktemp -d "$work_root/tern-agent-wan.XXXXXX")
prefix=""
cleanup() {
  [ -n "$prefix" ] && "$WAN" down "$prefix" >/dev/null 2>&1
  if ((keep)); then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

prefix=$("$WAN" up "$config")
root_host=$(awk 'NR == 1 {print $1}' "/run/tern-wan/$prefix/hosts")
echo "testbed $prefix up ($(wc -l <"/run/tern-wan/$prefix/hosts") hosts; $(basename "$config")); load $(cut -d' ' -f1-3 /proc/loadavg)"
# Per namespace; the kernel's default (1) unless --slow-start-after-idle.
if [ -n "$ssai" ]; then
  for h in $(awk '{print $1}' "/run/tern-wan/$prefix/hosts"); do
    "$WAN" exec "$prefix" "$h" sysctl -qw net.ipv4.tcp_slow_start_after_idle="$ssai"
  done
fi
echo "tcp_slow_start_after_idle in $root_host: $("$WAN" exec "$prefix" "$root_host" sysctl -n net.ipv4.tcp_slow_start_after_idle)"
rc=0
"$WAN" exec "$prefix" "$root_host" python3 "$here/bench/agent_wan/driver.py" \
  --hosts "/run/tern-wan/$prefix/hosts" --config "$config" --tern "$tern" --agent "$agent" \
  --work "$work" "${driver_args[@]}" || rc=$?
"$WAN" stats "$prefix" | grep -E '^link' || true
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
