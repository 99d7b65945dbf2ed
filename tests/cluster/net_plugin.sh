#!/usr/bin/env bash
# The net plugin transport with a real plugin nobody here wrote: aws-ofi-nccl over libfabric's
# tcp provider (scripts/build-ofi-plugin.sh PREFIX builds both), on hosts emulated with
# network namespaces (scripts/cluster.sh), ranks launched by Open MPI's mpirun.
#
#   tests/cluster/net_plugin.sh BUILD [PREFIX [ROUNDS [RATE]]]
#
# PREFIX defaults to BRAID_OFI_PREFIX; with neither, it is skipped (make test runs every
# tests/cluster script with BUILD alone, and a fresh clone has no plugin: this is opt-in).
# 1. Every perf tool with its results checked (-c 1), 8 B to 4 MiB, on 2x4 and 4x1 hosts x
#    ranks, through the plugin (NCCL_NET=Libfabric); each rank's log must say its peers on
#    other hosts went "via NET/Plugin".
# 2. all_reduce_perf at 64 MiB on 2x4 and 4x1 with every host link shaped to RATE (default 1gbit):
#    the plugin and Braid's own TCP transport (NCCL_NET=Socket) alternating, ROUNDS rounds
#    (default 5), every round's bus bandwidth printed, then the ratio of the medians; then the
#    same on 2x1 unshaped, where the CPU and not the network is the limit.
# Skipped with one line where not root, without mpirun or without the plugin under PREFIX.
# The plugin wants a CUDA runtime at init: BUILD/tests/fakecudart/libcudart.so stands in.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cluster=$top/scripts/cluster.sh
build=$(cd "${1:?usage: $0 BUILD [PREFIX [ROUNDS [RATE]]]}" && pwd)
prefix=${2:-${BRAID_OFI_PREFIX:-}}
rounds=${3:-5}
rate=${4:-1gbit}
plugin=$prefix/lib/libnccl-net-ofi.so

