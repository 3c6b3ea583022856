#!/usr/bin/env bash
# wan.sh: an emulated multi-region WAN on one machine (needs root).
#
#   wan.sh up CONFIG [--prefix P] [--fwd PATH] [--cc bbr|cubic]   prints P
#   wan.sh run CONFIG [--prefix P] [--fwd PATH] [--cc ..] -- CMD...  up, CMD, down
#   wan.sh down P | --all          idempotent; --all removes every tw-* testbed
#   wan.sh exec P HOST CMD...      run CMD in host HOST (e.g. us-1)
#   wan.sh ip P HOST               the host's address
#   wan.sh hosts P                 "HOST NAMESPACE ADDRESS" lines
#   wan.sh stats P                 the forwarder's per-link counters
#   wan.sh list                    testbeds on this machine
#
# Each host is a network namespace P-REGION-I with one veth to the router
# namespace P-rt. The router sends every packet between hosts through a TUN
# device to tern-wan-fwd, which applies each region pair's delay, rate and
# loss (this kernel has no netem). Host REGION-I of the Rth region is
# 10.R.I.2. Nothing is created in the caller's namespace. docs/wan.md has the
# config format and the measured accuracy. TERN_WAN_SYSCTL: more
# "key=value" sysctls set in every host namespace (an experiment's knob, e.g.
# net.ipv4.tcp_slow_start_after_idle=0).
set -euo pipefail

STATE_ROOT=/run/tern-wan
die() { echo "wan.sh: $*" >&2; exit 1; }

