/*
 * ncclMemAlloc's device memory through cuMem (the driver's virtual memory
 * management): a physical allocation that can be exported as a POSIX file
 * descriptor, mapped at a reserved range with read/write access for its
 * device, so that CUDA IPC can share it with another process (the
 * facts in docs/gpu-validation.md: it opens there over SCM_RIGHTS).
 */
#ifndef BRAID_CUDA_VMM_H_
#define BRAID_CUDA_VMM_H_

#include <cuda.h>

#include "cuda_driver.h"

/* Whether `dev` gives cuMem allocations with POSIX-fd handles. */
int cuda_vmm_usable(const struct cuda_api* cu, CUdevice dev);

/* `size` bytes (rounded up to the allocation granularity) on `dev`, in the
 * current context. */
ncclResult_t cuda_vmm_alloc(const struct cuda_api* cu, CUdevice dev, size_t size, void** ptr);

/* Map physical allocation h (`size` bytes) at a new range, readable and
 * writable by dev and every device that can reach dev as a peer; the
 * caller may release h then (the mapping holds the memory). */
ncclResult_t cuda_vmm_map(const struct cuda_api* cu, CUdevice dev, CUmemGenericAllocationHandle h,
                          size_t size, CUdeviceptr* out);

/* 1 and unmapped (freed, once no other mapping holds it) when ptr is the
 * start of a cuMem mapping, 0 (nothing done) when it is not one. */
int cuda_vmm_free(const struct cuda_api* cu, void* ptr);

#endif /* BRAID_CUDA_VMM_H_ */
