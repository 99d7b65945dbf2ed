/*
 * A simulated CUDA driver for the tests (build/tests/libcudasim.so, never in
 * the library): BRAID_CUDA_LIB points Braid at it where there is no GPU.
 * It resolves, through cuGetProcAddress_v2 as the real driver does, the
 * subset Braid calls:
 *  - devices (CUDASIM_DEVICES, default 1) with 4 SMs; a primary context per
 *    device, current per thread, and required, as by the real driver, for
 *    allocations, copies, module loads and launches;
 *  - device memory that is host memory (mmap'ed shared, so forked ranks
 *    can share it later), known to cuPointerGetAttribute as device memory;
 *  - copies (memmove: unified addressing);
 *  - modules: any image loads, and its function "braid_reduce_copy" runs the
 *    CPU grid emulation of kernels/cuda/kern_body.h (tests/common);
 *  - launches and stream synchronization, in order at the call (streams as
 *    queues run by threads come with the stream-ordered device path).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kern_emulate.h"

#define SIM_EXPORT __attribute__((visibility("default")))
#define SIM_SMS 4
#define SIM_MAX_ALLOCS 4096

static struct {
  pthread_mutex_t lock;
  int nallocs;
  struct {
    uintptr_t base;
    size_t size;
  } allocs[SIM_MAX_ALLOCS];
} g_mem = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread CUcontext t_ctx;
static int g_ndev = 1;

/* Contexts and functions are small tagged integers, never dereferenced. */
#define SIM_CTX(dev) ((CUcontext)(uintptr_t)(0x1000 + (dev)))
#define SIM_MODULE ((CUmodule)(uintptr_t)0x2000)
#define SIM_REDUCE_COPY ((CUfunction)(uintptr_t)0x3001)

static CUresult sim_init(unsigned flags) {
  const char* n = getenv("CUDASIM_DEVICES");
  (void)flags;
  g_ndev = n ? atoi(n) : 1;
  return CUDA_SUCCESS;
}

static CUresult sim_driver_version(int* v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

static CUresult sim_error_name(CUresult r, const char** s) {
  switch (r) {
    case CUDA_SUCCESS:
      *s = "CUDA_SUCCESS";
      break;
    case CUDA_ERROR_INVALID_VALUE:
      *s = "CUDA_ERROR_INVALID_VALUE";
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *s = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case CUDA_ERROR_NOT_FOUND:
      *s = "CUDA_ERROR_NOT_FOUND";
      break;
    case CUDA_ERROR_INVALID_CONTEXT:
      *s = "CUDA_ERROR_INVALID_CONTEXT";
      break;
    default:
      *s = "CUDA_ERROR_UNKNOWN";
      break;
  }
  return CUDA_SUCCESS;
}

static CUresult sim_device_count(int* n) {
  *n = g_ndev;
  return CUDA_SUCCESS;
}

static CUresult sim_device_get(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

static CUresult sim_device_attribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (d < 0 || d >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *v = SIM_SMS;
      break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      *v = 1;
      break;
    default:
      *v = 0;
      break;
  }
  return CUDA_SUCCESS;
}

static CUresult sim_primary_retain(CUcontext* c, CUdevice d) {
  if (d < 0 || d >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  *c = SIM_CTX(d);
  return CUDA_SUCCESS;
}

static CUresult sim_ctx_get(CUcontext* c) {
  *c = t_ctx;
  return CUDA_SUCCESS;
}

static CUresult sim_ctx_set(CUcontext c) {
  t_ctx = c;
  return CUDA_SUCCESS;
}

/* The allocation holding p, or -1. */
static int alloc_of(uintptr_t p) {
  for (int i = 0; i < g_mem.nallocs; i++)
    if (p >= g_mem.allocs[i].base && p - g_mem.allocs[i].base < g_mem.allocs[i].size) return i;
  return -1;
}

static CUresult sim_mem_alloc(CUdeviceptr* p, size_t bytes) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT; /* as the real driver */
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  void* m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&g_mem.lock);
  int ok = g_mem.nallocs < SIM_MAX_ALLOCS;
  if (ok)
    g_mem.allocs[g_mem.nallocs].base = (uintptr_t)m, g_mem.allocs[g_mem.nallocs++].size = bytes;
  pthread_mutex_unlock(&g_mem.lock);
  if (!ok) {
    munmap(m, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}

static CUresult sim_mem_free(CUdeviceptr p) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  int exact = i >= 0 && g_mem.allocs[i].base == (uintptr_t)p;
  size_t size = exact ? g_mem.allocs[i].size : 0;
  if (exact) g_mem.allocs[i] = g_mem.allocs[--g_mem.nallocs];
  pthread_mutex_unlock(&g_mem.lock);
  if (!exact) return CUDA_ERROR_INVALID_VALUE;
  munmap((void*)(uintptr_t)p, size);
  return CUDA_SUCCESS;
}

static CUresult sim_pointer_attribute(void* out, CUpointer_attribute a, CUdeviceptr p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  pthread_mutex_unlock(&g_mem.lock);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE; /* memory the driver does not know */
  switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned int*)out = CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *(unsigned int*)out = 0;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: /* all memory is device 0's */
      *(int*)out = 0;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static CUresult sim_memcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes);
  return CUDA_SUCCESS;
}

