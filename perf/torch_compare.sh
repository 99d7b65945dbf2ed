#!/usr/bin/env bash
# torch.distributed over Braid against gloo in the same run: all_reduce 4 KiB..256 MiB and DDP
# steps per second, NP ranks on this host (perf/torch_bench.py), then a plot (docs/torch-perf.png).
#
# Usage: perf/torch_compare.sh [BUILD_DIR]   (env: NP=4, OUT=a directory for the JSON and plot,
#        BENCH_ARGS=extra torch_bench.py flags). Installs torch (scripts/torch-env.sh),
#        matplotlib and bindings/torch into the cached environment first.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[[ $build = /* ]] || build=$top/$build # a build directory anywhere, or in the tree
np=${NP:-4}
out=${OUT:-$build/torch-perf}
mkdir -p "$out"

venv=$("$top/scripts/torch-env.sh")
"$top/bindings/torch/install.sh" "$venv" "$build" >&2
"$venv/bin/python" -c 'import matplotlib' 2>/dev/null ||
  "$venv/bin/python" -m pip install -q --disable-pip-version-check matplotlib >&2

# Braid's logs stay quiet; each rank one thread (NP ranks share the cores)
export OMP_NUM_THREADS=1
# shellcheck disable=SC2086
"$venv/bin/python" "$top/perf/torch_bench.py" --np "$np" --json "$out/torch-perf.json" \
  ${BENCH_ARGS:-} | tee "$out/torch-perf.txt"
"$venv/bin/python" "$top/perf/torch_plot.py" "$out/torch-perf.json" "$out/torch-perf.png"
echo "# plot: $out/torch-perf.png"
