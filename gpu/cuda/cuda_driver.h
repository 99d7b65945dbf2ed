/*
 * The CUDA driver, opened at first need: libcuda.so.1 (BRAID_CUDA_LIB names
 * another file, such as the tests' simulated driver) is dlopen'ed, its entry
 * points resolved through cuGetProcAddress, and the library links neither
 * libcudart nor libcuda. Without a driver or a device, everything on host
 * memory works as before and one INFO line says why there is no device path.
 * Built only with HAVE_CUDA (the toolkit's cuda.h gives the types).
 */
#ifndef BRAID_CUDA_DRIVER_H_
#define BRAID_CUDA_DRIVER_H_

#include <cuda.h>

#include "nccl.h"

/* The entry points Braid calls, by their cuda.h names. */
struct cuda_api {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuPointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr);
  CUresult (*cuMemcpy)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncLoad)(CUfunction); /* CUDA 12.4 and later; NULL before */
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuStreamSynchronize)(CUstream);
  /* stream ordering: streams, events, memory operations on pinned flags */
  CUresult (*cuStreamCreate)(CUstream*, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*);
  CUresult (*cuStreamGetId)(CUstream, unsigned long long*);
  CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode*);
  CUresult (*cuDeviceCanAccessPeer)(int*, CUdevice, CUdevice);
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice);
  CUresult (*cuStreamWaitValue64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  CUresult (*cuStreamWriteValue64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
  CUresult (*cuEventCreate)(CUevent*, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned int);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned int);
  CUresult (*cuMemHostRegister)(void*, size_t, unsigned int);
  CUresult (*cuMemHostUnregister)(void*);
  /* cuMem (virtual memory management): ncclMemAlloc's shareable memory */
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                            CUmemAllocationGranularity_flags);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                          unsigned long long);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle*, void*);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  /* CUDA IPC (transports/cudaipc): legacy handles, cuMem POSIX fds */
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned int);
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long);
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*,
                                             CUmemAllocationHandleType);
};

/* The driver's table, loaded and initialized once per process; NULL (with
 * the INFO line, once) when there is none. */
const struct cuda_api* cuda_driver(void);

/* A driver call's result as an NCCL result, with a WARN naming the call. */
ncclResult_t cuda_check(CUresult r, const char* what);

/* Zeroed pinned host memory the GPU can address (stream flags): its host
 * address in *host, the device's in *dev; freed with cuMemFreeHost. */
ncclResult_t cuda_flags_alloc(const struct cuda_api* cu, size_t bytes, const char* what,
                              void** host, CUdeviceptr* dev);

/* Device work done by a library thread (the proxy, the progress engine, a
 * host stream) or the user's: the context it belongs to is made current
 * around it, and what was current before is put back. *saved gets what
 * was current, to give back to cuda_ctx_restore. */
ncclResult_t cuda_ctx_enter(CUcontext ctx, CUcontext* saved);
void cuda_ctx_restore(CUcontext saved);

#endif /* BRAID_CUDA_DRIVER_H_ */
