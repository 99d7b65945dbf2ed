/* Device buffers for the perf tools (--mem device): the CUDA driver opened
 * by the tool itself, as a user program would use the runtime (the tools
 * see only the public headers): BRAID_CUDA_LIB names it, as for the
 * library, default libcuda.so.1. */
#ifndef BRAID_PERF_DEVICE_H_
#define BRAID_PERF_DEVICE_H_

#include <stddef.h>

#include "nccl.h"

/* Devices usable through the driver; 0 when there is none (why: *why). */
int perf_dev_count(const char** why);
/* This thread works on device `dev`: its primary context current, and a
 * stream of its own for the calls, non-blocking as nccl-tests makes them
 * (a legacy-stream operation elsewhere never waits on it). 0 on success. */
int perf_dev_bind(int dev, cudaStream_t* stream);
/* Whether the driver knows p as device memory (ncclMemAlloc falls back to
 * host memory in a library without a device path). */
int perf_dev_owns(const void* p);
/* 0 on success; each prints what failed. */
int perf_dev_sync(cudaStream_t stream);
/* A copy on `stream`, waited for: never on the legacy stream, which would
 * wait for other ranks' streams (threads of this process) that wait on us. */
int perf_dev_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

#endif /* BRAID_PERF_DEVICE_H_ */
