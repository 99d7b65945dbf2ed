#!/usr/bin/env bash
# include/nccl.h must compile as C99 and C++ with no CUDA headers around,
# and next to CUDA's runtime header when a toolkit is installed.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/use.c" <<'SRC'
#include "nccl.h"
int braid_header_check(ncclComm_t comm, cudaStream_t stream) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclCollConfig_t coll = NCCL_COLLCONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  ncclWindow_t win = NULL;
  uint64_t stat = 0;
  float x = 0;
  (void)cfg, (void)sim, (void)enc, (void)win, (void)stat;
  return (int)ncclAllReduceConfig(&x, &x, 1, ncclFloat, ncclSum, comm, stream, &coll);
}
SRC
cp "$tmp/use.c" "$tmp/use.cpp"
fail=0
check() {
  if "$@" 2>"$tmp/err"; then echo "ok: $*"; else echo "FAILED: $*"; cat "$tmp/err"; fail=1; fi
}
check cc -std=c99 -pedantic -Wall -Wextra -Werror -I"$top/include" -fsyntax-only "$tmp/use.c"
check cc -std=c11 -Wall -Wextra -Werror -I"$top/include" -fsyntax-only "$tmp/use.c"
if command -v c++ >/dev/null 2>&1; then
  check c++ -std=c++11 -Wall -Wextra -Werror -I"$top/include" -fsyntax-only "$tmp/use.cpp"
fi
cuda_inc=""
for d in /usr/local/cuda/include /usr/include; do
  [ -f "$d/cuda_runtime.h" ] && cuda_inc=$d && break
done
if [ -n "$cuda_inc" ]; then
  check cc -std=c99 -Wall -Wextra -Werror -I"$top/include" -I"$cuda_inc" -fsyntax-only "$tmp/use.c"
  check c++ -std=c++11 -Wall -Wextra -Werror -I"$top/include" -I"$cuda_inc" -fsyntax-only "$tmp/use.cpp"
else
  echo "skip: no cuda_runtime.h on this machine"
fi
exit $fail
