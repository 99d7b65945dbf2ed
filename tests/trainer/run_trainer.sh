#!/usr/bin/env bash
# braid-train end to end on a small slice of Fashion-MNIST, ranks launched with NCCL_COMM_ID
# (and once under mpirun): every --sync scheme and --compress code deterministic, resumable
# bitwise and ending with identical replicas; 2 ranks end where 1 rank does (to float tolerance), ranks sharing
# cores end bitwise where ranks that do not, a resumed run
# ends bitwise where an uninterrupted one does, --check-sync catches a planted divergence, a
# killed rank makes the others stop with a clear error, bad data stops every rank, and ranks on
# two emulated hosts train as ranks on one do (where root may make network namespaces).
# Usage: run_trainer.sh BUILD_DIR. Checks behaviour only, never timing.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
bin=$build/bin/braid-train
ckdiff=$build/tests/trainer_ckpt_diff
data=${BRAID_TRAIN_DATA:-/usr/share/datasets/fashion-mnist}
for f in "$bin" "$ckdiff"; do
  [ -x "$f" ] || { echo "FAIL: $f not built"; exit 1; }
done
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skip: no Fashion-MNIST at $data (Debian: dataset-fashion-mnist)"
  exit 0
fi

work=$(mktemp -d)
pids=()
cluster_up=0
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "$cluster_up" = 1 ] && "$top/scripts/cluster.sh" down >/dev/null 2>&1
  [ -n "${KEEP_WORK:-}" ] && echo "logs kept in $work" && return
  rm -rf "$work"
}
trap cleanup EXIT
export BRAID_TIMEOUT_MS=20000 # a safety net: nothing here should wait that long
HANG_S=60                     # a rank still running after this is hung
small=(--data "$data" --hidden 32 --limit-train 1024 --limit-test 256 --batch 64 --lr 0.05
  --csv none --plot none --progress never)
# Below the kernel's ephemeral range (32768 and up here): a port there may be the
# local end of any live connection on the machine, and rank 0 could not serve it
# (a CI run failed so: "cannot serve NCCL_COMM_ID=127.0.0.1:32776: Address already in
# use"). Each run takes the next port; the script starts well under 32000 runs.
port=$((20000 + RANDOM % 12000))
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# start TAG N ARGS...: N ranks in the background, logs in $work/TAG.R; pids in ranks[].
# The CPUs this script may use, in order: `--share-cores on` pins local rank r to the
# (r mod their count)-th; PIN_RR=1 makes start hold each rank there itself.
mapfile -t cpus < <(python3 -c 'import os; print("\n".join(map(str, sorted(os.sched_getaffinity(0)))))')

start() {
  local tag=$1 n=$2
  shift 2
  port=$((port + 1))
  ranks=()
  for ((r = 0; r < n; r++)); do
    local hold=()
    [ "${PIN_RR:-0}" = 1 ] && hold=(taskset -c "${cpus[r % ${#cpus[@]}]}")
    NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=$n "${hold[@]}" "$bin" "$@" >"$work/$tag.$r" 2>&1 &
    ranks+=($!)
    pids+=($!)
  done
}

# finish TAG: waits (at most HANG_S) for ranks[]; sets codes[] and prints the logs on request.
finish() {
  local tag=$1 deadline=$((SECONDS + HANG_S))
  codes=()
  for p in "${ranks[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      kill -9 "$p"
      wait "$p" 2>/dev/null
      codes+=(hung)
    else
      wait "$p"
      codes+=($?)
    fi
  done
}

show() { for f in "$work/$1".*; do echo "--- $f"; tail -n 20 "$f"; done; }

# run TAG N ARGS...: start + finish; returns 0 when every rank exited 0.
run() {
  local tag=$1
  start "$@"
  finish "$tag"
  for c in "${codes[@]}"; do
    [ "$c" = 0 ] || { show "$tag"; return 1; }
  done
  return 0
}

# 1. Two ranks end where one rank does, with the same global batch; parameters stay bitwise
#    identical across ranks (checked after every step).
echo "== 1 rank vs 2 ranks, same global batch"
run one 1 "${small[@]}" --epochs 2 --checkpoint "$work/one.ckpt" || fail "1-rank run"
run two 2 "${small[@]}" --epochs 2 --checkpoint "$work/two.ckpt" --check-sync 1 || fail "2-rank run"
grep -q "^epoch  2/2" "$work/one.0" || fail "no epoch line from the 1-rank run"
"$ckdiff" "$work/one.ckpt" "$work/two.ckpt" 1e-5 || fail "2 ranks did not end where 1 rank did"

