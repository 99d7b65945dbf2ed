#!/usr/bin/env bash
# `make bench-cluster`: Braid's all-reduce against Open MPI's MPI_Allreduce on an emulated cluster
# (scripts/cluster.sh: one network namespace per host, veth links on a bridge, tbf shaping). In one
# run it brings the cluster up, and for each link configuration (RATE-shaped, then unshaped):
#   (a) measures every host link with iperf3 (h(i+1) -> h(i), one pair at a time; the line rate
#       used below is the minimum over the links, receiver side),
#   (b) runs all_reduce_perf with NCCL_ALGO=Ring, Tree, RecDoubling, Hier and with the tuner's own
#       choice ("auto"; one extra short run logs which algorithm it picks per size),
#   (c) runs mpi_allreduce_perf (Open MPI's MPI_Allreduce; btl self,vader,tcp) as configured by
#       default ("mpi") and with its hierarchical component ("mpi-han": coll_han_priority 100),
# on the same hosts and ranks for every layout, float sum, 8 B..256 MiB by factors of 2: a latency
# sweep (..LAT_MAX, many iterations: one launch lasts at least a second, so that no scheduler tick
# decides a size), a small one (..SPLIT, REPS rounds each) and a large one (above SPLIT, few
# iterations). Then it
# prints, per configuration and layout, a markdown table of busbw and time, auto's fraction of the
# line rate / node-link bound and its time ratio to Open MPI, and the issue's target checks
# (PASS/FAIL) and tears the cluster down (always, on any exit). Needs root. Exits 0 after
# printing, 1 when it cannot run (not root, no cluster, tools missing), 2 on usage errors.
#
# Usage: perf/bench_cluster.sh [BUILD_DIR]        (default build; uses BUILD_DIR/bin/*_perf)
#
# Environment (defaults shown):
#   RATE=2gbit         tc rate every host link is shaped to, both ways; "off": no shaped run
#   UNSHAPED=1         0: skip the unshaped configuration
#   LAYOUTS="4x1 2x4"  NODESxRANKS_PER_NODE, hosts h0..h(NODES-1)
#   SYSTEMS="auto Ring Tree RecDoubling Hier mpi mpi-han"   (also "det": auto with
#                      BRAID_DETERMINISTIC=1, docs/determinism.md)
#   MINBYTES=8 MAXBYTES=256M SPLIT=1M   sizes (suffix K/M/G = KiB/MiB/GiB)
#   LAT_MAX=64K LAT_ITERS=1000 LAT_WARMUP=50           latency sweep MINBYTES..LAT_MAX
#   SMALL_ITERS=50 SMALL_WARMUP=5 REPS=3              small sweep 2xLAT_MAX..SPLIT; REPS rounds of both
#   LARGE_ITERS=3 LARGE_WARMUP=1 LARGE_REPS=1         large sweep 2xSPLIT..MAXBYTES
#   SLOW_SYSTEMS="Tree RecDoubling" SLOW_MAX=MAXBYTES  cap the large sweep of these systems
#   CHECK=0            all_reduce_perf -c (1: verify results; untimed, but slows the run)
#   CHOICE=1           0: skip the run that logs auto's algorithm per size
#   INPLACE=0          1: also run the in-place half of each row (not reported; Open MPI 4.1.4's
#                      han crashes in-place from 128 KiB); 0 passes --inplace 0 to the tools
#   IPERF_TIME=3       seconds per iperf3 link test
#   BENCH_TIMEOUT=1800 seconds per mpirun
#   OUT=BUILD_DIR/bench-cluster   output directory
#   REPORT_ONLY=1      measure nothing: tables, plots and verdict again from OUT's results.csv
#                      (give the same RATE/UNSHAPED/LAYOUTS/SYSTEMS/REPS as the measuring run)
#   BRAID_CLUSTER / BRAID_CLUSTER_SUBNET   passed to scripts/cluster.sh (default braid, 198.18.0)
#
# Outputs in OUT: results.csv, table-CONFIG-LAYOUT.md, busbw-CONFIG-LAYOUT.png (CONFIG: the RATE,
# e.g. 2gbit, or "unshaped"), report.md (everything printed at the end), raw/ (every tool's output).
# results.csv: config,layout,system,sweep,rep,bytes,time_us,algbw,busbw: one row per size per run,
# out-of-place, time as the tool printed it (average over ranks), algbw/busbw in GB/s recomputed
# from it at full precision (the tools print two decimals). Link rows: system "iperf3", sweep
# "hA->hB" (one link) or "min" (the line rate used), system "nominal" (RATE); busbw holds the GB/s.
# Medians in the tables: per size, the run with the median time (lower middle for an even count).
# Latency target: auto's median is no worse than each Open MPI's, or auto runs at the line rate
# (its time <= the node-link bound from iperf3's rate): there the link, not the library, sets the
# time, and the check line counts such sizes separately as "at line rate".
set -u

