/*
 * Point-to-point entry points: ncclSend and ncclRecv, and the collectives
 * NCCL defines as patterns of them: all-to-all, gather and scatter. Each
 * checks its arguments whole, then queues its sends and receives (one
 * group for a collective) for the comm's p2p lane (work_p2p.c), so they
 * run side by side with the comm's other work, in issue order; a rank's
 * own block is copied directly (skipped when in place).
 */
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "api/group.h"
#include "kernels.h"
#include "mem_kind.h"
#include "engine/p2p_lane.h"
#include "engine/work_op.h"

/* ---- ncclSend and ncclRecv ---- */

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

static ncclResult_t p2p_enqueue(const char* fn, int kind, void* buf, size_t count,
                                ncclDataType_t type, int peer, ncclComm_t comm,
                                cudaStream_t stream) {
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

/* ---- collectives made of sends and receives ---- */

/* What one of these calls is, as the user made it. */
struct p2p_coll {
  const char* fn;
  int rooted;     /* gather, scatter */
  int root_sends; /* scatter (only root reads sendbuff); else gather (only root writes recvbuff) */
  const void* sendbuff;
  void* recvbuff;
  size_t count; /* elements per block */
  ncclDataType_t type;
  int root; /* rooted calls only */
  ncclComm_t comm;
  cudaStream_t stream;
};

/* The arguments, on a comm the caller holds (comm_call_enter). */
static ncclResult_t p2p_coll_check(const struct p2p_coll* c) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check_type(c->type, c->fn));
  CHECK(comm_check_count(c->fn, c->count, kern_type_size(c->type), (size_t)c->comm->nranks));
  if (c->rooted && (c->root < 0 || c->root >= c->comm->nranks))
    FAIL(ncclInvalidArgument, "%s : root %d out of range [0,%d)", c->fn, c->root, c->comm->nranks);
  int is_root = c->rooted && c->comm->rank == c->root;
  int reads_send = !c->rooted || !c->root_sends || is_root;
  int writes_recv = !c->rooted || c->root_sends || is_root;
  if (c->count > 0 && reads_send && c->sendbuff == NULL)
    FAIL(ncclInvalidArgument, "%s : sendbuff is NULL", c->fn);
  if (c->count > 0 && writes_recv && c->recvbuff == NULL)
    FAIL(ncclInvalidArgument, "%s : recvbuff is NULL", c->fn);
fail:
  return res;
}

static char* block_of(const void* buf, size_t block_bytes, int i) {
  return (char*)buf + (size_t)i * block_bytes;
}

static ncclResult_t send_block(const struct p2p_coll* c, const void* buf, int peer) {
  return p2p_enqueue(c->fn, WORK_SEND, (void*)buf, c->count, c->type, peer, c->comm, c->stream);
}

static ncclResult_t recv_block(const struct p2p_coll* c, void* buf, int peer) {
  return p2p_enqueue(c->fn, WORK_RECV, buf, c->count, c->type, peer, c->comm, c->stream);
}

/* The own block: a send to self and a receive from self (a copy when the
 * group runs), nothing when it already lies in place. */
static ncclResult_t own_block(const struct p2p_coll* c, const void* src, void* dst) {
  ncclResult_t res = ncclSuccess;
  if (src == dst) return ncclSuccess;
  CHECK(send_block(c, src, c->comm->rank));
  CHECK(recv_block(c, dst, c->comm->rank));
fail:
  return res;
}

/* Peers in the order rank+1, rank+2, ...: ranks do not all start on the
 * same peer. */
static int peer_at(const struct ncclComm* comm, int k) {
  return (comm->rank + k) % comm->nranks;
}

static ncclResult_t alltoall_queue(const struct p2p_coll* c, size_t block) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = c->comm;
  CHECK(own_block(c, block_of(c->sendbuff, block, comm->rank),
                  block_of(c->recvbuff, block, comm->rank)));
  for (int k = 1; k < comm->nranks; k++) {
    int to = peer_at(comm, k), from = peer_at(comm, comm->nranks - k);
    CHECK(send_block(c, block_of(c->sendbuff, block, to), to));
    CHECK(recv_block(c, block_of(c->recvbuff, block, from), from));
  }
fail:
  return res;
}

static ncclResult_t gather_queue(const struct p2p_coll* c, size_t block) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = c->comm;
  if (comm->rank != c->root) return send_block(c, c->sendbuff, c->root);
  CHECK(own_block(c, c->sendbuff, block_of(c->recvbuff, block, c->root)));
  for (int k = 1; k < comm->nranks; k++) {
    int from = peer_at(comm, k);
    CHECK(recv_block(c, block_of(c->recvbuff, block, from), from));
  }
fail:
  return res;
}

static ncclResult_t scatter_queue(const struct p2p_coll* c, size_t block) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = c->comm;
  if (comm->rank != c->root) return recv_block(c, c->recvbuff, c->root);
  CHECK(own_block(c, block_of(c->sendbuff, block, c->root), c->recvbuff));
  for (int k = 1; k < comm->nranks; k++) {
    int to = peer_at(comm, k);
    CHECK(send_block(c, block_of(c->sendbuff, block, to), to));
  }
fail:
  return res;
}

