/*
 * The direct algorithm's plan (direct.h).
 */
#include "direct.h"

#include <string.h>

#include "core.h"
#include "layout.h"
#include "schedule.h"

/* Rank r's slice of `count` elements: an equal share, rounded up to
 * `align`, so the last ranks may get less, or nothing. */
static void direct_slice(size_t count, int r, int nranks, size_t align, size_t* lo, size_t* hi) {
  size_t share = (count + (size_t)nranks - 1) / (size_t)nranks;
  share = ALIGN_UP(share, align);
  *lo = MIN((size_t)r * share, count);
  *hi = MIN(*lo + share, count);
}

static struct direct_ref ref(int rank, int buf, size_t off) {
  return (struct direct_ref){rank, buf, off};
}

/* Every rank's `buf` at `off`, in rank order, as sources or destinations. */
static int refs_all(struct direct_ref* out, int nranks, int buf, size_t off) {
  for (int k = 0; k < nranks; k++) out[k] = ref(k, buf, off);
  return nranks;
}

ncclResult_t direct_plan(int coll, int rank, int nranks, int root, size_t count, size_t stride,
                         size_t align, struct direct_task* t) {
  size_t lo, hi;
  memset(t, 0, sizeof(*t));
  if (nranks < 1 || nranks > DIRECT_MAX_RANKS || rank < 0 || rank >= nranks) {
    WARN("Direct: %d ranks (rank %d); it joins 1 to %d", nranks, rank, DIRECT_MAX_RANKS);
    return ncclInvalidArgument;
  }
  if (stride == 0) stride = count;
  t->rows = 1;
  direct_slice(count, rank, nranks, MAX(align, (size_t)1), &lo, &hi);
  switch (coll) {
    case COLL_ALLREDUCE:
      t->nsrcs = refs_all(t->srcs, nranks, DIRECT_SEND, lo);
      t->ndsts = refs_all(t->dsts, nranks, DIRECT_RECV, lo);
      t->n = hi - lo;
      break;
    case COLL_REDUCE:
      t->nsrcs = refs_all(t->srcs, nranks, DIRECT_SEND, lo);
      t->ndsts = 1, t->dsts[0] = ref(root, DIRECT_RECV, lo);
      t->n = hi - lo;
      break;
    case COLL_BROADCAST:
      t->nsrcs = 1, t->srcs[0] = ref(root, DIRECT_SEND, lo);
      t->ndsts = refs_all(t->dsts, nranks, DIRECT_RECV, lo);
      t->n = hi - lo;
      break;
    case COLL_REDUCESCATTER: /* this rank's block, whole: the ranks' blocks are the slices */
      t->nsrcs = refs_all(t->srcs, nranks, DIRECT_SEND, (size_t)rank * stride);
      t->ndsts = 1, t->dsts[0] = ref(rank, DIRECT_RECV, 0);
      t->n = count;
      break;
    case COLL_ALLGATHER:
      t->nsrcs = 1, t->srcs[0] = ref(rank, DIRECT_SEND, 0);
      t->ndsts = refs_all(t->dsts, nranks, DIRECT_RECV, (size_t)rank * stride);
      t->n = count;
      break;
    default:
      WARN("Direct: collective %d has no direct plan", coll);
      return ncclInvalidArgument;
  }
  return ncclSuccess;
}