skip() {
  echo "net plugin tests: skipped ($*)"
  exit 0
}
[ -n "$prefix" ] || skip "no plugin named: PREFIX or BRAID_OFI_PREFIX (scripts/build-ofi-plugin.sh)"
[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
command -v mpirun >/dev/null 2>&1 || skip "no mpirun (Open MPI)"
[ -f "$plugin" ] || skip "no $plugin (scripts/build-ofi-plugin.sh $prefix)"
[ -f "$build/tests/fakecudart/libcudart.so" ] || skip "no $build/tests/fakecudart (make tests)"

for v in $(compgen -e | grep -E '^(NCCL_|BRAID_|FI_|OFI_)'); do unset "$v"; done
export BRAID_CLUSTER=bp BRAID_CLUSTER_SUBNET=198.18.2 PMIX_MCA_psec=${PMIX_MCA_psec:-native}
why=$("$cluster" check 2>&1) || skip "${why#cluster: }"
tmp=$(mktemp -d /tmp/braid-net-plugin.XXXXXX)
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$tmp"' EXIT
mapfile -t MPIARGS < <("$cluster" mpirun-args)
PLUGIN_ENV=(-x "LD_LIBRARY_PATH=$build/tests/fakecudart" -x "NCCL_NET_PLUGIN=$plugin"
  -x NCCL_NET=Libfabric -x FI_PROVIDER=tcp -x OFI_NCCL_PROTOCOL=SENDRECV)
fails=0

hosts_of() { # nhosts ppn -> "h0:ppn,h1:ppn,..."
  local s="" i
  for ((i = 0; i < $1; i++)); do s+="${s:+,}h$i:$2"; done
  echo "$s"
}

# One mpirun of a perf tool; its logs in $tmp/log.*.
run_tool() { # nhosts ppn tool args... (env in RUN_ENV)
  local nh=$1 ppn=$2 tool=$3
  shift 3
  rm -f "$tmp"/log.*
  timeout 300 mpirun "${MPIARGS[@]}" -np $((nh * ppn)) -host "$(hosts_of "$nh" "$ppn")" \
    -x BRAID_TIMEOUT_MS=30000 -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET \
    -x "NCCL_DEBUG_FILE=$tmp/log.%h.%p" "${RUN_ENV[@]}" "$build/bin/${tool}_perf" "$@"
}

correctness() { # nhosts ppn
  local nh=$1 ppn=$2 t out
  "$cluster" up "$nh" >/dev/null || { echo "FAILED: cluster up $nh"; fails=$((fails + 1)); return; }
  RUN_ENV=("${PLUGIN_ENV[@]}")
  for t in all_reduce all_gather broadcast reduce reduce_scatter sendrecv alltoall; do
    local rc=0
    out=$(run_tool "$nh" "$ppn" "$t" -b 8 -e 4M -f 8 -c 1 -n 3 -w 1 2>&1) || rc=$?
    if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
      echo "FAILED: ${nh}x$ppn $t"; tail -5 <<<"$out"; fails=$((fails + 1)); continue
    fi
    if ! grep -qh "via NET/Plugin" "$tmp"/log.*; then
      echo "FAILED: ${nh}x$ppn $t: no rank's peer went via NET/Plugin"; fails=$((fails + 1)); continue
    fi
    echo "ok: ${nh}x$ppn $t through the plugin, results checked"
  done
  "$cluster" down >/dev/null
}

busbw_64m() { # nranks: the out-of-place bus bandwidth of the 64 MiB line, from its time
  awk -v n="$1" '$1 == 67108864 { printf "%.4f\n", 2 * (n - 1) / n * $1 / $6 / 1000 }'
}

bandwidth() { # nhosts ppn rate ("unshaped": veth as it is, the CPU the limit)
  local nh=$1 ppn=$2 r=$3 i net out bw plugin_bw=() socket_bw=() up=("$1")
  [ "$r" = unshaped ] || up+=("$r")
  "$cluster" up "${up[@]}" >/dev/null || { echo "FAILED: cluster up $nh $r"; fails=$((fails + 1)); return; }
  for ((i = 1; i <= rounds; i++)); do
    for net in plugin socket; do
      if [ $net = plugin ]; then RUN_ENV=("${PLUGIN_ENV[@]}"); else RUN_ENV=(-x NCCL_NET=Socket); fi
      out=$(run_tool "$nh" "$ppn" all_reduce -b 64M -e 64M -n 5 -w 2 -c 0 2>&1)
      bw=$(busbw_64m $((nh * ppn)) <<<"$out")
      [ -n "$bw" ] || { echo "FAILED: $net round $i"; tail -5 <<<"$out"; fails=$((fails + 1)); continue; }
      echo "round $i: $net busbw $bw GB/s (${nh}x$ppn, $r links, 64 MiB all-reduce)"
      if [ $net = plugin ]; then plugin_bw+=("$bw"); else socket_bw+=("$bw"); fi
    done
  done
  "$cluster" down >/dev/null
  echo -n "${nh}x$ppn $r: "
  python3 - "${plugin_bw[*]}" "${socket_bw[*]}" <<'EOF'
import statistics, sys
p = [float(x) for x in sys.argv[1].split()]
s = [float(x) for x in sys.argv[2].split()]
if p and s:
    mp, ms = statistics.median(p), statistics.median(s)
    print("medians: plugin %.4f GB/s, Braid's TCP %.4f GB/s: plugin/TCP %.3f" % (mp, ms, mp / ms))
EOF
}

correctness 2 4
correctness 4 1
bandwidth 2 4 "$rate"
bandwidth 4 1 "$rate"
bandwidth 2 1 unshaped
[ $fails -eq 0 ] && echo "net plugin tests: ok" || echo "net plugin tests: $fails FAILED"
[ $fails -eq 0 ]
