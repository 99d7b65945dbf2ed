/*
 * Hierarchical algorithms: shared memory inside a node, few bytes between
 * nodes. All-reduce reduce-scatters inside each node, all-reduces every
 * piece between nodes among the ranks that own it (each rank carries 1/ppn
 * of the data over the network), then all-gathers inside each node. Small
 * buffers take the leader variant instead. All-gather runs its inter-node
 * part on ppn parallel rings and then gathers inside the node.
 *
 * Uneven layouts (3+2+2): every node cuts a round of the buffer into as
 * many segments as it has ranks. A piece is a stretch between any two
 * nodes' segment boundaries; its inter-node ring joins, on every node, the
 * rank whose segment holds it. Every rank walks its pieces in buffer order,
 * so two ranks that share several rings meet in them in the same order.
 */
#include "hier.h"

#include <stdlib.h>

#include "core.h"
#include "layout.h"
#include "recursive_doubling.h"
#include "ring.h"
#include "schedule.h"
#include "tree.h"

/* The layout as the algorithm needs it. */
struct hier {
  const struct sched_key* k;
  const struct sched_topo* t;
  int node, local, ppn, nnodes;
  size_t chunk, span;
};

static int node_rank(const struct sched_topo* t, int node, int local) {
  return t->order[t->node_start[node] + local];
}

/* Segment j of [0, len) cut into k: floor(j*len/k), so a segment starts no
 * earlier than its exact fraction (hier_peers relies on it). */
static size_t seg_start(size_t len, int j, int k) {
  return (size_t)((unsigned __int128)len * (unsigned)j / (unsigned)k);
}

/* The segment (of the round [base, base+len)) owned by `local` on a node
 * of k ranks; and which local owns element `off`. */
static size_t seg_owner(size_t len, size_t off, int k) {
  int j = 0;
  while (j + 1 < k && seg_start(len, j + 1, k) <= off) j++;
  return (size_t)j;
}

/* Ring blocks: segments of a range [base, base+len), n of them. */
struct range_ctx {
  size_t base, len;
  int n;
};
static struct ring_block range_block(const void* ctx, int j) {
  const struct range_ctx* r = ctx;
  size_t a = seg_start(r->len, j, r->n), e = seg_start(r->len, j + 1, r->n);
  return (struct ring_block){r->base + a, r->base + a, e - a};
}

static struct ring hier_ring(const struct hier* h, int n, int pos, int prev, int next,
                             ring_block_fn block, const void* ctx) {
  return (struct ring){.n = n,
                       .pos = pos,
                       .prev = prev,
                       .next = next,
                       .block = block,
                       .ctx = ctx,
                       .chunk = h->chunk,
                       .span = h->span};
}

/* The ring over this rank's node. */
static struct ring node_ring(const struct hier* h, ring_block_fn block, const void* ctx) {
  int k = h->ppn, nd = h->node, l = h->local;
  return hier_ring(h, k, l, node_rank(h->t, nd, (l + k - 1) % k), node_rank(h->t, nd, (l + 1) % k),
                   block, ctx);
}

/* The ring between nodes of the ranks with this rank's local index. */
static struct ring column_ring(const struct hier* h, ring_block_fn block, const void* ctx) {
  int m = h->nnodes, nd = h->node, l = h->local;
  return hier_ring(h, m, nd, node_rank(h->t, (nd + m - 1) % m, l), node_rank(h->t, (nd + 1) % m, l),
                   block, ctx);
}

/* The ring between nodes over piece [a, e): on each node, its owner. */
static int piece_owner(const struct hier* h, int node, size_t base, size_t len, size_t a) {
  int k = sched_topo_node_size(h->t, node);
  return node_rank(h->t, node, (int)seg_owner(len, a - base, k));
}

/* Hop `hop` of one piece's all-reduce between nodes. */
static ncclResult_t piece_allreduce_hop(struct schedule* s, const struct hier* h, size_t base,
                                        size_t len, size_t a, size_t e, int hop) {
  int m = h->nnodes, nd = h->node;
  struct range_ctx ctx = {a, e - a, m};
  struct ring g = hier_ring(h, m, nd, piece_owner(h, (nd + m - 1) % m, base, len, a),
                            piece_owner(h, (nd + 1) % m, base, len, a), range_block, &ctx);
  g.from_out = h->ppn > 1; /* the node's partial sum is in Y */
  g.post = 1;
  return ring_allreduce_hop(s, &g, nd + 1, hop, 0);
}