int direct_task_row(const struct direct_task* t, size_t r, struct direct_task* row) {
  ptrdiff_t si = t->src_at ? t->src_at[r] : (ptrdiff_t)r;
  ptrdiff_t di = t->dst_at ? t->dst_at[r] : (ptrdiff_t)r;
  *row = *t;
  row->rows = 1;
  row->src_row = row->dst_row = 0;
  row->src_at = row->dst_at = NULL;
  row->spread = 0;
  if (si < 0 || di < 0) return 0;
  if (t->spread == DIRECT_SPREAD_SRCS) { /* a row past the sources is none */
    if (r >= (size_t)t->nsrcs) return 0;
    row->nsrcs = 1, row->srcs[0] = t->srcs[r];
  }
  if (t->spread == DIRECT_SPREAD_DSTS) {
    if (r >= (size_t)t->ndsts) return 0;
    row->ndsts = 1, row->dsts[0] = t->dsts[r];
  }
  for (int k = 0; k < row->nsrcs; k++)
    row->srcs[k].off = (size_t)((ptrdiff_t)row->srcs[k].off + si * t->src_row);
  for (int k = 0; k < row->ndsts; k++)
    row->dsts[k].off = (size_t)((ptrdiff_t)row->dsts[k].off + di * t->dst_row);
  return 1;
}

/* Whether a gathered plan halves (direct.h): 4 to DIRECT_MAX_NODES nodes,
 * a power of two. */
static int hier_halves(const struct direct_hier* h) {
  return h->gathered && h->nnodes >= 4 && h->nnodes <= DIRECT_MAX_NODES &&
         (h->nnodes & (h->nnodes - 1)) == 0;
}

/* Whether a gathered reduction folds, then halves (direct.h): 3 to
 * DIRECT_MAX_NODES nodes, not a power of two. */
static int hier_folds(const struct direct_hier* h) {
  return h->gathered && h->coll != COLL_ALLGATHER && h->nnodes >= 3 &&
         h->nnodes <= DIRECT_MAX_NODES && (h->nnodes & (h->nnodes - 1)) != 0;
}

/* Bits [0, log2 p) of node reversed (p a power of two). */
static int bits_reversed(int node, int p) {
  int bits = 0;
  while ((1 << bits) < p) bits++;
  return braid_bit_reverse(node, bits);
}

/* The place node `node` takes in a halving among the first p nodes: its
 * own, or (canonical) its index's bits reversed, so that the halving's
 * first swap joins nodes 0 and 1 and its last the two halves of the
 * nodes: the canonical tree over them, lower node's first at every step
 * (direct.h). The map is its own inverse. */
static int hier_place(const struct direct_hier* h, int node, int p) {
  return h->canonical ? bits_reversed(node, p) : node;
}

/* This rank's node's place in a halving among the first p nodes; p for a
 * node past them (a fold's upper one, which halves nothing). */
static int own_place(const struct direct_hier* h, int p) {
  return h->node < p ? hier_place(h, h->node, p) : p;
}

int direct_hier_gathers(int coll, int nnodes) {
  if (coll == COLL_ALLGATHER || coll == COLL_BROADCAST) return 1;
  return nnodes >= 2 && nnodes <= DIRECT_MAX_NODES &&
         (coll == COLL_ALLREDUCE || coll == COLL_REDUCE || coll == COLL_REDUCESCATTER);
}

int direct_halving_nodes(int nnodes) {
  int p = 1;
  while (p * 2 <= nnodes) p *= 2;
  return p;
}

int direct_stage_partners(int coll, int nnodes, int node, int* out) {
  int m = 0, p = direct_halving_nodes(nnodes);
  if (nnodes < 2) return 0;
  if (coll == COLL_ALLGATHER || coll == COLL_BROADCAST) { /* the column's ring */
    out[m++] = (node + 1) % nnodes;
    if (nnodes > 2) out[m++] = (node + nnodes - 1) % nnodes;
    return m;
  }
  if (node >= p) { /* folds onto node - p, and no more */
    out[m++] = node - p;
    return m;
  }
  if (node + p < nnodes) out[m++] = node + p;
  for (int d = p / 2; d >= 1; d /= 2) out[m++] = node ^ d; /* halving and doubling */
  return m;
}

/* A one-way step between node `lower` and node `upper` = lower + p: the
 * member `from` sends `len` elements at `base`; the other receives them at
 * `at`. */
