#!/usr/bin/env bash
# `make bench`: Braid's all_reduce_perf against Open MPI's MPI_Allreduce, 4 ranks on loopback, float
# sum (64 MiB bandwidth and an 8 B..1 MiB latency sweep), then a side-by-side summary. Always exits 0.
#
# Usage: perf/compare_mpi.sh BUILD_DIR      (env: NP=4 ranks, BENCH_TIMEOUT=900 s per run)
set -u

BUILD=${1:-build}
BIN=$BUILD/bin
NP=${NP:-4}
TMO=${BENCH_TIMEOUT:-900}

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

# mpirun in a container: loopback only for the runtime's own wiring, root allowed when root.
LAUNCH=(mpirun -np "$NP" --bind-to none --mca oob_tcp_if_include lo)
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  LAUNCH+=(--allow-run-as-root)
fi
CORES=$(nproc 2>/dev/null || echo 1)
if [ "$CORES" -lt "$NP" ]; then
  LAUNCH+=(--oversubscribe --mca mpi_yield_when_idle 1)
fi
# MPI's own traffic over TCP loopback through ob1: no UCX, no vader/sm shared memory. Braid's run
# uses MPI only to broadcast the unique id and to aggregate timings; its data takes Braid's transport.
MPI_NET=(--mca pml ob1 --mca btl "self,tcp" --mca btl_tcp_if_include lo --mca coll "^sm")

run() { # run NAME BINARY ARGS...: prints the output and keeps it in $OUT/NAME
  local name=$1
  shift
  echo "### ${LAUNCH[*]} ${MPI_NET[*]} $*"
  timeout "$TMO" "${LAUNCH[@]}" "${MPI_NET[@]}" "$@" >"$OUT/$name" 2>&1
  local rc=$?
  cat "$OUT/$name"
  [ "$rc" = 0 ] || echo "### exit status $rc$([ "$rc" = 124 ] && echo " (timed out after ${TMO}s)")"
  echo
}

BW=(-b 64M -e 64M -d float -o sum)
LAT=(-b 8 -e 1M -f 2 -d float -o sum)
run braid_bw "$BIN/all_reduce_perf" "${BW[@]}"
run braid_lat "$BIN/all_reduce_perf" "${LAT[@]}"
run mpi_bw "$BIN/mpi_allreduce_perf" "${BW[@]}"
run mpi_lat "$BIN/mpi_allreduce_perf" "${LAT[@]}"

# Table rows: size count type redop root time algbw busbw #wrong (out-of-place) time ... (in-place)
rows() { awk '!/^#/ && NF >= 13 { print $1, $6, $8 }' "$OUT/$1" 2>/dev/null; }

echo "# Braid vs Open MPI MPI_Allreduce: $NP ranks, float sum, out-of-place time per op"
echo "# ratio = braid / MPI time (below 1: Braid is faster)"
printf "# %10s  %12s  %12s  %8s\n" "size(B)" "braid(us)" "mpi(us)" "ratio"
join -a1 -a2 -e - -o 0,1.2,2.2 <(rows braid_lat | sort -k1,1) <(rows mpi_lat | sort -k1,1) |
  sort -n -k1,1 |
  awk '{ r = ($2 != "-" && $3 != "-" && $3 > 0) ? sprintf("%8.2f", $2 / $3) : "     n/a";
         printf "  %10s  %12s  %12s  %s\n", $1, $2, $3, r }'

bb=$(rows braid_bw | awk 'NR == 1 { print $3 }')
mb=$(rows mpi_bw | awk 'NR == 1 { print $3 }')
echo "#"
echo "# 64 MiB busbw (GB/s, out-of-place): braid ${bb:-n/a}  MPI ${mb:-n/a}  braid/MPI" \
  "$(awk -v a="${bb:-}" -v b="${mb:-}" 'BEGIN { if (a != "" && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }')"
exit 0