find_fwd() {
  local here; here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  if [ -n "${TERN_WAN_FWD:-}" ]; then
    [ -x "$TERN_WAN_FWD" ] || die "TERN_WAN_FWD=$TERN_WAN_FWD is not an executable"
    echo "$TERN_WAN_FWD"; return
  fi
  for f in "$here"/build*/tools/wan/tern-wan-fwd "$here"/build/*/tools/wan/tern-wan-fwd; do
    [ -n "$f" ] && [ -x "$f" ] && { echo "$f"; return; }
  done
  die "tern-wan-fwd not found: build it or pass --fwd / set TERN_WAN_FWD"
}

# Parses CONFIG into REGIONS (names), HOSTS (per-region counts), LINKS
# ("r1 r2 delay rate loss queue corrupt"), MTU, CC, SEED; rejects anything unknown.
parse_config() {
  local file=$1 line kw n=0
  REGIONS=(); HOSTS=(); LINKS=(); MTU=1500; CC=bbr; SEED=1; OFFLOAD=on
  [ -r "$file" ] || die "cannot read config $file"
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%%#*}
    read -r -a w <<<"$line" || true
    [ ${#w[@]} -eq 0 ] && continue
    kw=${w[0]}
    case $kw in
      mtu) [[ ${w[1]:-} =~ ^[0-9]+$ ]] && ((w[1] >= 576 && w[1] <= 65000)) || die "$file:$n: mtu 576..65000"; MTU=${w[1]} ;;
      cc) [[ ${w[1]:-} =~ ^(bbr|cubic|reno)$ ]] || die "$file:$n: cc bbr|cubic|reno"; CC=${w[1]} ;;
      seed) [[ ${w[1]:-} =~ ^[0-9]+$ ]] || die "$file:$n: seed is an integer"; SEED=${w[1]} ;;
      offload) [[ ${w[1]:-} =~ ^(on|off)$ ]] || die "$file:$n: offload on|off"; OFFLOAD=${w[1]} ;;
      region)
        [[ ${w[1]:-} =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "$file:$n: region name: a-z0-9, at most 8"
        [[ ${w[2]:-} =~ ^hosts=([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= 250)) ||
          die "$file:$n: want 'region NAME hosts=N' (1..250)"
        region_index "${w[1]}" >/dev/null 2>&1 && die "$file:$n: region ${w[1]} twice"
        ((${#REGIONS[@]} < 250)) || die "$file:$n: at most 250 regions"
        REGIONS+=("${w[1]}"); HOSTS+=("${BASH_REMATCH[1]}") ;;
      link)
        local a b d=0 r=0 l=0 q=0 c=0 kv
        a=$(region_index "${w[1]:-}") || die "$file:$n: unknown region '${w[1]:-}'"
        b=$(region_index "${w[2]:-}") || die "$file:$n: unknown region '${w[2]:-}'"
        for kv in "${w[@]:3}"; do
          [[ $kv =~ ^(delay_ms|rate_mbit|loss_pct|queue_kb|corrupt_pct)=([0-9]+(\.[0-9]+)?)$ ]] ||
            die "$file:$n: bad '$kv' (delay_ms= rate_mbit= loss_pct= queue_kb= corrupt_pct=)"
          case ${BASH_REMATCH[1]} in
            delay_ms) d=${BASH_REMATCH[2]} ;; rate_mbit) r=${BASH_REMATCH[2]} ;;
            loss_pct) l=${BASH_REMATCH[2]} ;; queue_kb) q=${BASH_REMATCH[2]} ;;
            corrupt_pct) c=${BASH_REMATCH[2]} ;;
          esac
        done
        LINKS+=("$a $b $d $r $l $q $c") ;;
      *) die "$file:$n: unknown keyword '$kw' (mtu, cc, seed, offload, region, link)" ;;
    esac
  done <"$file"
  ((${#REGIONS[@]} >= 1)) || die "$file: no regions"
}

region_index() {
  local i
  for i in "${!REGIONS[@]}"; do [ "${REGIONS[$i]}" = "$1" ] && { echo $((i + 1)); return 0; }; done
  return 1
}

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

cmd_up() {
  local config="" prefix="" fwd="" cc=""
  while (($#)); do
    case $1 in
      --prefix) prefix=$2; shift 2 ;; --fwd) fwd=$2; shift 2 ;; --cc) cc=$2; shift 2 ;;
      -*) die "up: unknown flag $1" ;; *) config=$1; shift ;;
    esac
  done
  [ -n "$config" ] || die "up: CONFIG missing"
  [ "$(id -u)" -eq 0 ] || die "up: needs root (network namespaces, TUN)"
  parse_config "$config"
  [ -n "$cc" ] && CC=$cc
  [ -n "$prefix" ] || prefix=tw-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
  [[ $prefix =~ ^tw-[a-z0-9]{1,12}$ ]] || die "prefix must look like tw-[a-z0-9]{1,12}"
  [ -n "$fwd" ] || fwd=$(find_fwd)
  [ -x "$fwd" ] || die "forwarder $fwd is not an executable"
  local state=$STATE_ROOT/$prefix
  [ -e "$state" ] && die "testbed $prefix exists (wan.sh down $prefix)"
  mkdir -p "$state"
  cp "$config" "$state/config"
  # A namespace may only default to congestion controls the host allows.
  if [ "$CC" != "$(sysctl -n net.ipv4.tcp_congestion_control)" ] &&
     ! grep -qw "$CC" /proc/sys/net/ipv4/tcp_allowed_congestion_control; then
    rm -rf "$state"
    die "cc $CC: not in net.ipv4.tcp_allowed_congestion_control ($(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)); add it there first"
  fi
  # From here on a failure or a signal removes whatever was built.
  trap "cmd_down $prefix >/dev/null 2>&1" EXIT
  trap "exit 1" INT TERM

  local rt=$prefix-rt
  ip netns add "$rt"
  nsx "$rt" sh -c 'sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
    net.ipv4.conf.default.rp_filter=0 net.ipv6.conf.all.disable_ipv6=1 \
    net.ipv6.conf.default.disable_ipv6=1 && ip link set lo up'
  ip -n "$rt" tuntap add dev tw0 mode tun
  ip -n "$rt" link set tw0 mtu "$MTU" txqueuelen 10000 up
  nsx "$rt" sysctl -qw net.ipv4.conf.tw0.rp_filter=0
  # Packets that come back from the forwarder take the main table (direct
  # routes to hosts); all others go to the forwarder.
  ip -n "$rt" rule add pref 100 iif tw0 lookup main
  ip -n "$rt" rule add pref 200 lookup 100
  ip -n "$rt" route add default dev tw0 table 100

  local r i name ns addr
  : >"$state/hosts"
  for r in "${!REGIONS[@]}"; do
    for ((i = 1; i <= HOSTS[r]; i++)); do
      name=${REGIONS[$r]}-$i; ns=$prefix-$name; addr=10.$((r + 1)).$i.2
      ip netns add "$ns"
      ip link add "h$((r + 1))x$i" netns "$rt" type veth peer name eth0 netns "$ns"
      ip -n "$rt" addr add "10.$((r + 1)).$i.1/24" dev "h$((r + 1))x$i"
      ip -n "$rt" link set "h$((r + 1))x$i" mtu "$MTU" up
      nsx "$ns" sh -c "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
        net.ipv4.tcp_congestion_control=$CC net.ipv4.tcp_no_metrics_save=1 \
        net.ipv4.tcp_rmem='4096 131072 67108864' net.ipv4.tcp_wmem='4096 16384 67108864' ${TERN_WAN_SYSCTL:-}"
      ip -n "$ns" link set lo up
      ip -n "$ns" addr add "$addr/24" dev eth0
      ip -n "$ns" link set eth0 mtu "$MTU" up
      # GRO, as on a real NIC: the receiver handles merged segments.
      nsx "$ns" ethtool -K eth0 gro on >/dev/null 2>&1 || true
      ip -n "$ns" route add default via "10.$((r + 1)).$i.1"
      echo "$name $ns $addr" >>"$state/hosts"
    done
  done

  local specs=() a b d rate l q c
  for spec in "${LINKS[@]}"; do
    read -r a b d rate l q c <<<"$spec"
    specs+=("$a,$b,$d,$rate,$l,$q,$c")
    [ "$a" != "$b" ] && specs+=("$b,$a,$d,$rate,$l,$q,$c")
  done
  # Higher priority: on a busy machine a late wake-up is added to every delay.
  : >"$state/fwd.log"
  ip netns exec "$rt" nice -n -10 "$fwd" --tun tw0 --seed "$SEED" \
    $([ "$OFFLOAD" = off ] && echo --no_offload) -- "${specs[@]}" \
    >"$state/fwd.log" 2>&1 </dev/null &
  echo $! >"$state/fwd.pid"
  local t
  for ((t = 0; t < 50; t++)); do
    grep -q "forwarding on" "$state/fwd.log" && break
    kill -0 "$(cat "$state/fwd.pid")" 2>/dev/null || { cat "$state/fwd.log" >&2; false; }
    sleep 0.1
  done
  grep -q "forwarding on" "$state/fwd.log" || { cat "$state/fwd.log" >&2; false; }
  trap - EXIT INT TERM
  echo "$prefix"
}

# Stops the forwarder and every process left in the testbed's namespaces,
# then deletes them. Safe to repeat and on half-built testbeds.
cmd_down() {
  local prefix=$1 ns pid pids t
  [[ $prefix =~ ^tw-[a-z0-9]{1,12}$ ]] || die "down: bad prefix '$prefix'"
  local state=$STATE_ROOT/$prefix
  if [ -f "$state/fwd.pid" ]; then
    pid=$(cat "$state/fwd.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for ((t = 0; t < 20; t++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
    for ((t = 0; t < 20; t++)); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.1
    done
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$state"
}

cmd_list() {
  { ls "$STATE_ROOT" 2>/dev/null || true
    ip netns list | awk '{print $1}' | grep -oE '^tw-[a-z0-9]{1,12}' || true; } | sort -u
}

host_field() {  # host_field PREFIX HOST FIELD(2=ns,3=addr)
  local f=$STATE_ROOT/$1/hosts
  [ -r "$f" ] || die "no testbed $1"
  awk -v h="$2" -v k="$3" '$1 == h {print $k; found=1} END {exit !found}' "$f" ||
    die "no host $2 in $1 (have: $(awk '{printf "%s ", $1}' "$f"))"
}

cmd_run() {
  local args=()
  while (($#)) && [ "$1" != "--" ]; do args+=("$1"); shift; done
  (($#)) || die "run: want CONFIG ... -- CMD"
  shift
  local prefix
  prefix=$(cmd_up "${args[@]}")
  trap "cmd_down $prefix" EXIT
  trap "exit 130" INT TERM
  WAN_PREFIX=$prefix "$@"
}

main() {
  local sub=${1:-}; shift || true
  case $sub in
    up) cmd_up "$@" ;;
    run) cmd_run "$@" ;;
    down)
      [ "${1:-}" = "--all" ] && { for p in $(cmd_list); do cmd_down "$p"; done; return; }
      cmd_down "${1:?down: PREFIX or --all}" ;;
    exec) local ns; ns=$(host_field "${1:?}" "${2:?}" 2); shift 2; exec ip netns exec "$ns" "$@" ;;
    ip) host_field "${1:?}" "${2:?}" 3 ;;
    hosts) cat "$STATE_ROOT/${1:?}/hosts" ;;
    stats)
      local state=$STATE_ROOT/${1:?}
      [ -f "$state/fwd.pid" ] || die "no testbed ${1}"
      kill -USR1 "$(cat "$state/fwd.pid")" && sleep 0.2
      awk '/^stats$/ {n = 0; delete a; next} {a[n++] = $0} END {for (i = 0; i < n; i++) print a[i]}' "$state/fwd.log" ;;
    list) cmd_list ;;
    *) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; [ -z "$sub" ] || [ "$sub" = help ] || exit 2 ;;
  esac
}
main "$@"