/* Nodes whose sizes stand for all: where every node holds as many ranks,
 * node 0 alone (at 16k ranks a loop over 2k nodes per boundary made a
 * schedule cost seconds). */
static int distinct_nodes(const struct hier* h) {
  return h->t->min_ppn == h->t->max_ppn ? 1 : h->nnodes;
}

/* The next segment boundary of any node after `off` in the round. */
static size_t next_boundary(const struct hier* h, size_t len, size_t off) {
  size_t best = len;
  for (int i = 0; i < distinct_nodes(h); i++) {
    int k = sched_topo_node_size(h->t, i);
    size_t j = seg_owner(len, off, k) + 1;
    if ((int)j < k) best = MIN(best, seg_start(len, (int)j, k));
  }
  return best;
}

/* A round runs in stages: stage 0 reduce-scatters inside the node and
 * starts the inter-node rings (hop 0); stage i is their hop i; the last
 * stage ends them and all-gathers inside the node. */
static int hier_nstages(const struct hier* h) {
  return h->nnodes > 1 ? 2 * h->nnodes - 1 : 1;
}

/* Stage `stage` of the round [base, base+len). */
static ncclResult_t hier_round_stage(struct schedule* s, const struct hier* h, size_t base,
                                     size_t len, int stage) {
  ncclResult_t res = ncclSuccess;
  struct range_ctx nctx = {base, len, h->ppn};
  struct ring g = node_ring(h, range_block, &nctx);
  size_t lo = seg_start(len, h->local, h->ppn), hi = seg_start(len, h->local + 1, h->ppn);
  if (stage == 0 && h->ppn > 1) {
    g.post = h->nnodes == 1;
    CHECK(ring_reduce_phase(s, &g, h->local, PRIM_RECV_REDUCE_COPY, 0));
  }
  for (size_t a = lo; h->nnodes > 1 && a < hi;) {
    size_t e = MIN(hi, next_boundary(h, len, a));
    CHECK(piece_allreduce_hop(s, h, base, len, base + a, base + e, stage));
    a = e;
  }
  if (stage == hier_nstages(h) - 1 && h->ppn > 1) {
    g.from_out = 1;
    CHECK(ring_send_own(s, &g, 0));
    CHECK(ring_gather_phase(s, &g, h->local, 0));
  }
fail:
  return res;
}

static struct hier hier_of(const struct sched_key* k) {
  const struct sched_topo* t = k->topo;
  struct hier h = {.k = k, .t = t, .chunk = MAX((size_t)1, k->chunk_bytes / k->elem_size)};
  h.span = h.chunk * (size_t)MAX(1, k->slices_per_step);
  h.node = t->node_of[k->rank];
  h.local = t->local_of[k->rank];
  h.ppn = sched_topo_node_size(t, h.node);
  h.nnodes = t->nnodes;
  return h;
}

/* Build a sub-schedule with `build` over `members` (the sub-key's ranks
 * are indices into it), then adapt its steps: peers renamed to ranks;
 * with `from_out` the data is already in Y (copies of X into Y dropped,
 * reductions and sends read Y); without `post` nothing is final yet. */
static ncclResult_t sub_schedule(struct schedule* s, const struct sched_key* k,
                                 ncclResult_t (*build)(struct schedule*, const struct sched_key*),
                                 const int* members, int n, int index, int root, int from_out,
                                 int post) {
  ncclResult_t res = ncclSuccess;
  struct sched_key sub = *k;
  size_t first = s->nsteps, w = first;
  sub.topo = NULL;
  sub.rank = index;
  sub.nranks = n;
  sub.root = root;
  CHECK(build(s, &sub));
  for (size_t i = first; i < s->nsteps; i++) {
    struct sched_step st = s->steps[i];
    if (from_out && st.prim == PRIM_COPY) continue;
    if (st.recv_peer >= 0) st.recv_peer = members[st.recv_peer];
    if (st.send_peer >= 0) st.send_peer = members[st.send_peer];
    if (from_out) st.flags = (uint8_t)((st.flags & ~SCHED_PRE) | SCHED_LOCAL_OUT);
    if (!post) st.flags &= (uint8_t)~SCHED_POST;
    s->steps[w++] = st;
  }
  s->nsteps = w;
fail:
  return res;
}

