/*
 * Executor: runs one schedule at a time with a window of steps in flight,
 * staging slots for received partials, and a backend that runs its
 * reductions and copies as tasks. It sees an executor context, not a comm:
 * the comm owns one and plans calls for it (exec_plan.c); tests build their
 * own around fake transports and backends.
 */
#ifndef BRAID_EXECUTOR_H_
#define BRAID_EXECUTOR_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "engine/mem.h"
#include "nccl.h"
#include "sched_build.h"
#include "schedule.h"
#include "engine/exec_chain.h"
#include "transport.h"

#define EXEC_MAX_WINDOW 32

/* A call runs as pieces of at most this many chunks of data (all ranks'
 * blocks together), so a schedule's length is bounded whatever the count:
 * a piece's pipeline drains only once per 8192 chunks. */
#define EXEC_PIECE_CHUNKS 8192

/* One collective call as the executor sees it. `count` is the per-rank
 * block for all-gather and reduce-scatter, else the whole buffer; `stride`
 * (0: count) spaces the blocks of all-gather / reduce-scatter. */
struct exec_args {
  int coll; /* enum sched_coll */
  int root;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  size_t stride;
  ncclDataType_t type;
  struct kern_redop redop;
  /* a PreMulSum scalar of ncclScalarDevice residence: read into
   * redop.scalar when the call starts (work.c), not when it is issued; a
   * device call points it at the scalar's staged copy. NULL: none */
  const void* scalar_src;
  unsigned pre;      /* KERN_PRE when every input read is pre-multiplied */
  unsigned post;     /* KERN_POST when every final result is divided */
  enum mem_kind mem; /* of the user's buffers (mem_query): picks the backend */
  /* the ncclCommRegister'ed ranges holding them (exec_plan), NULL: none */
  const struct mem_reg* sendreg;
  const struct mem_reg* recvreg;
  int algo;      /* enum sched_algo, from exec_plan */
  int canonical; /* the comm's deterministic mode when the call was issued */
  size_t chunk_bytes;
  /* A call among some of the comm's ranks (group_ranks: group_size of them,
   * this rank at group_rank), NULL: all. Hier on devices runs its stage
   * between nodes so (src/cuda/cuda_direct.c). */
  const int* group_ranks;
  int group_size;
  int group_rank;
  /* Run with no task at all (a device call gated on its stream, whose
   * proxy may launch nothing: src/cuda/cuda_unit.c); one that would need a
   * task fails instead. */
  int no_tasks;
};

/*
 * Where tasks run. post() starts one (a kern_task: the backend copies what
 * it needs) and names it by a ticket, setting *done when it already
 * completed (a synchronous backend, then never asked again); test() sets
 * *done once it completed, its destinations written. The executor touches nothing a task reads or
 * writes until test() said so, and never has two tasks in flight where one
 * writes bytes the other touches: a backend may run them in any order.
 */
struct exec_backend {
  const char* name;
  ncclResult_t (*post)(void* state, const struct kern_task* task, uint64_t* ticket, int* done);
  ncclResult_t (*test)(void* state, uint64_t ticket, int* done);
};

/* Post `t` and wait for it, polling (yielding the core between polls): for
 * a task that needs nothing but the backend to finish. */
ncclResult_t exec_backend_run(const struct exec_backend* b, void* state, const struct kern_task* t);

/*
 * Calls on memory that is not host memory (args.mem) run on the device
 * backend, staged: the transports move only the staging slots, never the
 * user's buffers. Every step that receives lands in a slot and a task
 * copies or reduces it into the output; every step that sends, sends a
 * slot that a task filled (a recv-reduce-copy-send writes the output and
 * the slot in one task). So the backend must reach both the user's memory
 * and the slots (src/cuda pins them), and the slots are its to pin. Where
 * every connection of the call reads and writes device memory itself
 * (transport_conn.device_direct: a net plugin's NIC), the call is not
 * staged: its steps post the user's buffers as a host call's do, and only
 * partials land in the slots; nothing is lent or written in place.
 */

/* What the owner gives an executor context, once. */
struct exec_conf {
  int rank;
  int nranks;
  const struct sched_topo* topo;      /* NULL or empty: one node */
  struct transport_conn** send_conns; /* per peer, filled before a call needs them */
  struct transport_conn** recv_conns;
  const struct exec_backend* backend;
  void* backend_state;
  _Atomic int* aborted; /* set: the running call fails at once */
  int64_t timeout_ms;   /* no progress for this long fails the call */
  int window;           /* steps in flight (raised to at least 4) */
  size_t slot_bytes;    /* staging slot size, the largest chunk */
};

