#!/bin/bash
# A direct all-reduce of 2 processes on the one GPU (all_reduce_perf on
# device buffers, NCCL_ALGO=Direct, 8 B to 4 MiB), each process under
# compute-sanitizer's TOOL; each process's log is OUTDIR/san_TOOL_RANK.log.
# Exits non-zero if either process does (the sanitizer's --error-exitcode 9
# for an error it found). Run by tests/gpu/run_all.sh.
#
#   tests/gpu/san_allreduce.sh memcheck|racecheck|synccheck BINDIR OUTDIR
set -u
tool=$1 bin=$2 out=$3
port=$((29500 + RANDOM % 1000))
rc=0
for r in 0 1; do
  NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=2 NCCL_ALGO=Direct \
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/all_reduce_perf" --mem device \
    -b 8 -e 4M -f 8 -n 2 -w 1 -c 1 >"$out/san_${tool}_$r.log" 2>&1 &
done
for r in 0 1; do wait -n || rc=$?; done
exit $rc