/* Buffers below one chunk take the leader variant: the leaders' exchange
 * is latency-bound. From one chunk on the node's ranks share the wire,
 * while the leaders' node phases would wait for it (docs/performance.md,
 * "Measurements behind the defaults", has the 2x4 timings). */
int hier_allreduce_uses_leaders(size_t bytes, size_t chunk_bytes) {
  return bytes < chunk_bytes;
}

/* Leader variant: reduce to each node's first rank (tree), leaders
 * all-reduce (recursive doubling), broadcast inside the node (tree). */
static ncclResult_t hier_leaders(struct schedule* s, const struct hier* h) {
  ncclResult_t res = ncclSuccess;
  const struct sched_topo* t = h->t;
  const int* mine = &t->order[t->node_start[h->node]];
  int *leaders = NULL, m = h->nnodes, k = h->ppn;
  if (k > 1) CHECK(sub_schedule(s, h->k, tree_schedule_reduce, mine, k, h->local, 0, 0, m == 1));
  if (m > 1 && h->local == 0) {
    /* on the heap: any number of nodes (a stack array refused 4096+,
     * which braid-sim found at 16,384 ranks on 8,192 nodes) */
    CHECK(braid_calloc(&leaders, (size_t)m, sizeof(*leaders)));
    for (int i = 0; i < m; i++) leaders[i] = node_rank(t, i, 0);
    CHECK(sub_schedule(s, h->k, rd_schedule_allreduce, leaders, m, h->node, 0, k > 1, 1));
  }
  if (k > 1) CHECK(sub_schedule(s, h->k, tree_schedule_broadcast, mine, k, h->local, 0, 1, 1));
fail:
  free(leaders);
  return res;
}

/* Rounds small enough that no segment outgrows an iteration's span. */
static size_t hier_round_len(const struct hier* h) {
  return h->span * (size_t)h->t->min_ppn;
}

/* Pieces of the segment of `local` on `node` in a round of `len`. */
static size_t hier_pieces(const struct hier* h, int node, int local, size_t len) {
  int k = sched_topo_node_size(h->t, node);
  size_t n = 0, hi = seg_start(len, local + 1, k);
  for (size_t a = seg_start(len, local, k); a < hi; a = MIN(hi, next_boundary(h, len, a))) n++;
  return n;
}

/* Most steps any rank emits in one pipelined iteration, the same answer on
 * every rank (they must agree on pipelining): the node stages cut blocks of
 * at most span elements, (ppn-1) + ppn of them; each of the 2m-1 hop stages
 * cuts its pieces, at most pieces + span/chunk slices. */
static size_t hier_iteration_bound(const struct hier* h) {
  size_t q = h->span / h->chunk, round = hier_round_len(h), count = h->k->count, most = 0;
  size_t tail = count % round ? count % round : round;
  int hops = hier_nstages(h);
  for (int nd = 0; nd < distinct_nodes(h); nd++) {
    int k = sched_topo_node_size(h->t, nd);
    for (int l = 0; l < k; l++) {
      size_t pieces = MAX(hier_pieces(h, nd, l, MIN(round, count)), hier_pieces(h, nd, l, tail));
      size_t steps = (size_t)(2 * k - 1) * q + (size_t)hops * (pieces + q);
      most = MAX(most, steps);
    }
  }
  return most;
}

/* Rounds in iterations: iteration t runs stage i of round t - skew*i. With
 * skew 0 every round goes start to finish, one after the other, and the
 * link idles while a round is inside the node. With skew 1 it is a
 * software pipeline, newest round first. While a rank waits for an older round's inter-node data,
 * newer rounds' sends are already queued on the link, so it stays busy through the shared-memory
 * stages. Every rank emits the same order, so each connection sees its sends and receives in one
 * sequence at both ends. A send is matched about one iteration later at its receiver: with
 * iterations no longer than the executor window (hier_iteration_bound),
 * the receive is posted in time even on transports that complete a send
 * only once its receive is posted (the fake-transport test runs such
 * windows). */
static ncclResult_t hier_rounds(struct schedule* s, const struct hier* h, size_t skew) {
  ncclResult_t res = ncclSuccess;
  size_t round = hier_round_len(h), count = h->k->count, nrounds = DIV_UP(count, round);
  int nstages = hier_nstages(h);
  for (size_t t = 0; t < nrounds + skew * (size_t)(nstages - 1); t++)
    for (int i = 0; i < nstages; i++) {
      size_t lag = skew * (size_t)i;
      if (t < lag || t - lag >= nrounds) continue;
      size_t base = (t - lag) * round;
      CHECK(hier_round_stage(s, h, base, MIN(round, count - base), i));
    }
fail:
  return res;
}

