#!/bin/bash
# Everything Braid checks on a real GPU, in one run (issue 18's list):
# the device-buffer tests on the real driver, the kernel bitwise against the
# CPU and under compute-sanitizer, the kernel's bandwidth next to a copy and
# torch.add, nccl-tests on Braid's libnccl.so.2, and PyTorch's NCCL process
# group with 2 processes on cuda:0. Logs go to $OUT (a few files; see the
# end). Binaries come from tests/gpu/prepare.sh, run where they were built:
#
#   tests/gpu/prepare.sh            # here: builds gpu_carry/
#   OUT=/tmp/gpu tests/gpu/run_all.sh   # on the GPU machine, gpu_carry/ beside
#
# Each step has its own time limit and the run goes on after a failure.
# PARTS picks what runs (default all): tests torch perf nccl kernel.
set -u
cd "$(dirname "$0")/../.."
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run_all.sh: no GPU visible (nvidia-smi -L failed): skipped"
  exit 0
fi
C=${CARRY:-gpu_carry}
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$PWD/$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
SUM="$OUT/summary.txt"
PARTS=${PARTS:-tests torch perf nccl kernel}
want() { [[ " $PARTS " == *" $1 "* ]]; }
step() { # name limit_s logfile command...
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$(date +%s%N)
  echo "=== $name: $*" >>"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  printf '%-40s rc=%-3d %4d.%03d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$SUM"
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "bundled nccl", torch.cuda.nccl.version())'
  ldd "$C/bin/mp_test_device" | grep -E "cmocka|not found"
} >"$OUT/system.txt" 2>&1

# 1. Braid's device tests on the real driver
export BRAID_CUDA_LIB=libcuda.so.1
want tests && step mp_test_device 150 "$OUT/tests.txt" "$C/bin/mp_test_device"
want tests && step test_cuda_ipc 60 "$OUT/tests.txt" "$C/bin/test_cuda_ipc"

# 2. PyTorch's process group, 2 processes on cuda:0, Braid preloaded
unset BRAID_CUDA_LIB
want torch && step "torch.distributed" 150 "$OUT/torch.txt" env LD_PRELOAD="$PWD/$C/lib/libnccl.so.2" NCCL_DEBUG=INFO python3 tests/gpu/torch_dist.py
# 3. perf/gpu_bench.sh: the kernel next to a copy and torch.add, every type, Braid's
# all_reduce_perf on device buffers with 2 and 4 ranks (threads) on the one GPU, and the
# direct algorithm with 2, 4 and 8 processes
want perf && step "perf/gpu_bench.sh" 480 "$OUT/perf.txt" perf/gpu_bench.sh "$C/bin"
grep -E "Out of bounds|Avg bus|of the copy|torch.add" "$OUT/perf.txt" >>"$SUM" 2>/dev/null

# 4. nccl-tests on Braid: 2 ranks on the one GPU as threads (no MPI here; nccl-tests puts
# thread t on device t, so a preloaded shim maps every device number onto device 0), then
# one rank with -d all
NT="$C/nccl-tests"
for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter; do
  want nccl && step "nccl-tests ${t}_perf -t 2" 60 "$OUT/nccl_tests.txt" env NCCL_DEBUG=VERSION \
    LD_PRELOAD="$PWD/$C/lib/set_device_shim.so" "$NT/${t}_perf" -t 2 -b 8 -e 256M -f 4 -c 1 -n 5 -w 2
done
want nccl && step "nccl-tests all_reduce -d all" 120 "$OUT/nccl_tests.txt" "$NT/all_reduce_perf" -b 8 -e 1M -f 8 -c 1 -n 3 -w 1 -d all
grep -E "wrong|Out of bounds|Avg bus" "$OUT/nccl_tests.txt" | sort | uniq -c >>"$SUM"

# 5. the kernel: bitwise against the CPU kernels, and under compute-sanitizer
if want kernel; then
K="$C/bin/kern_bitwise $C/bin/reduce.fatbin"
step kern_bitwise 90 "$OUT/kernel.txt" $K
for tool in memcheck racecheck synccheck; do
  step "sanitizer $tool" 90 "$OUT/kernel.txt" compute-sanitizer --tool $tool --error-exitcode 9 $K small
done
fi

echo "NCCL version lines in the torch run:" >>"$SUM"
grep -o "NCCL version [^ ]*" "$OUT/torch.txt" | sort | uniq -c >>"$SUM"
grep -E "torch_dist:|WRONG|DDP" "$OUT/torch.txt" >>"$SUM"
grep -E "PASSED|FAILED|OK \]" "$OUT/tests.txt" | tail -20 >>"$SUM"
grep -E "ERROR SUMMARY|bitwise|GB/s|torch.add" "$OUT/kernel.txt" >>"$SUM" 2>/dev/null
cat "$SUM"
