/*
 * A communicator's device state, made at its first call on a CUDA stream:
 * the device and its primary context, whether stream memory operations
 * work there (else calls run synchronously, see cuda_unit.c), the stream
 * gates and deferred launches, the pinned mirrors that gated calls' device buffers are staged
 * through, the executor's device backend that synchronous calls run on,
 * and the proxy thread that runs the comm's gated calls in order.
 */
#ifndef BRAID_CUDA_COMM_H_
#define BRAID_CUDA_COMM_H_

#include <cuda.h>

#include "cuda_driver.h"
#include "cuda_deferred.h"
#include "cuda_gate.h"
#include "nccl.h"
#include "transport.h"

struct ncclComm;
struct braid_stream;
struct cuda_mirror;
struct cuda_exec;
struct cuda_direct;

struct cuda_comm {
  int dev;         /* ordinal */
  CUdevice handle; /* the driver's, for the primary context's release */
  CUcontext ctx;
  int memops; /* 1: gates on stream memory operations; 0: synchronous calls */
  struct cuda_gates gates;
  struct cuda_deferred_pool deferred; /* kernels of gated direct calls */
  struct cuda_mirror* mirrors;        /* one per stream the comm was called on */
  struct cuda_exec* exec;             /* the executor's device backend (synchronous calls) */
  struct cuda_direct* direct;         /* links of direct calls, made at the first */
  /* what the transports see of the device (ctx->device): the copy stream
   * and the cache of peers' allocations mapped here, Direct's too */
  struct transport_device tdev;
  struct braid_stream* proxy; /* runs the device calls (a non-blocking comm's own stream) */
  int own_proxy;              /* proxy is ours to destroy */
};

/* The device the calling thread's current context is on, else 0; -1
 * without a driver. What ncclCommCuDevice reports for a comm made here. */
int cuda_current_device(void);

/* What names device `dev` across processes: a hash of its UUID, and one
 * of the UUIDs of every device this process sees, in ordinal order (two
 * processes number devices alike when theirs agree: not so under
 * different CUDA_VISIBLE_DEVICES). Zeros without a driver. */
void cuda_device_identity(int dev, uint64_t* uuid, uint64_t* view);

/* Whether another rank of the comm lives in this process (ranks as
 * threads, ncclCommInitAll): their streams share one CUDA context, where a
 * stream waiting on a host flag that depends on another stream of the same
 * context may hold that stream back (the driver's warning on stream memory
 * operations; seen on the H200 with 4 ranks as threads). Such comms order
 * device calls by synchronizing instead. -1 while the peers are unknown
 * (a non-blocking init still running): treated as shared. */
int cuda_comm_shares_process(const struct ncclComm* comm);
/* Whether rank p of the comm lives in this process (the peer table must
 * be known). */
int cuda_peer_in_process(const struct ncclComm* comm, int p);

/* The comm's device state, made at first need (thread-safe). */
ncclResult_t cuda_comm_get(struct ncclComm* comm, struct cuda_comm** out);
/* Stop the proxy (its queued calls finish first) and free everything. */
void cuda_comm_free(struct ncclComm* comm);

/* Make the comm's context current on this thread; *saved gets the one to
 * give back to cuda_ctx_restore. */
ncclResult_t cuda_ctx_enter(const struct cuda_comm* cc, CUcontext* saved);
void cuda_ctx_restore(CUcontext saved);

#endif /* BRAID_CUDA_COMM_H_ */
