/*
 * Loading the embedded fatbins into each context that launches (two
 * modules per context, kept for the process: kernels/cuda/reduce.cu and
 * reduce_at.cu) and sizing the grid: 256-thread
 * blocks, up to 32 per SM, at most one thread per pair of 16-byte vectors
 * (the launch shapes measured on an H200, docs/gpu-validation.md).
 */
#include "cuda_kernels.h"

#include <pthread.h>
#include <string.h>

#include "core.h"
#include "cuda_driver.h"
#include "kernels.h"

extern const unsigned char braid_fatbin_reduce[];
extern const unsigned char braid_fatbin_reduce_at[];

#define CUDA_MAX_CONTEXTS 64
#define KERNEL_BLOCK 256u
#define KERNEL_BLOCKS_PER_SM 32u

struct loaded {
  CUcontext ctx;
  CUfunction fn;    /* braid_reduce_copy: the task as its parameter */
  CUfunction fn_at; /* braid_reduce_copy_at: the task in memory */
  int sms;
};

static struct {
  pthread_mutex_t lock;
  int n;
  struct loaded ctx[CUDA_MAX_CONTEXTS];
} g_mods = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* One embedded fatbin into the current context. A slow load is the driver
 * compiling the fatbin's PTX for this GPU (a build without its SASS:
 * docs/building.md, "GPU architectures"); the first call would seem to hang
 * for it, so say what it was. */
static ncclResult_t module_load(const struct cuda_api* cu, CUmodule* mod, const void* image,
                                const char* name) {
  uint64_t t0 = braid_now_ns();
  ncclResult_t res = cuda_check(cu->cuModuleLoadData(mod, image), "cuModuleLoadData");
  double s = (double)(braid_now_ns() - t0) * 1e-9;
  if (res == ncclSuccess && s >= 1.0)
    INFO(SUB_INIT,
         "CUDA: loading kernels/cuda/%s took %.1f s: the driver compiled its PTX for this GPU "
         "(kept in its JIT cache; a build with SASS for it: CUDA_ARCHS, docs/building.md)",
         name, s);
  return res;
}

static ncclResult_t launch(const struct cuda_api* cu, CUfunction fn, unsigned grid, void* arg,
                           CUstream stream) {
  void* args[] = {arg};
  return cuda_check(cu->cuLaunchKernel(fn, grid, 1, 1, KERNEL_BLOCK, 1, 1, 0, stream, args, NULL),
                    "cuLaunchKernel");
}

/* Without cuFuncLoad (drivers before 12.4): an empty launch of each
 * function, waited for on a stream of its own. */
