#!/bin/bash
# Builds the GPU fact probes and the kernel check (tests/gpu/kern_bitwise.cu,
# with the library's fatbin beside it) into $1 (default build/gpu-facts) for sm_90,
# against Braid's CPU kernels in build/lib/libbraid.a (run `make` first).
# They need a GPU to run: tests/gpu/facts/run.sh runs them.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUTDIR=${1:-build/gpu-facts}
mkdir -p "$OUTDIR"
NVCC="nvcc -O2 -arch=sm_90 -lineinfo"
LINK="-L/usr/local/cuda/lib64/stubs -lcuda -lpthread -lm"
for p in memops ipc interleave; do
  $NVCC -o "$OUTDIR/$p" "tests/gpu/facts/$p.cu" $LINK
done
$NVCC -Ikernels -Iinclude -o "$OUTDIR/numerics" tests/gpu/facts/numerics.cu build/lib/libbraid.a $LINK
# The reduce-copy kernel: the library's own fatbin, checked bitwise on the GPU.
$NVCC -Ikernels -Iinclude -Icommon -Itests -o "$OUTDIR/kern_bitwise" tests/gpu/kern_bitwise.cu build/lib/libbraid.a $LINK
cp build/obj/kernels/cuda/reduce.fatbin "$OUTDIR/reduce.fatbin"
