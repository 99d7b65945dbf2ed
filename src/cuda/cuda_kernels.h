/*
 * The reduce-copy kernel on a device: the fatbin the build embeds
 * (kernels/cuda/reduce.cu), loaded once per context, and its launch for a
 * kernels/cuda/kern_body.h task on a stream.
 */
#ifndef BRAID_CUDA_KERNELS_H_
#define BRAID_CUDA_KERNELS_H_

#include <cuda.h>

#include "cuda/kern_body.h"
#include "nccl.h"

/* Enqueue `task` (its pointers device-accessible) on `stream` in the
 * current context. */
ncclResult_t cuda_reduce_copy(const struct kern_dev_task* task, CUstream stream);

#endif /* BRAID_CUDA_KERNELS_H_ */
