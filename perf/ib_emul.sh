#!/bin/bash
# The verbs transport (NET/IB) under the verbs emulation, as issue 19 asks
# for a report (not a test: no RDMA hardware here, so no throughput figure
# means much). For a Ring all-reduce of S bytes on n ranks (processes,
# NCCL_SHM_DISABLE=1 so every pair takes the network), from the emulation's
# counters (FAKEVERBS_STATS): the requests and payload bytes each rank put
# on the wire per all-reduce, next to the ring's count (2(n-1)/n x S bytes
# per rank, in messages of at most one chunk: 2(n-1) x ceil(S/n/chunk),
# each with the receiver's announcement beside it). Then the cost of an 8 B
# all-reduce on 2 ranks over NET/IB and over NET/Socket in the same run
# (the CPU's work per message, both through the loopback here).
#
#   perf/ib_emul.sh [build]
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
FV=$(pwd)/$B/tests/fakeverbs/libibverbs.so.1
[ -f "$FV" ] || { echo "ib_emul: no $FV (built without <infiniband/verbs.h>)"; exit 0; }
ITERS=20
CHUNK=$((128 * 1024)) # BRAID_CHUNK_SIZE's default: the ring's message at most

# run NET n bytes [env...]: n processes, rank 0's table line; stats into $stats
run() {
  local net=$1 n=$2 bytes=$3 port=$((29500 + RANDOM % 1000)) r out
  shift 3
  out=$(mktemp -d)
  for ((r = 0; r < n; r++)); do
    env NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=$n NCCL_NET=$net NCCL_SHM_DISABLE=1 \
      NCCL_ALGO=Ring BRAID_IBVERBS_LIB="$FV" FAKEVERBS_HCAS=mlx5_0:1 FAKEVERBS_STATS="$stats" "$@" \
      timeout 300 "$B/bin/all_reduce_perf" -b "$bytes" -e "$bytes" -n $ITERS -w 0 -c 0 -d float --inplace 0 \
      >"$out/$r" 2>&1 &
  done
  wait
  grep -E "^ +[0-9]" "$out/0" | head -1
  rm -rf "$out"
}

echo "# NET/IB under the emulation: per rank per all-reduce (Ring, float sum, $ITERS iterations)"
printf "# %5s %10s %9s %9s %11s %11s %10s\n" ranks bytes ranks_seen messages ring_min bytes_on_wire ring_bytes
for n in 2 4; do
  for s in $((1 << 20)) $((16 << 20)); do
    stats=$(mktemp)
    run IB $n $s >/dev/null
    read -r seen req byt < <(awk '{ k++; r += $2; b += $3 } END { printf "%d %d %d", k, r, b }' "$stats")
    rm -f "$stats"
    awk -v n=$n -v s=$s -v it=$ITERS -v seen="$seen" -v req="$req" -v byt="$byt" -v c=$CHUNK 'BEGIN {
      seg = s / n; per = seg > c ? int((seg + c - 1) / c) : 1
      printf "  %5d %10d %9d %9.1f %11d %11.0f %10.0f\n", n, s, seen, req / 2 / seen / it,
             2 * (n - 1) * per, byt / seen / it, 2 * (n - 1) / n * s }'
  done
done
echo "# messages: requests / 2 (each message is the sender's write with immediate and"
echo "#  the receiver's announcement); ring_min: 2(n-1) x ceil(S/n / 128 KiB), the"
echo "#  fewest a ring could send; the counts include the tool's start-up calls"
echo "# 8 B all-reduce, 2 ranks, out-of-place time (us): NET/IB vs NET/Socket in the same run"
for net in IB Socket; do
  stats=/dev/null
  printf "  %-7s %s\n" "$net" "$(run $net 2 8 | awk '{ print $6 }')"
done
