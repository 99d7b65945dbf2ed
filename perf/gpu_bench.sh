#!/bin/bash
# The device path's figures on a real GPU, each next to its bound or peer
# measured in the same run: the fused reduce-copy kernel (2-source float
# sum, 256 MiB, bytes read + written) next to a device-to-device copy and to
# PyTorch's torch.add of the same tensors (where PyTorch is installed), the
# kernel on every type next to the copy and to torch.add of that type (a
# table at the end of the kernel's part), all_reduce_perf on device buffers with 2 and 4
# ranks (threads) on one GPU, and all_reduce, all_gather and reduce_scatter
# _perf with 2, 4 and 8 ranks as processes on one GPU on the direct
# algorithm, 8 B..1 GiB (and 2 ranks staged and on the tuner's choice): an all-reduce of S bytes on k ranks moves at
# least 2kS bytes through device memory, so its algbw is at most B/(2k),
# B the device copy's rate above (bytes read + written).
#
#   perf/gpu_bench.sh [bindir]
#
# THREADS=0 leaves out the runs with ranks as threads (staged calls only);
# PROCS_TIMEOUT (default 120 s) bounds each run of processes, PROCS_MAX
# (default 1G) the largest size of the Direct runs.
#
# bindir holds kern_bitwise, reduce.fatbin and all_reduce_perf (default:
# gpu_carry/bin from tests/gpu/prepare.sh, else build/bin and the kernel
# check built here with nvcc). Without a GPU it says so and exits 0.
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=${1:-gpu_carry/bin}
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_bench: no GPU visible (nvidia-smi -L failed): skipped"
  exit 0
fi
if [ ! -x "$BIN/kern_bitwise" ]; then
  BIN=build/gpu-bench
  mkdir -p "$BIN"
  make -j lib tools >/dev/null && cp build/bin/all_reduce_perf build/bin/all_gather_perf \
    build/bin/reduce_scatter_perf build/obj/kernels/cuda/reduce.fatbin "$BIN/" &&
    nvcc -O2 -arch=sm_90 -Ikernels -Iinclude -Icommon -Itests -o "$BIN/kern_bitwise" \
      tests/gpu/kern_bitwise.cu build/lib/libbraid.a -L/usr/local/cuda/lib64/stubs -lcuda -lpthread -lm ||
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "--- the kernel (bound: the device copy; peer: torch.add)"
k=$(mktemp)
"$BIN/kern_bitwise" "$BIN/reduce.fatbin" bw | grep -v "threads x" | tee "$k"
{ python3 tests/gpu/torch_add.py 2>/dev/null || echo "torch.add: PyTorch not installed"; } | tee -a "$k"
# every type side by side: the kernel's 2-source sum against the copy and torch.add (same run)
awk '/^fused 2-source [a-z0-9]+ sum, 256 MiB:/ { sub(",", "", $3); gbs[$3] = $(NF-5); cp[$3] = $(NF-3); n[++t] = $3 }
     /^torch.add [a-z0-9]+, 256 MiB:/ { sub(",", "", $2); th[$2] = $8 }
     END { for (i = 1; i <= t; i++) printf "%-7s %5d GB/s  %s of the copy  %s\n", n[i], gbs[n[i]], cp[n[i]],
             (n[i] in th) ? sprintf("%.2f of torch.add (%d GB/s)", gbs[n[i]] / th[n[i]], th[n[i]]) : "" }' "$k"
copy=$(awk '/^device-to-device copy, 256 MiB:/ { print $(NF-6); exit }' "$k")
rm -f "$k"
if [ -n "$copy" ]; then
  for n in 2 4 8; do
    echo "all-reduce bound, $n ranks on this GPU: algbw <= B/(2k) = $copy/$((2 * n)) = $((copy / (2 * n))) GB/s"
  done
fi
for n in $([ "${THREADS:-1}" = 0 ] || echo 2 4); do
  echo "--- all_reduce_perf on device buffers, $n ranks as threads on one GPU"
  "$BIN/all_reduce_perf" -t "$n" --mem device -b 8 -e 256M -f 4 -n 10 -w 3 | grep -E "^ +[0-9]|Out of|Avg"
done

# k processes launched as torchrun would (RANK, WORLD_SIZE, NCCL_COMM_ID),
# NCCL_ALGO=algo ("" for the tuner's choice), up to `max` bytes; rank 0's
# table is printed.
procs_perf() { # tool k [algo [max]]
  local tool=$1 k=$2 algo=${3-Direct} max=${4:-${PROCS_MAX:-1G}} port=$((29500 + RANDOM % 1000)) r out
  out=$(mktemp -d)
  for ((r = 0; r < k; r++)); do
    NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=$k NCCL_ALGO=$algo \
      timeout "${PROCS_TIMEOUT:-120}" stdbuf -oL "$BIN/$tool" --mem device -b 8 -e "$max" -f 4 -n 10 -w 3 >"$out/$r.log" 2>"$out/$r.err" &
  done
  wait
  # the table, and each of the tuner's device verdicts once (with NCCL_DEBUG_SUBSYS=TUNING)
  awk '/on devices: Direct/ { sub(/.*NCCL INFO /, ""); if (!seen[$0]++) print }' "$out/0.err"
  grep -E "^ +[0-9]|Out of|Avg" "$out/0.log" || tail -5 "$out/0.log" "$out/0.err"
  rm -rf "$out"
}
for n in 2 4 8; do
  echo "--- all_reduce_perf, $n processes on one GPU, NCCL_ALGO=Direct (bound: algbw <= B/(2k))"
  procs_perf all_reduce_perf "$n"
done
for tool in all_gather_perf reduce_scatter_perf; do
  echo "--- $tool, 4 processes on one GPU, NCCL_ALGO=Direct"
  procs_perf "$tool" 4
done
# The tuner's device model (src/tune/tuner_device.c) against both sides of its
# choice: staged through host memory, and its own pick per size.
echo "--- all_reduce_perf, 2 processes on one GPU, NCCL_ALGO=^Direct (staged)"
procs_perf all_reduce_perf 2 "^Direct" "${PROCS_MAX:-64M}"
echo "--- all_reduce_perf, 2 processes on one GPU, the tuner's choice"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING procs_perf all_reduce_perf 2 "" "${PROCS_MAX:-64M}"
