#!/usr/bin/env bash
# How many of the library's files one all-reduce passes, and how often a
# call climbs from a lower layer to a higher one (perf/call_walk.py), on
# host buffers (2 ranks as threads) and on device buffers (2 processes on
# the simulated driver, the call gated on its stream: the issuing call and
# the proxy's run of it, src/engine/work.c's unit_run). Needs valgrind, and mpirun
# for the device walk.
# Usage: perf/call_walk.sh [BUILD]
set -euo pipefail
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
perf=$build/bin/all_reduce_perf
args=(-b 1M -e 1M -n 2 -w 1 -c 0)

echo "== host buffers, 2 ranks as threads"
valgrind --tool=callgrind --toggle-collect=ncclAllReduce --callgrind-out-file="$out/host" \
  "$perf" -t 2 --mem host "${args[@]}" >"$out/host.log" 2>&1
python3 "$top/perf/call_walk.py" "$out/host" "$top"

echo "== device buffers, 2 processes (simulated driver)"
BRAID_CUDA_LIB=$(cd "$build/tests" && pwd)/libcudasim.so \
  mpirun --allow-run-as-root --oversubscribe -np 2 -x BRAID_CUDA_LIB \
  valgrind --tool=callgrind --toggle-collect=ncclAllReduce --toggle-collect=unit_run \
  --callgrind-out-file="$out/dev.%p" "$perf" --mem device "${args[@]}" >"$out/dev.log" 2>&1
for dev in "$out"/dev.*; do # the first process's profile (dev.log is the run's output)
  [ "$dev" != "$out/dev.log" ] && break
done
python3 "$top/perf/call_walk.py" "$dev" "$top"
