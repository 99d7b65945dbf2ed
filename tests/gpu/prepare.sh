#!/usr/bin/env bash
# Builds what tests/gpu/run_all.sh runs on the GPU machine into gpu_carry/
# (ignored by git; the device tool carries it): Braid's libnccl.so.2, the
# device tests, the kernel check with the library's fatbins, cmocka, and,
# where NCCL_TESTS_SRC names an nccl-tests checkout, nccl-tests built against
# NVIDIA's nccl.h (the toolkit's) and linked with Braid's library.
#
# A run carries at most 64 MiB, the tree included, and every binary that links
# libbraid.a embeds the kernels: they are built once more, in a build directory
# of their own (BUILD, default build-gpu; build/ is left as it is), as SASS for
# the GPU that runs them alone (CUDA_ARCHS, default 90: the H100 and H200 lent
# here), and everything is stripped. The size is checked at the end (CARRY_MAX_MB).
set -euo pipefail
cd "$(dirname "$0")/../.."
C=${CARRY:-gpu_carry}
B=${BUILD:-build-gpu}
archs=${CUDA_ARCHS:-90}
max_mb=${CARRY_MAX_MB:-48}
cuda=${CUDA_HOME:-/usr/local/cuda}
gencode=()
for a in ${archs//,/ }; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done

make -j2 BUILD="$B" CUDA_ARCHS="$archs" NVCC_ARCHS="${gencode[*]}" \
  lib tools "$B/tests/mp_test_device" "$B/tests/test_cuda_ipc" >/dev/null
rm -rf "$C" && mkdir -p "$C/lib" "$C/bin" "$C/nccl-tests"
cp "$B/lib/libnccl.so.2" "$C/lib/"
cp "$(ldconfig -p | awk '/libcmocka.so.0 /{print $NF; exit}')" "$C/lib/libcmocka.so.0"
cp "$B/tests/mp_test_device" "$B/tests/test_cuda_ipc" "$B/bin/all_reduce_perf" \
  "$B/bin/all_gather_perf" "$B/bin/reduce_scatter_perf" "$C/bin/"
"$cuda/bin/nvcc" -O2 "${gencode[@]}" -Ikernels -Iinclude -Icommon -Itests -o "$C/bin/kern_bitwise" \
  tests/gpu/kern_bitwise.cu "$B/lib/libbraid.a" -L"$cuda/lib64/stubs" -lcuda -lpthread -lm
cp "$B/obj/kernels/cuda/reduce.fatbin" "$B/obj/kernels/cuda/reduce_at.fatbin" "$C/bin/"
cc -O2 -shared -fPIC -o "$C/lib/set_device_shim.so" tests/gpu/set_device_shim.c -ldl
if [ -n "${NCCL_TESTS_SRC:-}" ]; then
  H=$(mktemp -d)
  mkdir -p "$H/include" "$H/lib"
  cp "$cuda/include/nccl.h" "$H/include/" # NVIDIA's 2.28 header: no device API
  cp "$B/lib/libnccl.so.2" "$H/lib/" && ln -s libnccl.so.2 "$H/lib/libnccl.so"
  make -C "$NCCL_TESTS_SRC" -j2 MPI=0 NCCL_HOME="$H" CUDA_HOME="$cuda" CUDARTLIB=cudart \
    NVCC_GENCODE="${gencode[*]}" >/dev/null
  for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter; do
    cp "$NCCL_TESTS_SRC/build/${t}_perf" "$C/nccl-tests/"
  done
fi
find "$C/bin" "$C/nccl-tests" -type f ! -name '*.fatbin' -exec strip {} +
strip "$C/lib/libnccl.so.2"
# nccl-tests' nine binaries each embed its verification kernels (36 MB in all,
# a tenth of that compressed): they travel packed, run_all.sh unpacks them
if [ -n "$(ls "$C/nccl-tests")" ]; then
  tar -cJf "$C/nccl-tests.tar.xz" -C "$C" nccl-tests
fi
rm -rf "$C/nccl-tests"
kb=$(du -sk "$C" | cut -f1)
echo "$C: $((kb / 1024)) MiB ($(ls "$C/bin" | wc -l) files in bin, kernels: ${gencode[*]})"
if [ "$kb" -gt $((max_mb * 1024)) ]; then
  echo "$C is over $max_mb MiB: with the tree it may not fit the 64 MiB a GPU run carries"
  exit 1
fi
