#!/bin/bash
# Runs the GPU fact probes built by build.sh (binaries in $1, default
# build/gpu-facts) and records what the machine says of its GPU, NCCL and
# PyTorch. Every log goes to $OUT (default /tmp/gpu-facts); the facts feed
# docs/gpu-validation.md.
set -u
cd "$(dirname "$0")/../../.."
BIN=${1:-build/gpu-facts}
OUT=${OUT:-/tmp/gpu-facts}
mkdir -p "$OUT"

{
  date -u
  uname -a
  nvidia-smi
  nvidia-smi -q | grep -iE "product name|driver version|cuda version|compute mode|mig mode|persistence|ecc mode|current|pending" | head -40
  echo "--- nvidia-smi topo / mps"
  ls /tmp/nvidia-mps 2>&1 | head -3
  echo "--- libnccl on this machine"
  find / -xdev -name 'libnccl*.so*' 2>/dev/null
  ldconfig -p | grep -i nccl
  python3 -m pip show nvidia-nccl-cu13 2>/dev/null | head -3
} >"$OUT/system.txt" 2>&1

for p in memops ipc interleave; do
  echo "=== $p"
  timeout 120 "$BIN/$p" >"$OUT/$p.txt" 2>&1
  echo "rc=$?" >>"$OUT/$p.txt"
  cat "$OUT/$p.txt"
done

echo "=== clients"
PY=$(command -v python3)
{
  $PY - <<'PYEOF'
import os, torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("torch.cuda.nccl.version()", torch.cuda.nccl.version())
print("torch lib dir", os.path.join(os.path.dirname(torch.__file__), "lib"))
try:
    import cupy, cupy.cuda.nccl as n
    print("cupy", cupy.__version__, "nccl", n.get_version(), "module", n.__file__)
except Exception as e:
    print("cupy nccl:", e)
PYEOF
  TL=$($PY -c 'import os,torch;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
  for so in "$TL"/libtorch_cuda.so; do
    echo "--- $so NEEDED and search path"
    readelf -d "$so" | grep -E "NEEDED|RPATH|RUNPATH"
    echo "--- $so imports (nm -D --undefined-only | grep nccl)"
    nm -D --undefined-only "$so" | grep -i nccl
  done
  echo "--- who loads libnccl"
  ldd "$TL/libtorch_cuda.so" | grep -i nccl
  SP=$($PY -c 'import site;print(site.getsitepackages()[0])')
  for so in $(find "$SP"/torch/lib "$SP"/cupy* "$SP"/cupy_backends "$SP"/jaxlib "$SP"/jax_plugins "$SP"/jax_cuda13* \
    -name '*.so*' 2>/dev/null | xargs timeout 60 grep -l -a ncclCommInitRank 2>/dev/null | grep -v libnccl); do
    echo "--- $so imports of nccl*"
    nm -D --undefined-only "$so" 2>/dev/null | grep -i ' ncclComm\| nccl' | awk '{print $2}' | tr '\n' ' '
    echo
  done
  for so in $(find "$SP" -name 'libnccl.so*' 2>/dev/null); do
    echo "--- $so version string"
    strings "$so" | grep -m2 -E '^NCCL version|NCCL_VERSION'
  done
} >"$OUT/clients.txt" 2>&1
cat "$OUT/clients.txt"

echo "=== torch, two ranks on one GPU, NVIDIA's NCCL"
NCCL_DEBUG=WARN timeout 120 python3 tests/gpu/facts/torch_same_gpu.py >"$OUT/torch_same_gpu.txt" 2>&1
echo "rc=$?" >>"$OUT/torch_same_gpu.txt"
cat "$OUT/torch_same_gpu.txt"

echo "=== numerics"
timeout 300 "$BIN/numerics" "${NUMERICS_MODE:-full}" >"$OUT/numerics.txt" 2>&1
echo "rc=$?" >>"$OUT/numerics.txt"
cat "$OUT/numerics.txt"
