#!/usr/bin/env bash
# Every nccl-tests-compatible *_perf tool, 3 ranks as threads, a few sizes,
# every root: it must exit 0 and report "Out of bounds values : 0 OK" (no
# #wrong anywhere) — the checks nccl-tests users read.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
fail=0
for tool in "$build"/bin/*_perf; do
  name=$(basename "$tool")
  case "$name" in mpi_*) continue ;; esac
  out=$(timeout 120 "$tool" -t 3 -b 8 -e 256K -f 8 -c 1 -r -1 -w 1 -n 2 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "Out of bounds values : 0 OK" <<<"$out"; then
    echo "FAILED: $name (exit $rc)"
    echo "$out" | tail -20
    fail=1
  else
    echo "ok: $name ($(grep -c '^ *[0-9]' <<<"$out") rows)"
  fi
done
exit $fail
