/* The perf tools' side of the CUDA driver (device.h), through dlopen and
 * cuGetProcAddress with just the types it needs. */
#include "device.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int cu_result;
typedef unsigned long long cu_ptr;
typedef cu_result (*get_proc_fn)(const char*, void**, int, unsigned long long, int*);

static struct {
  pthread_once_t once;
  int ndev;
  const char* why;
  cu_result (*init)(unsigned);
  cu_result (*count)(int*);
  cu_result (*device_get)(int*, int);
  cu_result (*primary_retain)(void**, int);
  cu_result (*ctx_set)(void*);
  cu_result (*stream_create)(void**, unsigned);
  cu_result (*stream_sync)(void*);
  cu_result (*copy)(cu_ptr, cu_ptr, size_t, void*);
  cu_result (*pointer_attribute)(void*, int, cu_ptr);
} g_dev = {.once = PTHREAD_ONCE_INIT};

static int resolve(get_proc_fn get, const char* name, void* slot) {
  int status = 0;
  return get(name, (void**)slot, 12000, 0, &status) != 0 || *(void**)slot == NULL;
}

static void dev_load(void) {
  const char* name = getenv("BRAID_CUDA_LIB"); /* as the library reads it: empty is unset */
  const char* lib = name && *name ? name : "libcuda.so.1";
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  get_proc_fn get = h ? (get_proc_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
  g_dev.why = "no CUDA driver (libcuda.so.1, or BRAID_CUDA_LIB) could be opened";
  if (get == NULL) return;
  g_dev.why = "the CUDA driver lacks entry points or cuInit failed";
  if (resolve(get, "cuInit", &g_dev.init) || resolve(get, "cuDeviceGetCount", &g_dev.count) ||
      resolve(get, "cuDeviceGet", &g_dev.device_get) ||
      resolve(get, "cuDevicePrimaryCtxRetain", &g_dev.primary_retain) ||
      resolve(get, "cuCtxSetCurrent", &g_dev.ctx_set) ||
      resolve(get, "cuStreamCreate", &g_dev.stream_create) ||
      resolve(get, "cuStreamSynchronize", &g_dev.stream_sync) ||
      resolve(get, "cuMemcpyAsync", &g_dev.copy) ||
      resolve(get, "cuPointerGetAttribute", &g_dev.pointer_attribute) || g_dev.init(0) != 0 ||
      g_dev.count(&g_dev.ndev) != 0)
    return;
  g_dev.why = g_dev.ndev > 0 ? NULL : "the CUDA driver sees no device";
}

int perf_dev_count(const char** why) {
  pthread_once(&g_dev.once, dev_load);
  if (why) *why = g_dev.why;
  return g_dev.why ? 0 : g_dev.ndev;
}

int perf_dev_bind(int dev, cudaStream_t* stream) {
  int d;
  void *ctx, *s = NULL;
  if (perf_dev_count(NULL) <= dev || g_dev.device_get(&d, dev) != 0 ||
      g_dev.primary_retain(&ctx, d) != 0 || g_dev.ctx_set(ctx) != 0 ||
      g_dev.stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */) != 0) {
    fprintf(stderr, "perf: cannot use CUDA device %d (context or stream)\n", dev);
    return -1;
  }
  *stream = (cudaStream_t)s;
  return 0;
}

int perf_dev_owns(const void* p) {
  unsigned type = 0; /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2): CU_MEMORYTYPE_DEVICE (2) */
  return g_dev.pointer_attribute(&type, 2, (cu_ptr)(uintptr_t)p) == 0 && type == 2;
}

int perf_dev_sync(cudaStream_t stream) {
  cu_result r = g_dev.stream_sync((void*)stream);
  if (r != 0) fprintf(stderr, "perf: cuStreamSynchronize failed (%d)\n", r);
  return r != 0;
}

int perf_dev_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  cu_result r = g_dev.copy((cu_ptr)(uintptr_t)dst, (cu_ptr)(uintptr_t)src, bytes, (void*)stream);
  if (r != 0) fprintf(stderr, "perf: cuMemcpyAsync of %zu bytes failed (%d)\n", bytes, r);
  return r != 0 || perf_dev_sync(stream);
}
