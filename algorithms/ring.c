/*
 * Ring algorithms. All-reduce is reduce-scatter then all-gather, and
 * all-gather / reduce-scatter alone are its halves. They run in iterations:
 * each one moves a window-sized piece of every block through all steps, as
 * slices that pipeline around the ring. With an iteration's slices per step
 * at half the executor window, a rank never needs its successor to run
 * ahead of it, so even rendezvous transports cannot deadlock, and the
 * window slides across iteration boundaries. Broadcast and reduce are a
 * pipelined chain along the ring from or to the root: no cycle, no limit.
 * The flat ring visits ranks node by node (the topology's order), so each
 * node's link is crossed twice per ring, not twice per rank.
 */
#include "ring.h"

#include "core.h"

static int ring_mod(int j, int n) {
  return ((j % n) + n) % n;
}

/* Append `prim` on elements [from, from+span) of block j (taken modulo n),
 * cut into slices of at most g->chunk elements. */
static ncclResult_t ring_step(struct schedule* s, const struct ring* g, enum sched_prim prim,
                              unsigned flags, int j, size_t from) {
  ncclResult_t res = ncclSuccess;
  int rpeer = sched_prim_recvs(prim) ? g->prev : -1;
  int speer = sched_prim_sends(prim) ? g->next : -1;
  struct ring_block b = g->block(g->ctx, ring_mod(j, g->n));
  size_t lo = MIN(from, b.len), hi = MIN(from + g->span, b.len);
  size_t nslices = DIV_UP(hi - lo, g->chunk);
  if (g->from_out) flags = (flags & ~SCHED_PRE) | SCHED_LOCAL_OUT;
  if (!g->post) flags &= ~SCHED_POST;
  for (size_t i = 0; i < nslices; i++) {
    size_t a = lo + (hi - lo) * i / nslices, e = lo + (hi - lo) * (i + 1) / nslices;
    CHECK(sched_append(s, prim, flags, rpeer, speer, b.xoff + a, b.yoff + a, e - a));
  }
fail:
  return res;
}

/* The phases below are runs of all-reduce hops (ring_allreduce_hop), so the
 * pipelined Hier and the plain rings emit the very same steps. */
ncclResult_t ring_allreduce_hop(struct schedule* s, const struct ring* g, int last, int hop,
                                size_t from) {
  int n = g->n;
  if (hop == 0) return ring_step(s, g, PRIM_SEND, SCHED_PRE, last - 1, from);
  if (hop < n - 1) return ring_step(s, g, PRIM_RECV_REDUCE_SEND, SCHED_PRE, last - 1 - hop, from);
  if (hop == n - 1)
    return ring_step(s, g, PRIM_RECV_REDUCE_COPY_SEND, SCHED_PRE | SCHED_POST, last, from);
  if (hop < 2 * n - 2) return ring_step(s, g, PRIM_RECV_COPY_SEND, 0, last - (hop - n + 1), from);
  return ring_step(s, g, PRIM_RECV, 0, last - (n - 1), from);
}

ncclResult_t ring_reduce_partial(struct schedule* s, const struct ring* g, int last, size_t from) {
  ncclResult_t res = ncclSuccess;
  for (int hop = 0; hop < g->n - 1; hop++) CHECK(ring_allreduce_hop(s, g, last, hop, from));
fail:
  return res;
}

ncclResult_t ring_reduce_phase(struct schedule* s, const struct ring* g, int last,
                               enum sched_prim final, size_t from) {
  ncclResult_t res = ncclSuccess;
  CHECK(ring_reduce_partial(s, g, last, from));
  CHECK(ring_step(s, g, final, SCHED_PRE | SCHED_POST, last, from));
fail:
  return res;
}

ncclResult_t ring_gather_phase(struct schedule* s, const struct ring* g, int first, size_t from) {
  ncclResult_t res = ncclSuccess;
  for (int hop = g->n; hop <= 2 * g->n - 2; hop++)
    CHECK(ring_allreduce_hop(s, g, first, hop, from));
fail:
  return res;
}

ncclResult_t ring_send_own(struct schedule* s, const struct ring* g, size_t from) {
  return ring_step(s, g, g->from_out ? PRIM_SEND_OUT : PRIM_SEND, 0, g->pos, from);
}

/* --- the flat ring over the whole comm --- */

/* All-reduce segments: counts differ by at most one element. */
static struct ring_block allreduce_block(const void* ctx, int j) {
  const struct sched_key* k = ctx;
  size_t n = (size_t)k->nranks, base = k->count / n, rem = k->count % n, jj = (size_t)j;
  size_t off = jj * base + MIN(jj, rem);
  return (struct ring_block){off, off, base + (jj < rem)};
}

/* All-gather: X is this rank's block, Y holds every rank's (block j of
 * the ring is the rank at ring position j). */
static struct ring_block allgather_block(const void* ctx, int j) {
  const struct sched_key* k = ctx;
  return (struct ring_block){0, sched_block_offset(k, sched_topo_rank(k->topo, j)), k->count};
}

/* Reduce-scatter: X holds every block, Y is this rank's. */
static struct ring_block reducescatter_block(const void* ctx, int j) {
  const struct sched_key* k = ctx;
  return (struct ring_block){sched_block_offset(k, sched_topo_rank(k->topo, j)), 0, k->count};
}

/* Elements per slice (whole elements, so no slice outgrows a slot), and per
 * block per iteration. */
