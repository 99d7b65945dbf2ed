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

#endif /* BRAID_CUDA_MEM_H_ */
