#!/usr/bin/env bash
# The transcripts of docs/debugging.md, produced on this machine: a 4-rank all-reduce loop under
# Open MPI's mpirun, asked with braid-status while it runs, with one rank stopped (SIGSTOP), after
# it goes on, and, once a rank was killed, the dumps the others left in BRAID_TRACE_DIR.
# Prints markdown (the commands and what they printed) to stdout.
#
#   scripts/status_demo.sh [BUILD]     (BUILD defaults to ./build)
set -u
build=$(cd "${1:-build}" && pwd) || exit 2
command -v mpirun >/dev/null || {
  echo "status_demo: needs Open MPI's mpirun" >&2
  exit 2
}
tmp=$(mktemp -d /tmp/braid-status-demo.XXXXXX)
trap 'kill -KILL $(pgrep -f "$tmp/all_reduce_perf") 2>/dev/null; rm -rf "$tmp"' EXIT
cp "$build/bin/all_reduce_perf" "$build/bin/braid-status" "$tmp/"
mkdir "$tmp/trace"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)

mpirun "${root[@]}" --oversubscribe --bind-to none -np 4 --mca btl self,tcp \
  -x BRAID_TIMEOUT_MS=8000 -x "BRAID_TRACE_DIR=$tmp/trace" -x NCCL_DEBUG=WARN \
  "$tmp/all_reduce_perf" -b 4M -e 4M -n 20 -w 0 -N 0 -c 0 >"$tmp/out" 2>&1 &
mpi=$!
pid_of() { # rank -> pid
  local p
  for p in $(pgrep -f "$tmp/all_reduce_perf"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
  done
}
for _ in $(seq 100); do grep -q '^ *4194304' "$tmp/out" && break; sleep 0.2; done
p0=$(pid_of 0) p2=$(pid_of 2) p3=$(pid_of 3)
show() { # title, then the command: its words, then what it printed
  local title=$1
  shift
  echo "$title"
  echo
  echo '```'
  echo "\$ braid-status ${*:2}" | sed "s|$tmp/trace|/tmp/trace|"
  "$@" 2>&1
  echo '```'
  echo
}
show "The job running (a 4 MiB all-reduce in a loop, 4 ranks of one host):" "$tmp/braid-status" "$p0"
kill -STOP "$p2"
sleep 3
show "Rank 2 stopped with \`kill -STOP\` three seconds before:" "$tmp/braid-status" "$p0"
kill -CONT "$p2"
sleep 1
show "Rank 2 let go on (\`kill -CONT\`): the job moves again." "$tmp/braid-status" "$p0"
kill -KILL "$p3"
wait "$mpi" 2>/dev/null
show "Rank 3 killed: the others failed, each wrote its recorder to BRAID_TRACE_DIR; merged:" \
  "$tmp/braid-status" --dumps "$tmp/trace"
