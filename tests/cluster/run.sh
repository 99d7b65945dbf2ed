#!/usr/bin/env bash
# Cluster tests: Braid's perf tools under Open MPI's mpirun on hosts emulated with network
# namespaces (scripts/cluster.sh), checking behaviour only, never timing.
#
#   tests/cluster/run.sh [BUILD]        (BUILD defaults to ./build; scripts/run-tests.sh passes it)
#
# 1. Matrix: every perf tool (-c 1: results checked) x every algorithm (NCCL_ALGO=Ring, Tree,
#    RecDoubling, Hier, and unset = tuner) on 2x2, 4x1 and 3x2 hosts x ranks. Each algorithm gets
#    its own type/op/size sweep/root so the matrix also covers odd and non-divisible counts,
#    integer, half, double and bfloat16 data, every op, and every root. A forced algorithm is
#    checked to be the one the ranks used (NCCL_DEBUG_SUBSYS=TUNING) where the layout supports
#    it for that collective, Ring where not.
#    Then the same over NET/IB: the verbs transport on the verbs emulation
#    (build/tests/fakeverbs, its QP sockets in a directory every host sees), all-reduce,
#    send/recv and all-to-all on 2x2 and 4x1 (4x1 striping each connection over 2 QPs), Ring and the
#    tuner.
# 3. braid-status (status_case): asked on a running 2x4 all-reduce loop, then with h1's link down:
#    the verdict must say the job moves, then name h1's ranks and the link a rank waits on. Its
#    ranks bootstrap from NCCL_COMM_ID: mpirun starts them, Open MPI carries nothing.
# 2. Link down: a long all-reduce on 2x2 (tuner) and 3x1 (Tree) hosts with shaped links; h1's
#    link goes down mid-collective; every rank must fail (non-zero exit with an NCCL error)
#    within BRAID_TIMEOUT_MS + a margin, and none may hang. Stacks of ranks still running are
#    printed.
#
# Skipped with one line where not root, without mpirun, or without network namespaces. The
# cluster ("bt" on 198.18.1.0/24, so it can run beside a benchmark on the default one) is always
# torn down, also on failure or interruption. Env: BRAID_CLUSTER_TEST_KEEP=1 keeps the logs;
# BRAID_CLUSTER_TEST_ONLY=REGEX runs only the cases whose "layout/tool/algo" matches (the link-down
# cases are "2x2/link-down" and "3x1/link-down").
set -uo pipefail
shopt -s extglob

top=$(cd "$(dirname "$0")/../.." && pwd)
cluster=$top/scripts/cluster.sh