static void one_way(const struct direct_hier* h, int p, int from, size_t base, size_t at,
                    size_t len, struct direct_step* s) {
  memset(s, 0, sizeof(*s));
  s->member = h->node >= p;
  s->lower = s->member ? h->node - p : h->node;
  s->upper = s->lower + p;
  s->from = from;
  s->count = len;
  s->send_off = base;
  s->recv_off = s->member == from ? base : at;
}

/* A fold's first step and last (direct.h): node j + p's partial to node j
 * (right after its region), which adds it, lower node's first;
 * the total back, in place. Nodes p - extra .. p - 1 have no partner. */
static void fold_plan(const struct direct_hier* h, int p, size_t base, size_t len,
                      struct direct_staged* st) {
  int extra = h->nnodes - p;
  if (len == 0 || (h->node >= extra && h->node < p)) return;
  struct direct_step* s = &st->steps[st->nsteps++];
  one_way(h, p, 1, base, base + len, len, s);
  if (!s->member) {
    struct direct_task* t = &s->reduce;
    t->n = len, t->rows = 1, t->nsrcs = 2, t->ndsts = 1;
    t->srcs[0] = ref(h->local, DIRECT_SCRATCH, base);
    t->srcs[1] = ref(h->local, DIRECT_SCRATCH, base + len);
    t->dsts[0] = ref(h->local, DIRECT_SCRATCH, base);
  }
  st->unfolds = 1;
  one_way(h, p, 0, base, base, len, &st->unfold);
}

/* The halving's steps over `len` elements of scratch from `base` among
 * the first p nodes (len a multiple of p whole blocks; base >= len / 2,
 * and as much room after the region, for what the first swap brings),
 * after the steps already planned. Each step keeps the member's half in
 * place, so what it offered and what came are free again once the reduce
 * ran. */
static void halving_plan(const struct direct_hier* h, int p, size_t base, size_t len,
                         struct direct_staged* st) {
  size_t lo = base;
  int v = own_place(h, p);
  for (int d = p / 2; d >= 1 && len > 0 && v < p; d /= 2) {
    struct direct_step* s = &st->steps[st->nsteps++];
    struct direct_task* t = &s->reduce;
    size_t half = len / 2;
    int m = (v / d) & 1;
    size_t kept = m ? lo + half : lo, came = m ? lo - half : lo + 2 * half;
    s->member = m;
    s->from = -1;
    s->lower = hier_place(h, m ? v - d : v, p);
    s->upper = hier_place(h, m ? v : v + d, p);
    s->count = half;
    s->send_off = m ? lo : lo + half;             /* the half the partner keeps */
    s->recv_off = s->send_off - (size_t)m * half; /* in place: ours at member * count */
    memset(t, 0, sizeof(*t));
    t->n = half, t->rows = 1, t->nsrcs = 2, t->ndsts = 1;
    t->srcs[0] = ref(h->local, DIRECT_SCRATCH, m ? came : kept); /* the lower node's first */
    t->srcs[1] = ref(h->local, DIRECT_SCRATCH, m ? kept : came);
    t->dsts[0] = ref(h->local, DIRECT_SCRATCH, kept);
    lo = kept, len = half;
  }
  /* the last step's reduce: the total (a fold's upper node gets it divided) */
  st->post_task = st->nsteps > 0 && v < p ? st->nsteps : -1;
}

/* The all-gather after a halving among the first p nodes, by recursive
 * doubling: member j holds block j of `len` elements from `base`; at
 * distance d = 1, 2, ... p/2 the members d apart swap the d blocks each
 * holds, in place (the scratch has room on either side), so that after
 * log2(p) steps every member holds the whole. Moves what a ring of p
 * would, in log2(p) rounds instead of p - 1; no reduce. */
