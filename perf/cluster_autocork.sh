#!/usr/bin/env bash
# A frame's tail on rate-limited links: recursive doubling (or ALGO) all-reduces on an emulated
# cluster (scripts/cluster.sh, tbf-shaped host links), with every host's net.ipv4.tcp_autocorking
# on (Linux's default) and off, alternating, ROUNDS times; prints each round's time per size.
# Autocorking holds a write's last small segment while the socket's earlier segments wait in the
# host's queue; before the TCP transport pushed its last frame out (socket_push), that tail held
# 256 KiB and 512 KiB calls 5x past the wire's time with autocorking on (docs/simulator.md,
# "Calibration"). With the push both columns agree. Needs root (network namespaces).
#
# Usage: perf/cluster_autocork.sh [BUILD_DIR]      (default build; uses BUILD_DIR/bin/all_reduce_perf)
# Environment: NODES=4 RPN=1 RATE=1gbit ALGO=RecDoubling MIN=128K MAX=1M ITERS=50 ROUNDS=3
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-build}
NODES=${NODES:-4} RPN=${RPN:-1} RATE=${RATE:-1gbit} ALGO=${ALGO:-RecDoubling}
MIN=${MIN:-128K} MAX=${MAX:-1M} ITERS=${ITERS:-50} ROUNDS=${ROUNDS:-3}
CLUSTER=$ROOT/scripts/cluster.sh
[ -x "$BUILD/bin/all_reduce_perf" ] || {
  echo "cluster_autocork: no $BUILD/bin/all_reduce_perf (make tools)" >&2
  exit 1
}
"$CLUSTER" check || exit 1
"$CLUSTER" up "$NODES" "$RATE" >/dev/null || exit 1
trap '"$CLUSTER" down >/dev/null' EXIT
mapfile -t ARGS < <("$CLUSTER" mpirun-args)
export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
hosts=""
for ((i = 0; i < NODES; i++)); do hosts+="${hosts:+,}h$i:$RPN"; done

# autocork 0|1: sets it in every host's network namespace (the setting is per namespace)
autocork() {
  for ((i = 0; i < NODES; i++)); do
    "$CLUSTER" exec "h$i" sysctl -q "net.ipv4.tcp_autocorking=$1"
  done
}

# run: "bytes us" per size of one all_reduce_perf sweep
run() {
  timeout 600 mpirun "${ARGS[@]}" -np $((NODES * RPN)) -host "$hosts" --mca btl self,vader,tcp \
    -x NCCL_ALGO="$ALGO" "$BUILD/bin/all_reduce_perf" -d float -o sum -b "$MIN" -e "$MAX" -f 2 \
    -n "$ITERS" -w 5 --inplace 0 -c 0 2>&1 | awk '!/^#/ && NF >= 13 { print $1, $6 }'
}

echo "# $ALGO all-reduce, $NODES hosts x $RPN at $RATE, $ITERS iterations: us per call"
printf "# %5s %10s %14s %14s\n" round bytes autocork=1 autocork=0
for ((r = 1; r <= ROUNDS; r++)); do
  autocork 1
  on=$(run)
  autocork 0
  off=$(run)
  paste -d ' ' <(echo "$on") <(echo "$off") |
    awk -v r="$r" '{ printf "  %5d %10s %14s %14s\n", r, $1, $2, $4 }'
done