/* Rounds of `span` elements per segment, or 0 when no span fits the window
 * (the rounds then run one after the other). */
static size_t hier_pipeline_span(const struct hier* h) {
  struct hier w = *h;
  for (size_t q = h->span / h->chunk; q >= 1; q /= 2) {
    w.span = q * h->chunk;
    if (hier_iteration_bound(&w) <= 2 * (size_t)MAX(1, h->k->slices_per_step)) return w.span;
  }
  return 0;
}

int hier_allreduce_pipelines(const struct sched_key* k) {
  if (k->topo == NULL || k->topo->nnodes < 2 || k->count == 0) return 0;
  struct hier h = hier_of(k);
  return hier_pipeline_span(&h) > 0;
}

ncclResult_t hier_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  if (k->count == 0) return ncclSuccess;
  if (k->nranks == 1 || k->topo == NULL) return ring_schedule_allreduce(s, k);
  struct hier h = hier_of(k);
  if (hier_allreduce_uses_leaders(k->count * k->elem_size, k->chunk_bytes))
    return hier_leaders(s, &h);
  /* Pipelined with the widest rounds whose iterations fit the window. */
  size_t span = hier_pipeline_span(&h);
  if (span == 0) return hier_rounds(s, &h, 0);
  h.span = span;
  return hier_rounds(s, &h, 1);
}

/* All-gather blocks: block j of a ring is rank members[j]'s. */
struct gather_ctx {
  const struct sched_key* k;
  const int* members; /* stride apart in t->order */
  int stride;
};
static struct ring_block gather_block(const void* ctx, int j) {
  const struct gather_ctx* c = ctx;
  int r = c->members[(size_t)j * (size_t)c->stride];
  return (struct ring_block){0, sched_block_offset(c->k, r), c->k->count};
}

/* All-gather on an even layout: the ranks with the same local index on
 * every node gather their blocks (ppn rings in parallel between nodes),
 * then every node passes each node's blocks around its own ring. */
ncclResult_t hier_schedule_allgather(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  if (k->nranks == 1 || k->topo == NULL) return ring_schedule_allgather(s, k);
  struct hier h = hier_of(k);
  const struct sched_topo* t = h.t;
  int m = h.nnodes, p = h.ppn, nd = h.node, l = h.local;
  struct gather_ctx across = {k, &t->order[l], p};
  struct ring inter = column_ring(&h, gather_block, &across);
  for (size_t from = 0; from < k->count; from += h.span) {
    size_t hi = MIN(from + h.span, k->count);
    CHECK(sched_append(s, PRIM_COPY, 0, -1, -1, from, sched_block_offset(k, k->rank) + from,
                       hi - from));
    if (m > 1) {
      CHECK(ring_send_own(s, &inter, from));
      CHECK(ring_gather_phase(s, &inter, nd, from));
    }
    for (int i = 0; i < m && p > 1; i++) { /* node i's blocks around this node */
      struct gather_ctx within = {k, &t->order[t->node_start[i]], 1};
      struct ring g = node_ring(&h, gather_block, &within);
      g.from_out = 1;
      CHECK(ring_send_own(s, &g, from));
      CHECK(ring_gather_phase(s, &g, l, from));
    }
  }
fail:
  return res;
}

/* Step `st` of m of the inter-node reduce-scatter of rank `owner`'s block,
 * slice [a, e), around the node's reduce-scatter of that block (whose last
 * step is folded in): the partial arriving from the previous node is
 * received first, into the carry, with this rank's input added; the node's
 * ring then adds the others', and its last step sends the sum on to the
 * next node (or, at the last step, stores it as final). Receiving first
 * keeps the inter-node send of one step and the receive of the next side
 * by side in the window, as a rendezvous transport needs. */