static void doubling_plan(const struct direct_hier* h, int p, size_t base, size_t len,
                          struct direct_staged* st) {
  size_t block = len / (size_t)p;
  int v = own_place(h, p);
  for (int d = 1; d < p && block > 0 && v < p; d *= 2) {
    struct direct_step* s = &st->steps[st->nsteps++];
    int m = (v / d) & 1;
    memset(s, 0, sizeof(*s));
    s->member = m;
    s->from = -1;
    s->lower = hier_place(h, m ? v - d : v, p);
    s->upper = hier_place(h, m ? v : v + d, p);
    s->count = (size_t)d * block;
    s->send_off = base + (size_t)(v & ~(d - 1)) * block; /* the d blocks held */
    s->recv_off = s->send_off - (size_t)m * s->count;
  }
}

/* Ranks on this rank's node (direct.h: more than the columns where nodes
 * differ in size). */
static int hier_node_ranks(const struct direct_hier* h) {
  return h->node_ranks > 0 ? h->node_ranks : h->nlocal;
}

/* A plan whose tasks are empty and whose stage between nodes moves
 * nothing (st zeroed): an index past the columns', or the start of one
 * that fills in what it does. */
static void hier_idle(struct direct_staged* st) {
  st->before.rows = st->after.rows = 1;
  st->post_task = -1;
}

/* R, the rows a node has in each column (direct.h): nodes of one size 1. */
static int rows_per_node(const struct sched_topo* t) {
  return (t->max_ppn + t->min_ppn - 1) / t->min_ppn;
}

size_t direct_hier_rows_size(const struct sched_topo* t) {
  return 3 * (size_t)t->nnodes * (size_t)rows_per_node(t);
}

/* The table: row j R + k names the rank of the column on node j (-1: none
 * there); then, at nnodes R on, where a fold's pairs hold the same row
 * (fold_rows): node j < p's rows at 2 j R + k, node p + i's after them at
 * 2 i R + R + k, in rows of the block; then, at 2 nnodes R on, where a
 * canonical halving wants them (halving_rows): node j's at its place
 * (hier_place) times R. */
void direct_hier_rows(const struct sched_topo* t, int local, int32_t* at) {
  int rows = rows_per_node(t), m = t->nnodes, p = direct_halving_nodes(m);
  int32_t* pairs = at + (size_t)m * (size_t)rows;
  int32_t* places = pairs + (size_t)m * (size_t)rows;
  for (int j = 0; j < m; j++)
    for (int k = 0; k < rows; k++) {
      int l = local + k * t->min_ppn, i = j * rows + k;
      at[i] = l < sched_topo_node_size(t, j) ? t->order[t->node_start[j] + l] : -1;
      pairs[i] = j < p ? 2 * j * rows + k : 2 * (j - p) * rows + rows + k;
      places[i] = (j < p ? bits_reversed(j, p) : j) * rows + k;
    }
}

/* The table's fold places, from node `node`'s first row on. */
static const int32_t* rows_pairs(const struct direct_hier* h, int node) {
  size_t rows = (size_t)rows_per_node(h->topo);
  return h->rows_at + ((size_t)h->nnodes + (size_t)node) * rows;
}

/* This rank's column on its node (indexes local, local + nlocal, ...) as
 * refs to `buf`: a spread side, a row each. How many. */
static int refs_mine(struct direct_ref* out, const struct direct_hier* h, int buf) {
  int m = 0;
  for (int l = h->local; l < hier_node_ranks(h); l += h->nlocal) out[m++] = ref(l, buf, 0);
  return m;
}

/* A row for each of the `n` refs of `side` (a spread task); one is a
 * plain task. */
static void spread(struct direct_task* t, int side, int n) {
  t->rows = (size_t)n;
  t->spread = n > 1 ? side : 0;
}

/* Reduce-scatter halving: the rows from base = half the rows on, member j
 * ends with node j's rows, which the task after copies out. */
static void halving_rows(const struct direct_hier* h, struct direct_staged* st) {
  size_t c = st->count, len = (size_t)h->nnodes * c, base = len / 2;
  size_t rows = (size_t)rows_per_node(h->topo);
  st->before.dsts[0].off = base;
  if (h->canonical) /* node j's rows at its place, where the halving leaves them to it */
    st->before.dst_at = h->rows_at + 2 * (size_t)h->nnodes * rows;
  st->scratch = 2 * len;
  halving_plan(h, h->nnodes, base, len, st);
  st->count = 0; /* no stage after the steps */
  st->after.srcs[0].off = base + (size_t)hier_place(h, h->node, h->nnodes) * c;
}

