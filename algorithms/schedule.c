/*
 * Schedule storage and the primitive table shared by every algorithm;
 * sched_build dispatches to the algorithm named in the key.
 */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

static const struct {
  const char* name;
  uint8_t recvs, sends;
} prims[PRIM_COUNT] = {
    [PRIM_SEND] = {"send", 0, 1},
    [PRIM_RECV] = {"recv", 1, 0},
    [PRIM_RECV_REDUCE_SEND] = {"recvReduceSend", 1, 1},
    [PRIM_RECV_REDUCE_COPY_SEND] = {"recvReduceCopySend", 1, 1},
    [PRIM_RECV_COPY_SEND] = {"recvCopySend", 1, 1},
    [PRIM_RECV_REDUCE_COPY] = {"recvReduceCopy", 1, 0},
    [PRIM_COPY] = {"copy", 0, 0},
    [PRIM_SEND_OUT] = {"sendOut", 0, 1},
    [PRIM_EXCHANGE] = {"exchange", 1, 1},
};

int sched_prim_recvs(enum sched_prim p) {
  return prims[p].recvs;
}
int sched_prim_sends(enum sched_prim p) {
  return prims[p].sends;
}
const char* sched_prim_name(enum sched_prim p) {
  return p < PRIM_COUNT ? prims[p].name : "?";
}

const char* sched_algo_name(int algo) {
  switch (algo) {
    case ALGO_RING:
      return "Ring";
    case ALGO_RD:
      return "RecDoubling";
    default:
      return "?";
  }
}

ncclResult_t sched_reserve(struct schedule* s, size_t n) {
  if (n <= s->capacity) return ncclSuccess;
  struct sched_step* steps = realloc(s->steps, n * sizeof(*steps));
  if (steps == NULL) {
    WARN("Out of memory for a schedule of %zu steps", n);
    return ncclSystemError;
  }
  s->steps = steps;
  s->capacity = n;
  return ncclSuccess;
}

ncclResult_t sched_append(struct schedule* s, enum sched_prim prim, unsigned flags, int recv_peer,
                          int send_peer, size_t offset, size_t count) {
  ncclResult_t res = ncclSuccess;
  if (count == 0) return ncclSuccess; /* both ends skip empty slices alike */
  if (s->nsteps == s->capacity) CHECK(sched_reserve(s, s->capacity ? 2 * s->capacity : 64));
  struct sched_step* st = &s->steps[s->nsteps++];
  st->prim = (uint8_t)prim;
  st->flags = (uint8_t)flags;
  st->recv_peer = recv_peer;
  st->send_peer = send_peer;
  st->offset = offset;
  st->count = count;
fail:
  return res;
}

void sched_free(struct schedule* s) {
  free(s->steps);
  memset(s, 0, sizeof(*s));
}

static int sched_key_equal(const struct sched_key* a, const struct sched_key* b) {
  return a->algo == b->algo && a->rank == b->rank && a->nranks == b->nranks &&
         a->count == b->count && a->elem_size == b->elem_size && a->chunk_bytes == b->chunk_bytes &&
         a->slices_per_step == b->slices_per_step;
}

ncclResult_t sched_build(struct schedule* s, const struct sched_key* key) {
  ncclResult_t res = ncclSuccess;
  if (s->valid && sched_key_equal(&s->key, key)) return ncclSuccess;
  s->valid = 0;
  s->nsteps = 0;
  switch (key->algo) {
    case ALGO_RING:
      CHECK(ring_schedule_allreduce(s, key));
      break;
    case ALGO_RD:
      CHECK(rd_schedule_allreduce(s, key));
      break;
    default:
      FAIL(ncclInternalError, "Unknown algorithm %d", key->algo);
  }
  s->key = *key;
  s->valid = 1;
fail:
  return res;
}
