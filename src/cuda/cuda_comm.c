/*
 * A communicator's device state (cuda_comm.h).
 */
#include "cuda_comm.h"

#include <stdlib.h>

#include "comm/comm.h"
#include "core.h"
#include "cuda/cuda_driver.h"
#include "cuda_direct_exchange.h"
#include "cuda_exec.h"
#include "cuda/cuda_kernels.h"
#include "cuda_stage.h"
#include "direct.h"
#include "layout.h"
#include "cuda/cudaipc_mem.h"
#include "engine/device.h"
#include "param.h"
#include "engine/stream.h"
#include "transport_table.h"

int device_current(void) {
  const struct cuda_api* cu = cuda_driver();
  CUcontext ctx = NULL;
  CUdevice dev = 0;
  if (cu == NULL) return -1;
  if (cu->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL) return 0;
  return cu->cuCtxGetDevice(&dev) == CUDA_SUCCESS ? (int)dev : 0;
}

void device_kernels_preload(void) {
  const struct cuda_api* cu = cuda_driver();
  CUcontext ctx = NULL;
  if (cu == NULL || cu->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL) return;
  if (cuda_kernels_load() != ncclSuccess)
    INFO(SUB_INIT, "CUDA: the kernels did not load at init (the WARN above says why)");
}

void device_identity(int dev, uint64_t* uuid, uint64_t* view) {
  const struct cuda_api* cu = cuda_driver();
  int n = 0;
  *uuid = *view = 0;
  if (cu == NULL || dev < 0 || cu->cuDeviceGetCount(&n) != CUDA_SUCCESS) return;
  uint64_t v = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++) {
    CUdevice d;
    CUuuid id;
    if (cu->cuDeviceGet(&d, i) != CUDA_SUCCESS || cu->cuDeviceGetUuid(&id, d) != CUDA_SUCCESS)
      return;
    v = braid_fnv1a(v, id.bytes, sizeof(id.bytes));
    if (i == dev) *uuid = braid_fnv1a(BRAID_FNV_OFFSET, id.bytes, sizeof(id.bytes));
  }
  *view = v;
}

int cuda_peer_in_process(const struct ncclComm* comm, int p) {
  const struct peer_info* me = &comm->peers[comm->rank];
  return comm->peers[p].pid == me->pid && comm->peers[p].host_hash == me->host_hash;
}

int cuda_comm_shares_process(const struct ncclComm* comm) {
  if (!atomic_load(&comm->init_done) || comm->peers == NULL) return -1;
  for (int p = 0; p < comm->nranks; p++)
    if (p != comm->rank && cuda_peer_in_process(comm, p)) return 1;
  return 0;
}

/* Stream memory operations on pinned host flags: the driver says whether
 * the device has them (the 64-bit ones Braid uses), BRAID_STREAM_MEMOPS=0
 * turns them off (the fallback, for tests and for drivers that misbehave). */