static ncclResult_t rs_node_step(struct schedule* s, const struct ring* g, const struct ring* inter,
                                 int owner, int st, size_t from) {
  ncclResult_t res = ncclSuccess;
  const struct sched_key* k = ((const struct gather_ctx*)g->ctx)->k;
  size_t cnt = k->count, a = MIN(from, cnt), len = MIN(from + g->span, cnt) - a;
  size_t x = sched_block_offset(k, owner) + a;
  int m = inter->n, last = st == m - 1;
  if (len == 0) return ncclSuccess;
  if (st > 0) CHECK(sched_append(s, PRIM_RECV_REDUCE_CARRY, SCHED_PRE, inter->prev, -1, x, a, len));
  CHECK(ring_reduce_partial(s, g, g->pos, from));
  unsigned flags = st > 0 ? SCHED_LOCAL_CARRY : SCHED_PRE;
  if (last)
    CHECK(sched_append(s, PRIM_RECV_REDUCE_COPY, flags | SCHED_POST, g->prev, -1, x, a, len));
  else
    CHECK(sched_append(s, PRIM_RECV_REDUCE_SEND, flags, g->prev, inter->next, x, a, len));
fail:
  return res;
}

/* Reduce-scatter blocks: block j of a ring is rank members[j*stride]'s, in X. */
static struct ring_block scatter_block(const void* ctx, int j) {
  struct ring_block b = gather_block(ctx, j);
  return (struct ring_block){b.yoff, 0, b.len};
}

/* Reduce-scatter on an even layout: the inter-node ring of the ranks with
 * this rank's local index, where each node first reduces (inside the node)
 * the block it is about to pass on. Between nodes only final-size partials
 * travel, on ppn rings in parallel. */
ncclResult_t hier_schedule_reducescatter(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  if (k->count == 0) return ncclSuccess;
  if (k->nranks == 1 || k->topo == NULL) return ring_schedule_reducescatter(s, k);
  struct hier h = hier_of(k);
  const struct sched_topo* t = h.t;
  int m = h.nnodes, p = h.ppn, nd = h.node, l = h.local;
  if (p == 1 || m == 1) return ring_schedule_reducescatter(s, k);
  h.span = h.chunk; /* one slice per iteration: the carry holds one slice */
  struct gather_ctx across = {k, &t->order[l], p};
  struct ring inter = column_ring(&h, scatter_block, &across);
  for (size_t from = 0; from < k->count; from += h.span)
    for (int st = 0; st < m; st++) {
      int b = ((nd - 1 - st) % m + m) % m; /* the node whose blocks move now */
      struct gather_ctx within = {k, &t->order[t->node_start[b]], 1};
      struct ring g = node_ring(&h, scatter_block, &within);
      CHECK(rs_node_step(s, &g, &inter, node_rank(t, b, l), st, from));
    }
fail:
  return res;
}

/* 1 when segment j of k and segment l of kk can share an element in some
 * round: their exact fractions overlap (segments start no earlier than
 * their fraction, so real overlap implies it; the test is symmetric). */
static int segments_meet(int j, int k, int l, int kk) {
  return (long)j * kk < (long)(l + 1) * k && (long)l * k < (long)(j + 1) * kk;
}

int hier_peers(const struct sched_key* k, int* peers, int max) {
  if (k->topo == NULL) return 0;
  struct hier h = hier_of(k);
  const struct sched_topo* t = h.t;
  int m = 0, kk = h.ppn, l = h.local, parent, child[2], rd[64];
  if (kk > 1) { /* the node's ring, and its tree rooted at the first rank */
    m = sched_add_peer(peers, m, max, node_rank(t, h.node, (l + kk - 1) % kk));
    m = sched_add_peer(peers, m, max, node_rank(t, h.node, (l + 1) % kk));
    tree_rooted_links(l, kk, 0, &parent, child);
    m = sched_add_peer(peers, m, max, parent >= 0 ? node_rank(t, h.node, parent) : -1);
    for (int c = 0; c < 2; c++)
      m = sched_add_peer(peers, m, max, child[c] >= 0 ? node_rank(t, h.node, child[c]) : -1);
  }
  for (int d = -1; d <= 1 && h.nnodes > 1; d += 2) { /* owners of my pieces next door */
    int nb = ((h.node + d) % h.nnodes + h.nnodes) % h.nnodes, knb = sched_topo_node_size(t, nb);
    for (int j = 0; j < knb; j++)
      if (segments_meet(j, knb, l, kk)) m = sched_add_peer(peers, m, max, node_rank(t, nb, j));
  }
  if (l == 0) /* leaders' recursive doubling */
    for (int i = 0, n = rd_peers(h.node, h.nnodes, rd, 64); i < n; i++)
      m = sched_add_peer(peers, m, max, node_rank(t, rd[i], 0));
  return m;
}