/* Check, then queue everything inside one group: a failure while queueing
 * (memory) drops the whole group and comes back from its end. The comm is
 * held throughout, so no teardown frees it under the checks. */
static ncclResult_t p2p_coll_run(const struct p2p_coll* c,
                                 ncclResult_t (*queue)(const struct p2p_coll*, size_t)) {
  ncclResult_t res = comm_call_enter(c->comm, c->fn, COMM_CALL_WORKING);
  if (res != ncclSuccess) return res;
  res = p2p_coll_check(c);
  if (res == ncclSuccess) {
    INFO(SUB_COLL,
         "%s: sendbuff %p recvbuff %p count %zu datatype %d root %d comm %p [nranks=%d] stream %p",
         c->fn + 4, c->sendbuff, c->recvbuff, c->count, (int)c->type, c->root, (void*)c->comm,
         c->comm->nranks, (void*)c->stream);
    res = ncclGroupStart();
  }
  if (res == ncclSuccess) {
    res = queue(c, c->count * kern_type_size(c->type));
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess) res = end;
  }
  comm_call_leave(c->comm);
  return res;
}

/* In place (sendbuff == recvbuff) is not defined by NCCL: every rank's own
 * block stays, the others are overwritten while being sent, so the result
 * is undefined; it runs, since nccl-tests calls it and checks nothing. */
NCCL_API(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  struct p2p_coll c = {"ncclAlltoAll", 0, 0, sendbuff, recvbuff, count, datatype, -1, comm, stream};
  return p2p_coll_run(&c, alltoall_queue);
}

NCCL_API(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  struct p2p_coll c = {"ncclGather", 1, 0, sendbuff, recvbuff, count, datatype, root, comm, stream};
  return p2p_coll_run(&c, gather_queue);
}

NCCL_API(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  struct p2p_coll c = {"ncclScatter", 1,        1,    sendbuff, recvbuff,
                       count,         datatype, root, comm,     stream};
  return p2p_coll_run(&c, scatter_queue);
}

/* ---- braidTaggedSend and braidTaggedRecv (p2p_lane.c) ---- */

static ncclResult_t tagged_post(const char* fn, int kind, void* buf, size_t count,
                                ncclDataType_t type, int peer, int tag, ncclComm_t comm,
                                int* source, braidHostFn_t done, void* arg) {
  ncclResult_t res = comm_call_enter(comm, fn, COMM_CALL_WORKING);
  if (res != ncclSuccess) return res;
  CHECK(comm_check_type(type, fn));
  CHECK(comm_check_count(fn, count, kern_type_size(type), 1));
  if ((peer < 0 && source == NULL) || peer >= comm->nranks)
    FAIL(ncclInvalidArgument, "%s : peer %d out of range [0,%d)", fn, peer, comm->nranks);
  if (count > 0 && buf == NULL) FAIL(ncclInvalidArgument, "%s : buffer is NULL", fn);
  if (done == NULL) FAIL(ncclInvalidArgument, "%s : done is NULL", fn);
  if (count > 0 && mem_query(buf) != MEM_HOST)
    FAIL(ncclInvalidUsage, "%s : the tagged lane moves host memory only; %p is not", fn, buf);
  INFO(SUB_P2P, "%s: buf %p count %zu datatype %d peer %d tag %d comm %p", fn, buf, count,
       (int)type, peer, tag, (void*)comm);
  res = lane_post(comm, kind, buf, count * kern_type_size(type), peer, tag, source, done, arg);
fail:
  comm_call_leave(comm);
  return res;
}

BRAID_API(ncclResult_t, braidTaggedSend, const void* sendbuff, size_t count,
          ncclDataType_t datatype, int peer, int tag, ncclComm_t comm, braidHostFn_t done,
          void* userData);
ncclResult_t braidTaggedSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             int tag, ncclComm_t comm, braidHostFn_t done, void* userData) {
  return tagged_post("braidTaggedSend", LANE_SEND, (void*)sendbuff, count, datatype, peer, tag,
                     comm, NULL, done, userData);
}

BRAID_API(ncclResult_t, braidTaggedRecv, void* recvbuff, size_t count, ncclDataType_t datatype,
          int peer, int tag, ncclComm_t comm, braidHostFn_t done, void* userData);
ncclResult_t braidTaggedRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             int tag, ncclComm_t comm, braidHostFn_t done, void* userData) {
  return tagged_post("braidTaggedRecv", LANE_RECV, recvbuff, count, datatype, peer, tag, comm, NULL,
                     done, userData);
}

BRAID_API(ncclResult_t, braidTaggedRecvAny, void* recvbuff, size_t count, ncclDataType_t datatype,
          int tag, ncclComm_t comm, int* source, braidHostFn_t done, void* userData);
ncclResult_t braidTaggedRecvAny(void* recvbuff, size_t count, ncclDataType_t datatype, int tag,
                                ncclComm_t comm, int* source, braidHostFn_t done, void* userData) {
  if (source == NULL) {
    WARN("braidTaggedRecvAny : source is NULL");
    return ncclInvalidArgument;
  }
  return tagged_post("braidTaggedRecvAny", LANE_RECV, recvbuff, count, datatype, -1, tag, comm,
                     source, done, userData);
}
