#!/usr/bin/env bash
# PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test,
# the DistributedTest base torch's backends run) against "braid", registered as a plugin, and
# against "gloo" on the same machine; then a table of each test's outcome side by side.
#
# Usage: bindings/torch/tests/run_torch_suites.sh [BUILD_DIR]
#   env: WORLD_SIZE=3, BACKENDS="gloo braid", OUT=BUILD_DIR/torch-suites, PYTEST_ARGS (-k ...),
#        SUITE_LIMIT_S=5400 per backend. Not part of make test (4 to 7 min per backend on 2 cores).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
out=${OUT:-$build/torch-suites}
mkdir -p "$out"
venv=$("$top/scripts/torch-env.sh") || exit 1
"$top/bindings/torch/install.sh" "$venv" "$build" || exit 1
export WORLD_SIZE=${WORLD_SIZE:-3} OMP_NUM_THREADS=1
# braid-as-gloo: braid registered under gloo's name, so that the tests the suite runs only for
# a backend named "gloo" run on braid too (their profiler-name checks aside)
for b in ${BACKENDS:-gloo braid braid-as-gloo}; do
  echo "=== $b: distributed_test, WORLD_SIZE=$WORLD_SIZE"
  t0=$(date +%s)
  as_gloo=0 name=$b
  [ "$b" = braid-as-gloo ] && as_gloo=1 name=gloo
  # shellcheck disable=SC2086
  BACKEND=$name BRAID_SUITE_AS_GLOO=$as_gloo TEMP_DIR=$(mktemp -d) timeout -k 30 "${SUITE_LIMIT_S:-5400}" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -q -rN "$here/suites/distributed_suite.py" \
    --junitxml="$out/$b.xml" ${PYTEST_ARGS:-} >"$out/$b.log" 2>&1
  echo "$b: exit $? after $(($(date +%s) - t0)) s; $(tail -1 "$out/$b.log")"
done
"$venv/bin/python" "$here/suites/summarize.py" "$out"/*.xml | tee "$out/table.md"
