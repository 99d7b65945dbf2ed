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
# (both through the loopback here), and the CPU time each path spends per
# message (the emulated HCA's own work taken out).
#
#   perf/ib_emul.sh [build]
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
FV=$(pwd)/$B/tests/fakeverbs/libibverbs.so.1
[ -f "$FV" ] || { echo "ib_emul: no $FV (built without <infiniband/verbs.h>)"; exit 0; }
ITERS=20
CHUNK=$((64 * 1024)) # BRAID_CHUNK_SIZE's default: the ring's message at most

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
echo "#  the receiver's announcement); ring_min: 2(n-1) x ceil(S/n / 64 KiB), the"
echo "#  fewest a ring could send; the counts include the tool's start-up calls"
echo "# 8 B all-reduce, 2 ranks, out-of-place time (us): NET/IB vs NET/Socket in the same run"
for net in IB Socket; do
  stats=/dev/null
  printf "  %-7s %s\n" "$net" "$(run $net 2 8 | awk '{ print $6 }')"
done

# cpu NET iters: 2 ranks, iters 8 B all-reduces, no spinning (BRAID_SPIN_US=0: a
# waiter sleeps at once, so CPU time is work, not polling); prints the two
# ranks' user+sys seconds summed, and the HCA threads' (from $stats).
cpu() {
  local net=$1 iters=$2 port=$((29500 + RANDOM % 1000)) r out
  out=$(mktemp -d)
  for ((r = 0; r < 2; r++)); do
    env NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=2 NCCL_NET=$net NCCL_SHM_DISABLE=1 \
      NCCL_ALGO=Ring BRAID_SPIN_US=0 BRAID_IBVERBS_LIB="$FV" FAKEVERBS_HCAS=mlx5_0:1 \
      FAKEVERBS_STATS="$stats" /usr/bin/time -f "%U %S" -o "$out/t$r" \
      timeout 300 "$B/bin/all_reduce_perf" -b 8 -e 8 -n "$iters" -w 0 -c 0 -d float >/dev/null 2>&1 &
  done
  wait
  cat "$out"/t0 "$out"/t1 | awk '{ s += $1 + $2 } END { printf "%.3f", s }'
  rm -rf "$out"
}
if [ -x /usr/bin/time ]; then
  N=2000
  stats=$(mktemp)
  ib_cpu=$(cpu IB $N)
  read -r ib_req ib_hca < <(awk '{ r += $2; h += $4 } END { printf "%d %.3f", r, h / 1e9 }' "$stats")
  rm -f "$stats"
  stats=/dev/null
  sock_cpu=$(cpu Socket $N)
  # the same schedule on both networks: as many messages on each
  awk -v ic="$ib_cpu" -v ih="$ib_hca" -v req="$ib_req" -v sc="$sock_cpu" -v n=$N 'BEGIN {
    msgs = req / 2
    printf "# CPU per message, 2 ranks x 2 x %d 8 B all-reduces (in and out of place; %d messages\n#  in all), user+sys of\n", n, msgs
    printf "#  both processes; for NET/IB less the emulated HCA threads'"'"' %.3f s, which a NIC does;\n", ih
    printf "#  its posts stay in: each is a socket write here, a doorbell on a NIC)\n"
    printf "  IB      %.1f us   (%.3f s - %.3f s)\n", (ic - ih) / msgs * 1e6, ic, ih
    printf "  Socket  %.1f us   (%.3f s; the kernel'"'"'s TCP work in softirq is not all counted)\n", sc / msgs * 1e6, sc }'
fi
