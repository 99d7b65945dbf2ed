/*
 * The communicator: identity, peers, connections, progress engine, executor
 * state, reduction-op table and error state. Everything mutable lives here.
 */
#ifndef BRAID_COMM_H_
#define BRAID_COMM_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "bootstrap.h"
#include "executor.h"
#include "mem.h"
#include "nccl.h"
#include "progress.h"
#include "schedule.h"
#include "transport.h"
#include "tuner.h"

#define COMM_MAGIC 0x6272616964636f6dull /* "braidcom" */

/* A PreMulSum operator made by ncclRedOpCreatePreMulSum. */
struct comm_redop {
  int in_use;
  ncclDataType_t type;
  ncclScalarResidence_t residence;
  uint64_t scalar;        /* host-immediate value, in the type's encoding */
  const void* scalar_ptr; /* read at each call for ncclScalarDevice */
};

struct braid_stream;
struct cuda_comm;

struct ncclComm {
  uint64_t magic;
  int rank;
  int nranks;
  int cuda_dev;
  struct tuner_model tune; /* the tuner's cost model of this comm */
  ncclConfig_t config;
  struct bootstrap_id id;
  struct peer_info* peers;
  struct sched_topo layout; /* nodes and local ranks, from the peers' host hashes */
  /* data plane */
  struct transport_ctx tctx;
  struct transport_conn** send_conns; /* collectives: per peer, NULL until needed */
  struct transport_conn** recv_conns;
  struct transport_conn** p2p_send; /* send/recv: their own connections */
  struct transport_conn** p2p_recv;
  struct transport_conn** p2p_send_dev; /* send/recv of device memory device to device */
  struct transport_conn** p2p_recv_dev;
  const struct transport** peer_transport;     /* per peer, chosen at first need */
  const struct transport** peer_transport_dev; /* the same, for device buffers */
  /* Work runs in the order it was issued, whichever thread or stream runs
   * it: issue takes a ticket, running waits for its turn. */
  pthread_mutex_t turn_lock;
  pthread_cond_t turn_cv;
  uint64_t next_ticket; /* under turn_lock */
  uint64_t serving;     /* under turn_lock */
  struct progress progress;
  struct transport_waits waits; /* what the last pass of progress found blocked */
  struct exec_ctx exec;         /* its connections are send_conns/recv_conns */
  /* user reduction operators */
  struct comm_redop* redops;
  int nredops;
  /* ncclCommRegister'ed buffers */
  struct mem_regs regs;
  /* non-blocking comm (config.blocking == 0): its work runs on this stream */
  struct braid_stream* internal_stream;
  /* device calls (src/cuda/cuda_comm.h): made at the first one, else NULL */
  struct cuda_comm* cuda;
  /* state */
  _Atomic int aborted;
  _Atomic int error;     /* ncclResult_t of the first failure, 0 if none */
  _Atomic int active;    /* units running on this comm (changed under turn_lock) */
  _Atomic int refs;      /* the user's handle, and one per unit issued and not yet run */
  _Atomic int calls;     /* API calls waiting on it outside a unit (comm_call_enter) */
  _Atomic int closing;   /* ncclCommAbort or ncclCommDestroy: those calls must leave */
  _Atomic int init_done; /* bootstrap completed: destroying it no longer aborts init */
  _Atomic int revoked;   /* ncclCommRevoke (or a shrink that aborted it): no new calls */
  _Atomic int suspended; /* ncclCommSuspend until ncclCommResume: no new calls */
  int finalized;
  /* the control channel (comm_ctrl.h) and how many shrinks it has served */
  int ctrl_fd;
  struct socket_wire_addr ctrl_addr;
  uint64_t shrink_epoch;
  uint64_t grow_epoch;
  int grow_id_pending; /* ncclCommGetUniqueId made grow_id; ncclCommGrow consumes it */
  ncclUniqueId grow_id;
  struct bootstrap_root* grow_root; /* grow_id's root while it is pending */
};

/* Wait until the work queued on the comm's own streams (a non-blocking
 * comm's, its device proxy's) has run: what ncclCommFinalize waits for. */
ncclResult_t comm_flush(struct ncclComm* comm);

/* ncclCommRevoke's work: stop what runs, refuse new calls, keep the comm. */
ncclResult_t comm_revoke(struct ncclComm* comm);

/* Free everything a comm owns (its own stream's queued work finishes
 * first) and drop the user's reference; the struct itself goes with the
 * last reference, so work still queued on a host stream can see that the
 * comm is gone instead of reading freed memory. */
