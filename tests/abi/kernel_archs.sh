#!/usr/bin/env bash
# The CUDA kernels a build embeds are the ones its flags ask nvcc for (docs/building.md, "GPU
# architectures"; the flags are the build's obj/kernels/cuda/nvcc-flags): SASS for every sm_NN
# code, PTX for every compute_NN, and nothing else, so a fatbin left from a build for other
# architectures fails, as does SASS where a build without a GPU asked for PTX alone (it would
# have cost ptxas time). Read from the fatbins' headers (the toolkit here has no cuobjdump);
# the library's embedded copies must hold the fatbins whole. Skipped with one line where the
# build has no CUDA kernels.
#   tests/abi/kernel_archs.sh [BUILD]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
dir=$build/obj/kernels/cuda
shopt -s nullglob
fatbins=("$dir"/*.fatbin)
if [ ${#fatbins[@]} -eq 0 ]; then
  echo "kernel_archs: skipped (no CUDA kernels in $build)"
  exit 0
fi

# Little-endian unsigned integer of $3 bytes at offset $2 of file $1.
uint_at() {
  local v=0 i b
  local -a bytes
  read -r -a bytes < <(od -An -v -t u1 -j "$2" -N "$3" "$1")
  for ((i = $3 - 1; i >= 0; i--)); do
    b=${bytes[$i]:-0}
    v=$((v * 256 + b))
  done
  echo "$v"
}

# One line per image of fatbin $1: "ptx NN" or "sass NN" (the fatbin header: magic 0xba55ed50,
# its own size at 6 (u16) and the images' at 8 (u64); each image: kind at 0 (u16: 1 PTX, 2 ELF),
# its header's size at 4 (u32), its payload's at 8 (u64), the architecture at 28 (u32)).
images() {
  local f=$1 magic end off kind hsize psize sm
  magic=$(uint_at "$f" 0 4)
  if [ "$magic" -ne $((0xba55ed50)) ]; then
    echo "bad-magic $magic"
    return
  fi
  off=$(uint_at "$f" 6 2)
  end=$((off + $(uint_at "$f" 8 8)))
  while [ "$off" -lt "$end" ]; do
    kind=$(uint_at "$f" "$off" 2)
    hsize=$(uint_at "$f" $((off + 4)) 4)
    psize=$(uint_at "$f" $((off + 8)) 8)
    sm=$(uint_at "$f" $((off + 28)) 4)
    case $kind in 1) echo "ptx $sm" ;; 2) echo "sass $sm" ;; *) echo "kind$kind $sm" ;; esac
    [ "$hsize" -gt 0 ] || break
    off=$((off + hsize + psize))
  done
}

# What nvcc was asked for (the build's nvcc-flags: the Makefile's choice from CUDA_ARCHS, or
# NVCC_ARCHS given by hand): "sm_NN" codes are SASS, "compute_NN" codes PTX.
flags=$(cat "$dir/nvcc-flags" 2>/dev/null || true)
want=$(grep -o 'code=\[[^]]*\]\|code=[a-z_0-9]*' <<<"$flags" | sed 's/^code=//; s/[][]//g' | tr ',' '\n' |
  sed -n 's/^sm_\([0-9]*\)$/sass \1/p; s/^compute_\([0-9]*\)$/ptx \1/p' | sort -u)
if [ -z "$want" ]; then
  echo "FAILED: no -gencode flags in $dir/nvcc-flags ($flags)"
  exit 1
fi
fail=0
for f in "${fatbins[@]}"; do
  got=$(images "$f" | sort)
  name=$(basename "$f")
  if [ "$got" != "$want" ]; then
    echo "FAILED: $name holds [$(tr '\n' ' ' <<<"$got")], nvcc was asked for [$(tr '\n' ' ' <<<"$want")]"
    fail=1
  else
    echo "ok: $name holds $(tr '\n' ' ' <<<"$got")"
  fi
  # the library's array braid_fatbin_<name>[] is this file (the .c the Makefile made from it)
  c=$dir/${name%.fatbin}.fatbin.c
  if [ ! -f "$c" ] || [ "$(grep -o '0x[0-9a-f][0-9a-f]' "$c" | wc -l)" -ne "$(stat -c %s "$f")" ]; then
    echo "FAILED: $c does not embed $name whole"
    fail=1
  fi
done
exit $fail
