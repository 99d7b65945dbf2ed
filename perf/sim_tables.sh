#!/usr/bin/env bash
# The tables of docs/simulator.md, produced (never typed): braid-sim's grids of every algorithm
# and the tuner's pick, and the calibration against a perf/bench_cluster.sh run.
#
#   perf/sim_tables.sh BUILD [RESULTS_CSV]      writes docs/sim/*.txt and nccl-compare.md (and
#                                               calibration-1gbit.md when a bench_cluster.sh
#                                               results.csv is given)
# The calibrated cluster's figures are CALIBRATED (below): what perf/sim_calibrate.py's fit chose
# for the emulated 1 Gbit/s cluster; its link rate is iperf3's.
set -euo pipefail
build=${1:?usage: perf/sim_tables.sh BUILD [RESULTS_CSV]}
csv=${2:-}
top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/docs/sim
sim=$build/bin/braid-sim
CALIBRATED=${CALIBRATED:-"nic_gbps=0.952 net_lat_us=4 msg_us=4 intra_msg_us=3"}
mkdir -p "$out"
# shellcheck disable=SC2086 # the figures are words
"$sim" --ranks 64:16384 --per-node 2 --bytes 8:1G --factor 8 $CALIBRATED >"$out/tuner-1gbit-ppn2.txt"
"$sim" --ranks 64:16384 --per-node 8 --bytes 8:1G --factor 8 $CALIBRATED >"$out/tuner-1gbit-ppn8.txt"
"$sim" --ranks 64:16384 --per-node 8 --bytes 8:1G --factor 8 >"$out/tuner-100gbit-ppn8.txt"
# Beside NCCL's published scaling (a few minutes of CPU: 24,576 ranks in full)
"$top/perf/nccl_compare.py" "$build" >"$out/nccl-compare.md"
if [ -n "$csv" ]; then
  "$top/perf/sim_calibrate.py" "$build" "$csv" wire_gbps=20 burst_bytes=65536 $CALIBRATED \
    >"$out/calibration-1gbit.md" || true # the table says where the bound is missed
fi
echo "sim_tables: $(ls "$out")"
