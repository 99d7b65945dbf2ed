#!/bin/bash
# Why a gated device call hangs on a real GPU (issue 32's first run: 2
# processes on one GPU, staged and direct alike, never finish while the
# synchronous path does). Runs 2-process all-reduces, staged (^Direct) and
# Direct side by side, lets them hang, and dumps every thread's stack of each
# process (cuda-gdb attaches; /proc's wchan and syscall beside it), then the
# same staged run with more hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=32)
# and with the synchronous path (BRAID_STREAM_MEMOPS=0) to tell the causes
# apart. Everything goes to OUTDIR/diag.txt.
#
#   tests/gpu/diagnose_gate.sh BINDIR OUTDIR    (BINDIR: an unstripped all_reduce_perf)
set -u
bin=$1 out=$2
log=$out/diag.txt
w=$(mktemp -d)
start() { # name algo env...
  local name=$1 algo=$2 port=$((29500 + RANDOM % 1000)) r
  shift 2
  for r in 0 1; do
    env "$@" NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=2 NCCL_ALGO=$algo NCCL_DEBUG=INFO \
      NCCL_DEBUG_SUBSYS=INIT,TUNING,COLL stdbuf -oL "$bin/all_reduce_perf" --mem device -b 1M -e 1M \
      -n 2 -w 1 -c 1 >"$w/$name.$r.log" 2>&1 &
    echo $! >"$w/$name.$r.pid"
  done
}
stacks() { # name: both ranks' stacks, the two attaches side by side
  local r pid t attach=()
  for r in 0 1; do
    pid=$(cat "$w/$1.$r.pid")
    kill -0 "$pid" 2>/dev/null || continue
    timeout 45 cuda-gdb -p "$pid" -batch -ex "info threads" -ex "thread apply all bt 25" 2>&1 |
      grep -vE "^\[New Thread|^warning: |Reading symbols|^$" | head -300 >"$w/$1.$r.bt" &
    attach+=($!)
  done
  # the attaches only: a bare `wait` would wait for the hung ranks too (run 2 of
  # 2026-11-27 lost its stacks that way)
  [ ${#attach[@]} -gt 0 ] && wait "${attach[@]}"
  for r in 0 1; do
    pid=$(cat "$w/$1.$r.pid")
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "--- $1 rank $r: exited"
      continue
    fi
    echo "--- $1 rank $r (pid $pid): still running; threads (name wchan syscall):"
    for t in /proc/$pid/task/*; do
      echo "  $(basename "$t") $(cat "$t/comm") $(cat "$t/wchan") $(cut -d' ' -f1-3 "$t/syscall")"
    done
    cat "$w/$1.$r.bt"
  done
}
finish() { # name seconds: wait up to seconds for both ranks, report
  local name=$1 s=$2 r pid alive
  for ((i = 0; i < s * 10; i++)); do
    alive=0
    for r in 0 1; do kill -0 "$(cat "$w/$name.$r.pid")" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  echo "=== $name: $([ $alive = 0 ] && echo "finished in about $((i / 10)) s" || echo "still running after $s s")"
  for r in 0 1; do
    wait "$(cat "$w/$name.$r.pid")" 2>/dev/null
    echo "--- $name rank $r log (last 25 lines)"
    tail -25 "$w/$name.$r.log"
  done
}
{
  echo "=== $(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  start staged "^Direct"
  start direct Direct
  sleep 15
  stacks staged >"$w/staged.stacks" &
  sp=$!
  stacks direct >"$w/direct.stacks"
  wait $sp
  cat "$w/staged.stacks" "$w/direct.stacks"
  for n in staged direct; do for r in 0 1; do kill -9 "$(cat "$w/$n.$r.pid")" 2>/dev/null; done; done
  finish staged 1
  finish direct 1
  start staged_conn32 "^Direct" CUDA_DEVICE_MAX_CONNECTIONS=32
  start direct_conn32 Direct CUDA_DEVICE_MAX_CONNECTIONS=32
  finish staged_conn32 20
  finish direct_conn32 5
  for n in staged_conn32 direct_conn32; do for r in 0 1; do kill -9 "$(cat "$w/$n.$r.pid")" 2>/dev/null; done; done
  start staged_sync "^Direct" BRAID_STREAM_MEMOPS=0
  finish staged_sync 20
} >>"$log" 2>&1
rm -rf "$w"
