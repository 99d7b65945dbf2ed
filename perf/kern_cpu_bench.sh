#!/bin/bash
# The CPU reduction kernels per type on every ISA path this CPU has, next to
# memcpy on the same buffers (tests/bench/kern_cpu_bench.c: a two-source
# sum, ns per element and per byte, and the ratio to float's time per byte;
# then a 4-source float fold without and with swap bits).
#
#   perf/kern_cpu_bench.sh [bytes per buffer (default 64 MiB)] [reps (5)]
#
# Builds the library first if it is missing (BUILD, default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
[ -f "$B/lib/libbraid.a" ] || make -j2 lib >/dev/null
mkdir -p "$B/bin"
${CC:-cc} -std=c11 -O2 -Iinclude -Icommon -Ikernels tests/bench/kern_cpu_bench.c \
  -o "$B/bin/kern_cpu_bench" "$B/lib/libbraid.a" -pthread -ldl -lm
grep -m1 'model name' /proc/cpuinfo || true
"$B/bin/kern_cpu_bench" "${1:-$((64 << 20))}" "${2:-5}"
