#!/usr/bin/env bash
# Build tests/abi/dropin.c against NVIDIA's nccl.h (shipped with the CUDA
# toolkit) and run it on Braid's libnccl.so.2. Skips where no such header is.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
hdr=""
for d in /usr/local/cuda/include /usr/local/include /usr/include; do
  [ -f "$d/nccl.h" ] && ! grep -q "Braid" "$d/nccl.h" && hdr=$d && break
done
cuda=""
[ -f /usr/local/cuda/include/cuda_runtime.h ] && cuda=/usr/local/cuda/include
if [ -z "$hdr" ] || [ -z "$cuda" ]; then
  echo "skip: no NVIDIA nccl.h + cuda_runtime.h here to build a foreign NCCL program"
  exit 0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -D_GNU_SOURCE -I"$hdr" -I"$cuda" "$top/tests/abi/dropin.c" -o "$out/dropin" \
  -L"$build/lib" -Wl,--disable-new-dtags -lnccl || { echo "dropin: build failed"; exit 1; }
echo "dropin: built against $hdr/nccl.h ($(grep -m1 'define NCCL_VERSION_CODE' "$hdr/nccl.h"))"
LD_LIBRARY_PATH="$build/lib" timeout 120 "$out/dropin"
