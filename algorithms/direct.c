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

/* The node's ranks' blocks of the column's rank on each node, as rows:
 * row j at column0 + j * step blocks of `stride` elements. */
static int refs_column(struct direct_ref* out, const struct direct_hier* h, int buf, size_t stride,
                       ptrdiff_t* row) {
  *row = (ptrdiff_t)h->column_step * (ptrdiff_t)stride;
  return refs_all(out, h->nlocal, buf, (size_t)h->column0 * stride);
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
  for (int d = p / 2; d >= 1 && len > 0 && h->node < p; d /= 2) {
    struct direct_step* s = &st->steps[st->nsteps++];
    struct direct_task* t = &s->reduce;
    size_t half = len / 2;
    int m = (h->node / d) & 1;
    size_t kept = m ? lo + half : lo, came = m ? lo - half : lo + 2 * half;
    s->member = m;
    s->from = -1;
    s->lower = m ? h->node - d : h->node;
    s->upper = m ? h->node : h->node + d;
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
  st->post_task = st->nsteps > 0 && h->node < p ? st->nsteps : -1;
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
  for (int d = 1; d < p && block > 0 && h->node < p; d *= 2) {
    struct direct_step* s = &st->steps[st->nsteps++];
    int m = (h->node / d) & 1;
    memset(s, 0, sizeof(*s));
    s->member = m;
    s->from = -1;
    s->lower = m ? h->node - d : h->node;
    s->upper = m ? h->node : h->node + d;
    s->count = (size_t)d * block;
    s->send_off = base + (size_t)(h->node & ~(d - 1)) * block; /* the d blocks held */
    s->recv_off = s->send_off - (size_t)m * s->count;
  }
}

/* Reduce-scatter halving: the rows from base = half the rows on, member j
 * ends with row j, which the task after copies out. */
static void halving_rows(const struct direct_hier* h, struct direct_staged* st) {
  size_t c = h->count, len = (size_t)h->nnodes * c, base = len / 2;
  st->before.dsts[0].off = base;
  st->scratch = 2 * len;
  halving_plan(h, h->nnodes, base, len, st);
  st->count = 0; /* no stage after the steps */
  st->after.srcs[0].off = base + (size_t)h->node * c;
}

/* Reduce-scatter folding onto p nodes (direct.h): the rows in pairs, pair
 * i = row i and row i + p (junk where i + p is no node), so that the
 * halving among the first p nodes leaves member i both rows its fold
 * stands for. The task before writes the rows of nodes below p, a step
 * that moves nothing the others' (the pairs' second rows); node i + p
 * sends node i all its pairs, node i sends it row i + p back. */
static void fold_rows(const struct direct_hier* h, struct direct_staged* st) {
  int p = direct_halving_nodes(h->nnodes), extra = h->nnodes - p;
  size_t c = h->count, len = 2 * (size_t)p * c, base = len / 2;
  struct direct_task* in = &st->before;
  struct direct_step* second = &st->steps[st->nsteps++];
  memset(second, 0, sizeof(*second));
  second->lower = second->upper = h->node;
  second->from = DIRECT_STEP_LOCAL;
  second->reduce = *in;
  second->reduce.rows = (size_t)extra;
  for (int k = 0; k < in->nsrcs; k++)
    second->reduce.srcs[k].off = (size_t)((ptrdiff_t)in->srcs[k].off + p * in->src_row);
  second->reduce.dsts[0].off = base + c;
  second->reduce.dst_row = (ptrdiff_t)(2 * c);
  in->rows = (size_t)p;
  in->dsts[0].off = base;
  in->dst_row = (ptrdiff_t)(2 * c);
  st->scratch = len / 2 + 2 * len; /* the first swap's lower half, the pairs, the fold's */
  fold_plan(h, p, base, len, st);
  halving_plan(h, p, base, len, st);
  st->count = 0; /* no stage after the steps */
  st->after.srcs[0].off = h->node < p ? base + 2 * (size_t)h->node * c : base;
  if (!st->unfolds) return;
  if (h->node < p) /* in place: row node + p of its pair */
    one_way(h, p, 0, base + (2 * (size_t)h->node + 1) * c, 0, c, &st->unfold);
  else /* lands where its pairs were */
    one_way(h, p, 0, base, base, c, &st->unfold);
}

/* Reduce-scatter on 2 nodes, gathered (direct.h): member m of the column
 * writes its rows from m blocks on (0 1 on node 0, 1 2 on node 1), so that
 * both offer the row the other needs at block 1 and an all-gather in place
 * lands the partner's at block 2 (node 0) or 0 (node 1): either way the
 * node's partials lie at blocks 0 and 2, node 0's first. */
static void swap_rows(const struct direct_hier* h, struct direct_staged* st) {
  size_t c = h->count, m = (size_t)h->node, o = 1 - m;
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

/* Both tasks one row per node between this rank's input or output and
 * its scratch rows (reduce-scatter: reduced in; all-gather: spread out). */
static void hier_blocks(const struct direct_hier* h, struct direct_staged* st) {
  size_t stride = h->stride ? h->stride : h->count, mine = (size_t)h->node * h->count;
  struct direct_task *in = &st->before, *out = &st->after;
  in->n = out->n = h->count;
  in->rows = out->rows = 1;
  st->scratch = (size_t)h->nnodes * h->count;
  st->count = h->count;
  st->column_coll = h->coll;
  st->post_task = -1;
  if (h->coll == COLL_REDUCESCATTER) {
    in->rows = (size_t)h->nnodes;
    in->nsrcs = refs_column(in->srcs, h, DIRECT_SEND, stride, &in->src_row);
    in->ndsts = 1, in->dsts[0] = ref(h->local, DIRECT_SCRATCH, 0);
    in->dst_row = (ptrdiff_t)h->count;
    st->send_off = 0, st->recv_off = mine;
    out->nsrcs = 1, out->srcs[0] = ref(h->local, DIRECT_SCRATCH, mine);
    out->ndsts = 1, out->dsts[0] = ref(h->local, DIRECT_RECV, 0);
    if (hier_halves(h))
      halving_rows(h, st);
    else if (hier_folds(h))
      fold_rows(h, st);
    else if (h->gathered)
      swap_rows(h, st);
  } else {
    in->nsrcs = 1, in->srcs[0] = ref(h->local, DIRECT_SEND, 0);
    in->ndsts = 1, in->dsts[0] = ref(h->local, DIRECT_SCRATCH, mine);
    st->send_off = mine, st->recv_off = 0;
    out->rows = (size_t)h->nnodes;
    out->nsrcs = 1, out->srcs[0] = ref(h->local, DIRECT_SCRATCH, 0);
    out->src_row = (ptrdiff_t)h->count;
    out->ndsts = refs_column(out->dsts, h, DIRECT_RECV, stride, &out->dst_row);
  }
}

/* Ranks on this rank's node (direct.h: more than the columns where nodes
 * differ in size). */
static int hier_node_ranks(const struct direct_hier* h) {
  return h->node_ranks > 0 ? h->node_ranks : h->nlocal;
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

/* A plan whose tasks are empty and whose stage between nodes moves
 * nothing (st zeroed): an index past the columns', or the start of one
 * that fills in what it does. */
static void hier_idle(struct direct_staged* st) {
  st->before.rows = st->after.rows = 1;
  st->post_task = -1;
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
  if (here != h->nlocal && h->coll != COLL_ALLREDUCE && h->coll != COLL_REDUCE &&
      h->coll != COLL_BROADCAST) {
    WARN("Direct: collective %d's Hier node stages need nodes of one size (%d ranks, %d columns)",
         h->coll, here, h->nlocal);
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
  switch (h->coll) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE:
      return hier_slice(h, st);
    case COLL_BROADCAST:
      return hier_broadcast(h, st);
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
      hier_blocks(h, st);
      return ncclSuccess;
    default:
      WARN("Direct: collective %d has no Hier plan", h->coll);
      return ncclInvalidArgument;
  }
}

int direct_column(const struct sched_topo* t, int local, int* first, int* step) {
  for (int j = 0; j < t->nnodes; j++)
    if (sched_topo_node_size(t, j) <= local) return 0;
  *first = t->order[t->node_start[0] + local];
  *step = t->nnodes > 1 ? t->order[t->node_start[1] + local] - *first : 0;
  for (int j = 2; j < t->nnodes; j++)
    if (t->order[t->node_start[j] + local] != *first + j * *step) return 0;
  return 1;
}
