#!/usr/bin/env bash
# `make run`: the main job on a local default - braid-train, the MLP on Fashion-MNIST, with 4
# ranks on this machine for a few epochs (under mpirun when Open MPI is present, otherwise 4
# processes that find each other through NCCL_COMM_ID). Prints where the CSV and plot are.
set -euo pipefail
build=${1:-build}
ranks=${BRAID_RUN_RANKS:-4}
epochs=${BRAID_RUN_EPOCHS:-3}
out=$build/train
mkdir -p "$out"
args=(--model mlp --epochs "$epochs" --csv "$out/mlp.csv" --plot "$out/mlp.png")
[ -t 2 ] && args+=(--progress always) # mpirun's pipes hide the terminal from the ranks
echo "make run: braid-train, MLP on Fashion-MNIST, $ranks ranks, $epochs epochs (results in $out/)"
if command -v mpirun >/dev/null 2>&1; then
  # No munge for PMIx (a stale munge socket costs mpirun 2.3 s; see scripts/run-tests.sh).
  export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
  root=()
  [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
  exec mpirun -np "$ranks" --oversubscribe --bind-to none "${root[@]}" \
    --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$build/bin/braid-train" "${args[@]}"
fi
# No mpirun: rank 0 serves the bootstrap on a random local port.
port=$(( 20000 + RANDOM % 20000 ))
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
for ((r = 0; r < ranks; r++)); do
  NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=$ranks "$build/bin/braid-train" "${args[@]}" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