static ncclResult_t functions_warm_up(const struct cuda_api* cu, struct loaded* l) {
  ncclResult_t res = ncclSuccess;
  struct kern_dev_task none, *at_host = NULL;
  CUdeviceptr at = 0;
  CUstream s = NULL;
  memset(&none, 0, sizeof(none)); /* n = 0: the kernels return at once */
  CHECK(cuda_check(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate(kernel load)"));
  CHECK(launch(cu, l->fn, 1, &none, s));
  if (l->fn_at && cuda_flags_alloc(cu, sizeof(none), "cuMemHostAlloc(kernel load)",
                                   (void**)&at_host, &at) == ncclSuccess) {
    *at_host = none;
    if (launch(cu, l->fn_at, 1, &at, s) != ncclSuccess) l->fn_at = NULL;
  }
  CHECK(cuda_check(cu->cuStreamSynchronize(s), "cuStreamSynchronize(kernel load)"));
fail:
  if (at_host) cu->cuMemFreeHost(at_host);
  if (s) cu->cuStreamDestroy(s);
  return res;
}

/* Lazy loading (the driver's default since CUDA 12.2) finishes loading a
 * function at its first launch, and that may synchronize the whole
 * context. A first launch queued behind a stream gate (cuda_gate.c), or
 * made while a user stream waits on one, would then wait for a gate that
 * only this call's proxy opens, after the launch returns: for ever (issue
 * 32's first GPU run, where every gated direct call hung). So the
 * functions are loaded in full with their modules, before any gate. */
static ncclResult_t functions_finish_load(const struct cuda_api* cu, struct loaded* l) {
  if (cu->cuFuncLoad == NULL) return functions_warm_up(cu, l);
  ncclResult_t res = cuda_check(cu->cuFuncLoad(l->fn), "cuFuncLoad(braid_reduce_copy)");
  if (res == ncclSuccess && l->fn_at &&
      cuda_check(cu->cuFuncLoad(l->fn_at), "cuFuncLoad(braid_reduce_copy_at)") != ncclSuccess)
    l->fn_at = NULL;
  return res;
}

/* The kernel in the current context, loading the module the first time. */
static ncclResult_t kernel_for_current(const struct cuda_api* cu, struct loaded* out) {
  ncclResult_t res = ncclSuccess;
  CUcontext ctx = NULL;
  CUmodule mod, mod_at;
  CUdevice dev;
  CHECK(cuda_check(cu->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (ctx == NULL) FAIL(ncclInvalidUsage, "CUDA: no current context to launch in");
  pthread_mutex_lock(&g_mods.lock);
  for (int i = 0; i < g_mods.n; i++)
    if (g_mods.ctx[i].ctx == ctx) {
      *out = g_mods.ctx[i];
      pthread_mutex_unlock(&g_mods.lock);
      return ncclSuccess;
    }
  if (g_mods.n == CUDA_MAX_CONTEXTS) {
    pthread_mutex_unlock(&g_mods.lock);
    FAIL(ncclInternalError, "CUDA: kernels loaded in %d contexts already", CUDA_MAX_CONTEXTS);
  }
  struct loaded l = {ctx, NULL, NULL, 1};
  res = module_load(cu, &mod, braid_fatbin_reduce, "reduce.cu");
  if (res == ncclSuccess)
    res =
        cuda_check(cu->cuModuleGetFunction(&l.fn, mod, "braid_reduce_copy"), "cuModuleGetFunction");
  /* the second kernel is for gated direct calls only: without it they
   * fail (cuda_reduce_copy_at), everything else works */
  if (res == ncclSuccess &&
      (module_load(cu, &mod_at, braid_fatbin_reduce_at, "reduce_at.cu") != ncclSuccess ||
       cuda_check(cu->cuModuleGetFunction(&l.fn_at, mod_at, "braid_reduce_copy_at"),
                  "cuModuleGetFunction") != ncclSuccess))
    l.fn_at = NULL;
  if (res == ncclSuccess) res = functions_finish_load(cu, &l);
  if (res == ncclSuccess &&
      cu->cuDeviceGet(&dev, 0) == CUDA_SUCCESS) /* SM counts are alike across devices here */
    cu->cuDeviceGetAttribute(&l.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  if (res == ncclSuccess) g_mods.ctx[g_mods.n++] = l, *out = l;
  pthread_mutex_unlock(&g_mods.lock);
fail:
  return res;
}

/* Blocks for n elements: a pair of 16-byte vectors per thread at most,
 * up to KERNEL_BLOCKS_PER_SM per SM. */
static unsigned grid_for(const struct loaded* k, uint64_t n) {
  uint64_t threads = n / 8 + 1;
  uint64_t grid = (threads + KERNEL_BLOCK - 1) / KERNEL_BLOCK;
  uint64_t cap = (uint64_t)(k->sms > 0 ? k->sms : 1) * KERNEL_BLOCKS_PER_SM;
  return (unsigned)(grid > cap ? cap : grid);
}

ncclResult_t cuda_kernels_load(void) {
  const struct cuda_api* cu = cuda_driver();
  struct loaded k;
  if (cu == NULL) return ncclInvalidUsage;
  return kernel_for_current(cu, &k);
}

ncclResult_t cuda_reduce_copy(const struct kern_dev_task* task, CUstream stream) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  struct loaded k;
  if (cu == NULL) FAIL(ncclInvalidUsage, "CUDA: a kernel launch without a CUDA driver");
  if (task->n == 0) return ncclSuccess;
  /* this kernel runs one row: the caller makes each (cuda_direct.c's
   * synchronous calls); rows, their tables and spreads are
   * braid_reduce_copy_at's */
  if (kern_dev_task_rows(task) > 1 || task->src_at || task->dst_at || task->spread)
    FAIL(ncclInternalError, "CUDA: a task of rows given to braid_reduce_copy");
  CHECK(kernel_for_current(cu, &k));
  struct kern_dev_task param = *task; /* the launch copies it; the caller's stays const */
  CHECK(launch(cu, k.fn, grid_for(&k, task->n), &param, stream));
fail:
  return res;
}

ncclResult_t cuda_reduce_copy_at(CUdeviceptr task, uint64_t n_max, CUstream stream) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  struct loaded k;
  if (cu == NULL) FAIL(ncclInvalidUsage, "CUDA: a kernel launch without a CUDA driver");
  CHECK(kernel_for_current(cu, &k));
  if (k.fn_at == NULL) FAIL(ncclUnhandledCudaError, "CUDA: braid_reduce_copy_at did not load");
  CHECK(launch(cu, k.fn_at, grid_for(&k, n_max), &task, stream));
fail:
  return res;
}

void cuda_task_to_dev(const struct kern_task* t, struct kern_dev_task* d) {
  memset(d, 0, sizeof(*d));
  d->type = (int32_t)t->redop.type;
  d->op = t->nsrcs == 1 ? KB_COPY : (int32_t)t->redop.op;
  d->pre = t->pre & ((1u << t->nsrcs) - 1u);
  d->post = (t->flags & KERN_POST) ? 1u : 0u;
  d->nsrcs = t->nsrcs;
  d->ndsts = t->ndsts;
  d->n = t->n;
  d->scalar = t->redop.scalar;
  d->postdiv = t->redop.postdiv;
  for (int k = 0; k < t->nsrcs; k++) d->srcs[k] = t->srcs[k];
  for (int j = 0; j < t->ndsts; j++) d->dsts[j] = t->dsts[j];
}