/* Reduce-scatter folding onto p nodes (direct.h): the nodes' rows in
 * pairs, pair i = node i's and node i + p's (junk where i + p is no node),
 * so that the halving among the first p nodes leaves member i all the
 * rows its fold stands for. The task before writes the rows of nodes below
 * p, a step that moves nothing the others' (the pairs' second halves), each
 * row where the table's fold places say; node i + p sends node i all its
 * pairs, node i sends it node i + p's rows back. */
static void fold_rows(const struct direct_hier* h, struct direct_staged* st) {
  int p = direct_halving_nodes(h->nnodes), extra = h->nnodes - p;
  size_t rows = (size_t)rows_per_node(h->topo);
  size_t c = st->count, len = 2 * (size_t)p * c, base = len / 2;
  struct direct_task* in = &st->before;
  struct direct_step* second = &st->steps[st->nsteps++];
  memset(second, 0, sizeof(*second));
  second->lower = second->upper = h->node;
  second->from = DIRECT_STEP_LOCAL;
  second->reduce = *in;
  second->reduce.rows = (size_t)extra * rows;
  second->reduce.src_at = in->src_at + (size_t)p * rows;
  second->reduce.dsts[0].off = base;
  second->reduce.dst_at = rows_pairs(h, p);
  in->rows = (size_t)p * rows;
  in->dsts[0].off = base;
  in->dst_at = rows_pairs(h, 0);
  st->scratch = len / 2 + 2 * len; /* the first swap's lower half, the pairs, the fold's */
  fold_plan(h, p, base, len, st);
  halving_plan(h, p, base, len, st);
  st->count = 0; /* no stage after the steps */
  st->after.srcs[0].off = h->node < p ? base + 2 * (size_t)h->node * c : base;
  if (!st->unfolds) return;
  if (h->node < p) /* in place: node + p's half of its pair */
    one_way(h, p, 0, base + (2 * (size_t)h->node + 1) * c, 0, c, &st->unfold);
  else /* lands where its pairs were */
    one_way(h, p, 0, base, base, c, &st->unfold);
}

/* Reduce-scatter on 2 nodes, gathered (direct.h): member m of the column
 * writes its rows from m nodes' worth on (0 1 on node 0, 1 2 on node 1),
 * so that both offer the rows the other needs at block 1 and an all-gather
 * in place lands the partner's at block 2 (node 0) or 0 (node 1): either
 * way the node's partials lie at blocks 0 and 2, node 0's first. */
static void swap_rows(const struct direct_hier* h, struct direct_staged* st) {
  size_t c = st->count, m = (size_t)h->node, o = 1 - m;
  st->before.dsts[0].off = m * c;
  st->scratch = 3 * c;
  st->column_coll = COLL_ALLGATHER;
  st->send_off = c, st->recv_off = o * c;
  st->stride = c;
  st->after.nsrcs = 2;
  st->after.srcs[0] = ref(h->local, DIRECT_SCRATCH, 0);
  st->after.srcs[1] = ref(h->local, DIRECT_SCRATCH, 2 * c);
  st->post_task = 1;
}

/* Both tasks between the node's buffers and this rank's scratch, R rows of
 * a block per node (node j's from j R blocks on): a reduce-scatter reduces
 * every node's rows from every input of the node, the table naming each
 * row's block, and spreads this node's rows to its column's outputs; an
 * all-gather copies its column's inputs into this node's rows and writes
 * every node's rows to every output of the node. */
