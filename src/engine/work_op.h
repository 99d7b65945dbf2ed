/*
 * A unit of work (work.h) as its parts are: the operations of one group
 * (or one ungrouped call), each a collective or one side of a send/recv,
 * with what the device path attaches to it (direct, gated launches) and
 * the stream gates a unit may wait on. Types only: the engine, the host
 * streams and the device path all read them.
 */
#ifndef BRAID_WORK_OP_H_
#define BRAID_WORK_OP_H_

#include <stddef.h>
#include <stdint.h>

#include "engine/executor.h"
#include "status/flight.h"
#include "engine/mem.h"
#include "launch.h"
#include "nccl.h"

enum work_kind { WORK_COLL = 0, WORK_SEND, WORK_RECV };

/* How a collective on device buffers runs direct (src/cuda/cuda_direct.h):
 * all its ranks on one node, or Hier with the node's stages direct. */
enum work_direct { WORK_DIRECT_NONE = 0, WORK_DIRECT_NODE, WORK_DIRECT_HIER };

/* Kernels one operation may queue on its stream (work_op.deferred): Hier
 * with direct node stages, an all-reduce halving and doubling between
 * 16384 nodes, queues 30 (algorithms/direct.h, DIRECT_MAX_STEPS + 2), and
 * a PreMulSum one more (its input multiplied first: src/cuda/cuda_direct.c). */
#define WORK_MAX_LAUNCHES 31

struct work_op {
  struct ncclComm* comm;
  int kind;
  struct exec_args args; /* WORK_COLL */
  struct sched_key key;  /* WORK_COLL: the schedule work_plan chose */
  int peer;              /* WORK_SEND / WORK_RECV */
  void* buf;
  size_t bytes;
  enum mem_kind mem;         /* p2p: of buf (mem_query) */
  const struct mem_reg* reg; /* p2p: the registration holding buf (work_plan), NULL: none */
  /* progress of this run */
  int started;
  int done;
  uint64_t seq;              /* p2p: message number on its connection */
  struct flight_mark flight; /* its record (flight.h) */
  uint64_t ticket;           /* this unit's turn on op->comm (same for all its ops there) */
  cudaStream_t stream;       /* the stream the call named */
  int direct; /* enum work_direct: a collective run by the direct algorithm (cuda_direct.h) */
  int ipc;    /* p2p on device memory moved device to device (transports/cudaipc), not staged */
  /* Hier whose stage between nodes runs on the device (algorithms/direct.h,
   * gathered; src/cuda decides once per call): its column's peers there are
   * the collective's partners (ring neighbours; on a power of two of nodes,
   * the halving's), which connect.c links; on the host, the column's ring */
  int direct_between;
  /* gated: its kernels, queued on the stream: a direct collective's (for
   * Hier on devices: into its scratch, one per halving step, out of it), an
   * ipc send's copy. slot NULL: none */
  struct gpu_launch deferred[WORK_MAX_LAUNCHES];
};

/* The CUDA streams one unit may span. */
#define WORK_MAX_GATES 8

#endif /* BRAID_WORK_OP_H_ */
