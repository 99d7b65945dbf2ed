/*
 * The current context around device work (cuda_ctx.h).
 */
#include "cuda_ctx.h"

#include "core.h"

ncclResult_t cuda_ctx_enter(CUcontext ctx, CUcontext* saved) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  CHECK(cuda_check(cu->cuCtxGetCurrent(saved), "cuCtxGetCurrent"));
  if (*saved != ctx) CHECK(cuda_check(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
fail:
  return res;
}

void cuda_ctx_restore(CUcontext saved) {
  const struct cuda_api* cu = cuda_driver();
  CUcontext now = NULL;
  if (cu->cuCtxGetCurrent(&now) == CUDA_SUCCESS && now != saved) cu->cuCtxSetCurrent(saved);
}
