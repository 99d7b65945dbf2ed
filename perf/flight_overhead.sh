#!/usr/bin/env bash
# What the flight recorder costs a small call: all_reduce_perf at 8 B on NRANKS ranks (threads of
# one process), the recorder on (BRAID_FLIGHT_ENTRIES default) and off (0).
#  1. Latency: rounds alternating off and on, so that both see the same machine; every round's
#     out-of-place and in-place times, then the medians of each side.
#  2. CPU (where `perf` works): the share of CPU samples in the recorder's functions (flight_*),
#     on against off, from `perf record` of one long run each: what recording adds to each call,
#     without the scheduling noise that dominates the latency of 8 ranks on a few cores.
# The bar: within 2% of the recorder off.
#
# Usage: perf/flight_overhead.sh [BUILD]     env: ROUNDS=10 ITERS=5000 NRANKS=8
set -u
build=${1:-build}
rounds=${ROUNDS:-10}
iters=${ITERS:-5000}
nranks=${NRANKS:-8}
tool=$build/bin/all_reduce_perf
[ -x "$tool" ] || {
  echo "flight_overhead: no $tool (make tools)" >&2
  exit 2
}
run() { # entries [iters] -> the tool's output
  BRAID_FLIGHT_ENTRIES=$1 "$tool" -t "$nranks" -b 8 -e 8 -n "${2:-$iters}" -w 500 -c 0 2>&1
}
times() { awk '$1 == 8 { print $6, $10 }'; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

off=() on=()
echo "## latency, us (out-of-place in-place), $nranks ranks, 8 B, $iters iterations a run"
echo "round  off            on"
for r in $(seq 1 "$rounds"); do
  a=$(run 0 | times)
  b=$(run 256 | times)
  echo "$r      $a    $b"
  off+=($a) on+=($b)
done
m_off=$(median "${off[@]}")
m_on=$(median "${on[@]}")
awk -v a="$m_off" -v b="$m_on" \
  'BEGIN { printf "medians: off %.2f us, on %.2f us (%+.1f%%)\n", a, b, (b - a) / a * 100 }'

if perf record -q -o /dev/null true >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  echo "## CPU share of the recorder's functions (perf record, $((iters * 4)) iterations)"
  for e in 0 256; do
    perf record -q -o "$tmp/p$e" -- env BRAID_FLIGHT_ENTRIES=$e "$tool" -t "$nranks" -b 8 -e 8 \
      -n $((iters * 4)) -w 500 -c 0 >/dev/null 2>&1
    share=$(perf report -i "$tmp/p$e" --no-children --sort symbol 2>/dev/null |
      awk '$3 ~ /^flight_/ { s += $1 } END { printf "%.2f", s }')
    echo "entries $e: flight_* ${share}% of the samples"
  done
  rm -rf "$tmp"
else
  echo "## CPU share: skipped (perf record does not work here)"
fi
