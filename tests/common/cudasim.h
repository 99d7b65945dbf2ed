/*
 * The simulated CUDA driver's parts (tests/common/cudasim.c: devices,
 * contexts, streams, modules and the entry-point table; cudasim_mem.c:
 * memory). Test-only, never in the library.
 */
#ifndef BRAID_CUDASIM_H_
#define BRAID_CUDASIM_H_

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

extern __thread CUcontext t_ctx; /* the calling thread's current context */
extern int g_ndev;               /* CUDASIM_DEVICES */

/* Where the simulated GPU reaches address p: device memory at its shadow
 * mapping, anything else (pinned or plain host memory) where it is. */
void* gpu_addr(uintptr_t p);
/* Whether the simulated GPU may touch [p, p + bytes): device memory or
 * pinned host memory, all of it. */
int gpu_reaches(uintptr_t p, size_t bytes);

CUresult sim_mem_alloc(CUdeviceptr* p, size_t bytes);
CUresult sim_mem_free(CUdeviceptr p);
CUresult sim_pointer_attribute(void* out, CUpointer_attribute a, CUdeviceptr p);
CUresult sim_vmm_granularity(size_t* g, const CUmemAllocationProp* prop,
                             CUmemAllocationGranularity_flags flags);
CUresult sim_vmm_create(CUmemGenericAllocationHandle* h, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags);
CUresult sim_vmm_release(CUmemGenericAllocationHandle h);
CUresult sim_vmm_reserve(CUdeviceptr* p, size_t size, size_t align, CUdeviceptr addr,
                         unsigned long long flags);
CUresult sim_vmm_address_free(CUdeviceptr p, size_t size);
CUresult sim_vmm_map(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                     unsigned long long flags);
CUresult sim_vmm_set_access(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count);
CUresult sim_vmm_unmap(CUdeviceptr p, size_t size);
CUresult sim_vmm_retain(CUmemGenericAllocationHandle* h, void* p);
CUresult sim_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr p);
CUresult sim_host_alloc(void** p, size_t bytes, unsigned flags);
CUresult sim_host_free(void* p);
CUresult sim_host_device_pointer(CUdeviceptr* d, void* p, unsigned flags);
CUresult sim_host_register(void* p, size_t bytes, unsigned flags);
CUresult sim_ipc_get(CUipcMemHandle* h, CUdeviceptr p);
CUresult sim_ipc_open(CUdeviceptr* p, CUipcMemHandle h, unsigned flags);
CUresult sim_ipc_close(CUdeviceptr p);
CUresult sim_vmm_export(void* out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                        unsigned long long flags);
CUresult sim_vmm_import(CUmemGenericAllocationHandle* h, void* os_handle,
                        CUmemAllocationHandleType type);
CUresult sim_host_unregister(void* p);

#endif /* BRAID_CUDASIM_H_ */