void comm_free(struct ncclComm* comm);
void comm_ref(struct ncclComm* comm);
void comm_unref(struct ncclComm* comm);

/* The live communicators (comm_registry.c): added at creation, removed
 * when the user destroys or aborts one, so that comm_check refuses a
 * handle that is gone without reading its memory. */
ncclResult_t comm_registry_add(const struct ncclComm* comm);
void comm_registry_remove(const struct ncclComm* comm);
int comm_registry_has(const struct ncclComm* comm);
/* A user config read up to the size the caller's header gave it. */
ncclResult_t comm_config_read(const ncclConfig_t* user, ncclConfig_t* out);

/* No 64-bit machine addresses more than 2^56 bytes (x86-64 with 5-level
 * paging; arm64 stops at 2^52): a larger count is a bug, such as a
 * negative number cast to size_t, never data. */
#define COMM_MAX_BYTES (SIZE_MAX >> 8)

/* A data type argument; a count of `blocks` blocks of elem_size-byte
 * elements (no overflow, no impossible buffer); a comm a call is issued on
 * (live, not finalized). */
ncclResult_t comm_check_type(ncclDataType_t type, const char* fn);
ncclResult_t comm_check_count(const char* fn, size_t count, size_t elem_size, size_t blocks);
ncclResult_t comm_check_call(const struct ncclComm* comm, const char* fn);

/* Validate a comm argument (non-NULL, live). */
ncclResult_t comm_check(const struct ncclComm* comm, const char* fn);

/* What a comm_call_enter'ed call may find besides a working comm. */
enum comm_call_allow { COMM_CALL_WORKING = 0, COMM_CALL_REVOKED_TOO = 1 };

/* An API call that waits on the comm outside a unit (split, shrink, grow,
 * suspend, registration): refused as comm_check_call refuses (a revoked
 * comm too unless `allow` says otherwise). Once entered, ncclCommAbort
 * and ncclCommDestroy wake it (comm->aborted: the call then fails) and
 * wait for comm_call_leave before they free the comm. */
ncclResult_t comm_call_enter(struct ncclComm* comm, const char* fn, int allow);
/* The same for a call any live comm takes, whatever its state (queries). */
ncclResult_t comm_call_hold(struct ncclComm* comm, const char* fn);
void comm_call_leave(struct ncclComm* comm);
/* Under the registry's lock: count a call in (comm->calls) if comm is
 * live; 0 if it is not (comm_registry.c). */
int comm_registry_enter(struct ncclComm* comm);

/* Record the first failure, and make every peer notice it (shut down our
 * connections) so nobody waits for us. */
void comm_set_error(struct ncclComm* comm, ncclResult_t err);

/* A built-in op (op < ncclNumOps) in the executor's form on `nranks` ranks. */
void redop_builtin(ncclRedOp_t op, ncclDataType_t type, int nranks, struct exec_args* args);
/* Turn a user op into the executor's form; ncclInvalidArgument if unknown. */
ncclResult_t redop_resolve(struct ncclComm* comm, ncclRedOp_t op, ncclDataType_t type,
                           const char* fn, struct exec_args* args);
void redop_free_all(struct ncclComm* comm);

/* Tuner: algorithm and chunk size for `coll` on a buffer of `bytes`. */
void tuner_choose(const struct ncclComm* comm, int coll, size_t bytes, int* algo,
                  size_t* chunk_bytes);
/* The model's table for this comm, at INFO/TUNING. */
void tuner_log_table(const struct ncclComm* comm);
/* NCCL_ALGO syntax to a bit mask of enum sched_algo (exposed for tests). */
unsigned tuner_parse_algos(const char* s);
/* Whether NCCL_ALGO allows the direct algorithm on device buffers (it is
 * not a schedule: src/cuda/cuda_direct.h), and whether it names it (then a
 * call it fits runs direct even where it could have run gated). */
int tuner_allows_direct(void);
int tuner_forces_direct(void);
/* Whether direct is modelled faster than staging through host memory for
 * a device-buffer call of `bytes` on one node, `ranks_per_device` ranks at
 * most sharing a GPU (tuner_device.c). */
int tuner_prefers_direct(const struct ncclComm* comm, int coll, size_t bytes, int ranks_per_device);

/* Group queue: run now, defer to ncclGroupEnd when inside a group, or hand
 * to a host stream. */
ncclResult_t group_enqueue(struct ncclComm* comm, const struct exec_args* args,
                           cudaStream_t stream);

#endif /* BRAID_COMM_H_ */
