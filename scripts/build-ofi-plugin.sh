#!/usr/bin/env bash
# Builds a real NCCL net plugin nobody here wrote, from its public source, for
# tests/cluster/net_plugin.sh (docs/net-plugins.md): aws-ofi-nccl over libfabric's
# tcp provider, both under PREFIX, nothing in the repository.
#   scripts/build-ofi-plugin.sh PREFIX
# Sources: git repositories of ofiwg/libfabric and aws/aws-ofi-nccl, LIBFABRIC_GIT and
# OFI_GIT (a clone, bare or not; default: github.com), at LIBFABRIC_TAG (v2.6.0) and
# OFI_TAG (v1.21.1). Debian's libfabric (1.17) is too old: its tcp provider speaks only
# connected endpoints, and aws-ofi-nccl needs reliable datagrams (1.18 and up).
# aws-ofi-nccl builds only against a GPU runtime: the CUDA toolkit's headers, the runtime
# opened at run time (--enable-cudart-dynamic), so that a host without a GPU can load it
# with a stand-in libcudart (tests/common/fakecudart/fakecudart.c). Needs autoconf, automake, libtool,
# g++, hwloc's headers and the CUDA toolkit (CUDA_HOME, default /usr/local/cuda).
set -euo pipefail
prefix=${1:?usage: $0 PREFIX}
lf_git=${LIBFABRIC_GIT:-https://github.com/ofiwg/libfabric.git}
ofi_git=${OFI_GIT:-https://github.com/aws/aws-ofi-nccl.git}
lf_tag=${LIBFABRIC_TAG:-v2.6.0}
ofi_tag=${OFI_TAG:-v1.21.1}
cuda=${CUDA_HOME:-/usr/local/cuda}
jobs=$(nproc)
mkdir -p "$prefix/src"
prefix=$(cd "$prefix" && pwd)

# A tag's tree, from a clone given or made (shallow).
source_of() { # git-url tag into
  local url=$1 tag=$2 into=$3 repo
  repo=$url
  rm -rf "$into" && mkdir -p "$into"
  if [ ! -d "$url" ]; then
    repo=$prefix/src/$(basename "$into").git
    [ -d "$repo" ] || git clone -q --bare --depth 1 --branch "$tag" "$url" "$repo"
  fi
  git -C "$repo" archive "$tag" | tar -x -C "$into"
}

if [ ! -x "$prefix/bin/fi_info" ]; then
  source_of "$lf_git" "$lf_tag" "$prefix/src/libfabric"
  (cd "$prefix/src/libfabric" && ./autogen.sh >/dev/null &&
    ./configure -q --prefix="$prefix" --enable-only --enable-tcp=yes --disable-static &&
    make -s -j"$jobs" && make -s install) >"$prefix/libfabric-build.log" 2>&1 ||
    { tail -20 "$prefix/libfabric-build.log"; exit 1; }
fi
"$prefix/bin/fi_info" -p tcp -t FI_EP_RDM >/dev/null || { echo "libfabric: no tcp RDM provider" >&2; exit 1; }

if [ ! -f "$prefix/lib/libnccl-net-ofi.so" ]; then
  source_of "$ofi_git" "$ofi_tag" "$prefix/src/aws-ofi-nccl"
  echo "${ofi_tag#v}" >"$prefix/src/aws-ofi-nccl/.release_version" # no git history in an archive
  (cd "$prefix/src/aws-ofi-nccl" && ./autogen.sh >/dev/null &&
    ./configure -q --prefix="$prefix" --with-libfabric="$prefix" --with-cuda="$cuda" \
      --enable-cudart-dynamic --disable-tests --disable-werror \
      LDFLAGS="-Wl,-rpath,$prefix/lib" &&
    make -s -j"$jobs" && make -s install) >"$prefix/ofi-build.log" 2>&1 ||
    { tail -30 "$prefix/ofi-build.log"; exit 1; }
fi
nm -D --defined-only "$prefix/lib/libnccl-net-ofi.so" | grep -q ncclNetPlugin_v12 ||
  { echo "aws-ofi-nccl: no ncclNetPlugin_v12 in $prefix/lib/libnccl-net-ofi.so" >&2; exit 1; }
echo "built: $prefix/lib/libnccl-net-ofi.so over libfabric $lf_tag ($prefix/lib)"