# 1b. Ranks that share cores (pinned, taking turns between layers) compute exactly what
#     ranks held on the same cores without turns compute: turns move work in time, never
#     change it (width 128, so the first layer's weight gradient is cut into turn-sized
#     pieces). Held the same way, because where ranks are bound the comm orders its ring by
#     the caches they are bound inside (algorithms/layout.c): a float sum in another order.
echo "== shared cores change nothing"
run shared 3 "${small[@]}" --hidden 128 --epochs 1 --checkpoint "$work/shared.ckpt" \
  --share-cores on ||
  fail "run with --share-cores on"
PIN_RR=1 run alone 3 "${small[@]}" --hidden 128 --epochs 1 --checkpoint "$work/alone.ckpt" \
  --share-cores off ||
  fail "run with --share-cores off"
grep -q "^# cores: ranks take turns between layers (rank 0: pinned to cpu [0-9]*)" \
  "$work/shared.0" || { show shared; fail "--share-cores on did not pin rank 0 and take turns"; }
"$ckdiff" "$work/shared.ckpt" "$work/alone.ckpt" 0 || fail "taking turns changed the result"

# 2. Interrupted (a checkpoint every 5 steps, stopped after 23 as if killed) then resumed ends
#    bitwise where the uninterrupted run ends.
echo "== resume equals uninterrupted"
run full 2 "${small[@]}" --epochs 3 --checkpoint "$work/full.ckpt" || fail "uninterrupted run"
start cut 2 "${small[@]}" --epochs 3 --checkpoint "$work/cut.ckpt" --checkpoint-every 5 \
  --stop-after-steps 23
finish cut
[ "${codes[*]}" = "3 3" ] || { show cut; fail "the interrupted run exited ${codes[*]}, not 3 3"; }
run resumed 2 "${small[@]}" --epochs 3 --checkpoint "$work/cut.ckpt" --checkpoint-every 5 \
  --resume || fail "resumed run"
grep -q "resumed from .*epoch 2, step 4 (20 updates done)" "$work/resumed.0" ||
  fail "the resumed run did not start from the step-20 checkpoint"
"$ckdiff" "$work/full.ckpt" "$work/cut.ckpt" 0 || fail "resumed run differs from uninterrupted"

# 2b. --deterministic: the final weights are bitwise the same whatever the bucket sizes and
#     NCCL_ALGO (3 ranks: the canonical order has a position without a rank); without it, two
#     of those runs differ (the check has teeth).
echo "== --deterministic: same weights across buckets and algorithms"
fingerprint() { sed -n 's/^final parameters: .*fingerprint \([0-9a-f]*\)$/\1/p' "$work/$1.0"; }
det=()
for cfg in "Ring 0.01 0.01" "Tree 1 0.05" "auto 0.05 0.02"; do
  read -r algo mb first <<<"$cfg"
  tag=det-$algo
  NCCL_ALGO=$([ "$algo" = auto ] || echo "$algo") run "$tag" 3 "${small[@]}" --epochs 1 \
    --deterministic --bucket-mb "$mb" --first-bucket-mb "$first" || fail "deterministic $cfg"
  det+=("$(fingerprint "$tag")")
done
[ -n "${det[0]}" ] && [ "${det[0]}" = "${det[1]}" ] && [ "${det[0]}" = "${det[2]}" ] ||
  fail "--deterministic runs ended with different weights: ${det[*]}"
NCCL_ALGO=Ring run nodet-ring 3 "${small[@]}" --epochs 1 --bucket-mb 0.01 --first-bucket-mb 0.01 ||
  fail "default-mode Ring run"
NCCL_ALGO=Tree run nodet-tree 3 "${small[@]}" --epochs 1 --bucket-mb 1 --first-bucket-mb 0.05 ||
  fail "default-mode Tree run"
[ "$(fingerprint nodet-ring)" != "$(fingerprint nodet-tree)" ] ||
  fail "without --deterministic Ring and Tree ended alike: the comparison above proves nothing"

# 3. --check-sync stops the run when one rank's weights drift.
echo "== check-sync catches a planted divergence"
start drift 2 "${small[@]}" --epochs 2 --check-sync 2 --inject-divergence 1:3
finish drift
for r in 0 1; do
  [ "${codes[$r]}" = 1 ] || fail "rank $r exited ${codes[$r]} after a divergence, not 1"
  grep -q "parameters differ between ranks after step 4" "$work/drift.$r" ||
    { show drift; fail "rank $r did not report the divergence at step 4"; }
done

