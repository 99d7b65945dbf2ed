#!/usr/bin/env bash
# What the deterministic mode costs (docs/determinism.md): all_reduce_perf and
# reduce_scatter_perf, float sum, the default mode against the deterministic one in the same job:
# `--det-turns REPS` times each size in REPS turns, the default then the deterministic mode
# (braidCommSetDeterministic) in every turn, so that both see the same state of a machine whose
# speed drifts (this VM's moves 2x within seconds; separate jobs compared its phases, not the
# modes). For each rank count in NPS, over shared memory and over TCP (NCCL_SHM_DISABLE=1): the
# 8 B time (many iterations) and the BIG bus bandwidth (few). Prints every turn of both modes,
# then per configuration the medians and the median of the turns' det / default; with MD, also
# writes them as docs/det/cost.md's table (produced by this script, never typed).
# With LAYOUTS (e.g. "2x4": NODESxRANKS_PER_NODE), the same again on an emulated cluster of that
# many hosts (scripts/cluster.sh, links shaped to RATE; root only): shared memory inside a host,
# TCP between hosts.
# With PLACES (e.g. "free rr block parity"), each one-host configuration runs once per placement
# of its ranks on the cores (perf/pin_rank.sh): with more ranks than cores, which ranks share a
# core decides which messages stay in its cache, so a job left to the kernel ("free") keeps the
# figure of wherever it was put, and two jobs differ.
# Usage: perf/det_compare.sh [BUILD_DIR [MD]]   (env: NPS="4 8" (empty: none), REPS=7, BIG=64M, COLLS="all_reduce
#        reduce_scatter", SMALL_ITERS=2000, BIG_ITERS=5, TMO=900 seconds per run, LAYOUTS="",
#        RATE=2gbit, PLACES=free)
set -u
BUILD=${1:-build}
MD=${2:-}
NPS=${NPS-4 8}
REPS=${REPS:-7}
BIG=${BIG:-64M}
COLLS=${COLLS:-all_reduce reduce_scatter}
SMALL_ITERS=${SMALL_ITERS:-2000}
BIG_ITERS=${BIG_ITERS:-5}
TMO=${TMO:-900}
LAYOUTS=${LAYOUTS:-}
RATE=${RATE:-2gbit}
PLACES=${PLACES:-free}
PIN_RANK="$(dirname "$0")/pin_rank.sh"
PIN=()
CLUSTER="$(dirname "$0")/../scripts/cluster.sh"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"; [ -z "$LAYOUTS" ] || "$CLUSTER" down >/dev/null 2>&1' EXIT
# shellcheck source=perf/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck disable=SC2054 # "self,tcp" is one argument of mpirun's
MPI_ARGS=(--mca btl self,tcp --mca btl_tcp_if_include lo -x NCCL_SHM_DISABLE)
# run NAME COLL ARGS...: one job of REPS turns into $OUT/NAME
run() {
  local name=$1 coll=$2
  shift 2
  timeout "$TMO" "${LAUNCH[@]}" "${MPI_ARGS[@]}" "${PIN[@]}" "$BUILD/bin/${coll}_perf" -c 0 -d float \
    -o sum --inplace 0 --det-turns "$REPS" "$@" >"$OUT/$name" 2>&1 || echo "# $name failed" >&2
}
# turns NAME WHAT: the turns' values of one job; WHAT is "default" or "deterministic" (times in
# us), "ratio" (det / default time, per turn), or with BUS set, the bus bandwidths in GB/s (the
# table row's busbw x time over each turn's time)
turns() {
  awk -v what="$2" -v bus="${BUS:-0}" '
    !/^#/ && NF >= 13 && !f { f = $6 * $8 }
    $0 ~ "^#  " what "," { for (i = 4; i <= NF; i++) printf "%s ", (bus ? sprintf("%.2f", f / $i) : $i) }
    what == "ratio" && /^#  det \/ default, time:/ { for (i = 7; i <= NF; i++) printf "%s ", $i }
  ' "$OUT/$1" 2>/dev/null
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

# measure NAME_PREFIX RANKS LINK_LABEL: every collective and size of one configuration, launched
# with LAUNCH and MPI_ARGS; appends its table rows
measure() {
  local prefix=$1 np=$2 label=$3 coll what name bus unit d x a b ratio size
  for coll in $COLLS; do
    for what in small big; do
      [ "$what" = small ] && [ "$coll" != all_reduce ] && continue
      name="$coll-$prefix-$what"
      if [ "$what" = small ]; then
        run "$name" "$coll" -b 8 -e 8 -n "$SMALL_ITERS" -w 100
      else
        run "$name" "$coll" -b "$BIG" -e "$BIG" -n "$BIG_ITERS" -w 1
      fi
      # small: time in us (lower is better); big: busbw in GB/s (higher is better)
      bus=$([ "$what" = big ] && echo 1 || echo 0)
      unit=$([ "$what" = small ] && echo us || echo GB/s)
      d=$(BUS=$bus turns "$name" default)
      x=$(BUS=$bus turns "$name" deterministic)
      a=$(median <<<"$d")
      b=$(median <<<"$x")
      # the median of the turns' ratios: time for 8 B, bandwidth (its inverse) for BIG
      ratio=$(turns "$name" ratio | tr ' ' '\n' | grep -v '^$' |
        awk -v inv="$bus" '{ print inv ? 1 / $1 : $1 }' | median)
      ratio=$(awk -v r="${ratio:-0}" 'BEGIN { if (r > 0) printf "%.2f", r; else print "?" }')
      size=$([ "$what" = small ] && echo 8B || echo "$BIG")
      printf "%-14s %-3s %-14s %-5s turns  default: %s %s\n" "$coll" "$np" "$label" "$size" "$d" "$unit"
      printf "%-14s %-3s %-14s %-5s turns  determ.: %s %s\n" "$coll" "$np" "$label" "$size" "$x" "$unit"
      printf "%-14s %-3s %-14s %-5s medians default %s, deterministic %s %s: det/default %s%s\n" \
        "$coll" "$np" "$label" "$size" "${a:-?}" "${b:-?}" "$unit" "$ratio" \
        "$([ "$what" = small ] && echo " (time)")"
      rows+=("| ${coll/_/-} | $np | $label | $size | ${a:-?} $unit | ${b:-?} $unit | $ratio$([ "$what" = small ] && echo " (time)") | ${d% } | ${x% } |")
      [ "$what" = big ] && [ -n "$SUM_KEY" ] && by_place["$SUM_KEY|$coll"]=$ratio
    done
  done
}

rows=()
declare -A by_place # "NP LINK|PLACE|COLL" -> the BIG det / default of that job
SUM_KEY=""
for np in $NPS; do
  bench_launch "$np"
  for place in $PLACES; do
    cores=$("$PIN_RANK" --cores "$place" "$np") || exit 2
    PIN=("$PIN_RANK" "$place")
    where=$([ "$place" = free ] || echo ", cores $cores")
    for link in shm tcp; do
      NCCL_SHM_DISABLE=$([ "$link" = tcp ] && echo 1 || echo 0)
      export NCCL_SHM_DISABLE
      SUM_KEY="$np $link|$place"
      measure "$np-$link-$place" "$np" "$([ "$link" = shm ] && echo shared memory || echo TCP)$where"
    done
  done
done
SUM_KEY=""
PIN=()
export NCCL_SHM_DISABLE=0
for lay in $LAYOUTS; do
  nodes=${lay%x*} rpn=${lay#*x} hosts=""
  "$CLUSTER" up "$nodes" "$RATE" >/dev/null || { echo "# $lay: scripts/cluster.sh up failed" >&2; continue; }
  mapfile -t cluster_args < <("$CLUSTER" mpirun-args)
  for ((i = 0; i < nodes; i++)); do hosts+="${hosts:+,}h$i:$rpn"; done
  LAUNCH=(mpirun "${cluster_args[@]}" -np $((nodes * rpn)) -host "$hosts")
  # shellcheck disable=SC2054 # "self,vader,tcp" is one argument of mpirun's
  MPI_ARGS=(--mca btl self,vader,tcp -x NCCL_SHM_DISABLE)
  measure "$lay" $((nodes * rpn)) "$nodes x $rpn hosts, $RATE"
  "$CLUSTER" down >/dev/null
done

# placement_table: the BIG ratios of every one-host job, a column per placement
placement_table() {
  local np link place
  echo
  echo "By placement of the ranks on the cores ($BIG, det / default of the bus bandwidth, all-reduce /"
  echo "reduce-scatter; \"free\": placed by the kernel; the rows above give each one's cores):"
  echo
  printf '| ranks, link |'
  for place in $PLACES; do printf ' %s |' "$place"; done
  printf '\n|---|'
  for place in $PLACES; do printf -- '---|'; done
  echo
  for np in $NPS; do
    for link in shm tcp; do
      printf '| %s, %s |' "$np" "$([ "$link" = shm ] && echo shared memory || echo TCP)"
      for place in $PLACES; do
        printf ' %s / %s |' "${by_place["$np $link|$place|all_reduce"]:-?}" \
          "${by_place["$np $link|$place|reduce_scatter"]:-?}"
      done
      echo
    done
  done
}

[ -n "$MD" ] || exit 0
mkdir -p "$(dirname "$MD")"
top=$(cd "$(dirname "$0")/.." && pwd)
shown=$(realpath -m "$MD")
shown=${shown#"$top/"}
{
  echo "# What the deterministic mode costs: produced by perf/det_compare.sh"
  echo
  echo "Produced by \`NPS=\"$NPS\" REPS=$REPS BIG=$BIG LAYOUTS=\"$LAYOUTS\" RATE=$RATE PLACES=\"$PLACES\" perf/det_compare.sh BUILD $shown\` on"
  echo "$(date -u +%Y-%m-%d), commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null),"
  echo "$(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)): float sum,"
  echo "\`--inplace 0\`. Each configuration is one job whose $REPS turns each time the default"
  echo "mode, then the deterministic one (\`--det-turns\`); shown: the medians of the turns, the"
  echo "median of the turns' det / default (8 B: time, lower is better; $BIG: bus bandwidth), and"
  echo "every turn in the order run. A link's \"cores\" are the cores its ranks were held on, rank 0"
  echo "first (perf/pin_rank.sh); without them the kernel placed the ranks. Do not edit: run the"
  echo "script again."
  echo
  echo "| collective | ranks | link | size | default | deterministic | det / default | default, each turn | deterministic, each turn |"
  echo "|---|---:|---|---|---:|---:|---:|---|---|"
  printf '%s\n' "${rows[@]}"
  [ "$PLACES" = free ] || placement_table
} >"$MD"
echo "wrote $MD"
