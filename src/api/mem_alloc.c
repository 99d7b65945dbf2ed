/*
 * ncclMemAlloc and ncclMemFree: device memory that CUDA IPC can share
 * where a driver and device are, else page-aligned host memory. Every
 * block handed out is recorded (a pointer set: process-wide, as the
 * blocks are), so that ncclMemFree refuses a pointer it did not give, or
 * gave back already, instead of handing it to free() or the driver.
 */
#include <stdlib.h>

#include "comm/comm.h"
#include "core.h"
#include "engine/mem.h"
#include "ptr_set.h"

static struct ptr_set g_blocks = PTR_SET_INIT;

/* The block itself, recorded nowhere yet. */
static ncclResult_t block_alloc(void** ptr, size_t size) {
  ncclResult_t res = mem_device_alloc(ptr, size);
  if (res != ncclSuccess || *ptr != NULL) return res;
  /* Not braid_calloc: page-aligned and unzeroed, as cudaMalloc'd memory is
   * (a transport may map or pin it whole). */
  *ptr = aligned_alloc(4096, ALIGN_UP(size, 4096));
  if (*ptr != NULL) return ncclSuccess;
  WARN("ncclMemAlloc : out of memory for %zu bytes", size);
  return ncclSystemError;
}

static ncclResult_t block_free(void* ptr) {
  if (mem_query(ptr) != MEM_HOST) return mem_device_free(ptr);
  free(ptr);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size);
ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  ncclResult_t res = ncclSuccess;
  if (ptr == NULL || size == 0 || size > COMM_MAX_BYTES)
    FAIL(ncclInvalidArgument, "ncclMemAlloc : ptr %p size %zu", (void*)ptr, size);
  *ptr = NULL;
  CHECK(block_alloc(ptr, size));
  res = ptr_set_add(&g_blocks, *ptr);
  if (res != ncclSuccess) {
    block_free(*ptr);
    *ptr = NULL;
  }
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclMemFree, void* ptr);
ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == NULL) return ncclSuccess;
  if (!ptr_set_remove(&g_blocks, ptr)) {
    WARN("ncclMemFree : %p is not a block from ncclMemAlloc, or was freed already", ptr);
    return ncclInvalidArgument;
  }
  return block_free(ptr);
}
