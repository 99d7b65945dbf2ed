#!/usr/bin/env bash
# perf/taxonomy.sh: the distributed-training taxonomy side by side (issue 20). braid-train runs
# the same model on the same data once per scheme, each on RANKS local ranks (NCCL_COMM_ID
# launch), and, when root, again on an emulated 4x1 cluster with 2 Gbit/s links
# (scripts/cluster.sh, mpirun through its agent). From each run's CSV: the final test accuracy,
# the training bytes each rank handed to Braid (mean over ranks), and the wall time of training.
# Writes, per setting, a markdown table (accuracy against the synchronous fp32 run, bytes as a
# fraction of its bytes, epoch time) and a PNG (test accuracy against bytes sent and against
# wall time, one point per scheme), and prints the tables.
#
# Usage: perf/taxonomy.sh [BUILD_DIR]          (default build)
# Environment (defaults shown):
#   EPOCHS=10 RANKS=4 BATCH=512         braid-train's defaults otherwise (MLP 512,256, lr 0.1, seed 1)
#   SCHEMES="allreduce:none allreduce:fp16 allreduce:bf16 allreduce:fp8 allreduce:topk:0.01
#            ps:none local:8:none stale:1:none gossip:none"   SYNC:CODE pairs
#   CLUSTER=auto                        auto: when root with network namespaces; 0: never
#   RATE=2gbit                          the cluster's link rate
#   DATA=/usr/share/datasets/fashion-mnist
#   OUT=BUILD_DIR/taxonomy              tables, plots, CSVs and logs
#   EXTRA="..."                         more braid-train flags for every run
#   REPORT_ONLY=1                       run nothing: the tables and plots again from OUT's CSVs
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
bin=$build/bin/braid-train
EPOCHS=${EPOCHS:-10}
RANKS=${RANKS:-4}
BATCH=${BATCH:-512}
SCHEMES=${SCHEMES:-"allreduce:none allreduce:fp16 allreduce:bf16 allreduce:fp8 allreduce:topk:0.01 ps:none local:8:none stale:1:none gossip:none"}
CLUSTER=${CLUSTER:-auto}
RATE=${RATE:-2gbit}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
OUT=${OUT:-$build/taxonomy}
EXTRA=${EXTRA:-}
REPORT_ONLY=${REPORT_ONLY:-0}
[ -x "$bin" ] || { echo "taxonomy: no $bin (make first)"; exit 1; }
[ -r "$DATA/train-images-idx3-ubyte.gz" ] || { echo "taxonomy: no Fashion-MNIST at $DATA"; exit 1; }
mkdir -p "$OUT"
port=$((20000 + RANDOM % 10000))
cluster_up=0
cleanup() { [ "$cluster_up" = 1 ] && BRAID_CLUSTER=tax "$top/scripts/cluster.sh" down >/dev/null 2>&1; }
trap cleanup EXIT

# "local:8:none" -> sync "local:8", code "none"; "allreduce:topk:0.01" -> allreduce, topk:0.01
split_scheme() {
  case "$1" in
    ps:[0-9]* | local:* | stale:*) sync=${1%%:*}:$(cut -d: -f2 <<<"$1"); code=$(cut -d: -f3- <<<"$1") ;;
    *) sync=${1%%:*}; code=${1#*:} ;;
  esac
}

flags() { # the run's braid-train flags
  echo --data "$DATA" --epochs "$EPOCHS" --batch "$BATCH" --sync "$sync" --compress "$code" \
    --plot none --progress never $EXTRA
}

# run_local TAG: RANKS ranks on this host
run_local() {
  local tag=$1 r pids=()
  port=$((port + 1))
  for ((r = 0; r < RANKS; r++)); do
    NCCL_COMM_ID=127.0.0.1:$port RANK=$r WORLD_SIZE=$RANKS \
      "$bin" $(flags) --csv "$OUT/$tag.csv" >"$OUT/$tag.log.$r" 2>&1 &
    pids+=($!)
  done
  local bad=0
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  return $bad
}

# run_cluster TAG: 4 ranks, one per emulated host
run_cluster() {
  local tag=$1
  BRAID_CLUSTER=tax timeout -k 5 7200 mpirun "${margs[@]}" -H h0,h1,h2,h3 -np 4 \
    "$bin" $(flags) --csv "$OUT/$tag.csv" >"$OUT/$tag.log.0" 2>&1
}

