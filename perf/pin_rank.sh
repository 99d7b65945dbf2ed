#!/usr/bin/env bash
# Runs a command with this rank held on one core, the core a placement gives it: for
# measurements on a host with more ranks than cores, where which ranks share a core (and its L2)
# decides which messages stay in a cache, so that a job's figure depends on where the kernel
# happened to put its ranks (docs/determinism.md, "Cost").
#   perf/pin_rank.sh PLACE COMMAND ARGS...     (under mpirun; the rank from
#                                              OMPI_COMM_WORLD_LOCAL_RANK, the count from
#                                              OMPI_COMM_WORLD_LOCAL_SIZE)
#   perf/pin_rank.sh --cores PLACE NP          prints the cores of ranks 0..NP-1, comma separated
# PLACE, with C the cores this process may use (in their order):
#   free    no pinning (the kernel places and moves ranks)
#   rr      rank r on core r mod C (what mpirun --bind-to core gives)
#   block   consecutive ranks together: rank r on core r * C / NP
#   parity  rank r on core popcount(r) mod C: ranks 2^l apart never share a core
set -euo pipefail

cores_of() { # PLACE NP: the core index (0..C-1) of each rank, one per line
  local place=$1 np=$2 ncores=$3 r
  for ((r = 0; r < np; r++)); do
    case $place in
      rr) echo $((r % ncores)) ;;
      block) echo $((r * ncores / np)) ;;
      parity)
        local bits=0 v=$r
        while ((v)); do bits=$((bits + (v & 1))) v=$((v >> 1)); done
        echo $((bits % ncores))
        ;;
    esac
  done
}

allowed_cpus() { # the CPUs this process may run on, one per line
  local list
  list=$(taskset -pc $$ | sed 's/.*: //')
  local IFS=,
  for part in $list; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}

mapfile -t cpus < <(allowed_cpus)
place=${1:-}
[ "$place" = --cores ] && place=${2:-}
case $place in
  free | rr | block | parity) ;;
  *)
    echo "pin_rank.sh: unknown placement '$place' (free, rr, block, parity)" >&2
    exit 2
    ;;
esac
if [ "${1:-}" = --cores ]; then
  [ "$2" = free ] && { echo free; exit 0; }
  mapfile -t idx < <(cores_of "$2" "$3" "${#cpus[@]}")
  out=""
  for i in "${idx[@]}"; do out+="${out:+,}${cpus[$i]}"; done
  echo "$out"
  exit 0
fi

shift
[ "$place" = free ] && exec "$@"
rank=${OMPI_COMM_WORLD_LOCAL_RANK:?pin_rank.sh: run it under mpirun}
np=${OMPI_COMM_WORLD_LOCAL_SIZE:?pin_rank.sh: run it under mpirun}
mapfile -t idx < <(cores_of "$place" "$np" "${#cpus[@]}")
exec taskset -c "${cpus[${idx[$rank]}]}" "$@"