static int memops_usable(const struct cuda_api* cu, CUdevice dev) {
  int ok64 = 0, map = 0;
  cu->cuDeviceGetAttribute(&ok64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
  cu->cuDeviceGetAttribute(&map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, dev);
  return ok64 && map && param_stream_memops();
}

/* What the transports need of the device (transport.h): a copy stream,
 * non-blocking (a user stream waiting on a gate never holds it back), the
 * import cache, made in the comm's context. */
static ncclResult_t cuda_comm_transports(struct ncclComm* comm, struct device_comm* cc) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  CUcontext saved;
  CUstream s = NULL;
  CHECK(cuda_ctx_enter(cc->ctx, &saved));
  res = cuda_check(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate(copies)");
  cc->tdev.copy_stream = s;
  if (res == ncclSuccess) res = cudaipc_cache_create(cc->handle, &cc->tdev.cache);
  cuda_ctx_restore(saved);
  cc->tdev.context = cc->ctx;
  if (res == ncclSuccess) res = transport_device_attach(&comm->tctx, &cc->tdev);
fail:
  return res;
}

/* The kernels, loaded in the comm's context before any call can hold one
 * of its streams at a gate (cuda_kernels_load says why). */
static ncclResult_t cuda_comm_kernels(struct device_comm* cc) {
  ncclResult_t res = ncclSuccess;
  CUcontext saved;
  CHECK(cuda_ctx_enter(cc->ctx, &saved));
  res = cuda_kernels_load();
  cuda_ctx_restore(saved);
fail:
  return res;
}

/* Hier's rows of this rank's column (device_comm.h), where Hier's node
 * stages can run: several nodes, none of more ranks than a task joins;
 * pinned in the comm's context, whatever the caller's. Without them a
 * reduce-scatter or all-gather on devices is staged (cuda_direct_policy.c),
 * so a failure here costs nothing else. */
static void cuda_comm_rows(const struct ncclComm* comm, struct device_comm* cc) {
  const struct sched_topo* t = &comm->layout;
  void* host = NULL;
  CUcontext saved;
  if (t->nnodes < 2 || t->max_ppn > DIRECT_MAX_RANKS) return;
  if (cuda_ctx_enter(cc->ctx, &saved) != ncclSuccess) return;
  if (cuda_flags_alloc(cuda_driver(), direct_hier_rows_size(t) * sizeof(int32_t),
                       "cuMemHostAlloc(Hier rows)", &host, &cc->hier_rows_dev) == ncclSuccess) {
    cc->hier_rows = host;
    direct_hier_rows(t, t->local_of[comm->rank], cc->hier_rows);
  } else {
    INFO(SUB_INIT,
         "Rank %d: no Hier rows (the WARN above says why): device reduce-scatters and "
         "all-gathers across nodes are staged",
         comm->rank);
  }
  cuda_ctx_restore(saved);
}

/* The comm's device state into comm->device: once the primary context is
 * retained, device_comm_free undoes whatever was made if a later step fails. */
static ncclResult_t cuda_comm_make(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  struct device_comm* cc = NULL;
  CUdevice dev;
  if (cu == NULL)
    FAIL(ncclInvalidUsage, "Device call on comm %p, but there is no CUDA driver", (void*)comm);
  CHECK(braid_calloc(&cc, 1, sizeof(*cc)));
  cc->dev = comm->cuda_dev < 0 ? 0 : comm->cuda_dev;
  CHECK(cuda_check(cu->cuDeviceGet(&dev, cc->dev), "cuDeviceGet"));
  cc->handle = dev;
  CHECK(cuda_check(cu->cuDevicePrimaryCtxRetain(&cc->ctx, dev), "cuDevicePrimaryCtxRetain"));
  comm->device = cc;
  cc->memops = memops_usable(cu, dev);
  cuda_gates_init(&cc->gates);
  cuda_deferred_init(&cc->deferred);
  cc->proxy = comm->internal_stream; /* a non-blocking comm's calls already run there */
  if (cc->proxy == NULL) {
    res = stream_create(&cc->proxy);
    cc->own_proxy = res == ncclSuccess;
  }
  if (res == ncclSuccess && cuda_comm_kernels(cc) != ncclSuccess)
    INFO(SUB_INIT, "Rank %d: the kernels did not load (the WARN above says why)", comm->rank);
  if (res == ncclSuccess) cuda_comm_rows(comm, cc);
  if (res == ncclSuccess) res = cuda_comm_transports(comm, cc);
  if (res == ncclSuccess && cuda_exec_attach(cc, &comm->exec, &cc->exec) != ncclSuccess)
    INFO(SUB_INIT,
         "Rank %d: no CUDA backend for the executor (the WARN above says why): "
         "synchronous device calls are staged through host memory",
         comm->rank);
  if (res != ncclSuccess) {
    device_comm_free(comm);
    return res;
  }
  INFO(SUB_INIT, "Rank %d: device calls on CUDA device %d, %s", comm->rank, cc->dev,
       cc->memops ? "ordered by stream memory operations"
                  : "synchronous (no stream memory operations, or BRAID_STREAM_MEMOPS=0)");
  return ncclSuccess;
fail:
  free(cc);
  return res;
}

ncclResult_t cuda_comm_get(struct ncclComm* comm, struct device_comm** out) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&comm->turn_lock);
  if (comm->device == NULL) res = cuda_comm_make(comm);
  *out = comm->device;
  pthread_mutex_unlock(&comm->turn_lock);
  return res;
}

/* In the comm's context. The mappings go only once every stream passed
 * what it was given, and no kernel may still use one. */
static void cuda_comm_transports_free(struct ncclComm* comm, struct device_comm* cc, int passed) {
  const struct cuda_api* cu = cuda_driver();
  comm->tctx.device = NULL;
  if (cc->tdev.copy_stream) {
    cu->cuStreamSynchronize(cc->tdev.copy_stream);
    cu->cuStreamDestroy(cc->tdev.copy_stream);
  }
  if (passed && !cc->tdev.mappings_in_use)
    cudaipc_cache_destroy(cc->tdev.cache);
  else if (cc->tdev.cache) /* unmapped under a kernel, the peers' memory would fault it */
    WARN("CUDA IPC: a kernel may still use peers' buffers: their mappings are left in place");
}

void device_comm_free(struct ncclComm* comm) {
  struct device_comm* cc = comm->device;
  const struct cuda_api* cu = cuda_driver();
  CUcontext saved;
  if (cc == NULL) return;
  if (cc->own_proxy) stream_destroy(cc->proxy); /* its queued calls finish first */
  cuda_exec_detach(cc->exec, &comm->exec);
  if (cuda_ctx_enter(cc->ctx, &saved) == ncclSuccess) {
    int passed = cuda_mirrors_free(&cc->mirrors, cu); /* no stream waits on a flag any more */
    cuda_direct_free(cc->direct, passed);             /* nor runs a kernel on peers' buffers */
    cuda_comm_transports_free(comm, cc, passed);
    if (passed) {
      cuda_gates_free(&cc->gates, cu);
      cuda_deferred_free(&cc->deferred, cu);
      if (cc->hier_rows) cu->cuMemFreeHost(cc->hier_rows); /* a kernel may read it until then */
    }
    cuda_ctx_restore(saved);
  }
  cu->cuDevicePrimaryCtxRelease(cc->handle); /* the retain of cuda_comm_make */
  free(cc);
  comm->device = NULL;
}

ncclResult_t device_comm_flush(struct ncclComm* comm) {
  struct device_comm* dc = comm->device;
  return dc && dc->own_proxy ? stream_sync(dc->proxy) : ncclSuccess;
}
