/*
 * Loading the CUDA driver (cuda_driver.h): dlopen, cuGetProcAddress for
 * every entry point of the table (at the API version of the header this is
 * built with, so versioned names such as cuMemAlloc_v2 resolve), cuInit.
 */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "core.h"
#include "param.h"

/* cuGetProcAddress as CUDA 12.0 and later export it. */
typedef CUresult (*get_proc_fn)(const char*, void**, int, cuuint64_t,
                                CUdriverProcAddressQueryResult*);

static struct {
  pthread_once_t once;
  const struct cuda_api* api; /* NULL: no device path */
  struct cuda_api table;
} g_cuda = {.once = PTHREAD_ONCE_INIT};

#define CUDA_SYM(name) \
  { (void**)&g_cuda.table.name, #name, CUDA_VERSION }
/* An entry point whose signature changed in a later CUDA (the driver hands
 * out the newest ABI not above the version asked for): asked for at the
 * version of the signature the table declares. */
#define CUDA_SYM_AT(name, version) \
  { (void**)&g_cuda.table.name, #name, version }

static int resolve(get_proc_fn get_proc, const char* lib) {
  const struct {
    void** slot;
    const char* name;
    int version;
  } syms[] = {
      CUDA_SYM(cuInit),
      CUDA_SYM(cuDriverGetVersion),
      CUDA_SYM(cuGetErrorName),
      CUDA_SYM(cuDeviceGetCount),
      CUDA_SYM(cuDeviceGet),
      CUDA_SYM(cuDeviceGetAttribute),
      CUDA_SYM(cuDevicePrimaryCtxRetain),
      CUDA_SYM(cuDevicePrimaryCtxRelease),
      CUDA_SYM(cuCtxGetCurrent),
      CUDA_SYM(cuCtxSetCurrent),
      CUDA_SYM_AT(cuCtxGetDevice, 12000), /* 13.0's is cuCtxGetDevice_v2(dev, ctx) */
      CUDA_SYM(cuPointerGetAttribute),
      CUDA_SYM(cuMemcpy),
      CUDA_SYM(cuMemAlloc),
      CUDA_SYM(cuMemFree),
      CUDA_SYM(cuModuleLoadData),
      CUDA_SYM(cuModuleGetFunction),
      CUDA_SYM(cuLaunchKernel),
      CUDA_SYM(cuStreamSynchronize),
      CUDA_SYM(cuStreamCreate),
      CUDA_SYM(cuStreamDestroy),
      CUDA_SYM(cuStreamQuery),
      CUDA_SYM(cuStreamIsCapturing),
      CUDA_SYM(cuStreamGetId),
      CUDA_SYM(cuThreadExchangeStreamCaptureMode),
      CUDA_SYM(cuDeviceCanAccessPeer),
      CUDA_SYM(cuDeviceGetUuid),
      CUDA_SYM(cuStreamWaitValue64),
      CUDA_SYM(cuStreamWriteValue64),
      CUDA_SYM(cuStreamWaitEvent),
      CUDA_SYM(cuEventCreate),
      CUDA_SYM(cuEventDestroy),
      CUDA_SYM(cuEventRecord),
      CUDA_SYM(cuEventQuery),
      CUDA_SYM(cuEventSynchronize),
      CUDA_SYM(cuMemcpyAsync),
      CUDA_SYM(cuMemHostAlloc),
      CUDA_SYM(cuMemFreeHost),
      CUDA_SYM(cuMemHostGetDevicePointer),
      CUDA_SYM(cuMemHostRegister),
      CUDA_SYM(cuMemHostUnregister),
      CUDA_SYM(cuMemGetAllocationGranularity),
      CUDA_SYM(cuMemCreate),
      CUDA_SYM(cuMemRelease),
      CUDA_SYM(cuMemAddressReserve),
      CUDA_SYM(cuMemAddressFree),
      CUDA_SYM(cuMemMap),
      CUDA_SYM(cuMemUnmap),
      CUDA_SYM(cuMemSetAccess),
      CUDA_SYM(cuMemRetainAllocationHandle),
      CUDA_SYM(cuMemGetAddressRange),
      CUDA_SYM(cuIpcGetMemHandle),
      CUDA_SYM(cuIpcOpenMemHandle),
      CUDA_SYM(cuIpcCloseMemHandle),
      CUDA_SYM(cuMemExportToShareableHandle),
      CUDA_SYM(cuMemImportFromShareableHandle),
  };
  /* what newer drivers add, used where there: NULL without */
  const struct {
    void** slot;
    const char* name;
    int version;
  } optional[] = {
      CUDA_SYM(cuFuncLoad),
  };
  for (size_t i = 0; i < sizeof(optional) / sizeof(optional[0]); i++) {
    CUdriverProcAddressQueryResult status;
    if (get_proc(optional[i].name, optional[i].slot, optional[i].version,
                 CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS)
      *optional[i].slot = NULL;
  }
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    CUdriverProcAddressQueryResult status;
    *syms[i].slot = NULL;
    if (get_proc(syms[i].name, syms[i].slot, syms[i].version, CU_GET_PROC_ADDRESS_DEFAULT,
                 &status) != CUDA_SUCCESS ||
        *syms[i].slot == NULL) {
      INFO(SUB_INIT, "CUDA: %s has no %s (needs a CUDA %d.%d driver): no device path", lib,
           syms[i].name, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
      return -1;
    }
  }
  return 0;
}

static void cuda_load(void) {
  const char* lib = param_cuda_lib();
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    INFO(SUB_INIT, "CUDA: cannot open %s (%s): no device path, host buffers only", lib, dlerror());
    return;
  }
  get_proc_fn get_proc = (get_proc_fn)dlsym(h, "cuGetProcAddress_v2");
  if (get_proc == NULL) {
    INFO(SUB_INIT, "CUDA: %s has no cuGetProcAddress_v2 (a driver older than 12.0): no device path",
         lib);
    return;
  }
  if (resolve(get_proc, lib) != 0) return;
  int version = 0, ndev = 0;
  CUresult r = g_cuda.table.cuInit(0);
  if (r == CUDA_SUCCESS) r = g_cuda.table.cuDeviceGetCount(&ndev);
  g_cuda.table.cuDriverGetVersion(&version);
  if (r != CUDA_SUCCESS || ndev == 0) {
    const char* name = "?";
    g_cuda.table.cuGetErrorName(r, &name);
    INFO(SUB_INIT, "CUDA: driver %d.%d from %s, %s: no device path", version / 1000,
         version % 1000 / 10, lib, r != CUDA_SUCCESS ? name : "no device");
    return;
  }
  INFO(SUB_INIT, "CUDA: driver %d.%d from %s, %d device%s", version / 1000, version % 1000 / 10,
       lib, ndev, ndev == 1 ? "" : "s");
  g_cuda.api = &g_cuda.table;
}

const struct cuda_api* cuda_driver(void) {
  pthread_once(&g_cuda.once, cuda_load);
  return g_cuda.api;
}

ncclResult_t cuda_check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return ncclSuccess;
  const char* name = "?";
  if (g_cuda.api) g_cuda.api->cuGetErrorName(r, &name);
  WARN("Cuda failure %d '%s' in %s", (int)r, name, what);
  return ncclUnhandledCudaError;
}

ncclResult_t cuda_flags_alloc(const struct cuda_api* cu, size_t bytes, const char* what,
                              void** host, CUdeviceptr* dev) {
  ncclResult_t res = ncclSuccess;
  void* mem = NULL;
  CHECK(cuda_check(
      cu->cuMemHostAlloc(&mem, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), what));
  memset(mem, 0, bytes); /* the driver does not zero it */
  CHECK(cuda_check(cu->cuMemHostGetDevicePointer(dev, mem, 0), "cuMemHostGetDevicePointer"));
  *host = mem;
  return ncclSuccess;
fail:
  if (mem) cu->cuMemFreeHost(mem);
  return res;
}

ncclResult_t cuda_ctx_enter(CUcontext ctx, CUcontext* saved) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  CHECK(cuda_check(cu->cuCtxGetCurrent(saved), "cuCtxGetCurrent"));
  if (*saved != ctx) CHECK(cuda_check(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
fail:
  return res;
}

void cuda_ctx_restore(CUcontext saved) {
  const struct cuda_api* cu = cuda_driver();
  CUcontext now = NULL;
  if (cu->cuCtxGetCurrent(&now) == CUDA_SUCCESS && now != saved) cu->cuCtxSetCurrent(saved);
}
