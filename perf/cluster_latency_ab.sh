#!/usr/bin/env bash
# Small all-reduces on the emulated cluster (scripts/cluster.sh, 4 hosts, every link shaped), two
# or more builds taking turns, so that a change in latency between two days can be told apart from
# a change in the library: the same calls from each build, one after another, in every round.
# 2x1 gives every rank a core of its own on a 2-core machine, 4x1 puts two ranks on a core.
#
# Usage: perf/cluster_latency_ab.sh BUILD [BUILD...]     (each BUILD with bin/all_reduce_perf)
# Environment: RATE=1gbit ROUNDS=2 ALGOS="Ring RecDoubling" LAYOUTS="2x1 4x1" SIZES="8 1K 8"
#   (SIZES: -b -e -f of all_reduce_perf). Prints one line per round, layout, algorithm and build:
#   the time per call in us at each size. Needs root; tears the cluster down on exit.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
cluster=$top/scripts/cluster.sh
RATE=${RATE:-1gbit} ROUNDS=${ROUNDS:-2} ALGOS=${ALGOS:-"Ring RecDoubling"}
LAYOUTS=${LAYOUTS:-"2x1 4x1"}
read -r lo hi factor <<<"${SIZES:-8 1K 8}"
"$cluster" up 4 "$RATE" >/dev/null
trap '"$cluster" down >/dev/null' EXIT
mapfile -t args < <("$cluster" mpirun-args)
export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
echo "# $(date -u +%F) all_reduce_perf -d float -b $lo -e $hi -f $factor -n 1000 -w 50, $RATE links"
for ((r = 1; r <= ROUNDS; r++)); do
  for lay in $LAYOUTS; do
    n=${lay%x*} hosts=""
    for ((i = 0; i < n; i++)); do hosts+="${hosts:+,}h$i:${lay#*x}"; done
    for algo in $ALGOS; do
      for build in "$@"; do
        times=$(timeout 300 mpirun "${args[@]}" -np $((n * ${lay#*x})) -host "$hosts" \
          --mca btl self,vader,tcp -x NCCL_ALGO="$algo" "$build/bin/all_reduce_perf" -d float \
          -o sum -c 0 --inplace 0 -b "$lo" -e "$hi" -f "$factor" -n 1000 -w 50 2>&1 |
          awk '$1 ~ /^[0-9]+$/ {printf "%s ", $6}')
        echo "round $r $lay $algo $build: ${times:-failed}"
      done
    done
  done
done
