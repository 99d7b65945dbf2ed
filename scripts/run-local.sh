#!/usr/bin/env bash
# `make run`: the main job on a local default - all_reduce_perf with 4 ranks
# on this machine over loopback TCP (under mpirun when Open MPI is present,
# otherwise as 4 threads of one process).
set -euo pipefail
build=${1:-build}
ranks=${BRAID_RUN_RANKS:-4}
args=(-b 8 -e 64M -f 4 -d float -o sum)
if command -v mpirun >/dev/null 2>&1; then
  root=()
  [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
  exec mpirun -np "$ranks" --oversubscribe --bind-to none "${root[@]}" \
    --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$build/bin/all_reduce_perf" "${args[@]}"
fi
exec "$build/bin/all_reduce_perf" -t "$ranks" "${args[@]}"