usage() {
  sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
[ $# -le 1 ] || usage
case "${1:-}" in -h | --help | -*) usage ;; esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=$ROOT/scripts/cluster.sh
BUILD=${1:-build}
RATE=${RATE:-2gbit}
UNSHAPED=${UNSHAPED:-1}
LAYOUTS=${LAYOUTS:-4x1 2x4}
SYSTEMS=${SYSTEMS:-auto Ring Tree RecDoubling Hier mpi mpi-han}
LAT_ITERS=${LAT_ITERS:-1000}
LAT_WARMUP=${LAT_WARMUP:-50}
SMALL_ITERS=${SMALL_ITERS:-50}
SMALL_WARMUP=${SMALL_WARMUP:-5}
REPS=${REPS:-3}
LARGE_ITERS=${LARGE_ITERS:-3}
LARGE_WARMUP=${LARGE_WARMUP:-1}
LARGE_REPS=${LARGE_REPS:-1}
SLOW_SYSTEMS=${SLOW_SYSTEMS:-Tree RecDoubling}
CHECK=${CHECK:-0}
CHOICE=${CHOICE:-1}
INPLACE=${INPLACE:-0}
IPERF_TIME=${IPERF_TIME:-3}
TMO=${BENCH_TIMEOUT:-1800}
SUBNET=${BRAID_CLUSTER_SUBNET:-198.18.0}
PREFIX=${BRAID_CLUSTER:-braid}

die_usage() {
  echo "bench-cluster: $*" >&2
  exit 2
}
cannot() {
  echo "bench-cluster: $*" >&2
  exit 1
}

# bytes_of 64K -> 65536 (K/M/G are binary, as in all_reduce_perf); empty when malformed.
bytes_of() {
  awk -v s="$1" 'BEGIN {
    if (s !~ /^[0-9]+[kKmMgG]?$/) exit
    u = tolower(substr(s, length(s)))
    f = u == "k" ? 1024 : u == "m" ? 1048576 : u == "g" ? 1073741824 : 1
    printf "%.0f\n", (s + 0) * f }'
}
# hsize 65536 -> "64 KiB"
hsize() {
  awk -v b="$1" 'BEGIN {
    if (b >= 1073741824 && b % 1073741824 == 0) print b / 1073741824 " GiB"
    else if (b >= 1048576 && b % 1048576 == 0) print b / 1048576 " MiB"
    else if (b >= 1024 && b % 1024 == 0) print b / 1024 " KiB"
    else print b " B" }'
}
# rate_mbps 2gbit -> 2000 (tc's units: bit, kbit, mbit, gbit; bps, kbps... are bytes/s)
rate_mbps() {
  awk -v r="$1" 'BEGIN {
    r = tolower(r); n = r + 0; u = r; sub(/^[0-9.]+/, "", u)
    f = -1
    if (u == "gbit") f = 1000; else if (u == "mbit") f = 1; else if (u == "kbit") f = 1e-3
    else if (u == "bit") f = 1e-6; else if (u == "gbps") f = 8000; else if (u == "mbps") f = 8
    else if (u == "kbps") f = 8e-3; else if (u == "bps") f = 8e-6
    if (f > 0 && n > 0) print n * f }'
}

MINB=$(bytes_of "${MINBYTES:-8}")
MAXB=$(bytes_of "${MAXBYTES:-256M}")
SPLITB=$(bytes_of "${SPLIT:-1M}")
LATB=$(bytes_of "${LAT_MAX:-64K}")
SLOWB=$(bytes_of "${SLOW_MAX:-${MAXBYTES:-256M}}")
[ -n "$MINB" ] && [ -n "$MAXB" ] && [ -n "$SPLITB" ] && [ -n "$SLOWB" ] && [ -n "$LATB" ] ||
  die_usage "MINBYTES, MAXBYTES, SPLIT, SLOW_MAX, LAT_MAX must be sizes like 8, 64K, 1M, 256M"
[ "$LATB" -le "$SPLITB" ] || die_usage "need LAT_MAX <= SPLIT"
[ "$MINB" -ge 1 ] && [ "$MINB" -le "$MAXB" ] || die_usage "need 1 <= MINBYTES <= MAXBYTES"
for v in LAT_ITERS LAT_WARMUP SMALL_ITERS SMALL_WARMUP REPS LARGE_ITERS LARGE_WARMUP LARGE_REPS IPERF_TIME TMO; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die_usage "$v must be a number, got '${!v}'"
done
[ "$REPS" -ge 1 ] && [ "$LARGE_REPS" -ge 1 ] || die_usage "REPS and LARGE_REPS must be >= 1"
NHOSTS=0
for l in $LAYOUTS; do
  [[ $l =~ ^([0-9]+)x([0-9]+)$ ]] || die_usage "layout '$l' is not NODESxRANKS (e.g. 2x4)"
  [ "${BASH_REMATCH[1]}" -ge 2 ] && [ "${BASH_REMATCH[2]}" -ge 1 ] ||
    die_usage "layout '$l': needs 2 or more nodes and 1 or more ranks per node"
  [ "${BASH_REMATCH[1]}" -gt "$NHOSTS" ] && NHOSTS=${BASH_REMATCH[1]}
