/* Multi-process tests: one call of any collective with generated inputs, an
 * exact reference and guarded buffers, checked element by element. */
#ifndef MP_COLLCHECK_H_
#define MP_COLLCHECK_H_

#include <stddef.h>
#include <stdint.h>

#include "archeck.h"
#include "launcher.h"
#include "nccl.h"

/* CC_BROADCAST in place is ncclBroadcast(buf, buf); CC_BCAST is ncclBcast. */
enum cc_coll {
  CC_ALLREDUCE,
  CC_BROADCAST,
  CC_BCAST,
  CC_REDUCE,
  CC_ALLGATHER,
  CC_REDUCESCATTER,
  CC_ALLTOALL, /* never in place: NCCL leaves that undefined (the flag is ignored) */
  CC_GATHER,
  CC_SCATTER,
  CC_NCOLLS
};

/* One collective. The caller fills coll..op; count is NCCL's count argument
 * (sendcount for all-gather, recvcount for reduce-scatter, the block for
 * all-to-all, gather and scatter); kind/op matter for reductions only, root
 * for broadcast, reduce, gather and scatter only. cc_prepare fills the
 * rest: send/recv are what the call gets, both inside guarded allocations. */
typedef struct cc_call {
  int coll;
  ncclDataType_t type;
  int kind;
  size_t count;
  int root;
  int inplace;
  uint64_t salt;
  ncclRedOp_t op;
  /* set by cc_prepare */
  int rank;
  int nranks;
  void* send;
  void* recv;
  unsigned char* sbase; /* send allocation (NULL when in place) */
  unsigned char* rbase; /* recv allocation, or the one in-place buffer */
  size_t selems;        /* elements in the send allocation */
  size_t relems;        /* elements in the recv allocation */
  ar_call ref;          /* reference tables (reductions) */
} cc_call;

const char* cc_coll_name(int coll);
int cc_is_reduction(int coll);
int cc_has_root(int coll);

/* "reduce type=half op=avg count=7 root=2 in-place nranks=5" */
void cc_describe(const cc_call* c, char* buf, size_t n);

/* Allocates and fills the buffers for the rank and size of env (use a copy
 * of env with the comm's rank and size for a split comm). 0 on success. */
int cc_prepare(cc_call* c, const mp_env* env);
/* Checks the outputs, that inputs are unchanged, that a non-root's reduce
 * recvbuff was not written and that no guard byte changed. 0 when exact. */
int cc_verify(const cc_call* c, const mp_env* env);
/* Only that no guard byte changed: all a failed call promises. */
int cc_verify_guards(const cc_call* c, const mp_env* env);
void cc_release(cc_call* c);

/* The NCCL call for c. Inline so helpers that never issue need no symbol. */
static inline ncclResult_t cc_issue(const cc_call* c, ncclComm_t comm, cudaStream_t stream) {
  switch (c->coll) {
    case CC_ALLREDUCE:
      return ncclAllReduce(c->send, c->recv, c->count, c->type, c->op, comm, stream);
    case CC_BROADCAST:
      return ncclBroadcast(c->send, c->recv, c->count, c->type, c->root, comm, stream);
    case CC_BCAST:
      return ncclBcast(c->recv, c->count, c->type, c->root, comm, stream);
    case CC_REDUCE:
      return ncclReduce(c->send, c->recv, c->count, c->type, c->op, c->root, comm, stream);
    case CC_ALLGATHER:
      return ncclAllGather(c->send, c->recv, c->count, c->type, comm, stream);
    case CC_REDUCESCATTER:
      return ncclReduceScatter(c->send, c->recv, c->count, c->type, c->op, comm, stream);
    case CC_ALLTOALL:
      return ncclAlltoAll(c->send, c->recv, c->count, c->type, comm, stream);
    case CC_GATHER:
      return ncclGather(c->send, c->recv, c->count, c->type, c->root, comm, stream);
    case CC_SCATTER:
      return ncclScatter(c->send, c->recv, c->count, c->type, c->root, comm, stream);
    default:
      return ncclInvalidArgument;
  }
}

/* Logs a failed issue of c. */
void cc_report_rc(const cc_call* c, const mp_env* env, ncclComm_t comm, ncclResult_t rc);

/* prepare + issue (stream NULL) + verify + release: 0 exact, 1 wrong data,
 * -1 when the call itself failed (the comm should then be abandoned). */
static inline int cc_run(cc_call* c, const mp_env* env, ncclComm_t comm) {
  if (cc_prepare(c, env) != 0) return -1;
  ncclResult_t rc = cc_issue(c, comm, NULL);
  if (rc != ncclSuccess) {
    cc_report_rc(c, env, comm, rc);
    cc_release(c);
    return -1;
  }
  int bad = cc_verify(c, env);
  cc_release(c);
  return bad;
}

/* 64-bit FNV-1a of n bytes, for comparing results across ranks. */
uint64_t cc_hash(const void* p, size_t n);

/* Publishes h as this rank's value in slot `round` of a shared table and
 * waits for every rank's (timeout_ms); 0 when all ranks hold the same hash.
 * Uses env->shm from int 512 on; rounds must increase by one per call. */
int cc_same_everywhere(const mp_env* env, uint64_t h, int round, const char* what);

/* Shares an id made by `maker` (it calls ncclGetUniqueId) through env->shm
 * slot `slot` (0..3): for a second communicator of the same ranks. 0 on success. */
int cc_share_id(const mp_env* env, int maker, int slot, ncclUniqueId* id);

#endif /* MP_COLLCHECK_H_ */
