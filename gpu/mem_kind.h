/*
 * Memory kinds: what kind a buffer is, copies between buffers of any
 * kinds, and device memory that CUDA IPC can share. The build picks the
 * implementation as libuv picks its platform files: gpu/cuda/mem_cuda.c
 * asks the CUDA driver (built with HAVE_CUDA), gpu/host/mem_host.c knows
 * host memory only. Library code reaches user buffers only through these
 * (and the kernels).
 */
#ifndef BRAID_MEM_KIND_H_
#define BRAID_MEM_KIND_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Where a buffer lives: host memory (malloc'ed, pinned or registered), or
 * device or managed memory by the CUDA driver's pointer attributes (always
 * host without a driver). */
enum mem_kind { MEM_HOST = 0, MEM_DEVICE = 1, MEM_MANAGED = 2, MEM_KIND_COUNT };

enum mem_kind mem_query(const void* ptr);
const char* mem_kind_name(enum mem_kind kind);

/* The driver allocation that holds ptr (device memory; host memory the
 * driver allocated or registered too): where it starts, its size, and
 * its buffer id, which the driver never gives two allocations of one
 * process (an address freed and allocated again comes back with another
 * id), so a registration of the range can be checked before reuse. 0 where
 * the driver does not know ptr, or there is no driver. */
int mem_device_range(const void* ptr, uintptr_t* base, size_t* size, uint64_t* id);

/* Copy `bytes` from src to dst, whatever their kinds; the ranges may
 * overlap (memmove's rule). */
ncclResult_t mem_copy(void* dst, const void* src, size_t bytes);

/* ncclMemAlloc's device memory, on the current context's device (the
 * caller's, as cudaMalloc), else device 0's: cuMem exportable as a POSIX
 * fd where the device has it, else cuMemAlloc. ncclSuccess with *ptr NULL
 * where there is no driver or device (host memory then). */
ncclResult_t mem_device_alloc(void** ptr, size_t size);
/* Free what mem_device_alloc gave. */
ncclResult_t mem_device_free(void* ptr);

#endif /* BRAID_MEM_KIND_H_ */