done
[ "$NHOSTS" -ge 2 ] || die_usage "LAYOUTS is empty"
for s in $SYSTEMS; do
  case $s in auto | det | Ring | Tree | RecDoubling | Hier | mpi | mpi-han) ;;
    *) die_usage "unknown system '$s' (auto det Ring Tree RecDoubling Hier mpi mpi-han)" ;;
  esac
done
CONFIGS=()
[ "$RATE" != off ] && CONFIGS+=("$RATE")
[ "$UNSHAPED" != 0 ] && CONFIGS+=(off)
[ ${#CONFIGS[@]} -gt 0 ] || die_usage "nothing to run (RATE=off and UNSHAPED=0)"
if [ "$RATE" != off ]; then
  [[ $RATE =~ ^[0-9.]+[a-zA-Z]+$ ]] || die_usage "RATE '$RATE' is not a tc rate like 2gbit"
fi

# ---------------------------------------------------------------- prerequisites
[ -d "$BUILD" ] || cannot "no build directory '$BUILD' (make all builds it)"
BIN=$(cd "$BUILD" && pwd)/bin
OUT=${OUT:-$BUILD/bench-cluster}
command -v gnuplot >/dev/null 2>&1 || cannot "gnuplot not found (make deps installs it)"
declare -A SYS_SECS=()
T_START=$SECONDS

# start: checks what a measuring run needs, clears OUT's previous results, brings the cluster up.
start() {
  local t b need_bin=()
  [ "$(id -u)" -eq 0 ] ||
    cannot "needs root (it creates network namespaces and tc qdiscs): run it as root, e.g. sudo make bench-cluster"
  for t in mpirun iperf3 tc ip; do
    command -v "$t" >/dev/null 2>&1 || cannot "$t not found (make deps installs it)"
  done
  for t in $SYSTEMS; do
    case $t in mpi*) need_bin+=(mpi_allreduce_perf) ;; *) need_bin+=(all_reduce_perf) ;; esac
  done
  for b in $(printf '%s\n' "${need_bin[@]}" | sort -u); do
    [ -x "$BIN/$b" ] || cannot "$BIN/$b is missing (make all builds it; mpi_* needs mpicc)"
  done
  "$CLUSTER" check || cannot "cannot run an emulated cluster here"
  if [ -n "$("$CLUSTER" hosts)" ]; then
    cannot "cluster '$PREFIX' is already up ($("$CLUSTER" hosts | tr '\n' ' ')); another benchmark" \
      "may be using it. If not, run scripts/cluster.sh down first"
  fi
  if [ -n "${NCCL_ALGO:-}" ]; then
    echo "bench-cluster: ignoring NCCL_ALGO=$NCCL_ALGO from the environment (each system sets its own)"
    unset NCCL_ALGO
  fi
  mkdir -p "$OUT" || cannot "cannot create $OUT"
  OUT=$(cd "$OUT" && pwd)
  RAW=$OUT/raw
  CSV=$OUT/results.csv
  rm -rf "$RAW" "$OUT"/table-*.md "$OUT"/busbw-*.png "$CSV" "$OUT/report.md"
  mkdir -p "$RAW"
  echo "config,layout,system,sweep,rep,bytes,time_us,algbw,busbw" >"$CSV"
  # Traps first, so that no signal leaves the cluster up; a failed `up` has cleaned up after itself.
  CLUSTER_UP=1
  trap '[ -n "$CLUSTER_UP" ] && "$CLUSTER" down && echo "bench-cluster: cluster down"' EXIT
  trap on_signal INT TERM HUP
  "$CLUSTER" up "$NHOSTS" || {
    CLUSTER_UP=""
    cannot "scripts/cluster.sh up $NHOSTS failed"
  }
  mapfile -t MPIRUN_ARGS < <("$CLUSTER" mpirun-args)
  # No munge for PMIx (a stale munge socket costs every mpirun 2.3 s; see scripts/run-tests.sh).
  export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
}

# Children run in the background and are waited for, so that a signal ends the run at once:
# on_signal stops the running one (timeout passes it on to mpirun) and the EXIT trap tears down.
CHILD=""
CLUSTER_UP=""
on_signal() {
  echo "bench-cluster: interrupted" >&2
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null
  exit 130
}
# run_child OUTFILE CMD...: CMD with the BENCH_TIMEOUT, appending to OUTFILE; returns its status.
run_child() {
  local f=$1 rc
  shift
  timeout -k 30 "$TMO" "$@" >>"$f" 2>&1 </dev/null &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=""
  return $rc
}

label_of() { [ "$1" = off ] && echo unshaped || echo "$1"; }

# reap: after a failed or timed-out run, end what it left in the cluster's hosts (all started here).
reap() { "$CLUSTER" kill; }