/* Runtime record of one in-flight step. */
struct exec_rec {
  int slot;              /* staging slot, -1 if none */
  int out_slot;          /* staged exchange: the copy of Y it sends, -1 if none */
  int carry_in;          /* the carry slot its task reads, freed when the task is done; -1 */
  int pending;           /* its task is posted and not yet seen complete */
  uint64_t recv_seq;     /* message number on the receive connection */
  uint64_t send_seq;     /* message number on the send connection */
  uint64_t ticket;       /* its task, as the backend named it */
  const void* out;       /* what it sends, once computed (NULL: nothing, or sent at post) */
  int sent_early;        /* a plain send posted before its turn (post_early_sends) */
  int lent;              /* its receive stays where it arrived until its task read it */
  int in_place;          /* its task writes what it sends where the peer reads it */
  struct exec_held held; /* a chain its task folds: what that holds, given back when done */
  struct kern_task task;
};

/* Step i of the running piece goes through, in order: posted (receive
 * posted, a slot taken), computed (its task posted), finished (task done,
 * send posted), retired (send done, slot free). */
struct exec_ctx {
  struct exec_conf conf;
  /* the device backend, once its owner attached one (NULL: none) */
  const struct exec_backend* dev_backend;
  void* dev_state;
  /* slots: fixed at init, reused by every call */
  char* slot_mem;
  size_t slot_bytes;
  int nslots;
  int free_slots[EXEC_MAX_WINDOW];
  int nfree;
  int window;
  struct sched_cache cache;
  const struct schedule* sched; /* the running piece's, from the cache */
  /* the running call, and the piece of it that runs now (args) */
  int busy;
  struct exec_args call;
  struct transport_tag tag; /* the call, as every message of it carries it */
  struct exec_args args;
  const struct exec_backend* backend; /* the running call's, and its state */
  void* bstate;
  int staged;       /* the piece is on device memory, and transports move slots only */
  size_t es;        /* bytes per element */
  size_t piece;     /* elements per block in every piece but the last */
  size_t piece_off; /* where in each block the running piece starts */
  size_t next_post, next_compute, next_finish, retired;
  int carry[SCHED_CARRIES]; /* per register: the slot a reduce-carry step left, -1 if none */
  struct exec_chain chains[SCHED_CARRIES]; /* per register: combines left undone (exec_chain.h) */
  struct exec_rec recs[EXEC_MAX_WINDOW];
  size_t lend_bytes; /* the running piece may lend receives this long (0: none) */
  uint64_t last_progress_ns;
};

/* Staging slot `slot` of the context. */
static inline char* exec_slot_ptr(const struct exec_ctx* ex, int slot) {
  return ex->slot_mem + (size_t)slot * ex->slot_bytes;
}

ncclResult_t exec_init(struct exec_ctx* ex, const struct exec_conf* conf);
void exec_free(struct exec_ctx* ex);

/* Run later calls on device memory on `backend` (the context must be
 * idle). Its owner pins the slots first: exec_slots tells where they are. */
void exec_set_device_backend(struct exec_ctx* ex, const struct exec_backend* backend, void* state);
void exec_slots(const struct exec_ctx* ex, void** base, size_t* bytes);

/* The schedule key of a call whose algorithm and chunk are chosen. */
void exec_ctx_key(const struct exec_ctx* ex, const struct exec_args* args, struct sched_key* key);
/* Elements of each block per piece of a call (EXEC_PIECE_CHUNKS chunks of
 * all the blocks together, a chunk of each at least); every rank derives
 * the same. */
size_t exec_piece_count(const struct exec_ctx* ex, const struct exec_args* args);

/* Begin a call (the context must be idle); every message carries `tag`. */
ncclResult_t exec_start(struct exec_ctx* ex, const struct exec_args* args,
                        const struct transport_tag* tag);
/* Advance without blocking; *done when finished, *progressed when anything
 * moved. After an error the context is idle again (no task in flight). */
ncclResult_t exec_progress(struct exec_ctx* ex, int* done, int* progressed);

/* Whether a posted task has not been seen complete: backends wake no
 * sleeper when a task completes, so whoever drives the context polls
 * instead of sleeping while this holds. */
int exec_tasks_pending(const struct exec_ctx* ex);

#endif /* BRAID_EXECUTOR_H_ */
