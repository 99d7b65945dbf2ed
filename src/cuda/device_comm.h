/*
 * A communicator's device state (comm->device), made at its first call on
 * a CUDA stream (cuda_comm.c): the device and its primary context, whether
 * stream memory operations work there (else calls run synchronously, see
 * cuda_unit.c), the stream gates and deferred launches, the pinned mirrors
 * that gated calls' device buffers are staged through, the executor's
 * device backend that synchronous calls run on, and the proxy thread that
 * runs the comm's gated calls in order. Types only: every part of the
 * device path reads it, cuda_comm.c alone makes and frees it.
 */
#ifndef BRAID_DEVICE_COMM_H_
#define BRAID_DEVICE_COMM_H_

#include <cuda.h>

#include "cuda/cuda_driver.h"
#include "cuda/cuda_deferred.h"
#include "cuda/cuda_gate.h"
#include "transport.h"

struct braid_stream;
struct cuda_mirror;
struct cuda_exec;
struct cuda_direct;

struct device_comm {
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
  /* every peer joined by a network that takes device memory itself, for
   * host and device memory alike (cuda_unit.c): 0 not asked yet, 1 yes,
   * -1 no (the peer table does not change) */
  int net_direct;
  /* every pair of this rank's Hier column that an all-gather's stage
   * joins, and that a reduction's joins, joined so (cuda_direct_policy.c),
   * the same three values */
  int column_direct, stages_direct;
  /* every node's ranks fit Hier's direct node stages (cuda_direct_policy.c,
   * comm_hier_shape: a question over every node, asked once), the same
   * three values */
  int hier_shape;
  /* whether the layout's nodes cut the deterministic mode's tree into
   * subtrees (comm_hier_canonical), known the same way */
  int hier_canonical;
  /* Hier's rows of this rank's column (algorithms/direct.h,
   * direct_hier_rows): made with the state, never changed, so that issue
   * and proxy read it alike; NULL on one node. Pinned and mapped, where
   * the kernels read it: a copy to the device would be GPU work from the
   * proxy, which a stream waiting at a gate may hold back */
  int32_t* hier_rows;
  CUdeviceptr hier_rows_dev;
};

#endif /* BRAID_DEVICE_COMM_H_ */