# 4. A rank killed mid-run: the others stop with a clear error instead of hanging.
echo "== killed rank"
start kill 3 "${small[@]}" --epochs 100000
for ((i = 0; i < 300; i++)); do
  grep -q "^epoch  1/" "$work/kill.0" && break
  sleep 0.1
done
grep -q "^epoch  1/" "$work/kill.0" || fail "the run to kill never finished an epoch"
{ # bash reports the SIGKILL on stderr: not news here
  kill -9 "${ranks[2]}"
  finish kill
} 2>/dev/null
for r in 0 1; do
  [ "${codes[$r]}" = 1 ] || fail "survivor rank $r exited ${codes[$r]}, not 1"
  grep -q "braid-train: rank $r: .*failed at epoch .*another rank has probably died" \
    "$work/kill.$r" || { show kill; fail "survivor rank $r gave no clear error"; }
done

# 5. Missing data: every rank stops, the one that looked says why.
echo "== missing data"
start nodata 2 "${small[@]}" --data "$work/nowhere"
finish nodata
[ "${codes[*]}" = "1 1" ] || fail "missing data: ranks exited ${codes[*]}, not 1 1"
grep -q "cannot open $work/nowhere/train-images-idx3-ubyte.gz" "$work/nodata.0" ||
  { show nodata; fail "missing data: no clear message"; }

