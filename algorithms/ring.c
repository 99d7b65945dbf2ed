/*
 * Ring all-reduce: reduce-scatter then all-gather. Step-major, slice-minor:
 * every step streams its segment as slices, so all ranks work on the same
 * step at once and slices pipeline around the ring.
 */
#include "core.h"
#include "schedule.h"

/* Segment j of the buffer: counts differ by at most one element. */
static void ring_segment(size_t count, int nranks, int j, size_t* off, size_t* len) {
  size_t base = count / (size_t)nranks, rem = count % (size_t)nranks;
  *off = (size_t)j * base + MIN((size_t)j, rem);
  *len = base + ((size_t)j < rem);
}

static ncclResult_t ring_step(struct schedule* s, const struct sched_key* k, enum sched_prim prim,
                              int seg, size_t nslices) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, prev = (k->rank + n - 1) % n, next = (k->rank + 1) % n;
  int rpeer = sched_prim_recvs(prim) ? prev : -1;
  int speer = sched_prim_sends(prim) ? next : -1;
  size_t off, len;
  ring_segment(k->count, n, ((seg % n) + n) % n, &off, &len);
  for (size_t i = 0; i < nslices; i++) {
    size_t lo = len * i / nslices, hi = len * (i + 1) / nslices;
    CHECK(sched_append(s, prim, rpeer, speer, off + lo, hi - lo));
  }
fail:
  return res;
}

ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank;
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return sched_append(s, PRIM_COPY, -1, -1, 0, k->count);
  /* Whole elements per slice, so no slice outgrows a chunk-sized slot. */
  size_t chunk_elems = MAX((size_t)1, k->chunk_bytes / k->elem_size);
  size_t nslices = DIV_UP(DIV_UP(k->count, (size_t)n), chunk_elems);
  CHECK(sched_reserve(s, (size_t)(2 * n - 1) * nslices));
  CHECK(ring_step(s, k, PRIM_SEND, r, nslices));
  for (int st = 1; st < n - 1; st++) CHECK(ring_step(s, k, PRIM_RECV_REDUCE_SEND, r - st, nslices));
  CHECK(ring_step(s, k, PRIM_RECV_REDUCE_COPY_SEND, r + 1, nslices));
  for (int t = 1; t < n - 1; t++) CHECK(ring_step(s, k, PRIM_RECV_COPY_SEND, r - t + 1, nslices));
  CHECK(ring_step(s, k, PRIM_RECV, r + 2, nslices));
fail:
  return res;
}