static size_t ring_chunk(const struct sched_key* k) {
  return MAX((size_t)1, k->chunk_bytes / k->elem_size);
}
static size_t ring_span(const struct sched_key* k) {
  return ring_chunk(k) * (size_t)MAX(1, k->slices_per_step);
}

static struct ring flat_ring(const struct sched_key* k, ring_block_fn block) {
  int n = k->nranks, pos = sched_topo_pos(k->topo, k->rank);
  return (struct ring){.n = n,
                       .pos = pos,
                       .prev = sched_topo_rank(k->topo, ring_mod(pos - 1, n)),
                       .next = sched_topo_rank(k->topo, ring_mod(pos + 1, n)),
                       .block = block,
                       .ctx = k,
                       .chunk = ring_chunk(k),
                       .span = ring_span(k),
                       .post = 1};
}

static size_t ring_iterations(const struct sched_key* k, size_t block_max) {
  return DIV_UP(block_max, ring_span(k));
}

/* An all-reduce of fewer elements than ranks: only blocks 0..count-1 hold
 * one, and an empty block's hop appends nothing. Its hops, in the order of
 * the full walk: block j's reduce hop is (l-1-j) mod n, its gather hop n
 * more, block l's is the final n-1 (l = last mod n). Walking just those is
 * count hops a phase instead of n (at 16,384 ranks an 8 B call made every
 * rank walk 32,766, and a simulated one 5e8 over all ranks). */
static ncclResult_t ring_allreduce_few(struct schedule* s, const struct ring* g, int last,
                                       int count) {
  ncclResult_t res = ncclSuccess;
  int n = g->n, l = ring_mod(last, n);
  for (int gather = 0; gather <= 1; gather++) {
    for (int j = MIN(l, count) - 1; j >= 0; j--) /* hops 0..l-1 */
      CHECK(ring_allreduce_hop(s, g, last, gather * n + l - 1 - j, 0));
    for (int j = count - 1; j > l; j--) /* the blocks that wrap: hops n+l-count..n-2 */
      CHECK(ring_allreduce_hop(s, g, last, gather * n + l - 1 - j + n, 0));
    if (!gather) CHECK(ring_allreduce_hop(s, g, last, n - 1, 0));
  }
fail:
  return res;
}

ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  struct ring g = flat_ring(k, allreduce_block);
  if (k->count == 0) return ncclSuccess;
  if (g.n == 1) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, 0, 0, k->count);
  if (k->count < (size_t)g.n) return ring_allreduce_few(s, &g, g.pos + 1, (int)k->count);
  size_t niter = ring_iterations(k, DIV_UP(k->count, (size_t)g.n));
  CHECK(sched_reserve(s, (size_t)(2 * g.n - 1) * niter * (size_t)MAX(1, k->slices_per_step)));
  for (size_t it = 0; it < niter; it++) {
    size_t from = it * g.span;
    CHECK(ring_reduce_phase(s, &g, g.pos + 1, PRIM_RECV_REDUCE_COPY_SEND, from));
    CHECK(ring_gather_phase(s, &g, g.pos + 1, from));
  }
fail:
  return res;
}

ncclResult_t ring_schedule_allgather(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  struct ring g = flat_ring(k, allgather_block);
  size_t niter = ring_iterations(k, k->count);
  for (size_t it = 0; it < niter; it++) {
    size_t from = it * g.span, lo = MIN(from, k->count), hi = MIN(from + g.span, k->count);
    CHECK(sched_append(s, PRIM_COPY, 0, -1, -1, lo, sched_block_offset(k, k->rank) + lo, hi - lo));
    if (g.n == 1) continue;
    CHECK(ring_send_own(s, &g, from));
    CHECK(ring_gather_phase(s, &g, g.pos, from));
  }
fail:
  return res;
}

ncclResult_t ring_schedule_reducescatter(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  struct ring g = flat_ring(k, reducescatter_block);
  if (k->count == 0) return ncclSuccess;
  if (g.n == 1) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, 0, 0, k->count);
  size_t niter = ring_iterations(k, k->count);
  for (size_t it = 0; it < niter; it++)
    CHECK(ring_reduce_phase(s, &g, g.pos, PRIM_RECV_REDUCE_COPY, it * g.span));
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

/* The chain runs along the ring's order; `shift` is where it starts
 * relative to the root. Returns this rank's place in it. */
static int chain_links(const struct sched_key* k, int shift, int* prev, int* next) {
  int n = k->nranks, pos = sched_topo_pos(k->topo, k->rank);
  *prev = sched_topo_rank(k->topo, ring_mod(pos - 1, n));
  *next = sched_topo_rank(k->topo, ring_mod(pos + 1, n));
  return ring_mod(pos - sched_topo_pos(k->topo, k->root) - shift, n);
}

/* Broadcast: root -> root+1 -> ... -> root-1, each passing slices on as
 * they arrive. The root also copies its input to its own output. */
ncclResult_t chain_schedule_broadcast(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, prev, next, pos = chain_links(k, 0, &prev, &next);
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
  int n = k->nranks, prev, next, pos = chain_links(k, 1, &prev, &next);
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return chain_slices(s, k, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1);
  if (pos == 0) return chain_slices(s, k, PRIM_SEND, SCHED_PRE, -1, next);
  if (pos < n - 1) return chain_slices(s, k, PRIM_RECV_REDUCE_SEND, SCHED_PRE, prev, next);
  return chain_slices(s, k, PRIM_RECV_REDUCE_COPY, SCHED_PRE | SCHED_POST, prev, -1);
}