static void hier_blocks(const struct direct_hier* h, struct direct_staged* st) {
  size_t stride = h->stride ? h->stride : h->count, rows = (size_t)rows_per_node(h->topo);
  size_t c = rows * h->count, mine = (size_t)h->node * c;
  struct direct_task *in = &st->before, *out = &st->after;
  hier_idle(st);
  if (h->local >= h->nlocal) return; /* past the columns: its column's ranks do its part */
  in->n = out->n = h->count;
  st->scratch = (size_t)h->nnodes * c;
  st->count = c;
  st->column_coll = h->coll;
  if (h->coll == COLL_REDUCESCATTER) {
    in->rows = (size_t)h->nnodes * rows;
    in->nsrcs = refs_all(in->srcs, hier_node_ranks(h), DIRECT_SEND, 0);
    in->src_row = (ptrdiff_t)stride, in->src_at = h->rows_at;
    in->ndsts = 1, in->dsts[0] = ref(h->local, DIRECT_SCRATCH, 0);
    in->dst_row = (ptrdiff_t)h->count;
    st->send_off = 0, st->recv_off = mine;
    out->nsrcs = 1, out->srcs[0] = ref(h->local, DIRECT_SCRATCH, mine);
    out->src_row = (ptrdiff_t)h->count;
    out->ndsts = refs_mine(out->dsts, h, DIRECT_RECV);
    spread(out, DIRECT_SPREAD_DSTS, out->ndsts);
    if (hier_halves(h))
      halving_rows(h, st);
    else if (hier_folds(h))
      fold_rows(h, st);
    else if (h->gathered)
      swap_rows(h, st);
  } else {
    in->nsrcs = refs_mine(in->srcs, h, DIRECT_SEND);
    spread(in, DIRECT_SPREAD_SRCS, in->nsrcs);
    in->ndsts = 1, in->dsts[0] = ref(h->local, DIRECT_SCRATCH, mine);
    in->dst_row = (ptrdiff_t)h->count;
    st->send_off = mine, st->recv_off = 0;
    out->rows = (size_t)h->nnodes * rows;
    out->nsrcs = 1, out->srcs[0] = ref(h->local, DIRECT_SCRATCH, 0);
    out->src_row = (ptrdiff_t)h->count;
    out->ndsts = refs_all(out->dsts, hier_node_ranks(h), DIRECT_RECV, 0);
    out->dst_row = (ptrdiff_t)stride, out->dst_at = h->rows_at;
  }
}

/* A side's table whose rows are evenly spaced, none skipped: its first
 * entry and its spacing. */
static int rows_even(const int32_t* at, size_t rows, ptrdiff_t* first, ptrdiff_t* step) {
  *first = at[0];
  *step = rows > 1 ? (ptrdiff_t)at[1] - at[0] : 1;
  for (size_t r = 0; r < rows; r++)
    if (at[r] < 0 || at[r] != *first + (ptrdiff_t)r * *step) return 0;
  return 1;
}

/* Such a side as plain rows (its first row on every ref, the spacing in
 * the row step): the kernel then reads no table. */
static void side_plain(const int32_t** at, size_t rows, struct direct_ref* refs, int n,
                       ptrdiff_t* row) {
  ptrdiff_t first, step;
  if (*at == NULL || rows == 0 || !rows_even(*at, rows, &first, &step)) return;
  for (int k = 0; k < n; k++) refs[k].off = (size_t)((ptrdiff_t)refs[k].off + first * *row);
  *row *= step;
  *at = NULL;
}

static void task_plain(struct direct_task* t) {
  side_plain(&t->src_at, t->rows, t->srcs, t->nsrcs, &t->src_row);
  side_plain(&t->dst_at, t->rows, t->dsts, t->ndsts, &t->dst_row);
}

/* Every task of the plan with tables that need none in the plain form. */
static void plan_plain(struct direct_staged* st) {
  task_plain(&st->before);
  task_plain(&st->after);
  for (int i = 0; i < st->nsteps; i++) task_plain(&st->steps[i].reduce);
}

/* Column `local`'s one-pass all-reduce task on its node: its slice of the
 * columns' (nlocal), from every input of the node, to every output. */
