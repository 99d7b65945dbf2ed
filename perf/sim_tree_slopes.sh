#!/usr/bin/env bash
# The double tree's bandwidth in braid-sim (docs/simulator.md, "The double tree at the single
# tree's speed"): the slope per KB of a large tree all-reduce, reduce and broadcast, one rank a
# node on the calibrated 1 Gbit/s links, from the difference between a 16 MiB and a 32 MiB call;
# and the all-reduce's slope at 16 ranks with wider executor windows. Run by perf/sim_tables.sh.
#
# Usage: perf/sim_tree_slopes.sh BUILD    (prints the table)
set -euo pipefail
sim=${1:?usage: perf/sim_tree_slopes.sh BUILD}/bin/braid-sim
CALIBRATED=${CALIBRATED:-"nic_gbps=0.952 net_lat_us=4 msg_us=4 intra_msg_us=3"}
lo=$((16 << 20)) hi=$((32 << 20))

# us of one call: ranks, collective, extra figures
us() {
  # shellcheck disable=SC2086 # the figures are words
  "$sim" --ranks "$1" --per-node 1 --coll "$2" --bytes "$3" --algo Tree --csv $CALIBRATED \
    "${@:4}" | awk -F, '$5 == "Tree" { print $6 }'
}
slope() { # us per KB between the two sizes
  awk -v a="$(us "$1" "$2" "$lo" "${@:3}")" -v b="$(us "$1" "$2" "$hi" "${@:3}")" \
    -v kb=$(((hi - lo) / 1024)) 'BEGIN { printf "%.1f", (b - a) / kb }'
}

line=$(awk 'BEGIN { printf "%.1f", 8192 / 952 }')
echo "# tree slope, us per KB of the buffer (16 -> 32 MiB), one rank a node; a NIC's line: $line us/KB"
printf "# %6s %10s %10s %10s\n" ranks AllReduce Reduce Broadcast
for n in 4 8 16 64 1024; do
  printf "  %6d %10s %10s %10s\n" "$n" "$(slope "$n" AllReduce)" "$(slope "$n" Reduce)" \
    "$(slope "$n" Broadcast)"
done
echo "# AllReduce at 16 ranks by executor window (steps in flight)"
for w in 16 64 256; do
  printf "  window %4d %10s\n" "$w" "$(slope 16 AllReduce "window=$w")"
done
