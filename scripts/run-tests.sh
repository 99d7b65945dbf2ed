#!/usr/bin/env bash
# Run every unit and multi-process test binary under BUILD/tests (braid-train's
# included) and the scripts in tests/abi, tests/launch, tests/trainer and tests/cluster, each with
# a wall-clock limit so a hang fails instead of stalling CI; summarize.
#
# The cluster scripts run beside the others, from the start: they spend nearly all their
# time waiting on rate-limited links inside their own network namespaces (a fifth of a
# core), so they share no port, name or file with the rest and take little from it.
# Their output is printed when they end. BRAID_TEST_SERIAL=1 runs everything in turn.
set -uo pipefail
# Open MPI's PMIx authenticates its clients through munge when libmunge is installed (Debian's
# libpmix links it); with munge's socket present but no daemon (Slurm installed, munged stopped)
# every mpirun and orted retries it for 2.3 s, which made the cluster tests miss their limit.
# The native check (the peer's uid on the local socket) is what PMIx uses without munge.
export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
build=${1:-build}
limit=${BRAID_TEST_LIMIT_S:-600}
pass=0 fail=0 failed=()
start=$(date +%s)
top=$(cd "$(dirname "$0")/.." && pwd)

# run_one PATH: runs one test with the limit, its output on stdout; returns its status
run_one() {
  local t=$1 name t0 rc args=()
  name=$(basename "$t")
  t0=$(date +%s)
  echo "=== $name"
  case "$t" in *.sh) args=("$build") ;; */test_abi) args=("$build/lib/libnccl.so.2") ;; esac
  timeout -k 10 "$limit" "$t" "${args[@]}"
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "=== $name ok ($(($(date +%s) - t0)) s)"
  else
    echo "=== $name FAILED rc=$rc ($(($(date +%s) - t0)) s)"
  fi
  return $rc
}

count() { # count NAME STATUS
  if [ "$2" -eq 0 ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    failed+=("$1")
  fi
}

side=() main=()
for t in "$build"/tests/test_* "$build"/tests/mp_test_* "$top"/tests/abi/*.sh "$top"/tests/launch/*.sh \
  "$top"/tests/trainer/*.sh "$top"/tests/cluster/*.sh; do
  [ -x "$t" ] || continue
  case "$t" in
    "$top"/tests/cluster/*) [ "${BRAID_TEST_SERIAL:-0}" = 1 ] && main+=("$t") || side+=("$t") ;;
    *) main+=("$t") ;;
  esac
done

side_dir=$(mktemp -d)
trap 'rm -rf "$side_dir"' EXIT
side_pids=()
for i in "${!side[@]}"; do
  (run_one "${side[$i]}" >"$side_dir/$i.log" 2>&1) &
  side_pids+=($!)
done

for t in "${main[@]}"; do
  run_one "$t"
  rc=$? # before count's arguments: "$(basename ...)" would reset $? to 0 first
  count "$(basename "$t")" "$rc"
done

for i in "${!side[@]}"; do
  wait "${side_pids[$i]}"
  rc=$?
  cat "$side_dir/$i.log"
  count "$(basename "${side[$i]}")" $rc
done

echo
echo "test binaries: ${#failed[@]} failed: ${failed[*]:-none}; total $(($(date +%s) - start)) s"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
