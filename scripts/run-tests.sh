#!/usr/bin/env bash
# Run every unit and multi-process test binary under BUILD/tests (braid-train's
# included) and the scripts in tests/abi, tests/launch, tests/trainer and tests/cluster, each with
# a wall-clock limit so a hang fails instead of stalling CI; summarize.
set -uo pipefail
build=${1:-build}
limit=${BRAID_TEST_LIMIT_S:-600}
pass=0 fail=0 failed=()
start=$(date +%s)
top=$(cd "$(dirname "$0")/.." && pwd)
for t in "$build"/tests/test_* "$build"/tests/mp_test_* "$top"/tests/abi/*.sh "$top"/tests/launch/*.sh \
  "$top"/tests/trainer/*.sh "$top"/tests/cluster/*.sh; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  t0=$(date +%s)
  echo "=== $name"
  args=()
  case "$t" in *.sh) args=("$build") ;; */test_abi) args=("$build/lib/libnccl.so.2") ;; esac
  if timeout -k 10 "$limit" "$t" "${args[@]}"; then
    pass=$((pass + 1))
    echo "=== $name ok ($(( $(date +%s) - t0 )) s)"
  else
    rc=$?
    fail=$((fail + 1))
    failed+=("$name")
    echo "=== $name FAILED rc=$rc ($(( $(date +%s) - t0 )) s)"
  fi
done
echo
echo "test binaries: ${#failed[@]} failed: ${failed[*]:-none}; total $(( $(date +%s) - start )) s"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