# ---------------------------------------------------------------- (a) iperf3
# measure_links CONFIG: every link h(i+1) -> h(i), one pair at a time; sets LINE_MBPS to the minimum.
measure_links() {
  local cfg=$1 i srv cli f mbps spid port tries
  LINE_MBPS=""
  port=$((5201 + CFG_INDEX))
  for ((i = 0; i < NHOSTS; i++)); do
    srv=h$i
    cli=h$(((i + 1) % NHOSTS))
    f=$RAW/iperf-$(label_of "$cfg")-$cli-$srv.txt
    "$CLUSTER" exec "$srv" "timeout $((IPERF_TIME + 30)) iperf3 -s -1 -p $port" >/dev/null 2>&1 &
    spid=$!
    for ((tries = 0; tries < 50; tries++)); do
      "$CLUSTER" exec "$srv" "ss -ltnH" 2>/dev/null | grep -q ":$port\b" && break
      sleep 0.1
    done
    if "$CLUSTER" exec "$cli" "iperf3 -c $SUBNET.$((i + 1)) -p $port -t $IPERF_TIME -f m" >"$f" 2>&1; then
      wait "$spid" 2>/dev/null
    fi
    mbps=$(awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") v = $(i - 1) }
                END { print v }' "$f")
    if [ -z "$mbps" ]; then
      echo "  iperf3 $cli -> $srv: failed: $(tail -n 1 "$f")"
      continue
    fi
    printf "  iperf3 %s -> %s: %s Mbit/s\n" "$cli" "$srv" "$mbps"
    echo "$(label_of "$cfg"),link,iperf3,$cli->$srv,1,,,$(awk -v m="$mbps" 'BEGIN { printf "%.6f,%.6f", m / 8000, m / 8000 }')" >>"$CSV"
    LINE_MBPS=$(awk -v a="$LINE_MBPS" -v b="$mbps" 'BEGIN { print (a == "" || b + 0 < a + 0) ? b : a }')
  done
  if [ -n "$LINE_MBPS" ]; then
    echo "$(label_of "$cfg"),link,iperf3,min,1,,,$(awk -v m="$LINE_MBPS" 'BEGIN { printf "%.6f,%.6f", m / 8000, m / 8000 }')" >>"$CSV"
  fi
  local nom
  nom=$([ "$cfg" = off ] || rate_mbps "$cfg")
  if [ -n "$nom" ]; then
    echo "$(label_of "$cfg"),link,nominal,$cfg,1,,,$(awk -v m="$nom" 'BEGIN { printf "%.6f,%.6f", m / 8000, m / 8000 }')" >>"$CSV"
  fi
}

# ---------------------------------------------------------------- (b), (c) the sweeps
# cmd_for SYSTEM NODES RPN: sets CMD to the launch of one sweep (sizes and counts appended later).
cmd_for() {
  local sys=$1 nodes=$2 rpn=$3 hosts="" i tool=all_reduce_perf
  for ((i = 0; i < nodes; i++)); do hosts+="${hosts:+,}h$i:$rpn"; done
  CMD=(mpirun "${MPIRUN_ARGS[@]}" -np $((nodes * rpn)) -host "$hosts" --mca btl "self,vader,tcp")
  case $sys in
    auto) ;;
    det) CMD+=(-x BRAID_DETERMINISTIC=1) ;; # the deterministic mode (docs/determinism.md)
    mpi) tool=mpi_allreduce_perf ;;
    mpi-han)
      tool=mpi_allreduce_perf
      CMD+=(--mca coll_han_priority 100)
      ;;
    *) CMD+=(-x "NCCL_ALGO=$sys") ;;
  esac
  CMD+=("$BIN/$tool" -d float -o sum -c "$CHECK")
  # Out-of-place only (both tools take --inplace): halves the time, and Open MPI 4.1.4's han crashes on
  # MPI_IN_PLACE above its 64 KiB segment (it offsets the MPI_IN_PLACE pointer; fixed upstream
  # by open-mpi/ompi#11488, after 4.1.4).
  if [ "$INPLACE" = 0 ]; then CMD+=(--inplace 0); fi
  return 0
}

# sweep CONFIG LAYOUT NODES RPN SYSTEM latency|small|large REP NREPS MIN MAX ITERS WARMUP
sweep() {
  local cfg=$1 lay=$2 nodes=$3 rpn=$4 sys=$5 kind=$6 rep=$7 nreps=$8 min=$9 max=${10}
  local iters=${11} warm=${12} f rc t0 dt
  f=$RAW/$(label_of "$cfg")-$lay-$sys-$kind.$rep.txt
  cmd_for "$sys" "$nodes" "$rpn"
  CMD+=(-b "$min" -e "$max" -f 2 -n "$iters" -w "$warm")
  t0=$SECONDS
  echo "# ${CMD[*]}" >"$f"
  run_child "$f" "${CMD[@]}"
  rc=$?
  dt=$((SECONDS - t0))
  SYS_SECS[$sys]=$((${SYS_SECS[$sys]:-0} + dt))
  awk -v c="$(label_of "$cfg")" -v l="$lay" -v s="$sys" -v w="$kind" -v r="$rep" -v n=$((nodes * rpn)) '
    !/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ && $6 + 0 > 0 {
      alg = $1 / 1e3 / $6
      printf "%s,%s,%s,%s,%s,%s,%s,%.6f,%.6f\n", c, l, s, w, r, $1, $6, alg, alg * 2 * (n - 1) / n
    }' "$f" >>"$CSV"
  printf "  %-8s %-12s %s sweep %d/%d: %4d s" "$lay" "$sys" "$kind" "$rep" "$nreps" "$dt"
  if [ "$rc" != 0 ]; then
    printf "  FAILED (exit %s%s), %s:\n" "$rc" "$([ "$rc" = 124 ] && echo ", timed out after ${TMO}s")" "$f"
    grep -v '^#' "$f" | tail -n 5 | sed 's/^/      /'
    reap
  else
    echo
  fi
}

