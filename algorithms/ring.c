/*
 * Ring algorithms. All-reduce is reduce-scatter then all-gather, and
 * all-gather / reduce-scatter alone are its halves. They run in iterations:
 * each one moves a window-sized piece of every block through all steps, as
 * slices that pipeline around the ring. With an iteration's slices per step
 * at half the executor window, a rank never needs its successor to run
 * ahead of it, so even rendezvous transports cannot deadlock, and the
 * window slides across iteration boundaries. Broadcast and reduce are a
 * pipelined chain along the ring from or to the root: no cycle, no limit.
 */
#include "core.h"
#include "schedule.h"

/* Where block j of a ring collective lives in the input and the output. */
struct ring_block {
  size_t xoff, yoff, len;
};

typedef struct ring_block (*ring_block_fn)(const struct sched_key* k, int j);

static int ring_mod(int j, int n) {
  return ((j % n) + n) % n;
}

/* All-reduce segments: counts differ by at most one element. */
static struct ring_block allreduce_block(const struct sched_key* k, int j) {
  size_t n = (size_t)k->nranks, base = k->count / n, rem = k->count % n, jj = (size_t)j;
  size_t off = jj * base + MIN(jj, rem);
  return (struct ring_block){off, off, base + (jj < rem)};
}

/* All-gather: X is this rank's block, Y holds every rank's. */
static struct ring_block allgather_block(const struct sched_key* k, int j) {
  return (struct ring_block){0, (size_t)j * k->count, k->count};
}

/* Reduce-scatter: X holds every block, Y is this rank's. */
static struct ring_block reducescatter_block(const struct sched_key* k, int j) {
  return (struct ring_block){(size_t)j * k->count, 0, k->count};
}

/* Append `prim` on elements [from, from+span) of block j (taken modulo n),
 * cut into slices of at most `chunk` elements. */
static ncclResult_t ring_step(struct schedule* s, const struct sched_key* k, ring_block_fn blk,
                              enum sched_prim prim, unsigned flags, int j, size_t from, size_t span,
                              size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, prev = ring_mod(k->rank - 1, n), next = ring_mod(k->rank + 1, n);
  int rpeer = sched_prim_recvs(prim) ? prev : -1;
  int speer = sched_prim_sends(prim) ? next : -1;
  struct ring_block b = blk(k, ring_mod(j, n));
  size_t lo = MIN(from, b.len), hi = MIN(from + span, b.len);
  size_t nslices = DIV_UP(hi - lo, chunk);
  for (size_t i = 0; i < nslices; i++) {
    size_t a = lo + (hi - lo) * i / nslices, e = lo + (hi - lo) * (i + 1) / nslices;
    CHECK(sched_append(s, prim, flags, rpeer, speer, b.xoff + a, b.yoff + a, e - a));
  }
fail:
  return res;
}

/* Elements per slice (whole elements, so no slice outgrows a slot), and per
 * block per iteration. */
static size_t ring_chunk(const struct sched_key* k) {
  return MAX((size_t)1, k->chunk_bytes / k->elem_size);
}
static size_t ring_span(const struct sched_key* k) {
  return ring_chunk(k) * (size_t)MAX(1, k->slices_per_step);
}

/* Reduce-scatter phase ending with block `last` fully reduced here;
 * `final` is the primitive that produces it. */
static ncclResult_t ring_reduce_phase(struct schedule* s, const struct sched_key* k,
                                      ring_block_fn blk, int last, enum sched_prim final,
                                      size_t from) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks;
  size_t span = ring_span(k), chunk = ring_chunk(k);
  CHECK(ring_step(s, k, blk, PRIM_SEND, SCHED_PRE, last - 1, from, span, chunk));
  for (int st = 1; st < n - 1; st++)
    CHECK(ring_step(s, k, blk, PRIM_RECV_REDUCE_SEND, SCHED_PRE, last - 1 - st, from, span, chunk));
  CHECK(ring_step(s, k, blk, final, SCHED_PRE | SCHED_POST, last, from, span, chunk));
fail:
  return res;
}

/* All-gather phase: block `first` is already final here (and sent on by
 * the step before, or by `first_prim`); the others arrive in turn. */
