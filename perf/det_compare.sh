#!/usr/bin/env bash
# What the deterministic mode costs (docs/determinism.md): all_reduce_perf and
# reduce_scatter_perf, float sum, the default mode against BRAID_DETERMINISTIC=1 in interleaved
# rounds on the same machine, for each rank count in NPS, over shared memory and over TCP
# (NCCL_SHM_DISABLE=1): the 8 B time (many iterations) and the BIG busbw (few). Prints every
# round of both modes, then per configuration the medians and deterministic / default; with MD,
# also writes them as docs/det/cost.md's table (produced by this script, never typed).
# Usage: perf/det_compare.sh [BUILD_DIR [MD]]   (env: NPS="4 8", REPS=5, BIG=64M, COLLS="all_reduce
#        reduce_scatter", SMALL_ITERS=2000, BIG_ITERS=5, TMO=900 seconds per run)
set -u
BUILD=${1:-build}
MD=${2:-}
NPS=${NPS:-4 8}
REPS=${REPS:-5}
BIG=${BIG:-64M}
COLLS=${COLLS:-all_reduce reduce_scatter}
SMALL_ITERS=${SMALL_ITERS:-2000}
BIG_ITERS=${BIG_ITERS:-5}
TMO=${TMO:-900}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# shellcheck source=perf/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck disable=SC2054 # "self,tcp" is one argument of mpirun's
MPI_ARGS=(--mca btl self,tcp --mca btl_tcp_if_include lo -x BRAID_DETERMINISTIC -x NCCL_SHM_DISABLE)
# run NAME COLL ARGS...: one run appended to $OUT/NAME.REP
run() {
  local name=$1 coll=$2
  shift 2
  timeout "$TMO" "${LAUNCH[@]}" "${MPI_ARGS[@]}" "$BUILD/bin/${coll}_perf" -c 0 -d float \
    -o sum --inplace 0 "$@" >"$OUT/$name.$rep" 2>&1 || echo "# $name round $rep failed" >&2
}
# value NAME REP COL: the out-of-place time (col 6) or busbw (col 8) of round REP's row
value() {
  awk -v c="$3" '!/^#/ && NF >= 13 { print $c; exit }' "$OUT/$1.$2" 2>/dev/null
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

rows=()
for np in $NPS; do
  bench_launch "$np"
  for link in shm tcp; do
    NCCL_SHM_DISABLE=$([ "$link" = tcp ] && echo 1 || echo 0)
    export NCCL_SHM_DISABLE
    for rep in $(seq 1 "$REPS"); do
      for coll in $COLLS; do
        for mode in 0 1; do
          export BRAID_DETERMINISTIC=$mode
          [ "$coll" = all_reduce ] && run "$coll-$np-$link-small-$mode" "$coll" -b 8 -e 8 \
            -n "$SMALL_ITERS" -w 100
          run "$coll-$np-$link-big-$mode" "$coll" -b "$BIG" -e "$BIG" -n "$BIG_ITERS" -w 1
        done
      done
    done
    for coll in $COLLS; do
      for what in small big; do
        [ "$what" = small ] && [ "$coll" != all_reduce ] && continue
        # small: time in us (lower is better); big: busbw in GB/s (higher is better)
        col=$([ "$what" = small ] && echo 6 || echo 8)
        unit=$([ "$what" = small ] && echo us || echo GB/s)
        d="" x=""
        for rep in $(seq 1 "$REPS"); do
          d+="$(value "$coll-$np-$link-$what-0" "$rep" "$col") "
          x+="$(value "$coll-$np-$link-$what-1" "$rep" "$col") "
        done
        a=$(median <<<"$d")
        b=$(median <<<"$x")
        ratio=$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "?" }')
        size=$([ "$what" = small ] && echo 8B || echo "$BIG")
        printf "%-14s %-3s %-4s %-5s rounds  default: %s %s\n" "$coll" "$np" "$link" "$size" "$d" "$unit"
        printf "%-14s %-3s %-4s %-5s rounds  determ.: %s %s\n" "$coll" "$np" "$link" "$size" "$x" "$unit"
        printf "%-14s %-3s %-4s %-5s medians default %s, deterministic %s %s: det/default %s%s\n" \
          "$coll" "$np" "$link" "$size" "${a:-?}" "${b:-?}" "$unit" "$ratio" \
          "$([ "$what" = small ] && echo " (time)")"
        rows+=("| ${coll/_/-} | $np | $([ "$link" = shm ] && echo shared memory || echo TCP) | $size | ${a:-?} $unit | ${b:-?} $unit | $ratio$([ "$what" = small ] && echo " (time)") | ${d% } | ${x% } |")
      done
    done
  done
done

[ -n "$MD" ] || exit 0
mkdir -p "$(dirname "$MD")"
top=$(cd "$(dirname "$0")/.." && pwd)
shown=$(realpath -m "$MD")
shown=${shown#"$top/"}
{
  echo "# What the deterministic mode costs: produced by perf/det_compare.sh"
  echo
  echo "Produced by \`NPS=\"$NPS\" REPS=$REPS BIG=$BIG perf/det_compare.sh BUILD $shown\` on"
  echo "$(date -u +%Y-%m-%d), commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null),"
  echo "$(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)): float sum,"
  echo "\`--inplace 0\`, the two modes alternating in every round; the medians of $REPS rounds, and"
  echo "every round in the order run (8 B: time, lower is better; $BIG: bus bandwidth). Do not"
  echo "edit: run the script again."
  echo
  echo "| collective | ranks | link | size | default | deterministic | det / default | default, each round | deterministic, each round |"
  echo "|---|---:|---|---|---:|---:|---:|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$MD"
echo "wrote $MD"
