/*
 * cuMem allocations for ncclMemAlloc (cuda_vmm.h). The handle is released
 * once mapped (the mapping keeps the memory); freeing finds the range from
 * the pointer, so nothing is kept on the side.
 */
#include "cuda_vmm.h"

#include <string.h>

#include "core.h"

int cuda_vmm_usable(const struct cuda_api* cu, CUdevice dev) {
  int vmm = 0, fd = 0;
  cu->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  cu->cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           dev);
  return vmm && fd;
}

static CUmemAllocationProp vmm_prop(CUdevice dev) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

#define VMM_MAX_DEVICES 64

/* Read/write access for dev and every device that can reach dev's memory
 * as a peer (cuMemAlloc'ed memory is open to peers once peer access is on;
 * cuMem memory only where it is granted). Returns how many. */
static size_t vmm_access(const struct cuda_api* cu, CUdevice dev, CUmemAccessDesc* desc) {
  int ndev = 0;
  size_t n = 0;
  cu->cuDeviceGetCount(&ndev);
  for (int d = 0; d < ndev && n < VMM_MAX_DEVICES; d++) {
    CUdevice other;
    int can = 0;
    if (cu->cuDeviceGet(&other, d) != CUDA_SUCCESS) continue;
    if (other != dev && (cu->cuDeviceCanAccessPeer(&can, other, dev) != CUDA_SUCCESS || !can))
      continue;
    memset(&desc[n], 0, sizeof(desc[n]));
    desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[n].location.id = d;
    desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return n;
}

static ncclResult_t vmm_granularity(const struct cuda_api* cu, CUdevice dev, size_t* gran) {
  CUmemAllocationProp prop = vmm_prop(dev);
  *gran = 0;
  ncclResult_t res = cuda_check(
      cu->cuMemGetAllocationGranularity(gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      "cuMemGetAllocationGranularity");
  if (*gran == 0) *gran = 1;
  return res;
}

ncclResult_t cuda_vmm_map(const struct cuda_api* cu, CUdevice dev, CUmemGenericAllocationHandle h,
                          size_t size, CUdeviceptr* out) {
  ncclResult_t res = ncclSuccess;
  CUdeviceptr p = 0;
  int mapped = 0;
  size_t align;
  CUmemAccessDesc access[VMM_MAX_DEVICES];
  size_t naccess = vmm_access(cu, dev, access);
  CHECK(vmm_granularity(cu, dev, &align));
  CHECK(cuda_check(cu->cuMemAddressReserve(&p, size, align, 0, 0), "cuMemAddressReserve"));
  CHECK(cuda_check(cu->cuMemMap(p, size, 0, h, 0), "cuMemMap"));
  mapped = 1;
  CHECK(cuda_check(cu->cuMemSetAccess(p, size, access, naccess), "cuMemSetAccess"));
  *out = p;
  return ncclSuccess;
fail:
  if (mapped) cu->cuMemUnmap(p, size);
  if (p) cu->cuMemAddressFree(p, size);
  return res;
}

ncclResult_t cuda_vmm_alloc(const struct cuda_api* cu, CUdevice dev, size_t size, void** ptr) {
  ncclResult_t res = ncclSuccess;
  CUmemAllocationProp prop = vmm_prop(dev);
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr p = 0;
  size_t gran;
  CHECK(vmm_granularity(cu, dev, &gran));
  size = ALIGN_UP(size, gran);
  CHECK(cuda_check(cu->cuMemCreate(&h, size, &prop, 0), "cuMemCreate"));
  res = cuda_vmm_map(cu, dev, h, size, &p);
  cu->cuMemRelease(h); /* the mapping holds the memory from here on */
  if (res != ncclSuccess) goto fail;
  *ptr = (void*)(uintptr_t)p;
fail:
  return res;
}

int cuda_vmm_free(const struct cuda_api* cu, void* ptr) {
  CUmemGenericAllocationHandle h;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (cu->cuMemRetainAllocationHandle(&h, ptr) != CUDA_SUCCESS) return 0; /* cuMemAlloc'ed */
  cu->cuMemRelease(h);
  if (cuda_check(cu->cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)ptr),
                 "cuMemGetAddressRange") != ncclSuccess)
    return 1; /* cuMem memory all the same: never to be cuMemFree'd */
  cuda_check(cu->cuMemUnmap(base, size), "cuMemUnmap");
  cuda_check(cu->cuMemAddressFree(base, size), "cuMemAddressFree");
  return 1;
}
