/*
 * The comm's side of the executor: the schedule key of a call on this comm,
 * the tuner's choice of algorithm and chunk, and running a call on the
 * comm's executor context with the comm's error state around it.
 */
#include "comm.h"
#include "core.h"
#include "executor.h"

void exec_key(const struct ncclComm* comm, const struct exec_args* args, struct sched_key* key) {
  exec_ctx_key(&comm->exec, args, key);
}

void exec_extents(const struct exec_args* a, int nranks, size_t* send, size_t* recv) {
  size_t es = kern_type_size(a->type), block = a->count * es;
  size_t stride = a->stride ? a->stride : a->count;
  size_t blocks = ((size_t)(nranks - 1) * stride + a->count) * es;
  *send = a->coll == COLL_REDUCESCATTER ? blocks : block;
  *recv = a->coll == COLL_ALLGATHER ? blocks : block;
}

void exec_plan(struct ncclComm* comm, struct exec_args* args, struct sched_key* key) {
  size_t send_bytes, recv_bytes;
  exec_extents(args, comm->nranks, &send_bytes, &recv_bytes);
  tuner_choose(comm, args->coll, MAX(send_bytes, recv_bytes), &args->algo, &args->chunk_bytes);
  args->sendreg = args->sendbuff ? mem_reg_find(&comm->regs, args->sendbuff, send_bytes) : NULL;
  args->recvreg = args->recvbuff ? mem_reg_find(&comm->regs, args->recvbuff, recv_bytes) : NULL;
  exec_key(comm, args, key);
}

ncclResult_t exec_comm_start(struct ncclComm* comm, const struct exec_args* args) {
  struct transport_tag tag;
  int err = atomic_load(&comm->error);
  if (err != ncclSuccess) {
    WARN("Rank %d: communicator has failed earlier (%s); abort it", comm->rank,
         ncclGetErrorString((ncclResult_t)err));
    return (ncclResult_t)err;
  }
  exec_tag_make(comm, args, &tag);
  return exec_start(&comm->exec, args, &tag);
}

ncclResult_t exec_comm_progress(struct ncclComm* comm, int* done, int* progressed) {
  ncclResult_t res = exec_progress(&comm->exec, done, progressed);
  if (res == ncclSuccess) return res;
  if (res == ncclInvalidUsage) exec_tag_report(comm, &comm->exec.tag);
  comm_set_error(comm, res);
  return res;
}
