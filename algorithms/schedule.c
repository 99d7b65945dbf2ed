/*
 * Schedule storage and the primitive table shared by every algorithm;
 * sched_build dispatches to the algorithm named in the key.
 */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

/* writes_y: the primitive writes its slice of the output (received or
 * computed into it), which a send of those bytes must wait for. */
static const struct {
  const char* name;
  uint8_t recvs, sends, writes_y;
} prims[PRIM_COUNT] = {
    [PRIM_SEND] = {"send", 0, 1, 0},
    [PRIM_RECV] = {"recv", 1, 0, 1},
    [PRIM_RECV_REDUCE_SEND] = {"recvReduceSend", 1, 1, 0},
    [PRIM_RECV_REDUCE_COPY_SEND] = {"recvReduceCopySend", 1, 1, 1},
    [PRIM_RECV_COPY_SEND] = {"recvCopySend", 1, 1, 1},
    [PRIM_RECV_REDUCE_COPY] = {"recvReduceCopy", 1, 0, 1},
    [PRIM_COPY] = {"copy", 0, 0, 1},
    [PRIM_SEND_OUT] = {"sendOut", 0, 1, 0},
    [PRIM_EXCHANGE] = {"exchange", 1, 1, 1},
    [PRIM_RECV_REDUCE_CARRY] = {"recvReduceCarry", 1, 0, 0},
    [PRIM_LOAD_CARRY] = {"loadCarry", 0, 0, 0},
};

int sched_prim_recvs(enum sched_prim p) {
  return prims[p].recvs;
}
int sched_prim_sends(enum sched_prim p) {
  return prims[p].sends;
}
int sched_prim_writes_y(enum sched_prim p) {
  return prims[p].writes_y;
}
int sched_step_sends_y(const struct sched_step* st) {
  return st->prim == PRIM_SEND_OUT || (st->prim == PRIM_SEND && (st->flags & SCHED_LOCAL_OUT));
}
const char* sched_prim_name(enum sched_prim p) {
  return p < PRIM_COUNT ? prims[p].name : "?";
}

const char* sched_coll_name(int coll) {
  static const char* const names[COLL_COUNT] = {"AllReduce", "AllGather", "ReduceScatter",
                                                "Broadcast", "Reduce"};
  return coll >= 0 && coll < COLL_COUNT ? names[coll] : "?";
}

int sched_coll_reads_send(int coll, int rank, int root) {
  return coll != COLL_BROADCAST || rank == root;
}

int sched_coll_writes_recv(int coll, int rank, int root) {
  return coll != COLL_REDUCE || rank == root;
}

int sched_coll_reduces(int coll) {
  return coll == COLL_ALLREDUCE || coll == COLL_REDUCESCATTER || coll == COLL_REDUCE;
}

ncclResult_t sched_reserve(struct schedule* s, size_t n) {
  if (n <= s->capacity) return ncclSuccess;
  ncclResult_t res = braid_realloc(&s->steps, n, sizeof(*s->steps));
  if (res == ncclSuccess) s->capacity = n;
  return res;
}

ncclResult_t sched_append(struct schedule* s, enum sched_prim prim, unsigned flags, int recv_peer,
                          int send_peer, size_t xoff, size_t yoff, size_t count) {
  ncclResult_t res = ncclSuccess;
  if (count == 0) return ncclSuccess; /* both ends skip empty slices alike */
  if (s->nsteps == s->capacity) CHECK(sched_reserve(s, s->capacity ? 2 * s->capacity : 64));
  struct sched_step* st = &s->steps[s->nsteps++];
  st->prim = (uint8_t)prim;
  st->flags = (uint8_t)flags;
  st->carry = 0;
  st->recv_peer = recv_peer;
  st->send_peer = send_peer;
  st->xoff = xoff;
  st->yoff = yoff;
  st->count = count;
  s->plain_sends |= prim == PRIM_SEND || prim == PRIM_SEND_OUT;
  s->max_count = MAX(s->max_count, count);
fail:
  return res;
}

void sched_free(struct schedule* s) {
  free(s->steps);
  memset(s, 0, sizeof(*s));
}

int sched_topo_rank(const struct sched_topo* t, int i) {
  return t ? t->order[i] : i;
}
int sched_topo_pos(const struct sched_topo* t, int rank) {
  return t ? t->pos_of[rank] : rank;
}

int sched_key_equal(const struct sched_key* a, const struct sched_key* b) {
  return a->topo == b->topo && a->coll == b->coll && a->algo == b->algo && a->rank == b->rank &&
         a->nranks == b->nranks && a->root == b->root && a->count == b->count &&
         a->stride == b->stride && a->elem_size == b->elem_size &&
         a->chunk_bytes == b->chunk_bytes && a->slices_per_step == b->slices_per_step &&
         a->ranks == b->ranks;
}

int sched_add_peer(int* peers, int m, int max, int p) {
  if (p < 0) return m;
  for (int i = 0; i < m; i++)
    if (peers[i] == p) return m;
  if (m < max) peers[m++] = p;
  return m;
}
