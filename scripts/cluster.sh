#!/usr/bin/env bash
# An emulated cluster on one machine: N hosts as network namespaces on a Linux bridge, each with its
# own hostname, optionally with every host link shaped by tbf in both directions.
#
#   scripts/cluster.sh up N [RATE]     hosts h0..h(N-1) at 198.18.0.1..N, bridge at 198.18.0.254;
#                                      RATE (e.g. 2gbit) shapes each host's link both ways
#   scripts/cluster.sh down            removes every namespace, link and qdisc it made
#   scripts/cluster.sh shape RATE|off  reshapes (or unshapes) the links of the running cluster
#   scripts/cluster.sh link HOST up|down   takes one host's link down or back up (fault tests)
#   scripts/cluster.sh kill            ends every process running inside the hosts
#   scripts/cluster.sh exec HOST CMD...    runs CMD inside HOST (its netns and its hostname)
#   scripts/cluster.sh agent HOST CMD...   the same, as mpirun's rsh agent calls it:
#                                      mpirun --mca plm_rsh_agent "scripts/cluster.sh agent" ...
#   scripts/cluster.sh hosts           prints the host names, one per line
#   scripts/cluster.sh mpirun-args     prints the mpirun options that launch through the agent
#   scripts/cluster.sh check           exits 0 when this machine can run a cluster (root, netns)
#
# Names: BRAID_CLUSTER (default "braid") prefixes the namespaces (braid-h0...) and the bridge
# (braid-br); BRAID_CLUSTER_SUBNET (default 198.18.0) is the /24 it uses. Two clusters with
# different prefixes and subnets can coexist (tests run beside a benchmark). The hosts have no default
# route: their traffic stays on the bridge, and nothing is sent to any other address.
#
# A host is entered with `ip netns exec` (network namespace) and `unshare --uts` (its own
# hostname h0, h1, ...), so Braid and Open MPI see distinct hosts exactly as on real machines.
set -euo pipefail

PREFIX=${BRAID_CLUSTER:-braid}
BRIDGE=$PREFIX-br
SUBNET=${BRAID_CLUSTER_SUBNET:-198.18.0}
BRIDGE_ADDR=$SUBNET.254
MAX_HOSTS=64
# tbf: the bucket must hold a full 64 KiB GSO segment with room to spare; 50 ms of queue is what
# a switch port buffers, and keeps TCP from seeing drops at line rate.
TBF_BURST=256kb
TBF_LATENCY=50ms

die() {
  echo "cluster: $*" >&2
  exit 1
}

ns_of() { echo "$PREFIX-$1"; }  # host name -> namespace
veth_of() { echo "$PREFIX-$1"; } # host name -> root-side veth (interface names are <= 15 chars)

hosts() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | sed -n "s/^$PREFIX-\(h[0-9]*\)$/\1/p" | sort -V
}

check() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
  command -v ip >/dev/null || die "needs iproute2 (ip)"
  command -v unshare >/dev/null || die "needs util-linux (unshare)"
  local probe=$PREFIX-probe$$
  ip netns add "$probe" 2>/dev/null || die "cannot create network namespaces (ip netns add)"
  ip netns del "$probe"
}

# shape_link HOST RATE|off: tbf on both ends of the host's veth; each end shapes its egress, so
# the root end limits what reaches the host and the host end what leaves it.
shape_link() {
  local host=$1 rate=$2 ns veth
  ns=$(ns_of "$host")
  veth=$(veth_of "$host")
  tc qdisc del dev "$veth" root 2>/dev/null || true
  ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  [ "$rate" = off ] && return 0
  tc qdisc add dev "$veth" root tbf rate "$rate" burst $TBF_BURST latency $TBF_LATENCY
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst $TBF_BURST latency $TBF_LATENCY
}

add_host() {
  local i=$1 rate=$2 host=h$1 ns veth
  ns=$(ns_of "$host")
  veth=$(veth_of "$host")
  ip netns add "$ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" master "$BRIDGE" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "$SUBNET.$((i + 1))/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  shape_link "$host" "$rate"
}

up() {
  local n=${1:-} rate=${2:-off}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_HOSTS ] ||
    die "up N [RATE]: N must be 1..$MAX_HOSTS, got '${n}'"
  check
  [ -z "$(hosts)" ] || die "a cluster '$PREFIX' is already up ($(hosts | tr '\n' ' ')); run down first"
  trap 'echo "cluster: up failed, tearing down" >&2; down' ERR
  ip link add "$BRIDGE" type bridge
  # Bridged frames skip iptables, so a host firewall's FORWARD policy cannot drop cluster traffic.
  ip link set "$BRIDGE" type bridge nf_call_iptables 0 nf_call_ip6tables 0 2>/dev/null || true
  ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq 0 $((n - 1))); do add_host "$i" "$rate"; done
  trap - ERR
  echo "cluster: $n hosts up ($(hosts | tr '\n' ' ')), links ${rate/off/unshaped}, bridge $BRIDGE_ADDR"
}