# 6. mpirun: MPI broadcasts the id, Braid carries the gradients; same result as above.
if command -v mpirun >/dev/null 2>&1 && grep -q "mpirun" <("$bin" --help); then
  echo "== mpirun launch"
  root=()
  [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
  timeout -k 5 $HANG_S mpirun -np 2 --oversubscribe --bind-to none "${root[@]}" \
    --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$bin" "${small[@]}" --epochs 2 --checkpoint "$work/mpi.ckpt" >"$work/mpi.0" 2>&1 ||
    { show mpi; fail "mpirun launch"; }
  grep -q "2 ranks (mpirun)" "$work/mpi.0" || fail "mpirun launch did not bootstrap through MPI"
  "$ckdiff" "$work/two.ckpt" "$work/mpi.ckpt" 0 || fail "mpirun run differs from the env launch"
fi

# 7. Two emulated hosts (network namespaces, scripts/cluster.sh) with two ranks each, launched
#    by mpirun through the cluster's agent: same result as one host's ranks.
if command -v mpirun >/dev/null 2>&1 && grep -q "mpirun" <("$bin" --help) &&
  BRAID_CLUSTER=trtest "$top/scripts/cluster.sh" check 2>/dev/null; then
  echo "== two emulated hosts"
  export BRAID_CLUSTER=trtest BRAID_CLUSTER_SUBNET=198.18.67
  cluster_up=1
  "$top/scripts/cluster.sh" up 2 >/dev/null || fail "cluster up"
  mapfile -t margs < <("$top/scripts/cluster.sh" mpirun-args)
  run one4 1 "${small[@]}" --epochs 1 --batch 64 --checkpoint "$work/one4.ckpt" || fail "1 rank"
  timeout -k 5 $HANG_S mpirun "${margs[@]}" -H h0:2,h1:2 -np 4 -x BRAID_TIMEOUT_MS \
    "$bin" "${small[@]}" --epochs 1 --checkpoint "$work/hosts.ckpt" >"$work/hosts.0" 2>&1 ||
    { show hosts; fail "run across two emulated hosts"; }
  "$ckdiff" "$work/one4.ckpt" "$work/hosts.ckpt" 1e-5 || fail "two hosts did not end where 1 rank did"
  "$top/scripts/cluster.sh" down >/dev/null
  cluster_up=0
else
  echo "== two emulated hosts: skipped (needs mpirun, root and network namespaces)"
fi

# 8. The taxonomy: every scheme (--sync) and code (--compress) is deterministic for a seed (two
#    runs end bitwise equal, every rank's state included), ends with the same model on every
#    rank (the trainer checks it after the final average and dies if not), and a run stopped
#    after 23 steps and resumed from its step-20 checkpoint ends bitwise where the
#    uninterrupted run ends (residuals, stale gradients, averaging anchors and the local
#    step count are in the checkpoint).
echo "== taxonomy: deterministic, identical replicas at the end, resume equals uninterrupted"
schemes=("allreduce fp16" "allreduce bf16" "allreduce fp8" "allreduce topk:0.05" "ps:1 none"
  "ps fp8" "local:4 none" "local:3 topk:0.1" "gossip none" "stale:2 none")
for sc in "${schemes[@]}"; do
  read -r sync code <<<"$sc"
  tag=${sync//:/_}_${code//[:.]/_}
  flags=("${small[@]}" --epochs 3 --sync "$sync" --compress "$code" --check-sync 1)
  run "$tag.a" 3 "${flags[@]}" --checkpoint "$work/$tag.a.ckpt" || fail "$sc: first run"
  run "$tag.b" 3 "${flags[@]}" --checkpoint "$work/$tag.b.ckpt" || fail "$sc: second run"
  "$ckdiff" "$work/$tag.a.ckpt" "$work/$tag.b.ckpt" 0 >/dev/null ||
    fail "$sc: two runs with one seed differ"
  start "$tag.cut" 3 "${flags[@]}" --checkpoint "$work/$tag.cut.ckpt" --checkpoint-every 5 \
    --stop-after-steps 23
  finish "$tag.cut"
  [ "${codes[*]}" = "3 3 3" ] || { show "$tag.cut"; fail "$sc: the interrupted run exited ${codes[*]}"; }
  run "$tag.res" 3 "${flags[@]}" --checkpoint "$work/$tag.cut.ckpt" --checkpoint-every 5 \
    --resume || fail "$sc: resumed run"
  "$ckdiff" "$work/$tag.a.ckpt" "$work/$tag.cut.ckpt" 0 >/dev/null ||
    fail "$sc: the resumed run differs from the uninterrupted one"
  grep -q "^epoch  3/3 .* sent [0-9.]* MB" "$work/$tag.a.0" || fail "$sc: no bytes in the epoch line"
  grep -q "^# sent per rank (mean): " "$work/$tag.a.0" || fail "$sc: no byte summary"
done
# what each scheme hands to Braid, by collective and type
grep -q "sent per rank (mean): .*allreduce e4m3" "$work/allreduce_fp8.a.0" || fail "fp8 sent no e4m3"
grep -q "sent per rank (mean): allgather u32" "$work/allreduce_topk_0_05.a.0" ||
  fail "topk sent no pairs"
grep -q "reduce f32 .*broadcast f32" "$work/ps_1_none.a.0" || fail "ps did not reduce and broadcast"
grep -q "send f32" "$work/gossip_none.a.0" || fail "gossip sent nothing to its neighbours"
grep -q "spread [0-9]" "$work/gossip_none.a.0" || fail "gossip reported no spread"

# 8b. The schemes' own exchanges fail as the all-reduce does: a rank killed under gossip
#     (send/recv) stops its neighbours with a clear error.
echo "== killed rank under gossip"
start gkill 3 "${small[@]}" --epochs 100000 --sync gossip
for ((i = 0; i < 300; i++)); do
  grep -q "^epoch  1/" "$work/gkill.0" && break
  sleep 0.1
done
{
  kill -9 "${ranks[2]}"
  finish gkill
} 2>/dev/null
for r in 0 1; do
  [ "${codes[$r]}" = 1 ] || fail "gossip: survivor rank $r exited ${codes[$r]}, not 1"
  grep -q "braid-train: rank $r: .*failed at epoch" "$work/gkill.$r" ||
    { show gkill; fail "gossip: survivor rank $r gave no clear error"; }
done

# 8c. Bad combinations are refused before anything runs, with the reason.
"$bin" --sync gossip --compress fp16 2>"$work/bad1" && fail "gossip with fp16 was accepted"
grep -q "works with --sync allreduce, ps and local" "$work/bad1" || fail "no reason for gossip+fp16"
"$bin" --compress topk:2 2>"$work/bad2" && fail "topk:2 was accepted"
grep -q "expected none, fp16, bf16, fp8 or topk:F" "$work/bad2" || fail "no reason for topk:2"
start badps 2 "${small[@]}" --sync ps:5
finish badps
[ "${codes[*]}" = "1 1" ] || fail "ps:5 on 2 ranks: ranks exited ${codes[*]}, not 1 1"
grep -q "ps:5 names a server rank, but there are 2 ranks" "$work/badps.0" ||
  { show badps; fail "no reason for ps:5 on 2 ranks"; }

# 9. --help names every flag.
"$bin" --help >"$work/help" || fail "--help exited non-zero"
for flag in model hidden channels kernel data limit-train limit-test epochs batch lr momentum \
  weight-decay warmup-epochs schedule step-epochs gamma seed sync compress bucket-mb \
  first-bucket-mb no-overlap check-sync blas-threads share-cores checkpoint checkpoint-every resume csv plot \
  progress stop-after-steps inject-divergence; do
  grep -q -- "--$flag " "$work/help" || fail "--help does not document --$flag"
done

if [ $failures -ne 0 ]; then
  echo "run_trainer: $failures failure(s)"
  exit 1
fi
echo "run_trainer: all passed"
