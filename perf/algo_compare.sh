#!/usr/bin/env bash
# All-reduce with NCCL_ALGO=Ring, Tree, RecDoubling and the tuner's own
# choice on NP ranks over loopback: REPS interleaved rounds of each over an
# 8 B..MAX sweep (small sizes with many iterations, large with few), then
# the median time per size side by side, and auto / the fastest forced one.
# Usage: perf/algo_compare.sh BUILD_DIR   (env: NP=8, MAX=256M, REPS=3, LARGE_ITERS=3)
set -u
BUILD=${1:-build}
NP=${NP:-8}
MAX=${MAX:-256M}
REPS=${REPS:-3}
LARGE_ITERS=${LARGE_ITERS:-3}
ALGOS=(Ring Tree RecDoubling Hier auto)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
LAUNCH=(mpirun -np "$NP" --bind-to none --oversubscribe --mca btl self,tcp
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x NCCL_ALGO)
[ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
sweep() { # sweep NAME ARGS...: one all_reduce_perf run, appended to $OUT/NAME
  local name=$1
  shift
  timeout 1800 "${LAUNCH[@]}" "$BUILD/bin/all_reduce_perf" -c 0 -d float -o sum "$@" \
    >>"$OUT/$name" 2>&1 || echo "# $name run failed" >&2
}
for rep in $(seq 1 "$REPS"); do
  for algo in "${ALGOS[@]}"; do
    if [ "$algo" = auto ]; then unset NCCL_ALGO; else export NCCL_ALGO=$algo; fi
    sweep "$algo" -b 8 -e 1M -f 4 -n 40 -w 5
    sweep "$algo" -b 4M -e "$MAX" -f 4 -n "$LARGE_ITERS" -w 1
  done
done
unset NCCL_ALGO
# What the tuner chose per size, from its TUNING log (short extra runs).
for range in "-b 8 -e 1M" "-b 4M -e $MAX"; do
  # shellcheck disable=SC2086
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING timeout 600 "${LAUNCH[@]}" -x NCCL_DEBUG \
    -x NCCL_DEBUG_SUBSYS "$BUILD/bin/all_reduce_perf" -c 0 -d float -o sum $range -f 4 -n 1 \
    -w 0 2>/dev/null
done | sed -n 's/.*AllReduce \([0-9]*\) bytes nranks [0-9]*: \([A-Za-z]*\).*/\1 \2/p' |
  sort -u -k1,1 >"$OUT/choice"
# rows NAME: size, median out-of-place time, its busbw
rows() {
  awk '!/^#/ && NF >= 13 { print $1, $6, $8 }' "$OUT/$1" | sort -k1,1n -k2,2g |
    awk '{ n[$1]++; t[$1, n[$1]] = $2; b[$1, n[$1]] = $3 }
         END { for (s in n) { m = int((n[s] + 1) / 2); print s, t[s, m], b[s, m] } }' |
    sort -k1,1
}
echo "# all-reduce, $NP ranks, float sum: out-of-place time (us), median of $REPS rounds"
printf "# %10s %11s %11s %11s %11s %11s %12s %9s %9s\n" size Ring Tree RecDoubling Hier auto \
  "auto chose" auto/best busbw
join <(rows Ring) <(rows Tree) | join - <(rows RecDoubling) | join - <(rows Hier) |
  join - <(rows auto) | join -a1 -e ? -o auto - "$OUT/choice" | sort -k1,1n |
  awk '{ best = $2; for (i = 4; i <= 8; i += 2) if ($i < best) best = $i;
         printf "  %10s %11s %11s %11s %11s %11s %12s %9.2f %9s\n", $1, $2, $4, $6, $8, $10, $12,
                $10 / best, $11 }'