static CUresult sim_module_load(CUmodule* m, const void* image) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (image == NULL) return CUDA_ERROR_INVALID_VALUE;
  *m = SIM_MODULE;
  return CUDA_SUCCESS;
}

static CUresult sim_module_function(CUfunction* f, CUmodule m, const char* name) {
  if (m != SIM_MODULE || strcmp(name, "braid_reduce_copy") != 0) return CUDA_ERROR_NOT_FOUND;
  *f = SIM_REDUCE_COPY;
  return CUDA_SUCCESS;
}

static CUresult sim_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, unsigned shmem, CUstream s, void** args,
                           void** extra) {
  (void)shmem, (void)s, (void)extra;
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (f != SIM_REDUCE_COPY || gy != 1 || gz != 1 || by != 1 || bz != 1 || args == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  kern_emulate_reduce_copy((const struct kern_dev_task*)args[0], gx, bx);
  return CUDA_SUCCESS;
}

static CUresult sim_stream_sync(CUstream s) {
  (void)s; /* work runs at the call */
  return CUDA_SUCCESS;
}

static const struct {
  const char* name;
  void* fn;
} k_entry_points[] = {
    {"cuInit", (void*)sim_init},
    {"cuDriverGetVersion", (void*)sim_driver_version},
    {"cuGetErrorName", (void*)sim_error_name},
    {"cuDeviceGetCount", (void*)sim_device_count},
    {"cuDeviceGet", (void*)sim_device_get},
    {"cuDeviceGetAttribute", (void*)sim_device_attribute},
    {"cuDevicePrimaryCtxRetain", (void*)sim_primary_retain},
    {"cuCtxGetCurrent", (void*)sim_ctx_get},
    {"cuCtxSetCurrent", (void*)sim_ctx_set},
    {"cuPointerGetAttribute", (void*)sim_pointer_attribute},
    {"cuMemcpy", (void*)sim_memcpy},
    {"cuMemAlloc", (void*)sim_mem_alloc},
    {"cuMemFree", (void*)sim_mem_free},
    {"cuModuleLoadData", (void*)sim_module_load},
    {"cuModuleGetFunction", (void*)sim_module_function},
    {"cuLaunchKernel", (void*)sim_launch},
    {"cuStreamSynchronize", (void*)sim_stream_sync},
};

SIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                        cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  (void)version, (void)flags;
  for (size_t i = 0; i < sizeof(k_entry_points) / sizeof(k_entry_points[0]); i++)
    if (strcmp(symbol, k_entry_points[i].name) == 0) {
      *pfn = k_entry_points[i].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
