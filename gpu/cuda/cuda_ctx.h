/*
 * Device work done by a library thread (the proxy, the progress engine,
 * a host stream) or the user's: the context it belongs to is made current
 * around it, and what was current before is put back.
 */
#ifndef BRAID_CUDA_CTX_H_
#define BRAID_CUDA_CTX_H_

#include <cuda.h>

#include "cuda_driver.h"
#include "nccl.h"

/* Make ctx current; *saved gets what was, to give back to cuda_ctx_restore. */
ncclResult_t cuda_ctx_enter(CUcontext ctx, CUcontext* saved);
void cuda_ctx_restore(CUcontext saved);

#endif /* BRAID_CUDA_CTX_H_ */
