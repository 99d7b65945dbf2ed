#!/usr/bin/env bash
# All-reduce with NCCL_ALGO=Ring, Tree, RecDoubling and the tuner's own
# choice, NP ranks on loopback, one run each over the same sweep; prints
# time per size side by side and auto / min(Ring, Tree).
# Usage: perf/algo_compare.sh BUILD_DIR   (env: NP=8, MIN=8, MAX=256M, ITERS=10)
set -u
BUILD=${1:-build}
NP=${NP:-8}
MIN=${MIN:-8}
MAX=${MAX:-256M}
ITERS=${ITERS:-10}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
LAUNCH=(mpirun -np "$NP" --bind-to none --oversubscribe --mca btl self,tcp
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x NCCL_ALGO)
[ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
for algo in Ring Tree RecDoubling auto; do
  if [ "$algo" = auto ]; then unset NCCL_ALGO; else export NCCL_ALGO=$algo; fi
  timeout 1800 "${LAUNCH[@]}" "$BUILD/bin/all_reduce_perf" -b "$MIN" -e "$MAX" -f 4 \
    -n "$ITERS" -w 2 -c 0 -d float -o sum >"$OUT/$algo" 2>&1 || echo "# $algo run failed"
done
unset NCCL_ALGO
echo "# all-reduce, $NP ranks, float sum, out-of-place time (us) and busbw (GB/s)"
printf "# %10s %11s %11s %11s %11s %9s %8s\n" size Ring Tree RecDoubling auto auto/best best_bw
rows() { awk '!/^#/ && NF >= 13 { print $1, $6, $8 }' "$OUT/$1"; }
join <(rows Ring) <(rows Tree) | join - <(rows RecDoubling) | join - <(rows auto) |
  awk '{ best = $2 < $4 ? $2 : $4; bw = $2 < $4 ? $3 : $5;
         printf "  %10s %11s %11s %11s %11s %9.2f %8s\n", $1, $2, $4, $6, $8, $8 / best, bw }'