# Ends every process inside the cluster's hosts (what a failed or timed-out run left).
kill_all() {
  local h
  for h in $(hosts); do
    ip netns pids "$(ns_of "$h")" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  return 0
}

down() {
  local h
  kill_all
  for h in $(hosts); do
    ip link del "$(veth_of "$h")" 2>/dev/null || true
    ip netns del "$(ns_of "$h")" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "/tmp/braid-cluster.$PREFIX"
  return 0
}

need_host() {
  local host=${1:-}
  [ -n "$host" ] && ip netns list | awk '{ print $1 }' | grep -qx "$(ns_of "$host")" ||
    die "no host '$host' in cluster '$PREFIX' (up: $(hosts | tr '\n' ' '))"
}

# run_in HOST CMD...: CMD as one shell command line (mpirun's agent passes it as words to be
# joined, like ssh does), inside the host's network and UTS namespaces.
run_in() {
  local host=$1
  shift
  need_host "$host"
  BRAID_CLUSTER_CMD="$*" exec ip netns exec "$(ns_of "$host")" unshare --uts -- \
    sh -c 'hostname "$0" && c=$BRAID_CLUSTER_CMD && unset BRAID_CLUSTER_CMD && eval "$c"' "$host"
}

link() {
  local host=${1:-} state=${2:-}
  need_host "$host"
  [ "$state" = up ] || [ "$state" = down ] || die "link HOST up|down"
  ip link set "$(veth_of "$host")" "$state"
  [ "$state" = down ] || wait_carries "$host"
}

# wait_carries HOST: a link set up again carries traffic once both ends have their carrier,
# the bridge forwards on the port and the neighbours resolve (here within 40 ms). Twice in CI
# a job started right after h1's link came back could not reach h0 from h1, cause not found:
# `link HOST up` now returns only once a TCP connect from HOST to another host is answered
# (refused: both ways work), and fails naming the link after 10 s without an answer.
wait_carries() {
  local host=$1 peer i ip out
  peer=$(hosts | grep -vx "$host" | head -n 1)
  [ -n "$peer" ] || return 0
  ip=$(ip -n "$(ns_of "$peer")" -4 -o addr show dev eth0 | awk '{ sub("/.*", "", $4); print $4 }')
  for ((i = 0; i < 50; i++)); do
    out=$(ip netns exec "$(ns_of "$host")" timeout 0.5 bash -c "exec 3<>/dev/tcp/$ip/9" 2>&1) ||
      true
    [[ "$out" == *refused* ]] && return 0
    sleep 0.2
  done
  die "link $host up: no answer from $peer ($ip) within 10 s"
}

# Open MPI names its session directory after the host: every cluster has an h0, so each
# cluster gets its own base, or two clusters launching at once trip over each other's files.
session_dir() {
  local d=/tmp/braid-cluster.$PREFIX
  mkdir -p "$d"
  echo "$d"
}

mpirun_args() {
  local self
  self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
  # The emulated hosts share this machine's cores: no binding, and MPI yields when it polls
  # (without it one rank spinning in a barrier starves the others for milliseconds).
  # The host names h0, h1, ... resolve nowhere: without if_base_do_not_resolve mpirun looks each
  # up in DNS before launching its daemons, and a lookup left unanswered stalls it for 5 s.
  local args=(--mca plm_rsh_agent "env BRAID_CLUSTER=$PREFIX $self agent" --mca routed direct
    --mca oob_tcp_if_include "$SUBNET.0/24" --mca btl_tcp_if_include "$SUBNET.0/24"
    --mca if_base_do_not_resolve 1 --bind-to none --mca mpi_yield_when_idle 1
    --mca orte_tmpdir_base "$(session_dir)")
  [ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
  printf '%s\n' "${args[@]}"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  shape)
    [ $# -eq 1 ] || die "shape RATE|off"
    for h in $(hosts); do shape_link "$h" "$1"; done
    ;;
  link) link "$@" ;;
  kill) kill_all ;;
  exec | agent) run_in "$@" ;;
  hosts) hosts ;;
  mpirun-args) mpirun_args ;;
  check) check ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2 && exit 2 ;;
esac
