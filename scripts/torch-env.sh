#!/usr/bin/env bash
# A Python environment with PyTorch from PyPI, for bindings/torch (make test-torch, the torch
# suites, perf/torch_compare.sh). Made once, then reused; prints the venv's directory.
#
# Usage: scripts/torch-env.sh     (env: BRAID_TORCH_VENV=~/.cache/braid/torch-venv,
#                                   BRAID_TORCH_VERSION=2.15.0, BRAID_TORCH_PYTHON=python3.11)
#
# PyPI has only CUDA builds of torch for Linux x86_64, and the default install pulls 3.0 GB of
# wheels. `import torch` needs only the CUDA libraries torch's own libraries link (DT_NEEDED),
# so this installs torch without its dependencies, then what it requires less triton,
# cuda-bindings and the cuda-toolkit extras nothing links (cusolver, loaded only by CUDA linear
# algebra, and nvtx). CPU tensors never load any of them.
set -euo pipefail

venv=${BRAID_TORCH_VENV:-$HOME/.cache/braid/torch-venv}
version=${BRAID_TORCH_VERSION:-2.15.0}
stamp="$venv/.braid-torch-$version"

if [ -f "$stamp" ] && "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "$venv"
  exit 0
fi

py=${BRAID_TORCH_PYTHON:-}
if [ -z "$py" ]; then
  for c in python3.11 python3.12 python3.10 python3; do
    if command -v "$c" >/dev/null 2>&1; then
      py=$c
      break
    fi
  done
fi
[ -n "$py" ] || { echo "torch-env: no python3 found" >&2; exit 1; }

t0=$(date +%s)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv" >&2
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
"${pip[@]}" "torch==$version" --no-deps >&2
# What torch's wheel requires (read from the installed wheel, so another BRAID_TORCH_VERSION
# gets its own pins), less what CPU tensors never load.
mapfile -t pkgs < <("$venv/bin/python" - <<'EOF'
import importlib.metadata as md, re
linked = {"cublas", "cudart", "cufft", "cufile", "cupti", "cusparse", "nvjitlink", "nvrtc"}
for r in md.requires("torch") or []:
    name = r.split(";")[0].strip()
    if "extra ==" in r or re.match(r"(triton|cuda-bindings)\b", name):
        continue
    m = re.match(r"cuda-toolkit\[([^\]]*)\](.*)", name)
    if m:
        extras = [e.strip() for e in m.group(1).split(",") if e.strip() in linked]
        name = "cuda-toolkit[%s]%s" % (",".join(extras), m.group(2))
    print(name)
EOF
)
"${pip[@]}" "${pkgs[@]}" numpy pytest expecttest >&2
"$venv/bin/python" -c 'import torch.distributed as d; assert d.is_available()' >&2
touch "$stamp"
echo "torch-env: torch $version in $venv ($(du -sh "$venv" | cut -f1), $(($(date +%s) - t0)) s)" >&2
echo "$venv"