static ncclResult_t column_task(const struct direct_hier* h, struct direct_task* t) {
  ncclResult_t res = direct_plan(COLL_ALLREDUCE, h->local, h->nlocal, 0, h->count, 0, h->align, t);
  if (res != ncclSuccess) return res;
  size_t lo = t->srcs[0].off;
  t->nsrcs = refs_all(t->srcs, hier_node_ranks(h), DIRECT_SEND, lo);
  t->ndsts = refs_all(t->dsts, hier_node_ranks(h), DIRECT_RECV, lo);
  return ncclSuccess;
}

/* All-reduce: the node's task cut around the scratch, which holds this
 * rank's slice only. An index past the columns has no slice: no task,
 * no stage between nodes. */
static ncclResult_t hier_slice(const struct direct_hier* h, struct direct_staged* st) {
  struct direct_task whole;
  hier_idle(st);
  if (h->local >= h->nlocal) return ncclSuccess; /* past the columns */
  ncclResult_t res = column_task(h, &whole);
  if (res != ncclSuccess) return res;
  st->before = st->after = whole;
  st->before.ndsts = 1, st->before.dsts[0] = ref(h->local, DIRECT_SCRATCH, 0);
  st->after.nsrcs = 1, st->after.srcs[0] = ref(h->local, DIRECT_SCRATCH, 0);
  st->scratch = st->count = whole.n;
  st->column_coll = COLL_ALLREDUCE;
  if (hier_halves(h) || hier_folds(h)) { /* padded to p whole blocks, halved, doubled */
    int p = direct_halving_nodes(h->nnodes), folds = p < h->nnodes;
    size_t len = ALIGN_UP(whole.n, (size_t)p * MAX(h->align, (size_t)1));
    size_t base = len / 2; /* room before for the first swap's lower half */
    st->before.dsts[0].off = st->after.srcs[0].off = base;
    st->scratch = folds ? len / 2 + 2 * len : 2 * len; /* a fold's partial lands after */
    if (folds) fold_plan(h, p, base, len, st);
    halving_plan(h, p, base, len, st);
    doubling_plan(h, p, base, len, st);
    st->count = 0;          /* no stage after the steps */
  } else if (h->gathered) { /* a row per node, each on whole vectors */
    size_t row = ALIGN_UP(whole.n, MAX(h->align, (size_t)1));
    st->before.dsts[0].off = (size_t)h->node * row;
    st->after.nsrcs = h->nnodes;
    for (int j = 0; j < h->nnodes; j++) st->after.srcs[j] = ref(h->local, DIRECT_SCRATCH, j * row);
    st->scratch = (size_t)h->nnodes * row;
    st->column_coll = COLL_ALLGATHER;
    st->send_off = st->before.dsts[0].off;
    st->stride = row;
    st->post_task = 1;
  }
  if (h->coll == COLL_REDUCE) { /* the root's output alone, on the root's node */
    st->after.ndsts = h->node == h->root_node;
    st->after.dsts[0] = ref(h->root_local, DIRECT_RECV, st->after.dsts[0].off);
    if (!st->after.ndsts) st->after.n = 0;
  }
  return ncclSuccess;
}

/* Broadcast: column `local`'s slice (of the columns', as an all-reduce
 * cuts it) from the root's input into the scratch on the root's node,
 * broadcast along the column from the root's node, then from the scratch
 * to every output of the node. An index past the columns, and the task
 * before off the root's node, have nothing to do. */
static ncclResult_t hier_broadcast(const struct direct_hier* h, struct direct_staged* st) {
  struct direct_task whole;
  hier_idle(st);
  if (h->local >= h->nlocal) return ncclSuccess; /* past the columns */
  ncclResult_t res = column_task(h, &whole);
  if (res != ncclSuccess) return res;
  st->after = whole;
  st->after.nsrcs = 1, st->after.srcs[0] = ref(h->local, DIRECT_SCRATCH, 0);
  if (h->node == h->root_node) {
    st->before = whole;
    st->before.nsrcs = 1, st->before.srcs[0] = ref(h->root_local, DIRECT_SEND, whole.srcs[0].off);
    st->before.ndsts = 1, st->before.dsts[0] = ref(h->local, DIRECT_SCRATCH, 0);
  }
  st->scratch = st->count = whole.n;
  st->column_coll = COLL_BROADCAST;
  st->column_root = h->root_node;
  return ncclSuccess;
}

