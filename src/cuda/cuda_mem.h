/*
 * The device side of src/mem.c, built with HAVE_CUDA: the kind of a
 * pointer by the driver's pointer attributes (host when there is no
 * driver or the driver does not know it), and copies through the driver
 * when either side is device memory (unified addressing).
 */
#ifndef BRAID_CUDA_MEM_H_
#define BRAID_CUDA_MEM_H_

#include <stddef.h>

#include "core.h"
#include "mem.h"

enum mem_kind cuda_mem_kind(const void* ptr);
/* `device` is whichever of dst and src is device memory (its context is
 * taken when the thread has none). */
ncclResult_t cuda_mem_copy(void* dst, const void* src, size_t bytes, const void* device);

/* ncclMemAlloc's device memory, on the current context's device (the
 * caller's, as cudaMalloc), else device 0's: cuMem exportable as a POSIX fd
 * where the device has it (cuda_vmm.h), else cuMemAlloc.
 * ncclSuccess with *ptr NULL when there is no driver (host memory then). */
ncclResult_t cuda_mem_alloc(void** ptr, size_t size);
/* Free what cuda_mem_alloc gave. */
ncclResult_t cuda_mem_free(void* ptr);

#endif /* BRAID_CUDA_MEM_H_ */