# summary SETTING: one line per scheme from the CSVs: scheme acc mb seconds epoch_s
summary() {
  local setting=$1 s
  for s in $SCHEMES; do
    split_scheme "$s"
    local csv="$OUT/$setting-${s//[:.]/_}.csv"
    [ -s "$csv" ] || { echo "$sync $code - - - -"; continue; }
    awk -F, -v name="$sync $code" 'NR > 1 { acc = $4; mb = $12; t += $6; n++ }
      END { printf "%s %.4f %.3f %.2f %.2f\n", name, acc, mb, t, t / n }' "$csv"
  done
}

# table SETTING TITLE: the markdown table; the first scheme is the reference
table() {
  local setting=$1 title=$2
  {
    echo "### $title"
    echo
    echo "| scheme | test acc | vs fp32 (points) | MB sent per rank | bytes vs fp32 | s per epoch | training s |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    summary "$setting" | awk '{ name = $1 " " $2 }
      NR == 1 { ra = $3; rm = $4 }
      $3 == "-" { printf "| %s | failed | | | | | |\n", name; next }
      { printf "| %s | %.2f%% | %+.2f | %.1f | %.4f | %.2f | %.1f |\n", name, 100 * $3,
               100 * ($3 - ra), $4, (rm > 0 ? $4 / rm : 0), $6, $5 }'
    echo
  } | tee "$OUT/$setting.md"
}

# plot SETTING TITLE: accuracy against bytes and against time
plot() {
  local setting=$1 title=$2
  summary "$setting" | awk '$3 != "-" { printf "\"%s %s\" %s %s %s\n", $1, $2, 100 * $3, $4, $5 }' \
    >"$OUT/$setting.dat"
  command -v gnuplot >/dev/null || { echo "(no gnuplot: no $setting.png)"; return; }
  local ref
  ref=$(awk 'NR == 1 { print $(NF - 2) }' "$OUT/$setting.dat") # the fp32 run's accuracy
  gnuplot <<GP
set terminal pngcairo size 1100,450 noenhanced
set output '$OUT/$setting.png'
set multiplot layout 1,2 title '$title: test accuracy after $EPOCHS epochs, one point per scheme'
set grid
set offsets graph 0.05, graph 0.05, graph 0.1, graph 0.05
set arrow from graph 0, first $ref to graph 1, first $ref nohead dashtype 2
set label 'synchronous fp32' at graph 0.02, first $ref offset 0,-0.7 font ',8'
set ylabel 'test accuracy (%)'
set xlabel 'MB sent per rank (log)'
set logscale x
plot '$OUT/$setting.dat' using 3:2 with points pt 7 notitle, '' using 3:2:1 with labels offset 0,1 font ',8' notitle
unset logscale x
set xlabel 'training wall time (s)'
plot '$OUT/$setting.dat' using 4:2 with points pt 7 notitle, '' using 4:2:1 with labels offset 0,1 font ',8' notitle
unset multiplot
GP
  echo "plot: $OUT/$setting.png"
}

echo "# taxonomy: $EPOCHS epochs, batch $BATCH, $(nproc) cores, $(date -u '+%F %H:%M UTC')"
for s in $SCHEMES; do
  [ "$REPORT_ONLY" = 1 ] && break
  split_scheme "$s"
  echo "local $RANKS ranks: --sync $sync --compress $code"
  run_local "local-${s//[:.]/_}" || echo "  failed: see $OUT/local-${s//[:.]/_}.log.*"
done
table local "$RANKS ranks on one host"
plot local "$RANKS ranks on one host"

if [ "$REPORT_ONLY" = 1 ]; then
  [ -f "$OUT/cluster.dat" ] && table cluster "4 emulated hosts, 1 rank each, $RATE links" &&
    plot cluster "4x1 emulated cluster, $RATE links"
elif [ "$CLUSTER" != 0 ] && [ "$(id -u)" -eq 0 ] && command -v mpirun >/dev/null &&
  BRAID_CLUSTER=tax "$top/scripts/cluster.sh" check 2>/dev/null; then
  export BRAID_CLUSTER=tax BRAID_CLUSTER_SUBNET=198.18.71
  cluster_up=1
  "$top/scripts/cluster.sh" up 4 "$RATE" >/dev/null || { echo "taxonomy: cluster up failed"; exit 1; }
  mapfile -t margs < <("$top/scripts/cluster.sh" mpirun-args)
  for s in $SCHEMES; do
    split_scheme "$s"
    echo "cluster 4x1 at $RATE: --sync $sync --compress $code"
    run_cluster "cluster-${s//[:.]/_}" || echo "  failed: see $OUT/cluster-${s//[:.]/_}.log.0"
  done
  table cluster "4 emulated hosts, 1 rank each, $RATE links"
  plot cluster "4x1 emulated cluster, $RATE links"
else
  echo "(emulated cluster skipped: needs root, mpirun and network namespaces)"
fi
