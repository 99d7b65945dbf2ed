/*
 * The point-to-point lane of a unit of work (work_p2p.h): all sends and
 * receives of a group are posted at once on the comm's p2p connections
 * (separate from the collectives', so both run side by side); per pair they
 * match in call order, as NCCL defines. Data moves straight between the
 * user's buffers and the transports. (ncclSend and ncclRecv are entry
 * points: collectives_p2p.c.)
 */
#include "engine/work_p2p.h"

#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "kernels.h"
#include "engine/mem.h"
#include "engine/connect.h"

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
    CHECK(transport_conn_post(c, &b, NULL));
    op->started = 1;
    *progressed = 1;
  }
  CHECK(c->ops->progress(c, progressed));
  if (c->completed > op->seq) op->done = 1, *progressed = 1;
fail:
  return res;
}