skip() {
  echo "cluster tests: skipped ($*)"
  exit 0
}
[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
command -v mpirun >/dev/null 2>&1 || skip "no mpirun (Open MPI)"

# Hermetic: no NCCL_/BRAID_ setting of the caller reaches the ranks (orted inherits this env).
only=${BRAID_CLUSTER_TEST_ONLY:-}
keep=${BRAID_CLUSTER_TEST_KEEP:-0}
for v in $(compgen -e | grep -E '^(NCCL_|BRAID_)'); do unset "$v"; done
export BRAID_CLUSTER=bt BRAID_CLUSTER_SUBNET=198.18.1
# No munge for PMIx (a stale munge socket costs every mpirun 2.3 s; see scripts/run-tests.sh).
export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
why=$("$cluster" check 2>&1) || skip "${why#cluster: }"

build=$(cd "${1:-$top/build}" 2>/dev/null && pwd) || {
  echo "cluster tests: FAILED (no build directory '${1:-$top/build}')"
  exit 1
}
TOOLS=(all_reduce all_gather broadcast reduce reduce_scatter sendrecv alltoall)
ALGOS=(Ring Tree RecDoubling Hier tuner)
for t in "${TOOLS[@]}"; do
  [ -x "$build/bin/${t}_perf" ] || {
    echo "cluster tests: FAILED (missing $build/bin/${t}_perf; run make all)"
    exit 1
  }
done

CASE_LIMIT_S=120      # wall-clock limit of one matrix mpirun (normally 1-3 s)
CASE_TIMEOUT_MS=20000 # BRAID_TIMEOUT_MS of matrix runs: Braid fails well before the limit
LD_TIMEOUT_MS=10000   # BRAID_TIMEOUT_MS of the link-down run
LD_MARGIN_S=20        # every rank must have failed this long after BRAID_TIMEOUT_MS
LD_RATE=1gbit         # shaped links: a 16 MiB all-reduce takes ~0.2 s, the loop never ends
STATUS_ROOT=$BRAID_CLUSTER_SUBNET.1:29517 # the braid-status job's bootstrap root: rank 0, on h0

tmp=$(mktemp -d /tmp/braid-cluster-test.XXXXXX)
# The tools under test, copied (they are linked statically): a rebuild while the tests run
# cannot swap them underneath mpirun.
mkdir -p "$tmp/bin" "$tmp/ompi"
for t in "${TOOLS[@]}"; do cp "$build/bin/${t}_perf" "$tmp/bin/"; done
cp "$build/bin/braid-status" "$tmp/bin/"
# mpirun-args gives the cluster its own Open MPI session directory base: other clusters' daemons
# use the same host names (h0, h1, ...).
mapfile -t MPIARGS < <("$cluster" mpirun-args)
# The tools use MPI only to hand out the NCCL id: skipping the probes of Open MPI's UCX, OFI,
# PSM and verbs components saves ~0.3 s of start-up per rank.
MPIARGS+=(--mca pml ob1 --mca btl "self,vader,tcp" --mca osc pt2pt --mca mtl "^ofi,psm,psm2")
bgpid=""
start=$(date +%s.%N)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

cleanup() {
  trap - EXIT INT TERM
  [ -n "$bgpid" ] && kill -TERM "$bgpid" 2>/dev/null
  "$cluster" down >/dev/null 2>&1 || "$cluster" down
  if [ "$keep" = 1 ]; then echo "cluster tests: logs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'echo "cluster tests: interrupted"; exit 130' INT TERM

# Rank processes (the perf tools) still alive in the cluster's hosts: "host pid" lines.
rank_procs() {
  local h ns pid
  for h in $("$cluster" hosts); do
    ns=$BRAID_CLUSTER-$h
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      case "$(cat "/proc/$pid/comm" 2>/dev/null)" in *_perf) echo "$h $pid" ;; esac
    done
  done
}

# Where each rank process still alive is blocked: kernel wait channel and stack, and the
# threads' backtraces when gdb is installed.
dump_stacks() {
  local h pid rank
  while read -r h pid; do
    rank=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    echo "--- rank ${rank:-?} pid $pid on $h still running: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
    echo "wchan: $(cat "/proc/$pid/wchan" 2>/dev/null); kernel stack:"
    sed 's/^/  /' "/proc/$pid/stack" 2>/dev/null
    if command -v gdb >/dev/null 2>&1; then
      timeout 60 gdb -p "$pid" -batch -nx -ex 'thread apply all bt' 2>/dev/null |
        grep -E '^(Thread|#)' | sed 's/^/  /'
    fi
  done < <(rank_procs)
}

# The network as each host sees it (sockets with their owners, neighbours, queues): why a
# launch that never got going did not, when Open MPI only says a connect() failed.
dump_net() {
  local h
  for h in $("$cluster" hosts); do
    echo "--- $h"
    ip netns exec "$BRAID_CLUSTER-$h" ss -tanp 2>&1 | sed 's/^/  /'
    ip -n "$BRAID_CLUSTER-$h" -s neigh 2>&1 | sed 's/^/  neigh: /'
    tc -n "$BRAID_CLUSTER-$h" -s qdisc show dev eth0 2>&1 | sed 's/^/  qdisc: /'
    # the bridge's end of the host's link: what reaches the host, and the port's state
    tc -s qdisc show dev "$BRAID_CLUSTER-$h" 2>&1 | sed 's/^/  bridge-side qdisc: /'
    bridge link show dev "$BRAID_CLUSTER-$h" 2>&1 | sed 's/^/  bridge port: /'
    # the kernel's TCP counters since the host came up (refused, reset, TIME-WAIT and PAWS
    # rejections, listen drops): what a failed connect met, which Open MPI does not say
    ip netns exec "$BRAID_CLUSTER-$h" nstat -as 2>&1 | grep -E '^(Tcp|TcpExt|Ip|Icmp)' |
      grep -viE 'InSegs|OutSegs|InReceives|OutRequests|InDelivers' | sed 's/^/  nstat: /'
  done
}

# Kill what a run left in the cluster's hosts (every process there was started by this script).
kill_leftovers() { "$cluster" kill; }

# stop_pid PID GRACE_S: TERM, then KILL after the grace period.
stop_pid() {
  kill -TERM "$1" 2>/dev/null
  sleep "$2"
  kill -KILL "$1" 2>/dev/null
}

# run_limited LIMIT_S STACKS_FILE CMD...: CMD in the background (so INT/TERM are handled at
# once), under `timeout` as a backstop; past LIMIT_S the stacks of the ranks still running go to
# STACKS_FILE and CMD is killed (status 124).
run_limited() {
  local limit=$1 stacks=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout -k 5 $((limit + 30)) "$@" </dev/null &
  bgpid=$!
  while kill -0 "$bgpid" 2>/dev/null; do
    if [ $(($(date +%s) - t0)) -ge "$limit" ]; then
      dump_stacks >"$stacks" 2>&1
      dump_net >"$(dirname "$stacks")/net" 2>&1
      stop_pid "$bgpid" 3
      wait "$bgpid" 2>/dev/null
      bgpid=""
      kill_leftovers
      return 124
    fi
    sleep 0.1
  done
  wait "$bgpid"
  rc=$?
  bgpid=""
  return $rc
}

# ---------------------------------------------------------------- the matrix

# Per algorithm: element type (reducing tools / moves-only tools), op, sweep, root.
#   pow2: 8 B .. 1 MiB by 32;  odd: 3 x 33^k elements (3, 99, 3267, 107811: odd, not a multiple of
#   the rank count, the last larger than a 64 KiB chunk per rank). The block tools (all_gather,
#   reduce_scatter, alltoall) round per-rank blocks down to 16 B as nccl-tests does (0 included).
#   root: -1 = every rank in turn.
declare -A RTYPE=([Ring]=float [Tree]=int32 [RecDoubling]=half [Hier]=double [tuner]=bfloat16)
declare -A MTYPE=([Ring]=float [Tree]=int32 [RecDoubling]=half [Hier]=double [tuner]=int8)
declare -A OP=([Ring]=sum [Tree]=max [RecDoubling]=sum [Hier]=avg [tuner]=all)
declare -A SWEEP=([Ring]=pow2 [Tree]=odd [RecDoubling]=odd [Hier]=pow2 [tuner]=odd)
declare -A ROOT=([Ring]=0 [Tree]=last [RecDoubling]=1 [Hier]=last [tuner]=-1)
declare -A COLL=([all_reduce]=AllReduce [all_gather]=AllGather [broadcast]=Broadcast
  [reduce]=Reduce [reduce_scatter]=ReduceScatter)
declare -A ESIZE=([float]=4 [int32]=4 [half]=2 [double]=8 [bfloat16]=2 [int8]=1)

ncases=0
failed=()
NETENV=() # the network's settings of the cases running now (NET/IB's below)

# The algorithm the ranks of a forced-algorithm run chose for COLL, from their TUNING logs:
# prints "ok" or why not.
check_algo() {
  local dir=$1 coll=$2 algo=$3 table expect got
  table=$(cat "$dir"/log.* 2>/dev/null | grep -m1 "Tuner table: $coll ")
  [ -n "$table" ] || {
    echo "no 'Tuner table: $coll' line in the rank logs"
    return
  }
  expect=Ring
  grep -q " $algo [0-9.]* us" <<<"$table" && expect=$algo
  got=$(cat "$dir"/log.* | sed -n "s/.* INFO $coll [0-9]* bytes nranks [0-9]*: \([A-Za-z]*\) chunk .*/\1/p" |
    sort | uniq -c | awk '{ printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1 }')
  if [ -z "$got" ]; then
    echo "no '$coll ... bytes' tuning decisions in the rank logs"
  elif [[ "$got" != "$expect x"+([0-9]) ]]; then
    echo "NCCL_ALGO=$algo: expected every call on $expect, ranks used $got"
  else
    echo ok
  fi
}

run_case() {
  local layout=$1 hosts=$2 np=$3 tool=$4 algo=$5
  local reducing=0 type op sweep root e dir args env rc t0 why="" desc nhosts
  nhosts=$(tr ',' '\n' <<<"$hosts" | wc -l)
  case "$tool" in all_reduce | reduce | reduce_scatter) reducing=1 ;; esac
  if [ $reducing = 1 ]; then type=${RTYPE[$algo]} op=${OP[$algo]}; else type=${MTYPE[$algo]} op=sum; fi
  sweep=${SWEEP[$algo]}
  e=${ESIZE[$type]}
  args=(-d "$type" -o "$op" -n 2 -w 0 -c 1)
  if [ "$sweep" = pow2 ]; then args+=(-b 8 -e 1M -f 32); else args+=(-b $((3 * e)) -e $((107811 * e)) -f 33); fi
  root=${ROOT[$algo]}
  [ "$root" = last ] && root=$((np - 1))
  case "$tool" in broadcast | reduce) args+=(-r "$root") ;; *) root="" ;; esac
  desc="$type $op $sweep${root:+ root $root}"
  dir=$tmp/$layout.$tool.$algo
  mkdir -p "$dir"
  env=(-x "BRAID_TIMEOUT_MS=$CASE_TIMEOUT_MS" -x NCCL_DEBUG=INFO -x "NCCL_DEBUG_SUBSYS=ENV,TUNING"
    -x "NCCL_DEBUG_FILE=$dir/log.%h.%p" "${TOPOENV[@]}" "${NETENV[@]}")
  [ "$algo" != tuner ] && env+=(-x "NCCL_ALGO=$algo")
  ncases=$((ncases + 1))
  t0=$(now)
  run_limited $CASE_LIMIT_S "$dir/stacks" mpirun "${MPIARGS[@]}" -np "$np" -host "$hosts" \
    "${env[@]}" "$tmp/bin/${tool}_perf" "${args[@]}" >"$dir/out" 2>&1
  rc=$?
  if [ $rc = 124 ]; then
    why="hung: no exit after ${CASE_LIMIT_S} s"
  elif [ $rc != 0 ]; then
    why="exit status $rc"
  elif ! grep -q "^# Out of bounds values : 0 OK" "$dir/out"; then
    why="no '# Out of bounds values : 0 OK' line"
  elif [ "$(awk '/^#  Rank / { print $3 }' "$dir/out" | sort -u | wc -l)" != "$np" ] ||
    [ "$(awk '/^#  Rank / { print $9 }' "$dir/out" | sort -u | wc -l)" != "$nhosts" ]; then
    why="the tool did not report $np ranks on $nhosts hosts (built without MPI?)"
  elif [ ${#NETENV[@]} -gt 0 ] && ! grep -qs "net NET/IB (100000 Mb/s)" "$dir"/log.*; then
    why="the tuner did not price NET/IB at its port's 100000 Mb/s (no 'net NET/IB' model line)"
  elif [ "$algo" != tuner ] && [ -n "${COLL[$tool]:-}" ]; then
    why=$(check_algo "$dir" "${COLL[$tool]}" "$algo")
    [ "$why" = ok ] && why=""
  fi
  printf 'cluster %-3s %-14s %-11s %-29s ' "$layout" "$tool" "$algo" "($desc)"
  if [ -z "$why" ]; then
    echo "ok $(since "$t0") s"
    return
  fi
  echo "FAILED ($why) $(since "$t0") s"
  failed+=("$layout/$tool/$algo")
  {
    echo "  command: mpirun -np $np -host $hosts ${env[*]} ${tool}_perf ${args[*]}"
    echo "  --- output (last 40 lines)"
    tail -n 40 "$dir/out"
    echo "  --- rank logs: warnings"
    grep -h "WARN" "$dir"/log.* 2>/dev/null | head -n 40
    [ -s "$dir/stacks" ] && echo "  --- stacks of ranks still running" && cat "$dir/stacks"
    [ -s "$dir/net" ] && echo "  --- the network when it hung" && cat "$dir/net"
  } | sed 's/^/  | /'
}

# ---------------------------------------------------------------- link down

# A rank's wrapper: the tool's stdout/stderr, exit status and exit time in per-rank files on the
# shared filesystem (mpirun's forwarded output from a host whose link is down is lost).
make_rank_wrapper() {
  cat >"$1" <<'SH'
#!/bin/sh
# rank.sh DIR CMD...: runs CMD, records "status time host" in DIR/rc.RANK
d=$1
shift
r=${OMPI_COMM_WORLD_RANK:-x}
# With NCCL_COMM_ID the ranks bootstrap from it and mpirun only starts them: the launcher's
# numbers as torchrun names them, and no Open MPI world for the tool to join.
if [ -n "${NCCL_COMM_ID:-}" ]; then
  export RANK=$r WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK
  unset OMPI_COMM_WORLD_SIZE
fi
"$@" >"$d/out.$r" 2>"$d/err.$r"
rc=$?
echo "$rc $(date +%s.%N) $(hostname)" >"$d/rc.$r"
exit $rc
SH
  chmod +x "$1"
}

# link_down_case LAYOUT HOSTS NP VICTIM ALGO (tuner: none forced)
link_down_case() {
  local layout=$1 hosts=$2 np=$3 victim=$4 algo=$5 dir=$tmp/$1.linkdown t0 tdown deadline n r
  local why="" fails=0 rc t host err warn mpid waited algoenv=()
  [ "$algo" != tuner ] && algoenv=(-x "NCCL_ALGO=$algo")
  mkdir -p "$dir"
  make_rank_wrapper "$dir/rank.sh"
  ncases=$((ncases + 1))
  t0=$(now)
  "$cluster" shape $LD_RATE
  # orte_abort_on_non_zero_status 0: mpirun does not kill the other ranks when one fails, so
  # each rank has to notice on its own.
  timeout -k 5 $((LD_TIMEOUT_MS / 1000 + LD_MARGIN_S + 150)) mpirun "${MPIARGS[@]}" \
    --mca orte_abort_on_non_zero_status 0 -np "$np" -host "$hosts" \
    -x BRAID_TIMEOUT_MS=$LD_TIMEOUT_MS -x NCCL_DEBUG=WARN -x "NCCL_DEBUG_FILE=$dir/log.%h.%p" "${algoenv[@]}" \
    "$dir/rank.sh" "$dir" "$tmp/bin/all_reduce_perf" -b 16M -e 16M -n 5 -w 0 -N 0 -c 0 \
    >"$dir/mpirun.out" 2>&1 </dev/null &
  bgpid=$!
  mpid=$bgpid
  # Take the link down once rank 0 printed a row: the all-reduces are running across hosts.
  for ((waited = 0; waited < 600; waited++)); do
    grep -qv '^#' "$dir/out.0" 2>/dev/null && break
    kill -0 "$mpid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -qv '^#' "$dir/out.0" 2>/dev/null; then
    why="the all-reduce loop did not start within 60 s"
    dump_stacks >"$dir/stacks" 2>&1
    dump_net >"$dir/net" 2>&1
  else
    tdown=$(now)
    "$cluster" link "$victim" down
    deadline=$(awk -v t="$tdown" -v s=$((LD_TIMEOUT_MS / 1000 + LD_MARGIN_S)) 'BEGIN { printf "%d", t + s + 1 }')
    while [ "$(date +%s)" -lt "$deadline" ]; do
      n=$(find "$dir" -name 'rc.*' | wc -l)
      [ "$n" -ge "$np" ] && break
      sleep 0.2
    done
    [ -n "$(rank_procs)" ] && dump_stacks >"$dir/stacks" 2>&1
    "$cluster" link "$victim" up
  fi
  # Per rank: failed (non-zero status, NCCL error) after the link went down, before the deadline.
  local lines=()
  for ((r = 0; r < np; r++)); do
    if [ -z "$why" ] && [ -f "$dir/rc.$r" ]; then
      read -r rc t host <"$dir/rc.$r"
      err=$(grep -m1 -o "Test NCCL failure.*" "$dir/err.$r" 2>/dev/null | cut -c1-160)
      t=$(awk -v a="$tdown" -v b="$t" 'BEGIN { printf "%.1f", b - a }')
      if [ "$rc" = 0 ]; then
        lines+=("rank $r ($host): FAILED: exited 0 ${t} s after the link went down")
        fails=$((fails + 1))
      elif awk -v t="$t" 'BEGIN { exit !(t < 0) }'; then
        lines+=("rank $r ($host): FAILED: failed before the link went down (status $rc): ${err:-no NCCL error}")
        fails=$((fails + 1))
      elif [ -z "$err" ]; then
        lines+=("rank $r ($host): FAILED: exit status $rc ${t} s after the link went down without an NCCL error")
        fails=$((fails + 1))
      else
        warn=$(cat "$dir"/log.* 2>/dev/null | grep -m1 " \[$r\] .*NCCL WARN" | sed 's/.*NCCL WARN //' | cut -c1-110)
        lines+=("rank $r ($host): failed after ${t} s: ${warn:-$err}")
      fi
    elif [ -z "$why" ]; then
      lines+=("rank $r: FAILED: no exit within $((LD_TIMEOUT_MS / 1000 + LD_MARGIN_S)) s of the link going down (hung)")
      fails=$((fails + 1))
    fi
  done
  [ -z "$why" ] && [ $fails -gt 0 ] && why="$fails of $np ranks did not fail in time"
  # With the link back, mpirun collects the exits; whatever is still running then is killed.
  for ((waited = 0; waited < 300; waited++)); do
    kill -0 "$mpid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$mpid" 2>/dev/null; then
    lines+=("note: mpirun still running 30 s after the link came back up; killed")
    stop_pid "$mpid" 2
  fi
  wait "$mpid" 2>/dev/null
  bgpid=""
  kill_leftovers
  "$cluster" shape off
  printf 'cluster %-3s %-14s %-11s %-29s ' "$layout" "link-down" "$algo" "(all_reduce, $victim down)"
  if [ -z "$why" ]; then
    echo "ok $(since "$t0") s"
    printf '  %s\n' "${lines[@]}"
    return
  fi
  echo "FAILED ($why) $(since "$t0") s"
  failed+=("$layout/link-down")
  {
    printf '%s\n' "${lines[@]}"
    echo "--- mpirun output (last 30 lines)"
    tail -n 30 "$dir/mpirun.out"
    for f in "$dir"/err.* "$dir"/log.*; do
      [ -s "$f" ] && echo "--- ${f##*/}" && tail -n 20 "$f"
    done
    [ -s "$dir/stacks" ] && echo "--- stacks of ranks still running at the deadline" && cat "$dir/stacks"
    [ -s "$dir/net" ] && echo "--- the network when the loop had not started" && cat "$dir/net"
  } | sed 's/^/  | /'
}

# ---------------------------------------------------------------- braid-status

# The pid of a rank process (the perf tool) running on HOST, "" when none.
rank_pid_on() { rank_procs | awk -v h="$1" '$1 == h { print $2; exit }'; }

# braid-status inside HOST against PID into FILE; prints the seconds it took.
ask_status() {
  local host=$1 pid=$2 file=$3 t0
  t0=$(now)
  "$cluster" exec "$host" "$tmp/bin/braid-status" "$pid" >"$file" 2>&1
  since "$t0"
}

# status_case LAYOUT HOSTS NP VICTIM: braid-status on a running 2x4 job, then with VICTIM's link
# down: the first verdict must say the job moves, the second must name VICTIM's ranks as silent
# and the link a rank on h0 waits on; the job must keep running while it is asked.
# The ranks bootstrap from NCCL_COMM_ID (h0's address): mpirun starts them, MPI carries nothing.
# Under MPI, 8 ranks on 2 loaded cores opened 16 Open MPI TCP links lazily, and Open MPI 4.1
# gives up on the first one whose connect fails (btl/tcp complete_connect: any SO_ERROR is
# fatal, reported with a stale errno, "Operation now in progress"): seen once in CI, the job
# hung before its first all-reduce. What this case tests is braid-status, not that launcher.
status_case() {
  local layout=$1 hosts=$2 np=$3 victim=$4 dir=$tmp/$1.status t0 pid waited why="" took1 took2
  local first last
  mkdir -p "$dir"
  make_rank_wrapper "$dir/rank.sh"
  ncases=$((ncases + 1))
  t0=$(now)
  "$cluster" shape $LD_RATE
  timeout -k 5 150 mpirun "${MPIARGS[@]}" --mca orte_abort_on_non_zero_status 0 -np "$np" \
    -host "$hosts" -x BRAID_TIMEOUT_MS=$LD_TIMEOUT_MS -x NCCL_DEBUG=WARN -x NCCL_COMM_ID=$STATUS_ROOT \
    -x "NCCL_DEBUG_FILE=$dir/log.%h.%p" "$dir/rank.sh" "$dir" "$tmp/bin/all_reduce_perf" \
    -b 16M -e 16M -n 5 -w 0 -N 0 -c 0 >"$dir/mpirun.out" 2>&1 </dev/null &
  bgpid=$!
  for ((waited = 0; waited < 600; waited++)); do
    grep -qv '^#' "$dir/out.0" 2>/dev/null && break
    sleep 0.1
  done
  pid=$(rank_pid_on h0)
  if ! grep -qv '^#' "$dir/out.0" 2>/dev/null || [ -z "$pid" ]; then
    why="the all-reduce loop did not start within 60 s"
    dump_stacks >"$dir/stacks" 2>&1
    dump_net >"$dir/net" 2>&1
  else
    took1=$(ask_status h0 "$pid" "$dir/running")
    first=$(grep -m1 '^comm ' "$dir/running")
    rows=$(grep -cv '^#' "$dir/out.0")
    "$cluster" link "$victim" down
    sleep 3
    took2=$(ask_status h0 "$pid" "$dir/down")
    last=$(grep -m1 '^comm ' "$dir/down")
    "$cluster" link "$victim" up
    if ! grep -q "is moving\|no rank waits\|is slow, not stuck" <<<"$first"; then
      why="running job: verdict '$first'"
    elif ! grep -q "ranks 4-7 do not answer" <<<"$last" ||
      ! grep -q "waits for .* from rank [4-7] over tcp, nothing moved" "$dir/down"; then
      why="link down: verdict '$last'"
    fi
  fi
  stop_pid "$bgpid" 2
  wait "$bgpid" 2>/dev/null
  bgpid=""
  kill_leftovers
  "$cluster" shape off
  printf 'cluster %-3s %-14s %-11s %-29s ' "$layout" "braid-status" "tuner" "(all_reduce, $victim down)"
  if [ -z "$why" ]; then
    echo "ok $(since "$t0") s"
    echo "  running ($rows rows by then; answered in $took1 s): $first"
    echo "  $victim down (answered in $took2 s):"
    sed 's/^/  | /' "$dir/down"
    return
  fi
  echo "FAILED ($why) $(since "$t0") s"
  failed+=("$layout/braid-status")
  {
    for f in "$dir"/running "$dir"/down "$dir"/mpirun.out "$dir"/err.*; do
      [ -s "$f" ] && echo "--- ${f##*/}" && tail -n 30 "$f"
    done
    [ -s "$dir/stacks" ] && echo "--- stacks of ranks still running at the deadline" && cat "$dir/stacks"
    [ -s "$dir/net" ] && echo "--- the network when the loop had not started" && cat "$dir/net"
  } | sed 's/^/  | /'
}

# ---------------------------------------------------------------- main

"$cluster" down >/dev/null 2>&1 # a cluster left by an interrupted run
if ! out=$("$cluster" up 4 2>&1); then
  echo "cluster tests: FAILED (cannot bring the cluster up: $out)"
  exit 1
fi
echo "cluster tests: $out"

# The matrix's ranks read the topology from a file that Braid's detection wrote inside h0 (the
# hosts are alike): detecting it (hwloc, a memcpy measurement) costs ~0.25 s per process, a
# third of the matrix's time on 2 cores. The link-down run detects as usual.
TOPOENV=()
if OMPI_MCA_orte_tmpdir_base=$tmp/ompi NCCL_TOPO_DUMP_FILE=$tmp/topo.json "$cluster" exec h0 \
  "$tmp/bin/all_reduce_perf" -b 8 -e 8 -n 1 -w 0 >"$tmp/topo.out" 2>&1 && [ -s "$tmp/topo.json" ]; then
  TOPOENV=(-x "NCCL_TOPO_FILE=$tmp/topo.json")
else
  echo "cluster tests: note: no topology dump from h0 (every rank detects its own):"
  tail -n 5 "$tmp/topo.out"
fi

# layout, -host, ranks
LAYOUTS=("2x2 h0:2,h1:2 4" "4x1 h0,h1,h2,h3 4" "3x2 h0:2,h1:2,h2:2 6")
for l in "${LAYOUTS[@]}"; do
  read -r layout hosts np <<<"$l"
  for tool in "${TOOLS[@]}"; do
    for algo in "${ALGOS[@]}"; do
      [[ "$layout/$tool/$algo" =~ ${only:-.} ]] || continue
      run_case "$layout" "$hosts" "$np" "$tool" "$algo"
    done
  done
done
# The same over NET/IB, where this build has the verbs transport and its emulation.
fakeverbs=$build/tests/fakeverbs/libibverbs.so.1
if [ -f "$fakeverbs" ]; then
  mkdir -p "$tmp/lib" "$tmp/fabric"
  cp "$fakeverbs" "$tmp/lib/"
  # the 4x1 cases stripe each connection over 2 QPs
  for l in "2x2ib h0:2,h1:2 4 1" "4x1ib h0,h1,h2,h3 4 2"; do
    read -r layout hosts np qps <<<"$l"
    NETENV=(-x NCCL_NET=IB -x "BRAID_IBVERBS_LIB=$tmp/lib/libibverbs.so.1" -x FAKEVERBS_HCAS=mlx5_0:1
      -x "FAKEVERBS_FABRIC=$tmp/fabric" -x NCCL_IB_QPS_PER_CONNECTION="$qps")
    for tool in all_reduce sendrecv alltoall; do
      for algo in Ring tuner; do
        [[ "$layout/$tool/$algo" =~ ${only:-.} ]] || continue
        run_case "$layout" "$hosts" "$np" "$tool" "$algo"
      done
    done
  done
  NETENV=()
else
  echo "cluster tests: NET/IB cases skipped (no $fakeverbs: built without <infiniband/verbs.h>)"
fi

# layout, -host, ranks, the host whose link goes down, algorithm
LINKDOWN=("2x2 h0:2,h1:2 4 h1 tuner" "3x1 h0,h1,h2 3 h1 Tree")
for l in "${LINKDOWN[@]}"; do
  read -r layout hosts np victim algo <<<"$l"
  [[ "$layout/link-down" =~ ${only:-.} ]] || continue
  link_down_case "$layout" "$hosts" "$np" "$victim" "$algo"
done
[[ "2x4/braid-status" =~ ${only:-.} ]] && status_case 2x4 h0:4,h1:4 8 h1

echo "cluster tests: $ncases cases, ${#failed[@]} failed${failed[*]:+: ${failed[*]}}; $(since "$start") s"
[ ${#failed[@]} -eq 0 ]
