/*
 * The communicator: identity, peers, connections, progress engine, executor
 * state, reduction-op table and error state. Everything mutable lives here.
 * This header declares what comm.c does with it: the checks every call
 * makes, calls counted in and out, references and the error state. The
 * comm is made in comm_init.c and unmade in comm_teardown.c.
 */
#ifndef BRAID_COMM_H_
#define BRAID_COMM_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "bootstrap/bootstrap.h"
#include "comm/comm_ctrl.h"
#include "engine/executor.h"
#include "status/flight.h"
#include "engine/mem.h"
#include "nccl.h"
#include "engine/progress.h"
#include "schedule.h"
#include "transport.h"
#include "tune/tuner_types.h"

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
struct device_comm;

struct ncclComm {
  uint64_t magic;
  int rank;
  int nranks;
  int cuda_dev;
  struct tuner_model tune; /* the tuner's cost model of this comm */
  ncclConfig_t config;
  struct bootstrap_ids ids; /* its root's id and the first: its key names the comm */
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
  /* its last operations (flight.h): what its status and dumps show */
  struct flight flight;
  /* control messages kept by the status service for ctrl_recv */
  struct ctrl_mailbox mailbox;
  /* the tagged point-to-point lane (p2p_lane.h), made at its first use
   * (under turn_lock) */
  struct p2p_lane* lane;
  /* non-blocking comm (config.blocking == 0): its work runs on this stream */
  struct braid_stream* internal_stream;
  /* calls on a NULL stream go to internal_stream (1) or run on the
   * caller's thread (0): !config.blocking at init, braidCommSetBlocking after */
  _Atomic int nonblocking;
  /* device calls (device.h): the device path's state, made at the first
   * one, else NULL */
  struct device_comm* device;
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
  /* reductions in the canonical order (docs/determinism.md): from
   * BRAID_DETERMINISTIC at creation, braidCommSetDeterministic after; a
   * call takes the value when it is issued */
  _Atomic int deterministic;
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

/* The live communicators: added at creation, removed when the user
 * destroys or aborts one, so that comm_check refuses a handle that is gone
 * without reading its memory. */
ncclResult_t comm_registry_add(const struct ncclComm* comm);
void comm_registry_remove(const struct ncclComm* comm);
int comm_registry_has(const struct ncclComm* comm);
/* Under the registry's lock: count a call in (comm->calls) if comm is
 * live; 0 if it is not. */
int comm_registry_enter(struct ncclComm* comm);

/* Every connection of the comm, both channels and directions: shut down
 * (peers notice at once), or closed and forgotten. */
void comm_conns_apply(struct ncclComm* comm, int close_them);

void comm_ref(struct ncclComm* comm);
/* The last reference frees the struct itself (comm_free freed what it
 * holds): work still queued on a host stream can then see that the comm
 * is gone instead of reading freed memory. */
void comm_unref(struct ncclComm* comm);

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

/* A call made on the comm (an entry point, or a call that waits on it
 * outside a unit: split, shrink, grow, suspend, registration): refused as
 * comm_check_call refuses (a revoked comm too unless `allow` says
 * otherwise). Once entered, ncclCommAbort and ncclCommDestroy wake it
 * (comm->closing, comm->aborted: the call then fails) and wait for
 * comm_call_leave before they free the comm. */
ncclResult_t comm_call_enter(struct ncclComm* comm, const char* fn, int allow);
/* The same for a call any live comm takes, whatever its state (queries). */
ncclResult_t comm_call_hold(struct ncclComm* comm, const char* fn);
void comm_call_leave(struct ncclComm* comm);

/* Record the first failure, and make every peer notice it (shut down our
 * connections) so nobody waits for us. */
void comm_set_error(struct ncclComm* comm, ncclResult_t err);

#endif /* BRAID_COMM_H_ */
