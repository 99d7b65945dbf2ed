#!/usr/bin/env bash
# Build and install braid_torch into a Python environment that has torch:
#   bindings/torch/install.sh VENV [BUILD_DIR]
# against Braid from BRAID_HOME when set (an install prefix), else the repository's headers and
# BUILD_DIR/lib (default: build). Does nothing when neither the sources nor the library changed.
# Builds from a copy, so the source tree gets no build/ or egg-info.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=$1
build=${2:-$here/../../build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "${BRAID_HOME:-}" ]; then
  home=$BRAID_HOME
else
  home=$tmp/home
  mkdir -p "$home"
  ln -s "$(cd "$build/lib" && pwd)" "$home/lib"
  ln -s "$(cd "$here/../../include" && pwd)" "$home/include"
fi
stamp="$venv/.braid-torch-build"
sum=$(cat "$home/lib/libbraid.a" "$home"/include/*.h "$here/setup.py" "$here"/braid_torch/*.py \
  "$here"/csrc/* | md5sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] &&
  "$venv/bin/python" -c 'import braid_torch' 2>/dev/null; then
  exit 0
fi
cp -r "$here/setup.py" "$here/braid_torch" "$here/csrc" "$tmp/"
MAX_JOBS=${MAX_JOBS:-2} BRAID_HOME=$home "$venv/bin/python" -m pip install -q \
  --disable-pip-version-check --no-build-isolation "$tmp" >&2
echo "$sum" >"$stamp"
