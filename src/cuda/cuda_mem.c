/*
 * What the driver says of a pointer (mem_query) and copies that involve
 * device memory (mem_copy): the device side of src/mem.c.
 */
#include "cuda_mem.h"

#include "cuda_driver.h"

enum mem_kind cuda_mem_kind(const void* ptr) {
  const struct cuda_api* cu = cuda_driver();
  unsigned int type = 0, managed = 0;
  if (cu == NULL || ptr == NULL) return MEM_HOST;
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
  /* Plain malloc'ed memory is unknown to the driver: an error means host. */
  if (cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CUDA_SUCCESS)
    return MEM_HOST;
  if (cu->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS &&
      managed)
    return MEM_MANAGED;
  return type == CU_MEMORYTYPE_DEVICE ? MEM_DEVICE : MEM_HOST;
}

ncclResult_t cuda_mem_copy(void* dst, const void* src, size_t bytes) {
  const struct cuda_api* cu = cuda_driver();
  if (cu == NULL) {
    WARN("mem_copy: device memory without a CUDA driver");
    return ncclInternalError;
  }
  return cuda_check(cu->cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes),
                    "cuMemcpy");
}
