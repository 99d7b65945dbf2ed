/*
 * A unit of work: the operations of one group (or one ungrouped call), run
 * together. Collectives of a comm run one after another on its executor;
 * its point-to-point operations all run at once beside them, on their own
 * connections.
 */
#ifndef BRAID_WORK_H_
#define BRAID_WORK_H_

#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "nccl.h"

enum work_kind { WORK_COLL = 0, WORK_SEND, WORK_RECV };

/* How a collective on device buffers runs direct (src/cuda/cuda_direct.h):
 * all its ranks on one node, or Hier with the node's stages direct. */
enum work_direct { WORK_DIRECT_NONE = 0, WORK_DIRECT_NODE, WORK_DIRECT_HIER };

/* Kernels one operation may queue on its stream (work_op.deferred). */
#define WORK_MAX_LAUNCHES 2

/* A kernel launch queued on a stream before its task is known
 * (src/cuda/cuda_deferred.h): the slot, and the value of its flags for
 * this use. slot NULL: none. */
struct work_deferred {
  void* slot;
  uint64_t value;
};

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
  uint64_t seq;        /* p2p: message number on its connection */
  uint64_t ticket;     /* this unit's turn on op->comm (same for all its ops there) */
  cudaStream_t stream; /* the stream the call named */
  int direct; /* enum work_direct: a collective run by the direct algorithm (cuda_direct.h) */
  int ipc;    /* p2p on device memory moved device to device (transports/cudaipc), not staged */
  /* gated: its kernels, queued on the stream: a direct collective's (two for
   * Hier on devices: into its scratch, out of it), an ipc send's copy. slot
   * NULL: none */
  struct work_deferred deferred[WORK_MAX_LAUNCHES];
};

/* A unit on device streams waits for each stream to reach it and lets each
 * go on when done (src/cuda/cuda_gate.h): the stream writes *ready = value,
 * then waits until *done >= value. Host addresses of pinned flags. */
struct work_gate {
  const volatile uint64_t* ready;
  volatile uint64_t* done;
  uint64_t value;
  /* While the wait lasts: ncclSuccess while the stream can still get there,
   * an error (the stream failed, its context is broken) once it cannot. */
  ncclResult_t (*check)(const struct work_gate* g);
  void* stream;
  void* ctx;
};

/* The CUDA streams one unit may span. */
#define WORK_MAX_GATES 8

/* Take the unit's turn on each of its comms, at issue time: units then run
 * in issue order per comm, whatever thread or stream runs them. */
ncclResult_t work_issue(struct work_op* ops, int n);

/* Wait for the unit's turn, run `n` operations to completion (or the first
 * error), pass the turn on. */
ncclResult_t work_run(struct work_op* ops, int n);

/* An issued unit that will not run (its stream failed earlier): wait for
 * its turns and pass them on, so later work on its comms is not stuck. */
ncclResult_t work_cancel(struct work_op* ops, int n);

/* The p2p lane (p2p.c): queue a send (WORK_SEND) or receive (WORK_RECV)
 * after checking it (fn names the API call in messages), match sends to
 * self with receives from self, post what the connection has room for,
 * check completion. */
ncclResult_t p2p_enqueue(const char* fn, int kind, void* buf, size_t count, ncclDataType_t type,
                         int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t p2p_match_self(struct work_op* ops, int n);
ncclResult_t p2p_step(struct work_op* op, uint64_t pass, int* progressed);

/* A unit runs in three steps. Plan (plan.c): the tuner picks each
 * collective's algorithm and chunk, which fixes its schedule and so the
 * peers it talks to. Connect (connect.c): every connection those need.
 * Drive (work.c): the executor and the p2p lane until every op is done. */
void work_plan(struct work_op* ops, int n);

/* Connections (connect.c): make every connection the operations need, all
 * sends first, then all receives, so that ranks (or one thread driving many
 * comms) never wait on each other. */
ncclResult_t work_connect(struct work_op* ops, int n);
/* Where op's connection with `peer` (send or receive side) is kept. */
struct transport_conn** work_conn_slot(struct work_op* op, int peer, int send);

#endif /* BRAID_WORK_H_ */
