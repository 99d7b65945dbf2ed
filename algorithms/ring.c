/*
 * Ring all-reduce: reduce-scatter then all-gather, in iterations. Each
 * iteration moves a window-sized piece of every segment through all 2n-1
 * steps, as slices that pipeline around the ring. Keeping an iteration's
 * slices per step at half the executor window means a rank never needs its
 * successor to run ahead of it, so even rendezvous transports cannot
 * deadlock, and the window slides across iteration boundaries.
 */
#include "core.h"
#include "schedule.h"

/* Segment j of the buffer: counts differ by at most one element. */
static void ring_segment(size_t count, int nranks, int j, size_t* off, size_t* len) {
  size_t base = count / (size_t)nranks, rem = count % (size_t)nranks;
  *off = (size_t)j * base + MIN((size_t)j, rem);
  *len = base + ((size_t)j < rem);
}

/* Append step `prim` on elements [from, from+span) of segment `seg`, cut
 * into slices of at most chunk_elems. */
static ncclResult_t ring_step(struct schedule* s, const struct sched_key* k, enum sched_prim prim,
                              unsigned flags, int seg, size_t from, size_t span,
                              size_t chunk_elems) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, prev = (k->rank + n - 1) % n, next = (k->rank + 1) % n;
  int rpeer = sched_prim_recvs(prim) ? prev : -1;
  int speer = sched_prim_sends(prim) ? next : -1;
  size_t off, len;
  ring_segment(k->count, n, ((seg % n) + n) % n, &off, &len);
  size_t lo = MIN(from, len), hi = MIN(from + span, len);
  size_t nslices = DIV_UP(hi - lo, chunk_elems);
  for (size_t i = 0; i < nslices; i++) {
    size_t a = lo + (hi - lo) * i / nslices, b = lo + (hi - lo) * (i + 1) / nslices;
    CHECK(sched_append(s, prim, flags, rpeer, speer, off + a, b - a));
  }
fail:
  return res;
}

ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank;
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, 0, k->count);
  /* Whole elements per slice, so no slice outgrows a chunk-sized slot. */
  size_t chunk = MAX((size_t)1, k->chunk_bytes / k->elem_size);
  size_t span = chunk * (size_t)MAX(1, k->slices_per_step);
  size_t seg_max = DIV_UP(k->count, (size_t)n);
  size_t niter = DIV_UP(seg_max, span);
  CHECK(sched_reserve(s, (size_t)(2 * n - 1) * niter * (size_t)MAX(1, k->slices_per_step)));
  for (size_t it = 0; it < niter; it++) {
    size_t from = it * span;
    CHECK(ring_step(s, k, PRIM_SEND, SCHED_PRE, r, from, span, chunk));
    for (int st = 1; st < n - 1; st++)
      CHECK(ring_step(s, k, PRIM_RECV_REDUCE_SEND, SCHED_PRE, r - st, from, span, chunk));
    CHECK(ring_step(s, k, PRIM_RECV_REDUCE_COPY_SEND, SCHED_PRE | SCHED_POST, r + 1, from, span,
                    chunk));
    for (int t = 1; t < n - 1; t++)
      CHECK(ring_step(s, k, PRIM_RECV_COPY_SEND, 0, r - t + 1, from, span, chunk));
    CHECK(ring_step(s, k, PRIM_RECV, 0, r + 2, from, span, chunk));
  }
fail:
  return res;
}
