/*
 * The fused reduce-copy kernel on the GPU: a grid-stride loop over
 * kern_body.h's task, the same body the CPU grid emulation runs. Built into
 * a fatbin the library embeds and loads through the driver (it links no
 * CUDA library); the launch side lives in src/cuda.
 */
#include "cuda/kern_body.h"

extern "C" __global__ void braid_reduce_copy(struct kern_dev_task t) {
  uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  kern_dev_task_run(&t, first, stride);
}
