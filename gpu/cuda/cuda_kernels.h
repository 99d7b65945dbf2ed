/*
 * The reduce-copy kernel on a device: the fatbin the build embeds
 * (kernels/cuda/reduce.cu), loaded once per context, and its launch for a
 * kernels/cuda/kern_body.h task on a stream, passed at the launch or read
 * from memory when the kernel runs.
 */
#ifndef BRAID_CUDA_KERNELS_H_
#define BRAID_CUDA_KERNELS_H_

#include <cuda.h>

#include "cuda/kern_body.h"
#include "nccl.h"

/* Load the kernels into the current context now, in full: a device comm
 * does so when it is made, before any of its calls can hold a stream at a
 * gate (a function's lazy load may wait for every stream of the context). */
ncclResult_t cuda_kernels_load(void);

/* Enqueue `task` (its pointers device-accessible) on `stream` in the
 * current context; a launch per row where it has several. */
ncclResult_t cuda_reduce_copy(const struct kern_dev_task* task, CUstream stream);

/* Enqueue the kernel that reads its task at `task` (device-accessible)
 * when it runs, with a grid for at most n_max elements (per row; it runs
 * every row itself): for launches queued before their pointers are
 * known. A task of n == 0 does nothing. */
ncclResult_t cuda_reduce_copy_at(CUdeviceptr task, uint64_t n_max, CUstream stream);

/* kernels.h's task in the kernel's form: the same type and operator
 * numbers, one source being a copy; pointers as they are. */
struct kern_task;
void cuda_task_to_dev(const struct kern_task* t, struct kern_dev_task* d);

#endif /* BRAID_CUDA_KERNELS_H_ */
