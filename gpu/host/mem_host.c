/*
 * The memory kinds of a build without CUDA (mem_kind.h): every pointer is
 * host memory, copies are memmove, and there is no device memory to hand
 * out (ncclMemAlloc gives host memory instead).
 */
#include <string.h>

#include "core.h"
#include "mem_kind.h"

enum mem_kind mem_query(const void* ptr) {
  (void)ptr;
  return MEM_HOST;
}

int mem_device_range(const void* ptr, uintptr_t* base, size_t* size, uint64_t* id) {
  (void)ptr, (void)base, (void)size, (void)id;
  return 0;
}

ncclResult_t mem_copy(void* dst, const void* src, size_t bytes) {
  if (bytes != 0 && dst != src) memmove(dst, src, bytes);
  return ncclSuccess;
}

ncclResult_t mem_device_alloc(void** ptr, size_t size) {
  (void)size;
  *ptr = NULL;
  return ncclSuccess;
}

ncclResult_t mem_device_free(void* ptr) {
  WARN("device memory %p to free in a build without CUDA", ptr);
  return ncclInternalError;
}
