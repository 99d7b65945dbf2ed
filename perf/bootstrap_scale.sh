#!/usr/bin/env bash
# The bootstrap's traffic as N grows (docs/clusters.md, "Bootstrap at scale"): ranks as threads
# on loopback against real roots (tests/unit/test_bootstrap_tree.c --sweep), counting what each
# rank and root 0 send. Three rows per N: the relay tree (fanout 8, the default), the same with
# four roots (ncclCommInitRankScalable), and the root sending every rank the table itself (the
# scheme before the tree: fanout N, up to the knob's 1024).
#
#   perf/bootstrap_scale.sh BUILD        writes docs/sim/bootstrap-scale.txt
set -euo pipefail
build=${1:?usage: perf/bootstrap_scale.sh BUILD}
top=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/tests/test_bootstrap_tree
out=$top/docs/sim/bootstrap-scale.txt
mkdir -p "$(dirname "$out")"
{
  echo "# perf/bootstrap_scale.sh on $(nproc) cores, $(date -u +%F)"
  echo "## the relay tree, fanout 8, one root"
  "$bin" --sweep 8 1
  echo "## the relay tree, fanout 8, four roots"
  "$bin" --sweep 8 4
  echo "## the root sends every rank the table (fanout N)"
  "$bin" --sweep -1 1
} 2>/dev/null | grep -v "NCCL INFO" >"$out"
cat "$out"
