#!/usr/bin/env bash
# Build braid_torch for a Python environment that has torch, and put it on that environment's
# path: bindings/torch/install.sh VENV [BUILD_DIR]
# Against Braid from BRAID_HOME when set (an install prefix), else the repository's headers and
# BUILD_DIR/lib (default: build). The tests and benchmarks use this; users can equally
# `pip install ./bindings/torch` (docs/torch.md).
#
# It builds in VENV/braid-torch-src, a copy of the sources whose unchanged files keep their
# times, with torch's ninja build: a later run recompiles only what changed and relinks when
# libbraid.a did (compiling against torch's headers takes minutes on 2 cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=$(cd "$1" && pwd)
build=${2:-$here/../../build}
py="$venv/bin/python"
src="$venv/braid-torch-src"
mkdir -p "$src/braid_torch" "$src/csrc" "$src/home"
if [ -n "${BRAID_HOME:-}" ]; then
  lib=$BRAID_HOME/lib inc=$BRAID_HOME/include
else
  lib=$(cd "$build/lib" && pwd) inc=$(cd "$here/../../include" && pwd)
fi
ln -sfn "$lib" "$src/home/lib"
ln -sfn "$inc" "$src/home/include"
for f in $(cd "$here" && echo setup.py braid_torch/*.py csrc/*); do
  cmp -s "$here/$f" "$src/$f" || cp "$here/$f" "$src/$f"
done
"$py" -c 'import ninja' 2>/dev/null ||
  "$py" -m pip install -q --disable-pip-version-check ninja >&2
# a pip-installed braid_torch would shadow this build
if "$py" -m pip show -q braid_torch >/dev/null 2>&1; then
  "$py" -m pip uninstall -y -q braid_torch >&2
fi
(cd "$src" && MAX_JOBS=${MAX_JOBS:-2} BRAID_HOME="$src/home" "$py" setup.py -q build_ext --inplace) >&2
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$src" >"$site/braid_torch_build.pth"
"$py" -c 'import braid_torch' >&2
