/*
 * The communicator: identity, peers, connections, progress engine, executor
 * state, reduction-op table and error state. Everything mutable lives here.
 */
#ifndef BRAID_COMM_H_
#define BRAID_COMM_H_

#include <stdatomic.h>
#include <stdint.h>

#include "bootstrap.h"
#include "executor.h"
#include "nccl.h"
#include "progress.h"
#include "schedule.h"
#include "transport.h"

#define COMM_MAGIC 0x6272616964636f6dull /* "braidcom" */

/* A PreMulSum operator made by ncclRedOpCreatePreMulSum. */
struct comm_redop {
  int in_use;
  ncclDataType_t type;
  ncclScalarResidence_t residence;
  uint64_t scalar;        /* host-immediate value, in the type's encoding */
  const void* scalar_ptr; /* read at each call for ncclScalarDevice */
};

struct ncclComm {
  uint64_t magic;
  int rank;
  int nranks;
  int cuda_dev;
  ncclConfig_t config;
  struct bootstrap_id id;
  struct peer_info* peers;
  /* data plane */
  struct transport_ctx tctx;
  struct transport_conn** send_conns; /* per peer, NULL when not connected */
  struct transport_conn** recv_conns;
  struct progress progress;
  struct exec_state exec;
  struct schedule sched;
  /* user reduction operators */
  struct comm_redop* redops;
  int nredops;
  /* state */
  _Atomic int aborted;
  _Atomic int error;  /* ncclResult_t of the first failure, 0 if none */
  _Atomic int active; /* calls currently inside the library on this comm */
  int finalized;
};

/* Validate a comm argument (non-NULL, live). */
ncclResult_t comm_check(const struct ncclComm* comm, const char* fn);

/* Record the first failure, and make every peer notice it (shut down our
 * connections) so nobody waits for us. */
void comm_set_error(struct ncclComm* comm, ncclResult_t err);

/* Turn a user op into the executor's form; ncclInvalidArgument if unknown. */
ncclResult_t redop_resolve(struct ncclComm* comm, ncclRedOp_t op, ncclDataType_t type,
                           struct exec_args* args);
void redop_free_all(struct ncclComm* comm);

/* Tuner: algorithm and chunk size for an all-reduce of `bytes`. */
void tuner_choose_allreduce(const struct ncclComm* comm, size_t count, size_t elem_size, int* algo,
                            size_t* chunk_bytes);

/* Group queue: run now, or defer to ncclGroupEnd when inside a group. */
ncclResult_t group_enqueue(struct ncclComm* comm, const struct exec_args* args);

#endif /* BRAID_COMM_H_ */