/* Whether a canonical plan exists (direct.h): nodes of one power-of-two
 * size, a power of two of them, the stage between them gathered. */
static int hier_canonical_fits(const struct direct_hier* h) {
  int n = h->nnodes, k = hier_node_ranks(h);
  return h->gathered && k == h->nlocal && braid_pow2(k) && n >= 2 && braid_pow2(n);
}

/* A canonical plan's reductions combine in the tree (the node's ranks
 * in rank order, then the nodes: direct.h). */
static void plan_tree(const struct direct_hier* h, struct direct_staged* st) {
  st->before.tree = st->after.tree = h->canonical;
  for (int i = 0; i < st->nsteps; i++) st->steps[i].reduce.tree = h->canonical;
}

ncclResult_t direct_plan_hier(const struct direct_hier* h, struct direct_staged* st) {
  int here = hier_node_ranks(h);
  memset(st, 0, sizeof(*st));
  if (h->nlocal < 1 || here < h->nlocal || here > DIRECT_MAX_RANKS || h->local < 0 ||
      h->local >= here || h->node < 0 || h->node >= h->nnodes) {
    WARN(
        "Direct: Hier's node stages for index %d of %d (%d columns) on node %d of %d; a node "
        "holds 1 to %d",
        h->local, here, h->nlocal, h->node, h->nnodes, DIRECT_MAX_RANKS);
    return ncclInvalidArgument;
  }
  if ((h->coll == COLL_REDUCESCATTER || h->coll == COLL_ALLGATHER) &&
      (h->topo == NULL || h->rows_at == NULL || h->topo->nnodes != h->nnodes ||
       h->topo->min_ppn != h->nlocal || h->topo->max_ppn > DIRECT_MAX_RANKS)) {
    WARN("Direct: collective %d's Hier node stages without the layout's rows (%d columns)", h->coll,
         h->nlocal);
    return ncclInvalidArgument;
  }
  if (h->gathered && !direct_hier_gathers(h->coll, h->nnodes)) {
    WARN("Direct: a gathered stage between %d nodes for collective %d", h->nnodes, h->coll);
    return ncclInvalidArgument;
  }
  if ((h->coll == COLL_REDUCE || h->coll == COLL_BROADCAST) &&
      ((h->coll == COLL_REDUCE && !h->gathered) || h->root_node < 0 || h->root_node >= h->nnodes ||
       h->root_local < 0 || h->root_local >= DIRECT_MAX_RANKS ||
       (h->node == h->root_node && h->root_local >= here))) {
    WARN("Direct: collective %d rooted at index %d of node %d has no Hier plan (gathered %d)",
         h->coll, h->root_local, h->root_node, h->gathered);
    return ncclInvalidArgument;
  }
  if (h->canonical && !hier_canonical_fits(h)) {
    WARN(
        "Direct: the canonical order on %d nodes of %d ranks (gathered %d): it takes a power of "
        "two of each, the stage between nodes gathered",
        h->nnodes, here, h->gathered);
    return ncclInvalidArgument;
  }
  switch (h->coll) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE: {
      ncclResult_t res = hier_slice(h, st);
      plan_tree(h, st);
      return res;
    }
    case COLL_BROADCAST:
      return hier_broadcast(h, st);
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
      hier_blocks(h, st);
      plan_plain(st);
      plan_tree(h, st);
      return ncclSuccess;
    default:
      WARN("Direct: collective %d has no Hier plan", h->coll);
      return ncclInvalidArgument;
  }
}
