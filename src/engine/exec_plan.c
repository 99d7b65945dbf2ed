/*
 * The comm's side of the executor (exec_plan.h): the schedule key of a call
 * on this comm, the tuner's choice of algorithm and chunk, the call every
 * collective message carries (transport_tag: what all ranks must have
 * called, as this rank planned it; a receiver whose call differs from its
 * peer's sees it on the first message from that peer and reports both
 * calls), and running a call on the comm's executor context with the
 * comm's error state around it.
 */
#include "engine/exec_plan.h"

#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "kernels.h"
#include "tune/tuner.h"
#include "sched_algos.h"

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
  tuner_choose(comm, args->coll, MAX(send_bytes, recv_bytes), args->canonical, &args->algo,
               &args->chunk_bytes);
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

/* ---- the call a message belongs to ---- */

#define EXEC_TAG_MAGIC 0xb7a1u /* nonzero: a collective; p2p messages carry no tag */

struct exec_tag {
  uint8_t coll, type, op, algo; /* op: kern_op | 0x10 premultiplied | 0x20 post-divided */
  int32_t root;
  uint64_t count;
  uint32_t chunk_bytes;
  uint16_t slices_per_step;
  uint16_t magic;
};
_Static_assert(sizeof(struct exec_tag) == TRANSPORT_TAG_BYTES, "a call is one transport tag");

void exec_tag_make(const struct ncclComm* comm, const struct exec_args* a,
                   struct transport_tag* out) {
  struct sched_key key;
  struct exec_tag t;
  exec_key(comm, a, &key);
  memset(&t, 0, sizeof(t));
  t.coll = (uint8_t)a->coll;
  t.type = (uint8_t)a->type;
  t.op = (uint8_t)(a->redop.op | (a->pre ? 0x10 : 0) | (a->post ? 0x20 : 0));
  t.algo = (uint8_t)a->algo;
  t.root = a->root;
  t.count = a->count;
  t.chunk_bytes = (uint32_t)key.chunk_bytes;
  t.slices_per_step = (uint16_t)key.slices_per_step;
  t.magic = EXEC_TAG_MAGIC;
  memcpy(out->b, &t, sizeof(t));
}

static void exec_tag_describe(const struct transport_tag* tag, char* buf, size_t len) {
  static const char* const ops[] = {"sum", "prod", "max", "min"};
  struct exec_tag t;
  memcpy(&t, tag->b, sizeof(t));
  if (t.magic != EXEC_TAG_MAGIC) {
    snprintf(buf, len, "a send/recv or no call");
    return;
  }
  snprintf(buf, len, "%s count %llu type %d op %s%s%s root %d (%s, chunk %u, %u slices)",
           sched_coll_name(t.coll), (unsigned long long)t.count, t.type, ops[t.op & 3],
           t.op & 0x10 ? " premultiplied" : "", t.op & 0x20 ? " averaged" : "", t.root,
           sched_algo_name(t.algo), t.chunk_bytes, t.slices_per_step);
}

void exec_tag_warn(const struct ncclComm* comm, const struct transport_tag* mine, int peer,
                   const struct transport_tag* theirs) {
  char here[192], there[192];
  exec_tag_describe(mine, here, sizeof(here));
  exec_tag_describe(theirs, there, sizeof(there));
  WARN(
      "Rank %d called %s; rank %d called %s: every rank must make the same collective calls "
      "on a communicator, in the same order, with the same environment",
      comm->rank, here, peer, there);
}

void exec_tag_report(const struct ncclComm* comm, const struct transport_tag* mine) {
  for (int p = 0; p < comm->nranks; p++) {
    const struct transport_conn* c = comm->recv_conns[p];
    if (c == NULL || c->mismatch == TRANSPORT_MATCH) continue;
    exec_tag_warn(comm, mine, p, &c->peer_tag);
    return;
  }
}