static ncclResult_t ring_gather_phase(struct schedule* s, const struct sched_key* k,
                                      ring_block_fn blk, int first, size_t from) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks;
  size_t span = ring_span(k), chunk = ring_chunk(k);
  for (int t = 1; t < n - 1; t++)
    CHECK(ring_step(s, k, blk, PRIM_RECV_COPY_SEND, 0, first - t, from, span, chunk));
  CHECK(ring_step(s, k, blk, PRIM_RECV, 0, first - (n - 1), from, span, chunk));
fail:
  return res;
}

static size_t ring_iterations(const struct sched_key* k, size_t block_max) {
  return DIV_UP(block_max, ring_span(k));
}

ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank;
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, 0, 0, k->count);
  size_t niter = ring_iterations(k, DIV_UP(k->count, (size_t)n));
  CHECK(sched_reserve(s, (size_t)(2 * n - 1) * niter * (size_t)MAX(1, k->slices_per_step)));
  for (size_t it = 0; it < niter; it++) {
    size_t from = it * ring_span(k);
    CHECK(ring_reduce_phase(s, k, allreduce_block, r + 1, PRIM_RECV_REDUCE_COPY_SEND, from));
    CHECK(ring_gather_phase(s, k, allreduce_block, r + 1, from));
  }
fail:
  return res;
}

ncclResult_t ring_schedule_allgather(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank;
  size_t niter = ring_iterations(k, k->count);
  for (size_t it = 0; it < niter; it++) {
    size_t from = it * ring_span(k), span = ring_span(k), chunk = ring_chunk(k);
    CHECK(ring_step(s, k, allgather_block, PRIM_COPY, 0, r, from, span, chunk));
    if (n == 1) continue;
    CHECK(ring_step(s, k, allgather_block, PRIM_SEND, 0, r, from, span, chunk));
    CHECK(ring_gather_phase(s, k, allgather_block, r, from));
  }
fail:
  return res;
}

ncclResult_t ring_schedule_reducescatter(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank;
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, 0, 0, k->count);
  size_t niter = ring_iterations(k, k->count);
  for (size_t it = 0; it < niter; it++)
    CHECK(
        ring_reduce_phase(s, k, reducescatter_block, r, PRIM_RECV_REDUCE_COPY, it * ring_span(k)));
fail:
  return res;
}

/* The chain's slices: the whole buffer cut into chunk-sized pieces. */
static ncclResult_t chain_slices(struct schedule* s, const struct sched_key* k,
                                 enum sched_prim prim, unsigned flags, int rpeer, int speer) {
  ncclResult_t res = ncclSuccess;
  size_t chunk = ring_chunk(k), nslices = DIV_UP(k->count, chunk);
  for (size_t i = 0; i < nslices; i++) {
    size_t a = k->count * i / nslices, e = k->count * (i + 1) / nslices;
    CHECK(sched_append(s, prim, flags, rpeer, speer, a, a, e - a));
  }
fail:
  return res;
}

/* Broadcast: root -> root+1 -> ... -> root-1, each passing slices on as
 * they arrive. The root also copies its input to its own output. */
ncclResult_t chain_schedule_broadcast(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank, pos = ring_mod(r - k->root, n);
  int prev = ring_mod(r - 1, n), next = ring_mod(r + 1, n);
  if (k->count == 0) return ncclSuccess;
  if (pos == 0) {
    CHECK(chain_slices(s, k, PRIM_COPY, 0, -1, -1));
    if (n > 1) CHECK(chain_slices(s, k, PRIM_SEND, 0, -1, next));
  } else if (pos < n - 1) {
    CHECK(chain_slices(s, k, PRIM_RECV_COPY_SEND, 0, prev, next));
  } else {
    CHECK(chain_slices(s, k, PRIM_RECV, 0, prev, -1));
  }
fail:
  return res;
}

/* Reduce: root+1 -> root+2 -> ... -> root, each adding its input. Only
 * the root writes its output. */
ncclResult_t chain_schedule_reduce(struct schedule* s, const struct sched_key* k) {
  int n = k->nranks, r = k->rank, pos = ring_mod(r - k->root - 1, n);
  int prev = ring_mod(r - 1, n), next = ring_mod(r + 1, n);
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return chain_slices(s, k, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1);
  if (pos == 0) return chain_slices(s, k, PRIM_SEND, SCHED_PRE, -1, next);
  if (pos < n - 1) return chain_slices(s, k, PRIM_RECV_REDUCE_SEND, SCHED_PRE, prev, next);
  return chain_slices(s, k, PRIM_RECV_REDUCE_COPY, SCHED_PRE | SCHED_POST, prev, -1);
}
