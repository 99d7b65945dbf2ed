#!/usr/bin/env bash
# Every nccl-tests-compatible *_perf tool, 3 ranks as threads, a few sizes,
# every root: it must exit 0 and report "Out of bounds values : 0 OK" (no
# #wrong anywhere) — the checks nccl-tests users read. On host buffers, and
# where the simulated CUDA driver is built, on device buffers (--mem device,
# 3 ranks on one device); --mem device without a driver, or with one the
# library cannot use, must fail, clearly.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
fail=0
sim="$build/tests/libcudasim.so"
run_tool() { # tool mem
  local tool=$1 mem=$2 name out rc
  name=$(basename "$tool")
  out=$(timeout 120 env ${BRAID_CUDA_LIB:+BRAID_CUDA_LIB=$BRAID_CUDA_LIB} "$tool" --mem "$mem" \
    -t 3 -b 8 -e 256K -f 8 -c 1 -r -1 -w 1 -n 2 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
    echo "FAILED: $name --mem $mem (exit $rc)"
    echo "$out" | tail -20
    fail=1
  else
    echo "ok: $name --mem $mem ($(grep -c '^ *[0-9]' <<<"$out") rows)"
  fi
}
for tool in "$build"/bin/*_perf; do
  case "$(basename "$tool")" in mpi_*) continue ;; esac
  BRAID_CUDA_LIB= run_tool "$tool" host
  [ -f "$sim" ] && BRAID_CUDA_LIB=$sim run_tool "$tool" device
done
out=$(BRAID_CUDA_LIB=/nonexistent/libcuda.so.1 "$build/bin/all_reduce_perf" --mem device 2>&1)
if [ $? -eq 0 ] || ! grep -q -- "--mem device: no CUDA driver" <<<"$out"; then
  echo "FAILED: --mem device without a driver must fail with a clear error, got: $out"
  fail=1
else
  echo "ok: --mem device without a driver: $(head -1 <<<"$out")"
fi
# A driver the tool can use but the library cannot (an entry point it needs
# is missing): ncclMemAlloc hands out host memory, and the tool says so.
if [ -f "$sim" ]; then
  out=$(CUDASIM_HIDE=cuMemHostRegister BRAID_CUDA_LIB=$sim timeout 60 \
    "$build/bin/all_reduce_perf" --mem device -t 2 -b 8 -e 8 2>&1)
  if [ $? -eq 0 ] || ! grep -q -- "--mem device, but ncclMemAlloc gave host memory" <<<"$out"; then
    echo "FAILED: --mem device on a library without a device path must fail, got: $out"
    fail=1
  else
    echo "ok: --mem device, library without a device path: $(grep -- '--mem device' <<<"$out")"
  fi
fi
exit $fail
