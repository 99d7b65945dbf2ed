#!/usr/bin/env bash
# Non-regression: the benchmarks of two builds (an old main's and a new one's) in one run,
# rounds alternating old and new so that both see the same machine. Per round: make bench's
# all-reduce against Open MPI (perf/compare_mpi.sh, 4 ranks on loopback TCP), make bench-shm's
# 2 ranks over shared memory (perf/compare_shm.sh), and, as root, make bench-cluster's 4x1 and
# 2x4 layouts with the tuner's choice (perf/bench_cluster.sh, SYSTEMS=auto, 8 B..64 KiB and
# 64 MiB, links shaped to RATE). The part "det" (not in the default PARTS) times the default and
# the deterministic mode in turns (`--det-turns 5`, DET_COLLS at DET_BYTES on DET_NP ranks over
# shared memory, each rank held on the core DET_PLACE names: perf/pin_rank.sh, "free" leaving
# them to the kernel) and prints each job's medians and det / default time. Prints each tool's
# summary under a heading naming build and round; the raw outputs stay in OUT. Always exits 0
# after printing.
#
# Usage: perf/compare_builds.sh OLD_BUILD NEW_BUILD
#   env: ROUNDS=2, PARTS="mpi shm cluster", OUT=/tmp/compare-builds, RATE=2gbit,
#        DET_NP=8, DET_COLLS="reduce_scatter all_reduce", DET_BYTES=64M, DET_PLACE=free
set -u
[ $# -eq 2 ] || {
  sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
old=$1 new=$2
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-2}
parts=${PARTS:-mpi shm cluster}
out=${OUT:-/tmp/compare-builds}
mkdir -p "$out"

run_part() { # part build label
  local part=$1 build=$2 label=$3 log="$out/$3-$1.log"
  case $part in
    det)
      for coll in ${DET_COLLS:-reduce_scatter all_reduce}; do
        echo "# $coll"
        mpirun --allow-run-as-root --oversubscribe -np "${DET_NP:-8}" --mca btl self,tcp \
          --mca btl_tcp_if_include lo "$here/pin_rank.sh" "${DET_PLACE:-free}" \
          "$build/bin/${coll}_perf" -c 0 -d float -o sum \
          --inplace 0 --det-turns 5 -b "${DET_BYTES:-64M}" -e "${DET_BYTES:-64M}" -n 5 -w 2
      done >"$log" 2>&1
      ;;
    mpi) REPS=1 "$here/compare_mpi.sh" "$build" >"$log" 2>&1 ;;
    shm) REPS=1 "$here/compare_shm.sh" "$build" >"$log" 2>&1 ;;
    cluster)
      SYSTEMS=auto LAYOUTS="4x1 2x4" UNSHAPED=0 MAXBYTES=64M SPLIT=64K LAT_MAX=64K REPS=1 \
        CHOICE=0 OUT="$out/$label-cluster" "$here/bench_cluster.sh" "$build" >"$log" 2>&1
      ;;
  esac
  echo "### $label $part"
  # The summary: compare_mpi/shm print theirs last; bench_cluster's tables are in report.md.
  if [ "$part" = cluster ] && [ -f "$out/$label-cluster/report.md" ]; then
    cat "$out/$label-cluster/report.md"
  elif [ "$part" = det ]; then
    grep -E '^# [a-z_]+$|medians' "$log"
  else
    tail -25 "$log"
  fi
}

for r in $(seq 1 "$rounds"); do
  for part in $parts; do
    run_part "$part" "$old" "old-r$r"
    run_part "$part" "$new" "new-r$r"
  done
done
exit 0
