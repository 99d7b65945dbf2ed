/* Device buffers for the multi-process tests (devmem.h): the driver API
 * through dlopen and cuGetProcAddress, with just the types it needs. */
#include "devmem.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEV_GUARD 64 /* collcheck's guard bytes on each side of an allocation */

typedef int cu_result;
typedef unsigned long long cu_ptr;
typedef cu_result (*get_proc_fn)(const char*, void**, int, unsigned long long, int*);

static struct {
  int loaded;
  cu_result (*init)(unsigned);
  cu_result (*device_get)(int*, int);
  cu_result (*primary_retain)(void**, int);
  cu_result (*ctx_set)(void*);
  cu_result (*stream_create)(void**, unsigned);
  cu_result (*stream_sync)(void*);
  cu_result (*memcpy_async)(cu_ptr, cu_ptr, size_t, void*);
  cu_result (*wait64)(void*, cu_ptr, unsigned long long, unsigned);
  cu_result (*mem_alloc)(cu_ptr*, size_t);
  cu_result (*mem_free)(cu_ptr);
} g_cu;

/* This thread's stream for dev_copy: non-blocking, so that a copy never
 * waits, as the legacy stream's would, for streams of other ranks of this
 * process that may wait on this thread. */
static __thread void* t_copy_stream;

static int resolve(get_proc_fn get, const char* name, void* slot) {
  int status = 0;
  return get(name, (void**)slot, 12000, 0, &status) != 0 || *(void**)slot == NULL;
}

static int driver_load(const mp_env* env) {
  const char* name = getenv("BRAID_CUDA_LIB"); /* as the library reads it: empty is unset */
  const char* lib = name && *name ? name : "libcuda.so.1";
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  get_proc_fn get = h ? (get_proc_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
  if (get == NULL) {
    mp_fail(env, "cannot open the CUDA driver %s (%s)", lib,
            h ? "no cuGetProcAddress_v2" : dlerror());
    return 1;
  }
  int bad = resolve(get, "cuInit", &g_cu.init) + resolve(get, "cuDeviceGet", &g_cu.device_get) +
            resolve(get, "cuDevicePrimaryCtxRetain", &g_cu.primary_retain) +
            resolve(get, "cuCtxSetCurrent", &g_cu.ctx_set) +
            resolve(get, "cuStreamCreate", &g_cu.stream_create) +
            resolve(get, "cuStreamSynchronize", &g_cu.stream_sync) +
            resolve(get, "cuMemcpyAsync", &g_cu.memcpy_async) +
            resolve(get, "cuStreamWaitValue64", &g_cu.wait64) +
            resolve(get, "cuMemAlloc", &g_cu.mem_alloc) + resolve(get, "cuMemFree", &g_cu.mem_free);
  if (bad || g_cu.init(0) != 0) {
    mp_fail(env, "%s: missing entry points or cuInit failed", lib);
    return 1;
  }
  g_cu.loaded = 1;
  return 0;
}

int dev_open(const mp_env* env, int dev) {
  int d;
  void* ctx;
  if (!g_cu.loaded && driver_load(env)) return 1;
  if (g_cu.device_get(&d, dev) != 0 || g_cu.primary_retain(&ctx, d) != 0 ||
      g_cu.ctx_set(ctx) != 0) {
    mp_fail(env, "cannot make device %d's context current", dev);
    return 1;
  }
  return 0;
}

cudaStream_t dev_stream(const mp_env* env) {
  void* s = NULL;
  if (g_cu.stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING, as nccl-tests' */) != 0 || s == NULL) {
    mp_fail(env, "cuStreamCreate failed");
    return NULL;
  }
  return (cudaStream_t)s;
}

int dev_sync(const mp_env* env, cudaStream_t s) {
  cu_result r = g_cu.stream_sync((void*)s);
  if (r != 0) mp_fail(env, "cuStreamSynchronize returned %d", r);
  return r != 0;
}

int dev_copy(const mp_env* env, void* dst, const void* src, size_t bytes) {
  return dev_copy_async(env, dst, src, bytes, (cudaStream_t)t_copy_stream) ||
         dev_sync(env, (cudaStream_t)t_copy_stream);
}

int dev_copy_async(const mp_env* env, void* dst, const void* src, size_t bytes, cudaStream_t s) {
  cu_result r = g_cu.memcpy_async((cu_ptr)(uintptr_t)dst, (cu_ptr)(uintptr_t)src, bytes, (void*)s);
  if (r != 0) mp_fail(env, "cuMemcpyAsync of %zu bytes returned %d", bytes, r);
  return r != 0;
}

/* A device copy of one guarded host allocation of `bytes` at base. */
static int upload(const mp_env* env, const unsigned char* base, size_t bytes, void** out) {
  void* d = NULL;
  ncclResult_t rc = ncclMemAlloc(&d, bytes + 2 * DEV_GUARD);
  if (rc != ncclSuccess) {
    mp_fail(env, "ncclMemAlloc(%zu) returned %d", bytes + 2 * DEV_GUARD, (int)rc);
    return 1;
  }
  *out = d;
  return dev_copy(env, d, base - DEV_GUARD, bytes + 2 * DEV_GUARD);
}

static size_t esize(const cc_call* c) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return (size_t)c->type < sizeof(sizes) / sizeof(sizes[0]) ? sizes[c->type] : 1;
}

