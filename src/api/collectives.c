/*
 * Collective entry points: validate arguments (a WARN naming the bad one),
 * resolve the reduction, and hand the call to the group queue, which runs
 * it now, at ncclGroupEnd, or on a host stream. The tuner picks the
 * algorithm when the call starts.
 */
#include "comm/comm.h"
#include "core.h"
#include "api/group.h"
#include "kernels.h"
#include "engine/mem.h"
#include "engine/redop.h"

/* One collective call as the user made it. */
struct coll_call {
  const char* fn;
  int coll;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op; /* ncclSum for collectives without one */
  int has_op;
  int root; /* -1 for rootless collectives */
  ncclComm_t comm;
  cudaStream_t stream;
};

/* All-gather and reduce-scatter move a block per rank. */
static size_t coll_blocks(const struct coll_call* c) {
  return c->coll == COLL_ALLGATHER || c->coll == COLL_REDUCESCATTER ? (size_t)c->comm->nranks : 1;
}

/* The arguments, on a comm the caller holds (comm_call_enter). */
static ncclResult_t coll_check(const struct coll_call* c) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = c->comm;
  CHECK(comm_check_type(c->type, c->fn));
  CHECK(comm_check_count(c->fn, c->count, kern_type_size(c->type), coll_blocks(c)));
  if (c->root != -1 && (c->root < 0 || c->root >= comm->nranks))
    FAIL(ncclInvalidArgument, "%s : root %d out of range [0,%d)", c->fn, c->root, comm->nranks);
  if (c->count > 0 && sched_coll_reads_send(c->coll, comm->rank, c->root) && c->sendbuff == NULL)
    FAIL(ncclInvalidArgument, "%s : sendbuff is NULL", c->fn);
  if (c->count > 0 && sched_coll_writes_recv(c->coll, comm->rank, c->root) && c->recvbuff == NULL)
    FAIL(ncclInvalidArgument, "%s : recvbuff is NULL", c->fn);
fail:
  return res;
}

static ncclResult_t coll_enqueue_held(const struct coll_call* c) {
  ncclResult_t res = ncclSuccess;
  struct exec_args a = {0};
  CHECK(coll_check(c));
  CHECK(redop_resolve(c->comm, c->op, c->type, c->fn, &a));
  if (!c->has_op) a.pre = a.post = 0;
  a.coll = c->coll;
  a.root = c->root < 0 ? 0 : c->root;
  a.sendbuff = c->sendbuff;
  a.recvbuff = c->recvbuff;
  a.count = c->count;
  a.type = c->type;
  a.mem = mem_query(c->recvbuff ? c->recvbuff : c->sendbuff);
  a.canonical = atomic_load(&c->comm->deterministic);
  INFO(SUB_COLL,
       "%s: sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p "
       "[nranks=%d] stream %p",
       sched_coll_name(c->coll), c->sendbuff, (void*)c->recvbuff, c->count, (int)c->type,
       (int)c->op, c->root, (void*)c->comm, c->comm->nranks, (void*)c->stream);
  CHECK(group_enqueue(c->comm, &a, c->stream));
  return ncclSuccess;
fail:
  group_record_error(res);
  return res;
}

/* The comm is held for the whole call: no teardown frees it under the
 * checks, or under a unit being handed over. */
static ncclResult_t coll_enqueue(const struct coll_call* c) {
  ncclResult_t res = comm_call_enter(c->comm, c->fn, COMM_CALL_WORKING);
  if (res != ncclSuccess) {
    group_record_error(res);
    return res;
  }
  res = coll_enqueue_held(c);
  comm_call_leave(c->comm);
  return res;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  struct coll_call c = {
      "ncclAllReduce", COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 1, -1, comm,
      stream};
  return coll_enqueue(&c);
}

NCCL_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  struct coll_call c = {"ncclReduce", COLL_REDUCE, sendbuff, recvbuff, count, datatype,
                        op,           1,           root,     comm,     stream};
  return root < 0 ? (WARN("ncclReduce : root %d out of range", root), ncclInvalidArgument)
                  : coll_enqueue(&c);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  struct coll_call c = {"ncclBroadcast", COLL_BROADCAST, sendbuff, recvbuff, count,
                        datatype,        ncclSum,        0,        root,     comm,
                        stream};
  return root < 0 ? (WARN("ncclBroadcast : root %d out of range", root), ncclInvalidArgument)
                  : coll_enqueue(&c);
}

NCCL_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  struct coll_call c = {"ncclAllGather", COLL_ALLGATHER, sendbuff, recvbuff, sendcount,
                        datatype,        ncclSum,        0,        -1,       comm,
                        stream};
  return coll_enqueue(&c);
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  struct coll_call c = {"ncclReduceScatter",
                        COLL_REDUCESCATTER,
                        sendbuff,
                        recvbuff,
                        recvcount,
                        datatype,
                        op,
                        1,
                        -1,
                        comm,
                        stream};
  return coll_enqueue(&c);
}