# choice CONFIG LAYOUT NODES RPN: which algorithm auto picks per size (one short logged run).
choice() {
  local cfg=$1 lay=$2 nodes=$3 rpn=$4 f t0
  f=$RAW/$(label_of "$cfg")-$lay-choice.log
  cmd_for auto "$nodes" "$rpn"
  CMD+=(-b "$MINB" -e "$MAXB" -f 2 -n 1 -w 0)
  t0=$SECONDS
  : >"$f"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING run_child "$f" "${CMD[@]}" || reap
  SYS_SECS[choice]=$((${SYS_SECS[choice]:-0} + SECONDS - t0))
  sed -n 's/.*AllReduce \([0-9]*\) bytes nranks [0-9]*: \([A-Za-z]*\).*/\1 \2/p' "$f" |
    sort -s -u -k1,1n >"$RAW/$(label_of "$cfg")-$lay-choice.txt"
}

run_layout() { # CONFIG LAYOUT
  local cfg=$1 lay=$2 nodes rpn rep sys smax lmax tmax
  nodes=${lay%x*}
  rpn=${lay#*x}
  smax=$((MAXB < SPLITB ? MAXB : SPLITB))
  tmax=$((smax < LATB ? smax : LATB))
  # Each round runs every system once, so that a slow spell of the machine
  # hits them all rather than one.
  for ((rep = 1; rep <= REPS; rep++)); do
    for sys in $SYSTEMS; do
      [ "$MINB" -le "$tmax" ] && sweep "$cfg" "$lay" "$nodes" "$rpn" "$sys" latency "$rep" "$REPS" \
        "$MINB" "$tmax" "$LAT_ITERS" "$LAT_WARMUP"
      local s0=$((tmax * 2 > MINB ? tmax * 2 : MINB))
      [ "$s0" -le "$smax" ] && sweep "$cfg" "$lay" "$nodes" "$rpn" "$sys" small "$rep" "$REPS" \
        "$s0" "$smax" "$SMALL_ITERS" "$SMALL_WARMUP"
    done
  done
  if [ "$MAXB" -gt "$SPLITB" ]; then
    local lmin=$((SPLITB * 2 > MINB ? SPLITB * 2 : MINB))
    for ((rep = 1; rep <= LARGE_REPS; rep++)); do
      for sys in $SYSTEMS; do
        lmax=$MAXB
        [[ " $SLOW_SYSTEMS " == *" $sys "* ]] && [ "$SLOWB" -lt "$lmax" ] && lmax=$SLOWB
        [ "$lmax" -ge "$lmin" ] || continue
        sweep "$cfg" "$lay" "$nodes" "$rpn" "$sys" large "$rep" "$LARGE_REPS" "$lmin" "$lmax" \
          "$LARGE_ITERS" "$LARGE_WARMUP"
      done
    done
  fi
  [ "$CHOICE" != 0 ] && [[ " $SYSTEMS " == *" auto "* ]] && choice "$cfg" "$lay" "$nodes" "$rpn"
  return 0
}

# ---------------------------------------------------------------- report
# One configuration and layout: the markdown tables (stdout), the plot's data file, the check lines.
REPORT_AWK='
function hsize(b) {
  if (b >= 1073741824 && b % 1073741824 == 0) return b / 1073741824 " GiB"
  if (b >= 1048576 && b % 1048576 == 0) return b / 1048576 " MiB"
  if (b >= 1024 && b % 1024 == 0) return b / 1024 " KiB"
  return b " B"
}
function fbw(x) { return x == "" ? "-" : x < 10 ? sprintf("%.3f", x) : sprintf("%.2f", x) }
function ftime(x) { return x == "" ? "-" : x < 1000 ? sprintf("%.1f", x) : sprintf("%.0f", x) }
function fr(x) { return x == "" ? "-" : sprintf("%.2f", x) }
function verdict(ok) { return !shaped ? "(unshaped: no target)" : ok ? "PASS" : "FAIL" }
function row(cells) { print "| " cells " |" }
BEGIN {
  FS = ","
  ns = split(systems, S, " ")
  nr = m * r; busf = 2 * (nr - 1) / nr; linkf = 2 * (m - 1) / m
  rate = mbps * 1e6 / 8                 # measured line rate, bytes/s
  bound_bw = rate / 1e9 * busf / linkf  # busbw at the node-link bound, GB/s
  name["auto"] = "Braid auto"; name["mpi"] = "MPI"; name["mpi-han"] = "MPI han"
  while ((getline line < choicef) > 0) { split(line, w, " "); ch[w[1]] = w[2] }
}
$1 == cfg && $2 == lay && ($4 == "latency" || $4 == "small" || $4 == "large") && $7 + 0 > 0 {
  k = $3 SUBSEP ($6 + 0); c = ++cnt[k]; tv[k, c] = $7 + 0
  if (!(($6 + 0) in seen)) { seen[$6 + 0] = 1; sz[++nsz] = $6 + 0 }
}
END {
  for (i = 2; i <= nsz; i++) {
    v = sz[i]; for (j = i - 1; j >= 1 && sz[j] > v; j--) sz[j + 1] = sz[j]; sz[j + 1] = v
  }
  for (k in cnt) {
    c = cnt[k]
    for (i = 2; i <= c; i++) {
      v = tv[k, i]; for (j = i - 1; j >= 1 && tv[k, j] > v; j--) tv[k, j + 1] = tv[k, j]; tv[k, j + 1] = v
    }
    med[k] = tv[k, int((c + 1) / 2)]
  }
  have_rate = mbps + 0 > 0
  fname = r == 1 ? "auto/line" : "auto/bound"
  printf "## all-reduce, %s links, %d hosts x %d rank%s (%s)\n\n", cfg, m, r, (r > 1 ? "s" : ""), lay
  printf "float sum, out-of-place; per size the median over %d run%s (sizes up to %s) or %d run%s (larger). ", reps, (reps > 1 ? "s" : ""), hsize(split_b), lreps, (lreps > 1 ? "s" : "")
  if (have_rate)
    printf "Line rate: iperf3, minimum over the links, %.0f Mbit/s = %.4f GB/s (nominal %s). ", mbps, rate / 1e9, nominal
  else
    printf "Line rate: not measured (iperf3 failed). "
  printf "Node-link bound: time >= 2(m-1)/m x bytes / line rate with m = %d nodes", m
  if (have_rate) printf ", i.e. busbw <= %.4f GB/s", bound_bw
  printf ". %s = bound time / measured time%s; auto/MPI, auto/han = time ratios (below 1: Braid faster).\n\n", \
    fname, (r == 1 ? " (= busbw / line rate with one rank per host)" : "")
  print "busbw (GB/s):\n"
  hdr = "size"; sep = "---:"
  for (s = 1; s <= ns; s++) { hdr = hdr " | " (S[s] in name ? name[S[s]] : S[s]); sep = sep " | ---:" }
  row(hdr " | " fname); row(sep " | ---:")
  printf "bytes" > dat
  for (s = 1; s <= ns; s++) printf " %s", (S[s] ~ /^mpi/ ? "OpenMPI" substr(S[s], 4) : "Braid-" S[s]) > dat
  printf "\n" > dat
  for (i = 1; i <= nsz; i++) {
    b = sz[i]; line = hsize(b); printf "%s", b > dat
    for (s = 1; s <= ns; s++) {
      k = S[s] SUBSEP b; bw = (k in med) ? b / med[k] / 1e3 * busf : ""
      line = line " | " fbw(bw); printf " %s", (bw == "" ? "?" : sprintf("%.6f", bw)) > dat
    }
    printf "\n" > dat
    k = "auto" SUBSEP b; frac[b] = (have_rate && (k in med)) ? linkf * b / rate * 1e6 / med[k] : ""
    row(line " | " fr(frac[b]))
  }
  close(dat)
  print "\ntime (us):\n"
  hdr = "size"; sep = "---:"
  for (s = 1; s <= ns; s++) { hdr = hdr " | " (S[s] in name ? name[S[s]] : S[s]); sep = sep " | ---:" }
  row(hdr " | auto chose | auto/MPI | auto/han"); row(sep " | :--- | ---: | ---:")
  for (i = 1; i <= nsz; i++) {
    b = sz[i]; line = hsize(b)
    for (s = 1; s <= ns; s++) { k = S[s] SUBSEP b; line = line " | " ((k in med) ? ftime(med[k]) : "-") }
    a = "auto" SUBSEP b; p = "mpi" SUBSEP b; h = "mpi-han" SUBSEP b
    ra[b] = (a in med) && (p in med) ? med[a] / med[p] : ""
    rh[b] = (a in med) && (h in med) ? med[a] / med[h] : ""
    row(line " | " (b in ch ? ch[b] : "-") " | " fr(ra[b]) " | " fr(rh[b]))
  }
  # The targets of issue 5.
  tag = cfg " " lay
  big = 67108864
  if (r == 1) {
    mn = ""; nbig = 0
    for (i = 1; i <= nsz; i++) if (sz[i] >= big && frac[sz[i]] != "") {
      nbig++; if (mn == "" || frac[sz[i]] < mn) mn = frac[sz[i]]
    }
    if (nbig) printf "%s, 64 MiB and up: auto busbw/line rate min %.2f over %d sizes (target >= 0.95): %s\n", tag, mn, nbig, verdict(mn >= 0.95) > chk
    else printf "%s, 64 MiB and up: n/a (not measured)\n", tag > chk
  } else {
    if (frac[big] != "") printf "%s, 64 MiB: auto/node-link bound %.2f (target >= 0.95): %s\n", tag, frac[big], verdict(frac[big] >= 0.95) > chk
    else printf "%s, 64 MiB: auto/node-link bound n/a (not measured)\n", tag > chk
    if (ra[big] != "" || rh[big] != "") {
      ok = ra[big] != "" && rh[big] != "" && ra[big] < 1 && rh[big] < 1
      printf "%s, 64 MiB: auto time / MPI default %s, / MPI han %s (target < 1 both): %s\n", tag, fr(ra[big]), fr(rh[big]), verdict(ok) > chk
    } else printf "%s, 64 MiB: auto vs MPI n/a (not measured)\n", tag > chk
  }
  # No worse: auto at most MPI, or auto at the line rate (frac >= 1), where the
  # link sets the time for every library; those are counted apart.
  na = ca = nh = chh = nw = 0; wire = ""; ok = 1
  for (i = 1; i <= nsz; i++) {
    b = sz[i]; if (b > 65536) continue
    if (ra[b] != "") { na++; if (ra[b] <= 1) ca++ }
    if (rh[b] != "") { nh++; if (rh[b] <= 1) chh++ }
    behind = (ra[b] != "" && ra[b] > 1) || (rh[b] != "" && rh[b] > 1)
    if (behind && frac[b] != "" && frac[b] >= 1) {
      nw++; wire = wire sprintf("%s%s: auto/line %.2f, auto/MPI %s, auto/han %s", (wire == "" ? "" : "; "), hsize(b), frac[b], fr(ra[b]), fr(rh[b]))
    } else if (behind) ok = 0
  }
  ok = ok && na > 0 && nh > 0
  if (na + nh) printf "%s, latency %s..64 KiB: auto <= MPI default at %d/%d sizes, <= MPI han at %d/%d%s: %s\n", tag, hsize(sz[1]), ca, na, chh, nh, (nw ? sprintf(", at line rate at %d more (%s)", nw, wire) : ""), verdict(ok) > chk
  else printf "%s, latency 8 B..64 KiB: n/a (not measured)\n", tag > chk
  close(chk)
}'

# plot DATFILE PNG TITLE RATE_GBPS BOUND_GBPS: busbw vs size, one line per system, limits dashed.
plot() {
  local dat=$1 png=$2 title=$3 rate=$4 bound=$5 term ncol extra=""
  ncol=$(head -n 1 "$dat" | awk '{ print NF }')
  # Braid's columns solid (auto thicker), Open MPI's dashed.
  local mpi1
  mpi1=$(head -n 1 "$dat" | awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^OpenMPI/) { print i; exit } print NF + 1 }')
  [ "$ncol" -ge 2 ] && [ "$(wc -l <"$dat")" -ge 2 ] || return 0
  term="pngcairo size 1100,700 font ',10'"
  gnuplot -e "set terminal pngcairo" >/dev/null 2>&1 || term="png size 1100,700"
  if [ -n "$rate" ]; then
    extra=", $rate with lines dt 2 lw 2 lc rgb 'black' title sprintf('line rate (iperf3) %.3f GB/s', $rate)"
    [ "$bound" != "$rate" ] &&
      extra+=", $bound with lines dt 3 lw 2 lc rgb 'red' title sprintf('node-link bound %.3f GB/s', $bound)"
  fi
  gnuplot >"$RAW/gnuplot.log" 2>&1 <<EOF || echo "  plot $png failed: $(tail -n 1 "$RAW/gnuplot.log")"
set terminal $term
set output '$png'
set title "$title"
set logscale x 2
set xtics ("8 B" 8, "64 B" 64, "512 B" 512, "4 KiB" 4096, "32 KiB" 32768, "256 KiB" 262144, "2 MiB" 2097152, "16 MiB" 16777216, "128 MiB" 134217728, "1 GiB" 1073741824)
set xlabel "size (bytes, float sum, out-of-place)"
set ylabel "busbw (GB/s)"
set yrange [0:*]
set grid
set key outside right top
set datafile missing "?"
plot for [i=2:$((mpi1 - 1))] '$dat' using 1:i with linespoints pt 7 ps 0.6 lw (i == 2 ? 2.5 : 1.2) \
  title columnheader(i), \
  for [i=$mpi1:$ncol] '$dat' using 1:i with linespoints pt 7 ps 0.6 lw 1.2 dt 2 title columnheader(i)$extra
EOF
}

