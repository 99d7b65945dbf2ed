/*
 * The memory kinds of a build with CUDA (mem_kind.h): what the driver
 * says of a pointer (host when there is no driver or the driver does not
 * know it), copies through the driver when either side is device memory
 * (unified addressing), and device memory from cuMem (cuda_vmm.h) or
 * cuMemAlloc.
 */
#include <string.h>

#include "core.h"
#include "cuda_driver.h"
#include "cuda_vmm.h"
#include "mem_kind.h"

enum mem_kind mem_query(const void* ptr) {
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

/* By pointer attributes, which need no current context (a transport's
 * progress thread has none). */
int mem_device_range(const void* ptr, uintptr_t* base, size_t* size, uint64_t* id) {
  const struct cuda_api* cu = cuda_driver();
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr, start = 0;
  unsigned long long buffer_id = 0;
  size_t bytes = 0;
  if (cu == NULL || ptr == NULL ||
      cu->cuPointerGetAttribute(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) != CUDA_SUCCESS ||
      cu->cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS ||
      cu->cuPointerGetAttribute(&bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS ||
      p < start || p - start >= bytes)
    return 0;
  *base = (uintptr_t)start;
  *size = bytes;
  *id = buffer_id;
  return 1;
}

/* Copies need a current context; a library thread (progress, host
 * streams) has none: take the primary context of the device that owns the
 * device side of the copy. */
static ncclResult_t ensure_context(const struct cuda_api* cu, const void* dev_ptr) {
  ncclResult_t res = ncclSuccess;
  CUcontext ctx = NULL;
  int ordinal = 0;
  CUdevice dev;
  CHECK(cuda_check(cu->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (ctx != NULL) return ncclSuccess;
  CHECK(cuda_check(cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                             (CUdeviceptr)(uintptr_t)dev_ptr),
                   "cuPointerGetAttribute(DEVICE_ORDINAL)"));
  CHECK(cuda_check(cu->cuDeviceGet(&dev, ordinal), "cuDeviceGet"));
  CHECK(cuda_check(cu->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
  CHECK(cuda_check(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
fail:
  return res;
}

/* `device` is whichever of dst and src is device memory (its context is
 * taken when the thread has none). */
static ncclResult_t copy_via_driver(void* dst, const void* src, size_t bytes, const void* device) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  if (cu == NULL) FAIL(ncclInternalError, "mem_copy: device memory without a CUDA driver");
  CHECK(ensure_context(cu, device));
  CHECK(cuda_check(cu->cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes),
                   "cuMemcpy"));
fail:
  return res;
}

ncclResult_t mem_copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return ncclSuccess;
  if (mem_query(dst) != MEM_HOST) return copy_via_driver(dst, src, bytes, dst);
  if (mem_query(src) != MEM_HOST) return copy_via_driver(dst, src, bytes, src);
  memmove(dst, src, bytes);
  return ncclSuccess;
}

/* A thread that never touched CUDA has no context: device 0's primary one,
 * as the runtime would pick. */
static ncclResult_t ensure_any_context(const struct cuda_api* cu) {
  ncclResult_t res = ncclSuccess;
  CUcontext ctx = NULL;
  CUdevice dev;
  CHECK(cuda_check(cu->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (ctx != NULL) return ncclSuccess;
  CHECK(cuda_check(cu->cuDeviceGet(&dev, 0), "cuDeviceGet"));
  CHECK(cuda_check(cu->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
  CHECK(cuda_check(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
fail:
  return res;
}

/* The device of the current context (one is made current if needed). */
static ncclResult_t current_device(const struct cuda_api* cu, CUdevice* dev) {
  ncclResult_t res = ncclSuccess;
  CHECK(ensure_any_context(cu));
  CHECK(cuda_check(cu->cuCtxGetDevice(dev), "cuCtxGetDevice"));
fail:
  return res;
}

ncclResult_t mem_device_alloc(void** ptr, size_t size) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  CUdevice dev;
  CUdeviceptr p = 0;
  *ptr = NULL;
  if (cu == NULL) return ncclSuccess;
  CHECK(current_device(cu, &dev));
  if (cuda_vmm_usable(cu, dev) && cuda_vmm_alloc(cu, dev, size, ptr) == ncclSuccess)
    return ncclSuccess;
  /* no cuMem with POSIX-fd handles (or it failed, said above): memory CUDA
   * IPC can still share through legacy handles */
  CHECK(cuda_check(cu->cuMemAlloc(&p, size), "cuMemAlloc"));
  *ptr = (void*)(uintptr_t)p;
fail:
  return res;
}

ncclResult_t mem_device_free(void* ptr) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  CHECK(ensure_context(cu, ptr));
  if (!cuda_vmm_free(cu, ptr))
    CHECK(cuda_check(cu->cuMemFree((CUdeviceptr)(uintptr_t)ptr), "cuMemFree"));
fail:
  return res;
}
