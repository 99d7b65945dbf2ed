#!/bin/bash
# Everything Braid checks on a real GPU, in one run (issue 32's list, most
# important first, every log written under $OUT as it goes so that a run cut
# short keeps what it did):
#   1. tests   the device-buffer tests and CUDA IPC on the real driver, the
#              kernel bitwise against the CPU kernels (rows included)
#   2. perf    perf/gpu_bench.sh: the kernel next to the copy and torch.add,
#              the direct all-reduce with 2/4/8 processes against B/(2k),
#              staged and the tuner's choice, all-gather/reduce-scatter
#   3. torch   PyTorch's NCCL process group on Braid, 2 and 4 processes on
#              cuda:0, and a 256 MiB all_reduce against gloo
#   4. sanitizer  memcheck, racecheck, synccheck on the kernel check and on a
#              2-process direct all-reduce (side by side: correctness only)
#   5. nccl    nccl-tests on Braid's libnccl.so.2, 2 ranks as threads
# Binaries come from tests/gpu/prepare.sh, run where they were built:
#
#   tests/gpu/prepare.sh                # here: builds gpu_carry/
#   OUT=/tmp/gpu tests/gpu/run_all.sh   # on the GPU machine, gpu_carry/ beside
#
# Each step has its own time limit and the run goes on after a failure.
# PARTS picks what runs (default all): tests perf torch sanitizer nccl, and
# diagnose (tests/gpu/diagnose_gate.sh, first when named). TORCH_WORLDS (default
# "2 4") and TORCH_ENV (more environment for the torch runs) shape the torch
# part; SAN_DIRECT=0 leaves the direct all-reduce out of the sanitizer part.
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
export PYTHONUNBUFFERED=1
SUM="$OUT/summary.txt"
PARTS=${PARTS:-tests perf torch sanitizer nccl}
want() { [[ " $PARTS " == *" $1 "* ]]; }
step() { # name limit_s logfile command...
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$(date +%s%N)
  echo "=== $name: $*" >>"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  printf '%-44s rc=%-3d %4d.%03d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$SUM"
}
T0=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "bundled nccl", torch.cuda.nccl.version())'
  ldd "$C/bin/mp_test_device" | grep -E "cmocka|not found"
} >"$OUT/system.txt" 2>&1

K="$C/bin/kern_bitwise $C/bin/reduce.fatbin"
want diagnose && step "diagnose_gate.sh" 150 "$OUT/diag.txt" tests/gpu/diagnose_gate.sh "$C/dbg" "$OUT"
# 1. Braid's device tests on the real driver, the kernel bitwise
if want tests; then
  export BRAID_CUDA_LIB=libcuda.so.1
  step mp_test_device 150 "$OUT/tests.txt" "$C/bin/mp_test_device"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[  ERROR|^\[  FAILED  \]" "$OUT/tests.txt" >>"$SUM"
  step test_cuda_ipc 45 "$OUT/tests.txt" "$C/bin/test_cuda_ipc"
  unset BRAID_CUDA_LIB
  step "kern_bitwise check" 60 "$OUT/tests.txt" $K check
  grep -E "bitwise|differ" "$OUT/tests.txt" >>"$SUM"
fi
# 2. the figures, each next to its bound or peer from the same run
if want perf; then
  step "perf/gpu_bench.sh" 200 "$OUT/perf.txt" env THREADS=0 PROCS_TIMEOUT=60 perf/gpu_bench.sh "$C/bin"
  grep -E "bound|of the copy  |GB/s  |Avg bus|Out of bounds" "$OUT/perf.txt" >>"$SUM"
fi
# 3. PyTorch's process group on Braid, TUNING shows which algorithm ran
if want torch; then
  for n in ${TORCH_WORLDS:-2 4}; do
    step "torch.distributed $n processes ${TORCH_ENV:-}" 120 "$OUT/torch.txt" env LD_PRELOAD="$PWD/$C/lib/libnccl.so.2" \
      ${TORCH_ENV:-} NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING python3 tests/gpu/torch_dist.py $n
  done
  grep -E "torch_dist:|WRONG|DDP" "$OUT/torch.txt" >>"$SUM"
  echo "NCCL versions and the algorithms the torch runs took:" >>"$SUM"
  grep -o "NCCL version [^ ]*" "$OUT/torch.txt" | sort | uniq -c >>"$SUM"
  grep -oE "(AllReduce|AllGather|ReduceScatter|Broadcast)[^:]*bytes nranks [0-9]+: [A-Za-z]+" "$OUT/torch.txt" |
    sed -E 's/ [0-9]+ bytes/ N bytes/' | sort | uniq -c >>"$SUM"
fi
# 4. compute-sanitizer on the kernel check and on a 2-process direct all-reduce
# (each side by side with the others: these are correctness runs)
if want sanitizer; then
  for tool in memcheck racecheck synccheck; do
    step "sanitizer $tool kern_bitwise small" 150 "$OUT/sanitizer.txt" \
      compute-sanitizer --tool $tool --error-exitcode 9 $K small &
    [ "${SAN_DIRECT:-1}" = 0 ] ||
      step "sanitizer $tool direct all_reduce 2 procs" 150 "$OUT/sanitizer.txt" tests/gpu/san_allreduce.sh $tool "$C/bin" "$OUT" &
  done
  wait
  for f in "$OUT"/san_*.log; do echo "=== $f" && cat "$f"; done >>"$OUT/sanitizer.txt" 2>/dev/null
  rm -f "$OUT"/san_*.log
  grep -E "ERROR SUMMARY|wrong|Out of bounds" "$OUT/sanitizer.txt" | sort | uniq -c >>"$SUM"
fi
# 5. nccl-tests on Braid: 2 ranks on the one GPU as threads (no MPI here; nccl-tests puts
# thread t on device t, so a preloaded shim maps every device number onto device 0),
# then one rank with -d all
NT="$C/nccl-tests"
[ -f "$C/nccl-tests.tar.xz" ] && tar -xJf "$C/nccl-tests.tar.xz" -C "$C"
if want nccl && [ -x "$NT/all_reduce_perf" ]; then
  for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter; do
    step "nccl-tests ${t}_perf -t 2" 60 "$OUT/nccl_tests.txt" env NCCL_DEBUG=VERSION \
      LD_PRELOAD="$PWD/$C/lib/set_device_shim.so" "$NT/${t}_perf" -t 2 -b 8 -e 64M -f 4 -c 1 -n 3 -w 1
  done
  step "nccl-tests all_reduce -d all" 60 "$OUT/nccl_tests.txt" "$NT/all_reduce_perf" -b 8 -e 1M -f 8 -c 1 -n 3 -w 1 -d all
  grep -E "wrong|Out of bounds|Avg bus" "$OUT/nccl_tests.txt" | sort | uniq -c >>"$SUM"
fi
echo "run_all: $(($(date +%s) - T0)) s" >>"$SUM"
cat "$SUM"