report() { # CONFIG LAYOUT
  local cfg=$1 lay=$2 lbl nodes rpn md dat chk rate="" bound=""
  lbl=$(label_of "$cfg")
  nodes=${lay%x*}
  rpn=${lay#*x}
  md=$OUT/table-$lbl-$lay.md
  dat=$RAW/busbw-$lbl-$lay.dat
  chk=$RAW/checks-$lbl-$lay.txt
  awk -v cfg="$lbl" -v lay="$lay" -v m="$nodes" -v r="$rpn" -v mbps="${LINE_MBPS_OF[$cfg]:-}" \
    -v nominal="$([ "$cfg" = off ] && echo none || echo "$cfg")" -v shaped="$([ "$cfg" = off ] && echo 0 || echo 1)" \
    -v systems="$SYSTEMS" -v reps="$REPS" -v lreps="$LARGE_REPS" -v split_b="$SPLITB" \
    -v choicef="$RAW/$lbl-$lay-choice.txt" -v dat="$dat" -v chk="$chk" "$REPORT_AWK" "$CSV" >"$md"
  { echo; echo "Targets:"; echo; sed 's/^/- /' "$chk"; } >>"$md"
  if [ -n "${LINE_MBPS_OF[$cfg]:-}" ]; then
    rate=$(awk -v m="${LINE_MBPS_OF[$cfg]}" 'BEGIN { printf "%.4f", m / 8000 }')
    bound=$(awk -v m="${LINE_MBPS_OF[$cfg]}" -v a="$nodes" -v r="$rpn" \
      'BEGIN { n = a * r; printf "%.4f", m / 8000 * (2 * (n - 1) / n) / (2 * (a - 1) / a) }')
  fi
  plot "$dat" "$OUT/busbw-$lbl-$lay.png" "all-reduce busbw, $lbl links, $nodes hosts x $rpn rank(s) per host" "$rate" "$bound"
}

# ---------------------------------------------------------------- main
declare -A LINE_MBPS_OF=()
if [ "${REPORT_ONLY:-0}" = 1 ]; then
  # Tables and plots again from OUT's results.csv and raw/ (no root, no cluster, nothing measured).
  OUT=$(cd "$OUT" 2>/dev/null && pwd) || cannot "no $OUT to report on"
  RAW=$OUT/raw
  CSV=$OUT/results.csv
  [ -f "$CSV" ] && [ -d "$RAW" ] || cannot "no $CSV or $RAW to report on"
  for cfg in "${CONFIGS[@]}"; do
    LINE_MBPS_OF[$cfg]=$(awk -F, -v c="$(label_of "$cfg")" \
      '$1 == c && $3 == "iperf3" && $4 == "min" { print $9 * 8000 }' "$CSV")
  done
else
  start
  CFG_INDEX=0
  for cfg in "${CONFIGS[@]}"; do
    t0=$SECONDS
    echo "### $(label_of "$cfg") links: $NHOSTS hosts, layouts $LAYOUTS"
    "$CLUSTER" shape "$cfg" || cannot "scripts/cluster.sh shape $cfg failed"
    measure_links "$cfg"
    LINE_MBPS_OF[$cfg]=$LINE_MBPS
    echo "  line rate (minimum over the links): ${LINE_MBPS:-n/a} Mbit/s"
    SYS_SECS[iperf3]=$((${SYS_SECS[iperf3]:-0} + SECONDS - t0))
    for lay in $LAYOUTS; do run_layout "$cfg" "$lay"; done
    CFG_INDEX=$((CFG_INDEX + 1))
  done
fi

{
  echo "# Braid all-reduce vs Open MPI on an emulated cluster"
  echo
  echo "$(date -u '+%F %H:%M UTC'), $(nproc) cores, $(uname -r), $(mpirun --version 2>/dev/null | head -n 1)." \
    "Every system: mpirun through scripts/cluster.sh, --mca btl self,vader,tcp, float sum," \
    "out-of-place; MPI han adds --mca coll_han_priority 100." \
    "Latency sweep $(hsize "$MINB")..$(hsize "$LATB"): -n $LAT_ITERS -w $LAT_WARMUP;" \
    "small sweep up to $(hsize $((MAXB < SPLITB ? MAXB : SPLITB))): -n $SMALL_ITERS" \
    "-w $SMALL_WARMUP; $REPS run(s) each$([ "$MAXB" -gt "$SPLITB" ] && echo "; large sweep up to $(hsize "$MAXB"):" \
      "-n $LARGE_ITERS -w $LARGE_WARMUP, $LARGE_REPS run(s)")$([ "$SLOWB" -lt "$MAXB" ] &&
      echo "; $SLOW_SYSTEMS up to $(hsize "$SLOWB")")."
  echo
  for cfg in "${CONFIGS[@]}"; do
    for lay in $LAYOUTS; do
      report "$cfg" "$lay"
      cat "$OUT/table-$(label_of "$cfg")-$lay.md"
      echo
    done
  done
  echo "## Verdict"
  echo
  for cfg in "${CONFIGS[@]}"; do
    for lay in $LAYOUTS; do sed 's/^/- /' "$RAW/checks-$(label_of "$cfg")-$lay.txt"; done
  done
  echo
  if [ "${REPORT_ONLY:-0}" != 1 ]; then
    total=$((SECONDS - T_START))
    printf "Runtime: %dm%02ds in all; seconds per system (all configurations and layouts):" \
      $((total / 60)) $((total % 60))
    sep=""
    for s in iperf3 $SYSTEMS choice; do
      [ -n "${SYS_SECS[$s]:-}" ] && printf "%s %s %d" "$sep" "$s" "${SYS_SECS[$s]}" && sep=","
    done
    echo
  fi
  echo
  echo "Files: $CSV, $OUT/table-*.md, $OUT/busbw-*.png, raw outputs in $RAW"
} | tee "$OUT/report.md"
exit 0
