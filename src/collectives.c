/*
 * Collective entry points: validate arguments (a WARN naming the bad one),
 * resolve the reduction, ask the tuner, and hand the call to the group
 * queue, which runs it now or at ncclGroupEnd.
 */
#include "comm.h"
#include "core.h"
#include "group.h"
#include "kernels.h"

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  ncclResult_t res = ncclSuccess;
  struct exec_args a;
  CHECK(comm_check(comm, "ncclAllReduce"));
  if (comm->finalized) FAIL(ncclInvalidUsage, "ncclAllReduce : comm %p is finalized", (void*)comm);
  CHECK(redop_resolve(comm, op, datatype, &a));
  if (count > 0 && sendbuff == NULL) FAIL(ncclInvalidArgument, "ncclAllReduce : sendbuff is NULL");
  if (count > 0 && recvbuff == NULL) FAIL(ncclInvalidArgument, "ncclAllReduce : recvbuff is NULL");
  INFO(SUB_COLL,
       "AllReduce: sendbuff %p recvbuff %p count %zu datatype %d op %d root 0 comm %p "
       "[nranks=%d] stream %p",
       sendbuff, recvbuff, count, (int)datatype, (int)op, (void*)comm, comm->nranks, (void*)stream);
  a.sendbuff = sendbuff;
  a.recvbuff = recvbuff;
  a.count = count;
  a.type = datatype;
  tuner_choose_allreduce(comm, count, kern_type_size(datatype), &a.algo, &a.chunk_bytes);
  CHECK(group_enqueue(comm, &a));
  return ncclSuccess;
fail:
  group_record_error(res);
  return res;
}
