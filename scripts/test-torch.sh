#!/usr/bin/env bash
# make test-torch (part of make test): the torch.distributed backend "braid" (bindings/torch).
# Makes or reuses the cached environment with torch from PyPI (scripts/torch-env.sh), builds and
# installs the package against BUILD's libbraid.a, and runs its tests (bindings/torch/tests).
# PyTorch's own suites are not part of it: bindings/torch/tests/run_torch_suites.sh.
#
#   scripts/test-torch.sh [prepare] [BUILD]
# prepare: only the environment and the package (make test runs it in the background,
# niced, while the C tests run: the download and the compile overlap them; the run
# after it finds both ready).
set -uo pipefail
mode=all
if [ "${1:-}" = prepare ]; then
  mode=prepare
  shift
fi
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
limit=${BRAID_TORCH_TEST_LIMIT_S:-600}
t0=$(date +%s)
venv=$("$top/scripts/torch-env.sh") || { echo "test-torch: no torch environment"; exit 1; }
"$top/bindings/torch/install.sh" "$venv" "$build" || { echo "test-torch: braid_torch did not build"; exit 1; }
echo "test-torch: environment and package ready ($(($(date +%s) - t0)) s)"
[ $mode = prepare ] && exit 0
cd "$top/bindings/torch/tests" &&
  OMP_NUM_THREADS=1 timeout -k 10 "$limit" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    -o console_output_style=classic .
rc=$?
echo "test-torch: $(($(date +%s) - t0)) s"
exit $rc
