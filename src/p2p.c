/*
 * Point-to-point: ncclSend/ncclRecv, and their lane in a unit of work. All
 * sends and receives of a group are posted at once on the comm's p2p
 * connections (separate from the collectives', so both run side by side);
 * per pair they match in call order, as NCCL defines. Data moves straight
 * between the user's buffers and the sockets.
 */
#include <string.h>

#include "comm.h"
#include "core.h"
#include "group.h"
#include "kernels.h"
#include "mem.h"
#include "work.h"

/* p2p_enqueue on a comm the caller holds (comm_call_enter). */
static ncclResult_t p2p_enqueue_held(const char* fn, int kind, void* buf, size_t count,
                                     ncclDataType_t type, int peer, ncclComm_t comm,
                                     cudaStream_t stream) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check_type(type, fn));
  CHECK(comm_check_count(fn, count, kern_type_size(type), 1));
  if (peer < 0 || peer >= comm->nranks)
    FAIL(ncclInvalidArgument, "%s : peer %d out of range [0,%d)", fn, peer, comm->nranks);
  if (count > 0 && buf == NULL) FAIL(ncclInvalidArgument, "%s : buffer is NULL", fn);
  INFO(SUB_P2P, "%s: buf %p count %zu datatype %d peer %d comm %p [nranks=%d] stream %p",
       kind == WORK_SEND ? "Send" : "Recv", buf, count, (int)type, peer, (void*)comm, comm->nranks,
       (void*)stream);
  struct work_op op;
  memset(&op, 0, sizeof(op));
  op.comm = comm;
  op.kind = kind;
  op.peer = peer;
  op.buf = buf;
  op.bytes = count * kern_type_size(type);
  op.mem = mem_query(buf);
  CHECK(group_enqueue_op(&op, stream));
  return ncclSuccess;
fail:
  group_record_error(res);
  return res;
}

ncclResult_t p2p_enqueue(const char* fn, int kind, void* buf, size_t count, ncclDataType_t type,
                         int peer, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t res = comm_call_enter(comm, fn, COMM_CALL_WORKING);
  if (res != ncclSuccess) {
    group_record_error(res);
    return res;
  }
  res = p2p_enqueue_held(fn, kind, buf, count, type, peer, comm, stream);
  comm_call_leave(comm);
  return res;
}

NCCL_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return p2p_enqueue("ncclSend", WORK_SEND, (void*)sendbuff, count, datatype, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return p2p_enqueue("ncclRecv", WORK_RECV, recvbuff, count, datatype, peer, comm, stream);
}

/* Sends to self meet receives from self of the same comm in call order:
 * a copy, no connection. Empty transfers complete at once. */
ncclResult_t p2p_match_self(struct work_op* ops, int n) {
  for (int i = 0; i < n; i++) {
    struct work_op* s = &ops[i];
    if (s->kind != WORK_COLL && s->bytes == 0) s->done = s->started = 1;
    if (s->kind != WORK_SEND || s->done || s->peer != s->comm->rank) continue;
    struct work_op* r = NULL;
    for (int j = 0; j < n && r == NULL; j++)
      if (ops[j].kind == WORK_RECV && !ops[j].done && ops[j].comm == s->comm &&
          ops[j].peer == s->comm->rank)
        r = &ops[j];
    if (r == NULL || r->bytes != s->bytes) {
      WARN(
          "ncclSend to self (%zu bytes) has no matching ncclRecv from self of the same size in "
          "its group",
          s->bytes);
      return ncclInvalidUsage;
    }
    ncclResult_t res = mem_copy(r->buf, s->buf, s->bytes); /* either may be device memory */
    if (res != ncclSuccess) return res;
    s->done = s->started = r->done = r->started = 1;
  }
  for (int i = 0; i < n; i++)
    if (ops[i].kind == WORK_RECV && !ops[i].done && ops[i].peer == ops[i].comm->rank) {
      WARN("ncclRecv from self (%zu bytes) has no matching ncclSend to self in its group",
           ops[i].bytes);
      return ncclInvalidUsage;
    }
  return ncclSuccess;
}

/* Post (when the connection has room and no earlier operation on it is
 * still waiting: `pass` marks a connection found full in this pass), then
 * check completion. */
ncclResult_t p2p_step(struct work_op* op, uint64_t pass, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct transport_conn* c = *work_conn_slot(op, op->peer, op->kind == WORK_SEND);
  if (!op->started) {
    if (c->stall_pass == pass || c->posted - c->completed >= TRANSPORT_MAX_INFLIGHT) {
      c->stall_pass = pass;
      return ncclSuccess;
    }
    op->seq = c->posted;
    struct transport_buf b = mem_transport_buf(op->buf, op->bytes, op->mem, op->reg, c->ops);
    if (op->deferred[0].slot) b.launch = &op->deferred[0]; /* a gated ipc send's copy */
    CHECK(c->ops->post(c, &b, NULL));
    op->started = 1;
    *progressed = 1;
  }
  CHECK(c->ops->progress(c, progressed));
  if (c->completed > op->seq) op->done = 1, *progressed = 1;
fail:
  return res;
}
