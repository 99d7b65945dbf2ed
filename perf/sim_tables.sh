#!/usr/bin/env bash
# The tables of docs/simulator.md, produced (never typed): braid-sim's grids of every algorithm
# and the tuner's pick, and the calibration against a perf/bench_cluster.sh run.
#
#   perf/sim_tables.sh BUILD [RESULTS_CSV]      writes docs/sim/*.txt and nccl-compare.md (and
#                                               calibration-1gbit.md when a bench_cluster.sh
#                                               results.csv is given)
# The calibrated cluster's figures are CALIBRATED (below): what perf/sim_calibrate.py's fit chose
# for the emulated 1 Gbit/s cluster; its link rate is iperf3's. EMULATED is what the emulation
# adds to a real cluster of those links, and only its calibration table plays it: every host is
# this 2-core machine, and TCP through veth costs the kernel's copy at each end.
set -euo pipefail
build=${1:?usage: perf/sim_tables.sh BUILD [RESULTS_CSV]}
csv=${2:-}
top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/docs/sim
sim=$build/bin/braid-sim
CALIBRATED=${CALIBRATED:-"nic_gbps=0.952 net_lat_us=4 msg_us=2.5 intra_msg_us=1.5"}
EMULATED=${EMULATED:-"host_cores=2 sock_gbps=20"}
mkdir -p "$out"
# A tuner table's closing line: how many picks are over 1.1x the best, the worst, and how many
# times (a pick, or any algorithm and size) braid-sim had no time to give ("too big").
tuner_summary() {
  awk '$1 ~ /^[0-9]+$/ {
         n++; big += gsub(/too big/, "&"); r = $NF
         if (r == "inf") { nopick++; next }
         if (r + 0 > 1.1) over++
         if (r + 0 > worst) { worst = r + 0; at = $1 " ranks, " $2 " B" }
       }
       END { printf "# tuner: %d of %d picks over 1.1x the best, the worst %.2fx (%s); " \
                    "%d picks and %d times in all too big to play\n", over, n, worst, at, nopick, big }' "$1"
}
tuner_table() { # name, then braid-sim's arguments
  local name=$1
  shift
  local summary
  "$sim" "$@" >"$out/$name.txt"
  summary=$(tuner_summary "$out/$name.txt") # read whole before the file grows
  echo "$summary" >>"$out/$name.txt"
}
# The tuner prices its links from each cluster's figures (tune_links=1: what a BRAID_TUNE_FILE
# written for that cluster says), so a miss is the model's structure, not this machine's lines.
# shellcheck disable=SC2086 # the figures are words
tuner_table tuner-1gbit-ppn2 --ranks 64:16384 --per-node 2 --bytes 8:1G --factor 8 $CALIBRATED \
  tune_links=1
# shellcheck disable=SC2086
tuner_table tuner-1gbit-ppn8 --ranks 64:16384 --per-node 8 --bytes 8:1G --factor 8 $CALIBRATED \
  tune_links=1
tuner_table tuner-100gbit-ppn8 --ranks 64:16384 --per-node 8 --bytes 8:1G --factor 8 tune_links=1
# The same tuner with the library's own lines (fitted to this machine's loopback TCP and shared
# memory), 64 to 1,024 ranks: what it picks on those clusters without a tune file.
own=$(mktemp)
trap 'rm -f "$own"' EXIT
{
  echo "# the tuner with the library's own link lines (tune_links=0), 64-1024 ranks, 8 B-1 GiB"
  for cluster in "1gbit-ppn2 --per-node 2 $CALIBRATED" "1gbit-ppn8 --per-node 8 $CALIBRATED" \
    "100gbit-ppn8 --per-node 8"; do
    # shellcheck disable=SC2086 # the name, then braid-sim's words
    set -- $cluster
    name=$1
    shift
    "$sim" --ranks 64:1024 --bytes 8:1G --factor 8 "$@" >"$own"
    echo "$name $(tuner_summary "$own" | sed 's/^# tuner: //')"
  done
} >"$out/tuner-own-lines.txt"
"$top/perf/sim_tree_slopes.sh" "$build" >"$out/tree-slopes.txt"
# Beside NCCL's published scaling (a few minutes of CPU: 24,576 ranks in full)
"$top/perf/nccl_compare.py" "$build" >"$out/nccl-compare.md"
if [ -n "$csv" ]; then
  # shellcheck disable=SC2086
  "$top/perf/sim_calibrate.py" "$build" "$csv" wire_gbps=20 burst_bytes=65536 $CALIBRATED $EMULATED \
    >"$out/calibration-1gbit.md" || true # the table says where the bound is missed
fi
echo "sim_tables: $(ls "$out")"