/* The device address of host pointer p inside the allocation at base. */
static void* moved(const void* p, const unsigned char* base, void* dbase) {
  if (p == NULL || base == NULL) return (void*)p;
  return (unsigned char*)dbase + DEV_GUARD + ((const unsigned char*)p - base);
}

int dev_call_prepare(dev_call* d, const mp_env* env) {
  cc_call* h = &d->host;
  size_t e = esize(h);
  d->dsend = d->drecv = NULL;
  if (cc_prepare(h, env)) return 1;
  if (h->sbase && upload(env, h->sbase, h->selems * e, &d->dsend)) return 1;
  if (upload(env, h->rbase, h->relems * e, &d->drecv)) return 1;
  d->dev = *h;
  d->dev.send = h->sbase && (unsigned char*)h->send >= h->sbase &&
                        (unsigned char*)h->send < h->sbase + h->selems * e + 1
                    ? moved(h->send, h->sbase, d->dsend)
                    : moved(h->send, h->rbase, d->drecv);
  d->dev.recv = moved(h->recv, h->rbase, d->drecv);
  return 0;
}

int dev_call_fetch(dev_call* d, const mp_env* env) {
  cc_call* h = &d->host;
  size_t e = esize(h);
  int bad = dev_copy(env, h->rbase - DEV_GUARD, d->drecv, h->relems * e + 2 * DEV_GUARD);
  if (h->sbase) bad += dev_copy(env, h->sbase - DEV_GUARD, d->dsend, h->selems * e + 2 * DEV_GUARD);
  return bad;
}

void dev_call_release(dev_call* d) {
  if (d->dsend) ncclMemFree(d->dsend);
  if (d->drecv) ncclMemFree(d->drecv);
  d->dsend = d->drecv = NULL;
  cc_release(&d->host);
}

int dev_wait_flag(const mp_env* env, cudaStream_t s, volatile uint64_t* flag, uint64_t value) {
  cu_result r = g_cu.wait64((void*)s, (cu_ptr)(uintptr_t)flag, value, 0 /* GEQ */);
  if (r != 0) mp_fail(env, "cuStreamWaitValue64 returned %d", r);
  return r != 0;
}

void* dev_alloc_legacy(const mp_env* env, size_t bytes) {
  cu_ptr p = 0;
  if (g_cu.mem_alloc(&p, bytes) != 0) {
    mp_fail(env, "cuMemAlloc(%zu) failed", bytes);
    return NULL;
  }
  return (void*)(uintptr_t)p;
}

void dev_free_legacy(void* p) {
  if (p) g_cu.mem_free((cu_ptr)(uintptr_t)p);
}

ncclResult_t dev_outcome(const mp_env* env, ncclComm_t comm, cudaStream_t s, ncclResult_t rc) {
  ncclResult_t async = ncclSuccess;
  if (rc != ncclSuccess) return rc;
  if (dev_sync(env, s)) return ncclUnhandledCudaError;
  ncclCommGetAsyncError(comm, &async);
  return async;
}
