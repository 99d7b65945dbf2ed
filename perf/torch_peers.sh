#!/usr/bin/env bash
# all_reduce through PyTorch on braid against the library itself and the two CPU peers, side by
# side in one run (issue 49): Braid's all_reduce_perf (the library's own time, its in-place
# column), torch.distributed on "braid", braid_torch.all_reduce_ (the same as a torch op with no
# Work, "braid-op"), DeepSpeed's shared-memory all-reduce for CPU inference
# (deepspeed.comm.inference_all_reduce, DS_ACCELERATOR=cpu, from PyPI) and torch on "gloo";
# 2 and 4 ranks on this host, float32 and bfloat16, 4 KiB..64 MiB. The backends take turns
# each round (perf/torch_bench.py); every figure is the median of ROUNDS rounds.
#
# Usage: perf/torch_peers.sh [BUILD_DIR]   (env: NPS="2 4", DTYPES="float32 bfloat16", ROUNDS=3,
#        OUT=a directory for the tables and JSON). Installs torch (scripts/torch-env.sh),
#        deepspeed and bindings/torch into the cached environment first.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[[ $build = /* ]] || build=$top/$build # a build directory anywhere, or in the tree
out=${OUT:-$build/torch-peers}
mkdir -p "$out"

venv=$("$top/scripts/torch-env.sh")
"$top/bindings/torch/install.sh" "$venv" "$build" >&2
"$venv/bin/python" -c 'import deepspeed' 2>/dev/null ||
  "$venv/bin/python" -m pip install -q --disable-pip-version-check deepspeed >&2

export OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu PMIX_MCA_psec=${PMIX_MCA_psec:-native}
for np in ${NPS:-2 4}; do
  for dt in ${DTYPES:-float32 bfloat16}; do
    "$venv/bin/python" "$top/perf/torch_bench.py" --np "$np" --dtype "$dt" --what allreduce \
      --backends library,braid,braid-op,deepspeed,gloo --min-bytes 4096 --max-bytes $((64 << 20)) \
      --rounds "${ROUNDS:-3}" --bin "$build/bin" --json "$out/peers-$np-$dt.json" \
      2> >(grep -v '^W[0-9]\|built successfully' >&2) | tee "$out/peers-$np-$dt.txt"
  done
done
