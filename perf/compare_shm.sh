#!/usr/bin/env bash
# `make bench-shm`: ranks of one node. Braid's all_reduce_perf (shared-memory transport) against
# Open MPI's MPI_Allreduce over its shared-memory BTL (--mca btl self,vader), float sum, 1 KiB..64 MiB,
# plus one thread's memcpy bandwidth on 64 MiB (what Braid's topology detection measures). Prints
# latency at 1 KiB and bus bandwidth at 4 and 64 MiB side by side. Always exits 0.
#
# Usage: perf/compare_shm.sh BUILD_DIR   (env: NP=2 ranks, REPS=5 rounds, BENCH_TIMEOUT=600 s per
# run). Rounds alternate Braid and MPI; the summary takes, per size, the median round's figures.
set -u

BUILD=${1:-build}
BIN=$BUILD/bin
NP=${NP:-2}
TMO=${BENCH_TIMEOUT:-600}
REPS=${REPS:-5}

for b in all_reduce_perf mpi_allreduce_perf; do
  if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$BIN/$b" ]; then
    echo "compare_shm: mpirun or $BIN/$b missing; nothing to compare"
    exit 0
  fi
done

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# shellcheck source=perf/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_launch "$NP"
MPI_ARGS=(--mca pml ob1 --mca btl "self,vader")

SWEEP=(-b 1K -e 64M -f 4 -d float -o sum)
for rep in $(seq 1 "$REPS"); do
  bench_run "braid.$rep" -x NCCL_TOPO_DUMP_FILE="$OUT/topo.$rep.json" "$BIN/all_reduce_perf" "${SWEEP[@]}"
  bench_run "mpi.$rep" "$BIN/mpi_allreduce_perf" "${SWEEP[@]}"
done

pick() { awk -v s="$2" -v c="$3" '$1 == s { print $c }' <(bench_rows "$1"); }

echo "# Braid (shm) vs Open MPI (btl self,vader): $NP ranks on one node, float sum, out-of-place, median of $REPS"
printf "# %10s  %10s  %10s  %10s  %10s\n" "size(B)" "braid(us)" "mpi(us)" "braid GB/s" "mpi GB/s"
join <(bench_rows braid | sort -k1,1) <(bench_rows mpi | sort -k1,1) | sort -n -k1,1 |
  awk '{ printf "  %10s  %10s  %10s  %10s  %10s\n", $1, $2, $4, $3, $5 }'
mem=$(cat "$OUT"/topo.*.json 2>/dev/null | sed -n 's/.*"mem_mbps": *\([0-9]*\).*/\1/p' | sort -n |
  awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo "#"
echo "# 1 KiB latency: braid $(pick braid 1024 2) us, MPI $(pick mpi 1024 2) us, braid/MPI $(ratio "$(pick braid 1024 2)" "$(pick mpi 1024 2)") (target <= 2)"
for s in 4194304 67108864; do
  echo "# $((s >> 20)) MiB busbw: braid $(pick braid $s 3) GB/s, MPI $(pick mpi $s 3) GB/s, braid/MPI $(ratio "$(pick braid $s 3)" "$(pick mpi $s 3)")"
done
echo "# memcpy 64 MiB, one thread: ${mem:-n/a} MB/s"
exit 0
