#!/usr/bin/env bash
# `make bench`: Braid's all_reduce_perf against Open MPI's MPI_Allreduce, 4 ranks on loopback, float
# sum (64 MiB bandwidth and an 8 B..1 MiB latency sweep), then a side-by-side summary. Always exits 0.
#
# Usage: perf/compare_mpi.sh BUILD_DIR      (env: NP=4 ranks, REPS=3 rounds, BENCH_TIMEOUT=900 s
# per run). Each round runs Braid then MPI; the summary takes the median over rounds, because on an
# oversubscribed host one run swings by 1.5x with how the scheduler happens to place the ranks.
set -u

BUILD=${1:-build}
BIN=$BUILD/bin
NP=${NP:-4}
TMO=${BENCH_TIMEOUT:-900}
REPS=${REPS:-3}

if ! command -v mpirun >/dev/null 2>&1; then
  echo "compare_mpi: mpirun not found; nothing to compare"
  exit 0
fi
for b in all_reduce_perf mpi_allreduce_perf; do
  if [ ! -x "$BIN/$b" ]; then
    echo "compare_mpi: $BIN/$b is missing (make tools builds it with mpicc); nothing to compare"
    exit 0
  fi
done

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# shellcheck source=perf/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_launch "$NP"
# MPI's own traffic over TCP loopback through ob1: no UCX, no vader/sm shared memory. Braid's run
# uses MPI only to broadcast the unique id and to aggregate timings; its data takes Braid's transport.
MPI_ARGS=(--mca pml ob1 --mca btl "self,tcp" --mca btl_tcp_if_include lo --mca coll "^sm")

BW=(-b 64M -e 64M -d float -o sum)
LAT=(-b 8 -e 1M -f 2 -d float -o sum)
for rep in $(seq 1 "$REPS"); do
  bench_run "braid_bw.$rep" "$BIN/all_reduce_perf" "${BW[@]}"
  bench_run "mpi_bw.$rep" "$BIN/mpi_allreduce_perf" "${BW[@]}"
  bench_run "braid_lat.$rep" "$BIN/all_reduce_perf" "${LAT[@]}"
  bench_run "mpi_lat.$rep" "$BIN/mpi_allreduce_perf" "${LAT[@]}"
done


echo "# Braid vs Open MPI MPI_Allreduce: $NP ranks, float sum, out-of-place time per op, median of $REPS"
echo "# ratio = braid / MPI time (below 1: Braid is faster)"
printf "# %10s  %12s  %12s  %8s\n" "size(B)" "braid(us)" "mpi(us)" "ratio"
join -a1 -a2 -e - -o 0,1.2,2.2 <(bench_rows braid_lat | sort -k1,1) <(bench_rows mpi_lat | sort -k1,1) |
  sort -n -k1,1 |
  awk '{ r = ($2 != "-" && $3 != "-" && $3 > 0) ? sprintf("%8.2f", $2 / $3) : "     n/a";
         printf "  %10s  %12s  %12s  %s\n", $1, $2, $3, r }'

bb=$(bench_rows braid_bw | awk 'NR == 1 { print $3 }')
mb=$(bench_rows mpi_bw | awk 'NR == 1 { print $3 }')
echo "#"
echo "# 64 MiB busbw (GB/s, out-of-place, median of $REPS): braid ${bb:-n/a}  MPI ${mb:-n/a}  braid/MPI" \
  "$(awk -v a="${bb:-}" -v b="${mb:-}" 'BEGIN { if (a != "" && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }')"
exit 0
