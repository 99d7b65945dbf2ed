#!/usr/bin/env bash
# What the deterministic mode costs (docs/determinism.md): all_reduce_perf, float sum, the default
# mode against BRAID_DETERMINISTIC=1 in interleaved rounds on the same machine, for each rank count
# in NPS, over shared memory and over TCP (NCCL_SHM_DISABLE=1): the 8 B time (many iterations)
# and the BIG busbw (few). Prints per configuration the median of REPS rounds for both modes and
# deterministic / default.
# Usage: perf/det_compare.sh [BUILD_DIR]   (env: NPS="4 8", REPS=3, BIG=64M, SMALL_ITERS=2000,
#        BIG_ITERS=5, TMO=900 seconds per run)
set -u
BUILD=${1:-build}
NPS=${NPS:-4 8}
REPS=${REPS:-3}
BIG=${BIG:-64M}
SMALL_ITERS=${SMALL_ITERS:-2000}
BIG_ITERS=${BIG_ITERS:-5}
TMO=${TMO:-900}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# shellcheck source=perf/lib.sh
. "$(dirname "$0")/lib.sh"
MPI_ARGS=(--mca btl self,tcp --mca btl_tcp_if_include lo -x BRAID_DETERMINISTIC -x NCCL_SHM_DISABLE)
# run NAME ARGS...: one all_reduce_perf run appended to $OUT/NAME.REP
run() {
  local name=$1
  shift
  timeout "$TMO" "${LAUNCH[@]}" "${MPI_ARGS[@]}" "$BUILD/bin/all_reduce_perf" -c 0 -d float \
    -o sum --inplace 0 "$@" >"$OUT/$name.$rep" 2>&1 || echo "# $name round $rep failed" >&2
}
printf "# %-3s %-4s %-6s %14s %14s %8s\n" np link size default deterministic det/def
for np in $NPS; do
  bench_launch "$np"
  for link in shm tcp; do
    export NCCL_SHM_DISABLE=$([ "$link" = tcp ] && echo 1 || echo 0)
    for rep in $(seq 1 "$REPS"); do
      for mode in 0 1; do
        export BRAID_DETERMINISTIC=$mode
        run "$np-$link-small-$mode" -b 8 -e 8 -n "$SMALL_ITERS" -w 100
        run "$np-$link-big-$mode" -b "$BIG" -e "$BIG" -n "$BIG_ITERS" -w 1
      done
    done
    for what in small big; do
      d=$(bench_rows "$np-$link-$what-0")
      x=$(bench_rows "$np-$link-$what-1")
      # small: time in us (lower is better); big: busbw in GB/s (higher is better)
      col=$([ "$what" = small ] && echo 2 || echo 3)
      a=$(echo "$d" | awk -v c="$col" 'NR == 1 { print $c }')
      b=$(echo "$x" | awk -v c="$col" 'NR == 1 { print $c }')
      unit=$([ "$what" = small ] && echo us || echo GB/s)
      printf "  %-3s %-4s %-6s %9s %-4s %9s %-4s %8s\n" "$np" "$link" \
        "$([ "$what" = small ] && echo 8B || echo "$BIG")" "${a:-?}" "$unit" "${b:-?}" "$unit" \
        "$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "?" }')"
    done
  done
done
