#!/usr/bin/env bash
# Four ranks of all_reduce_perf and of braid-train (a short run), started as each launcher
# starts them, the variables set per process here: torchrun (RANK, WORLD_SIZE, LOCAL_RANK),
# Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, two emulated nodes of two tasks)
# and MPICH's Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), each with NCCL_COMM_ID on
# 127.0.0.1 and a free port. Every rank must join one communicator of 4 (its INIT line says
# so: a rank that took MPI's singleton start-up instead would be rank 0 of 1), the perf
# table must check clean and the training must finish on every rank.
# Usage: launchers.sh BUILD_DIR. Checks behaviour only, never timing.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
perf=$build/bin/all_reduce_perf
train=$build/bin/braid-train
data=${BRAID_TRAIN_DATA:-/usr/share/datasets/fashion-mnist}
n=4
hang_s=90 # a rank still running after this is hung
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
export BRAID_TIMEOUT_MS=30000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT
# What any launcher may have left in this environment (a CI job under srun, say).
launcher_vars=(RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE PMI_RANK PMI_SIZE PMI_FD PMI_PORT
  PMI_ID MPI_LOCALRANKID MPI_LOCALNRANKS PMIX_RANK OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
  OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE SLURM_PROCID SLURM_NTASKS SLURM_LOCALID
  SLURM_NODEID SLURM_TASKS_PER_NODE SLURM_NTASKS_PER_NODE SLURM_JOB_ID SLURM_STEP_ID)
unset "${launcher_vars[@]}" NCCL_COMM_ID

# A port nobody holds, below the kernel's ephemeral range (scripts/free_port.py says why).
free_port() {
  python3 "$top/scripts/free_port.py" || { echo "launchers: no free port found" >&2; return 1; }
}

# The variables launcher $1 gives rank $2 of $n.
rank_env() {
  local r=$2
  case $1 in
    torchrun) echo "RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n" ;;
    slurm)
      echo "SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$((r % 2)) SLURM_NODEID=$((r / 2))" \
        "SLURM_TASKS_PER_NODE=2(x2) SLURM_JOB_ID=34 SLURM_STEP_ID=0"
      ;;
    pmi) echo "PMI_RANK=$r PMI_SIZE=$n MPI_LOCALRANKID=$r MPI_LOCALNRANKS=$n" ;;
  esac
}

# run LAUNCHER TAG PROGRAM ARGS...: n ranks, logs $work/TAG.R; fails unless every rank exits 0
# within hang_s and says it is rank R of n.
run() {
  local launcher=$1 tag=$2 port r p ok=0
  shift 2
  port=$(free_port) || return 1
  local ranks=()
  for ((r = 0; r < n; r++)); do
    # shellcheck disable=SC2046 # rank_env's words are NAME=VALUE pairs for env
    env $(rank_env "$launcher" "$r") NCCL_COMM_ID=127.0.0.1:$port "$@" >"$work/$tag.$r" 2>&1 &
    ranks+=($!)
    pids+=($!)
  done
  local deadline=$((SECONDS + hang_s))
  for ((r = 0; r < n; r++)); do
    p=${ranks[$r]}
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if kill -0 "$p" 2>/dev/null; then
      kill -9 "$p" 2>/dev/null || true
      echo "FAIL: $tag rank $r hung"
      ok=1
    elif ! wait "$p"; then
      echo "FAIL: $tag rank $r exited with an error"
      ok=1
    fi
    if ! grep -q "rank $r nranks $n - Init COMPLETE" "$work/$tag.$r"; then
      echo "FAIL: $tag rank $r did not join a communicator of $n as rank $r"
      ok=1
    fi
  done
  [ $ok -eq 0 ] || for ((r = 0; r < n; r++)); do
    echo "--- $tag rank $r"
    tail -n 15 "$work/$tag.$r"
  done
  return $ok
}

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

for launcher in torchrun slurm pmi; do
  tag=perf-$launcher
  if run "$launcher" "$tag" "$perf" -b 8 -e 1M -f 8 -c 1 -n 2 -w 1 --mem host; then
    if grep -q "Out of bounds values : 0 OK" "$work/$tag.0"; then
      echo "ok: all_reduce_perf, $n ranks launched as $launcher launches them"
    else
      fail "$tag: no clean result table"
      tail -n 15 "$work/$tag.0"
    fi
  else
    fail "$tag"
  fi
done

if [ -x "$train" ] && [ -r "$data/train-images-idx3-ubyte.gz" ]; then
  small=(--data "$data" --hidden 32 --limit-train 1024 --limit-test 256 --batch 64 --epochs 1
    --csv none --plot none --progress never)
  # what rank 0's header must say: who launched, and how many ranks share its host
  declare -A header=([torchrun]="4 ranks (RANK/WORLD_SIZE)" [slurm]="4 ranks (Slurm)"
    [pmi]="4 ranks (PMI)")
  declare -A local_ranks=([torchrun]=4 [slurm]=2 [pmi]=4)
  for launcher in torchrun slurm pmi; do
    tag=train-$launcher
    if ! run "$launcher" "$tag" "$train" "${small[@]}"; then
      fail "$tag"
    elif ! grep -qF "# ${header[$launcher]}" "$work/$tag.0" ||
      ! grep -q "; ${local_ranks[$launcher]} ranks on [0-9]* cores here" "$work/$tag.0" ||
      ! grep -q "^epoch  1/1" "$work/$tag.0"; then
      fail "$tag: rank 0 did not report ${header[$launcher]}, ${local_ranks[$launcher]} ranks" \
        "on its host and a finished epoch"
      head -n 5 "$work/$tag.0"
    else
      echo "ok: braid-train, $n ranks launched as $launcher launches them"
    fi
  done
else
  echo "skip: braid-train (not built, or no Fashion-MNIST at $data)"
fi

[ $failures -eq 0 ] || echo "launchers: $failures failure(s)"
[ $failures -eq 0 ]
