#!/bin/bash
# Builds what tests/gpu/run_all.sh runs on the GPU machine into gpu_carry/
# (ignored by git; the device tool carries it): Braid's libnccl.so.2, the
# device tests, the kernel check with the library's fatbin, cmocka, and
# nccl-tests built against NVIDIA's nccl.h (the toolkit's) and linked with
# Braid's library. NCCL_TESTS_SRC names an nccl-tests checkout.
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CARRY:-gpu_carry}
make -j2 lib tools build/tests/mp_test_device build/tests/test_cuda_ipc >/dev/null
rm -rf "$C" && mkdir -p "$C/lib" "$C/bin" "$C/nccl-tests"
cp build/lib/libnccl.so.2 "$C/lib/"
cp "$(ldconfig -p | awk '/libcmocka.so.0 /{print $NF; exit}')" "$C/lib/libcmocka.so.0"
cp build/tests/mp_test_device build/tests/test_cuda_ipc build/bin/all_reduce_perf \
  build/bin/all_gather_perf build/bin/reduce_scatter_perf "$C/bin/"
nvcc -O2 -arch=sm_90 -Ikernels -Iinclude -Icommon -Itests -o "$C/bin/kern_bitwise" \
  tests/gpu/kern_bitwise.cu build/lib/libbraid.a -L/usr/local/cuda/lib64/stubs -lcuda -lpthread -lm
cp build/obj/kernels/cuda/reduce.fatbin build/obj/kernels/cuda/reduce_at.fatbin "$C/bin/"
cc -O2 -shared -fPIC -o "$C/lib/set_device_shim.so" tests/gpu/set_device_shim.c -ldl
if [ -n "${NCCL_TESTS_SRC:-}" ]; then
  H=$(mktemp -d)
  mkdir -p "$H/include" "$H/lib"
  cp /usr/local/cuda/include/nccl.h "$H/include/" # NVIDIA's 2.28 header: no device API
  cp build/lib/libnccl.so.2 "$H/lib/" && ln -s libnccl.so.2 "$H/lib/libnccl.so"
  make -C "$NCCL_TESTS_SRC" -j2 MPI=0 NCCL_HOME="$H" CUDA_HOME=/usr/local/cuda CUDARTLIB=cudart \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >/dev/null
  for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter; do
    cp "$NCCL_TESTS_SRC/build/${t}_perf" "$C/nccl-tests/"
  done
fi
strip "$C"/bin/*_perf "$C"/bin/kern_bitwise "$C"/bin/mp_test_device "$C"/bin/test_cuda_ipc "$C"/nccl-tests/* "$C"/lib/libnccl.so.2
du -sh "$C"
