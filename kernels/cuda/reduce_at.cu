/*
 * The fused reduce-copy kernel with its task read from memory when it
 * runs (reduce.cu has the one whose task is its parameter): the same body,
 * in a fatbin of its own so that the two compile side by side.
 */
#include "cuda/kern_body.h"

/* The same, its task read from memory when it runs: for a launch queued
 * before its pointers are known (a direct call on its stream: the proxy
 * writes the task into pinned memory, then lets the stream run this).
 * One thread per block loads it into shared memory, and makes each row
 * from it once every thread of the block is done with the last. */
extern "C" __global__ void braid_reduce_copy_at(const struct kern_dev_task* at) {
  __shared__ struct kern_dev_task base, t;
  __shared__ int live;
  if (threadIdx.x == 0) kern_dev_task_load(&base, at);
  __syncthreads();
  uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  uint32_t rows = kern_dev_task_rows(&base);
  for (uint32_t r = 0; r < rows; r++) {
    if (threadIdx.x == 0) live = kern_dev_task_row(&base, r, &t);
    __syncthreads();
    if (live) kern_dev_task_run(&t, first, stride);
    __syncthreads(); /* every thread done with row r before thread 0 moves t on */
  }
}
