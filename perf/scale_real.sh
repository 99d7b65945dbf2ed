#!/usr/bin/env bash
# Real ranks, as many as this machine holds: perf/mpi_scale_probe at N = 8 .. 128 ranks, 4 per
# emulated host (scripts/cluster.sh: N/4 hosts, every link shaped to RATE), Braid beside Open MPI
# in the same processes. Per N, the probe's table: init time to the end of the first 8-byte
# all-reduce, and per rank the resident memory, file descriptors, sockets, threads and /dev/shm
# each library added, Braid's sockets right after init (its connections are made on first use)
# and the peers it connected to after every collective at three sizes, all checked
# exactly. Then, at ALGO_NS, all-reduces alone with each algorithm forced: the peers and sockets
# that algorithm needs.
#
#   perf/scale_real.sh BUILD          writes docs/sim/scale-real.txt; needs root and Open MPI
# Last, at ROOTS_NS, Braid's comm made with ncclCommInitRankScalable and one id per host.
# Environment: NS="8 16 32 64 128"  RPN=4  RATE=1gbit  ALGO_NS="32 64 128"  ROOTS_NS="64 128"
#              ALGOS="Ring Tree RecDoubling Hier"  TIMEOUT=900 (seconds per mpirun)
set -uo pipefail
build=${1:?usage: perf/scale_real.sh BUILD}
top=$(cd "$(dirname "$0")/.." && pwd)
cluster=$top/scripts/cluster.sh
probe=$build/bin/mpi_scale_probe
out=$top/docs/sim/scale-real.txt
NS=${NS:-8 16 32 64 128}
RPN=${RPN:-4}
RATE=${RATE:-1gbit}
ALGO_NS=${ALGO_NS:-32 64 128}
ALGOS=${ALGOS:-Ring Tree RecDoubling Hier}
ROOTS_NS=${ROOTS_NS:-64 128}
TIMEOUT=${TIMEOUT:-900}
[ -x "$probe" ] || { echo "scale_real: no $probe (make tools with Open MPI)" >&2; exit 1; }
for v in $(compgen -e | grep -E '^(NCCL_|BRAID_)'); do unset "$v"; done
export BRAID_CLUSTER=bs BRAID_CLUSTER_SUBNET=198.18.2
export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
"$cluster" check || exit 1
max=0
for n in $NS $ALGO_NS; do [ "$n" -gt "$max" ] && max=$n; done
trap '"$cluster" down >/dev/null 2>&1' EXIT
"$cluster" up $((max / RPN)) "$RATE" >/dev/null || exit 1
mapfile -t mpirun_args < <("$cluster" mpirun-args)

# run N [VAR=VALUE [PROBE_ARGS...]]: one launch of the probe on N/RPN hosts
run() {
  local n=$1 hosts="" i t0
  for ((i = 0; i < n / RPN; i++)); do hosts+="${hosts:+,}h$i:$RPN"; done
  local env=()
  [ -n "${2:-}" ] && env=(-x "$2")
  shift 2 || shift $#
  t0=$(date +%s.%N)
  timeout "$TIMEOUT" mpirun "${mpirun_args[@]}" --allow-run-as-root -np "$n" -host "$hosts" \
    --mca btl self,vader,tcp "${env[@]}" "$probe" "$@" 2>&1 | grep -v -e "NCCL INFO" -e "plm:rsh"
  echo "# launch to exit: $(echo "$(date +%s.%N) - $t0" | bc) s, rc ${PIPESTATUS[0]}"
}

{
  echo "# perf/scale_real.sh: $(nproc) cores, $RPN ranks per emulated host, links $RATE," \
    "$(mpirun --version 2>/dev/null | head -n 1), $(date -u +%F)"
  echo "# mpi_*: what MPI_Init and Open MPI's collectives added to a rank; braid_*: what Braid's"
  echo "# init and collectives added on top; *_init_ms: to the end of the first 8-byte all-reduce"
  for n in $NS; do
    echo
    echo "## $n ranks on $((n / RPN)) hosts, the tuner's choices"
    run "$n"
  done
  for n in $ALGO_NS; do
    for a in $ALGOS; do
      echo
      echo "## $n ranks on $((n / RPN)) hosts, NCCL_ALGO=$a, all-reduces only"
      run "$n" "NCCL_ALGO=$a" --allreduce-only 1 | grep -E "^#|peers|sockets"
    done
  done
  for n in $ROOTS_NS; do
    echo
    echo "## $n ranks on $((n / RPN)) hosts, one bootstrap root per host"
    run "$n" "BRAID_BOOTSTRAP_FANOUT=8" --roots $((n / RPN)) | grep -E "^#|init_ms|commInit|peers"
  done
} | tee "$out"
