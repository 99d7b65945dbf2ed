/*
 * Device-to-device copies (cuda_copy.c) for the transports that move
 * device memory (transports/cudaipc): the fused reduce-copy kernel with
 * one source and one destination, given to a gated call's deferred launch
 * or run on a copy stream and waited for. The device runtime below the
 * transports: they call it, never the other way round.
 */
#ifndef BRAID_CUDA_COPY_H_
#define BRAID_CUDA_COPY_H_

#include <stddef.h>

#include "launch.h"
#include "nccl.h"

/* Copy `bytes` device to device in `context` (a CUcontext, entered here).
 * With `launch` (a gated call's): that kernel gets the copy, and runs
 * when its stream gets there (cuda_copy_ran); bytes 0 lets it go empty.
 * Without: on `copy_stream` (a CUstream of that context), waited for. */
ncclResult_t cuda_copy_device(void* context, void* copy_stream, const struct gpu_launch* launch,
                              void* dst, const void* src, size_t bytes);
/* Whether a launch given a copy has run. */
int cuda_copy_ran(const struct gpu_launch* launch);

#endif /* BRAID_CUDA_COPY_H_ */
