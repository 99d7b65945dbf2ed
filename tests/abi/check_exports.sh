#!/usr/bin/env bash
# Braid's libnccl.so.2 exports every function NVIDIA's does: the 2.32.3
# list committed beside this script, and the toolkit's installed library
# (2.28.9 here) when there is one; each with its pnccl* alias. And the
# library needs nothing at load beyond libc, libm, libpthread, libdl, librt.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
lib="$build/lib/libnccl.so.2"
fail=0
exports=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
has() { grep -qx "$1" <<<"$exports"; }

check_list() { # $1: where the names came from; names on stdin
  local n=0 missing=0
  while read -r name; do
    [ -z "$name" ] && continue
    n=$((n + 1))
    if ! has "$name"; then echo "missing: $name ($1)"; missing=$((missing + 1)); fi
    if [ "$name" != ncclResetDebugInitInternal ] && ! has "p$name"; then
      echo "missing alias: p$name ($1)"
      missing=$((missing + 1))
    fi
  done
  echo "exports vs $1: $n names, $missing missing"
  [ "$missing" -eq 0 ] || fail=1
}

grep -v '^#' "$top/tests/abi/nccl-2.32.3.exports" | check_list "NCCL 2.32.3"
for nv in /usr/local/cuda/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
  if [ -f "$nv" ] && ! nm -D --defined-only "$nv" | grep -q braid; then
    nm -D --defined-only "$nv" | awk '{print $3}' | grep '^nccl' | sort -u | check_list "$nv"
  fi
done

for l in "$lib" "$build/lib/libbraid.so"; do
  needed=$(readelf -d "$l" | awk '/NEEDED/ {gsub(/[\[\]]/, "", $5); print $5}')
  for n in $needed; do
    case "$n" in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
      *) echo "$(basename "$l") NEEDs beyond the C runtime: $n"; fail=1 ;;
    esac
  done
  echo "$(basename "$l") NEEDED: $(echo $needed)"
done
exit $fail
