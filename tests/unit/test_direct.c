/*
 * The direct algorithm's plans (algorithms/direct.c) run on host buffers:
 * every collective x 1..16 ranks x counts x alignments x roots, in place
 * and not. The ranks' tasks run one after another in reverse rank order,
 * and the outputs must equal the collective's definition; every output
 * element is written by exactly one task, and no task writes memory that
 * another rank's task reads or writes (so they may run at once: on a GPU
 * they do). Hier's node stages on devices (all-reduce, reduce-scatter,
 * all-gather, reduce, broadcast, on several layouts) run the same way around a stand-in for
 * the stage between nodes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "direct.h"
#include "layout.h"
#include "schedule.h"

#define MAXN 1030                     /* elements per block */
#define MAX_NODES 8                   /* Hier's tests (3, 5, 6, 7 fold; 8 canonical) */
#define MAX_RANKS 16                  /* 4 nodes x 4, 7 x 2, or one node of DIRECT_MAX_RANKS */
#define HIER_COUNT 67                 /* Hier's largest block */
#define HIER_SCRATCH (HIER_COUNT + 4) /* a block on whole vectors (align 4) */
#define MAX_ROWS 4 /* a column's rows a node on unequal nodes ({2, 4, 1, 3}: 4) */
#define SCRATCH_ELEMS (5 * MAX_NODES * MAX_ROWS * HIER_SCRATCH) /* a reduce-scatter fold's */

/* nnodes x ppn ranks placed by `topo` (one node for the flat plans). Tasks
 * name ranks by their index on their node. */
struct world {
  int coll, nnodes, ppn, root, inplace;
  int nranks;    /* 0: nnodes x ppn; else nodes of unequal sizes, ppn the smallest */
  int gathered;  /* Hier's stage between nodes only moves data */
  int canonical; /* reductions in the deterministic mode's tree, on inputs that show the order */
  size_t count, send_len, recv_len;
  float bonus; /* what the stand-in for the stage between nodes adds */
  struct sched_topo topo;
  float mem[MAX_RANKS][2 * MAX_RANKS * MAXN];
  float* send[MAX_RANKS];
  float* recv[MAX_RANKS];
  float in[MAX_RANKS][MAX_RANKS * MAXN]; /* the inputs, kept */
  unsigned char writes[MAX_RANKS][MAX_RANKS * MAXN];
  float scratch[MAX_RANKS][SCRATCH_ELEMS];
  struct direct_staged st[MAX_RANKS];                        /* Hier's plans */
  int32_t rows[MAX_RANKS][2 * MAX_NODES * DIRECT_MAX_RANKS]; /* their rows' tables */
};

static int nranks_of(const struct world* w) {
  return w->nranks ? w->nranks : w->nnodes * w->ppn;
}

static int node_size(const struct world* w, int node) {
  return sched_topo_node_size(&w->topo, node);
}

static int rank_at(const struct world* w, int node, int local) {
  return w->topo.order[w->topo.node_start[node] + local];
}

static float* resolve(struct world* w, int node, const struct direct_ref* ref) {
  int r = rank_at(w, node, ref->rank);
  if (ref->buf == DIRECT_SCRATCH) return w->scratch[r] + ref->off;
  return (ref->buf == DIRECT_SEND ? w->send[r] : w->recv[r]) + ref->off;
}

/* Elements [off, off + n) of the scratch of the rank at `local` on `node`
 * lie inside the scratch its plan asked for (a device would be written
 * past its allocation). */
static void scratch_fits(struct world* w, int node, int local, ptrdiff_t off, size_t n) {
  int r = rank_at(w, node, local);
  assert_true(off >= 0 && (size_t)off + n <= w->st[r].scratch);
}

/* The layout: rank r on node node_of[r] (NULL: all on one node). */
static void world_place(struct world* w, const int* node_of) {
  uint64_t hosts[MAX_RANKS];
  for (int r = 0; r < nranks_of(w); r++) hosts[r] = 100 + (uint64_t)(node_of ? node_of[r] : 0);
  assert_int_equal(sched_topo_init(&w->topo, nranks_of(w), hosts), ncclSuccess);
}

static void world_setup(struct world* w) {
  size_t c = w->count, n = (size_t)nranks_of(w);
  w->send_len = w->coll == COLL_REDUCESCATTER ? n * c : c;
  w->recv_len = w->coll == COLL_ALLGATHER ? n * c : c;
  memset(w->writes, 0, sizeof(w->writes));
  for (size_t r = 0; r < n; r++) {
    w->send[r] = w->mem[r];
    w->recv[r] = w->mem[r] + MAX_RANKS * MAXN;
    if (w->inplace && w->coll == COLL_ALLGATHER) w->send[r] = w->recv[r] + r * c;
    if (w->inplace && w->coll == COLL_REDUCESCATTER) w->recv[r] = w->send[r] + r * c;
    if (w->inplace && w->coll != COLL_ALLGATHER && w->coll != COLL_REDUCESCATTER)
      w->recv[r] = w->send[r];
    for (size_t i = 0; i < w->recv_len; i++) w->recv[r][i] = -1.0f;
    for (size_t i = 0; i < w->send_len; i++) /* canonical: sums that round by their order */
      w->in[r][i] = w->send[r][i] = w->canonical
                                        ? ldexpf((float)(1 + (r * 7919 + i * 104729) % 1000003),
                                                 (int)((r * 31 + i * 17) % 41) - 20)
                                        : (float)(r * 1000 + i % 997);
  }
}

/* One row of a task on the world's floats: up to DIRECT_MAX_RANKS
 * sources and destinations (a kernel task's, more than the CPU kernels
 * take). */
struct row_task {
  size_t n;
  int nsrcs, ndsts;
  int tree;
  const float* srcs[DIRECT_MAX_RANKS];
  float* dsts[DIRECT_MAX_RANKS];
};

/* The canonical tree over x[base, base + size) of x[0, n) (docs/
 * determinism.md): the lower half's value + the upper's, a half past n
 * none. */
static float tree_sum(const float* x, int n, int base, int size) {
  if (size == 1) return x[base];
  float a = tree_sum(x, n, base, size / 2);
  return base + size / 2 < n ? a + tree_sum(x, n, base + size / 2, size / 2) : a;
}

static int pow2_above(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

/* The row as the kernel runs it: a float sum chained in source order, or
 * (tree) in the canonical tree over them, one rounding a step, every
 * source of an element read before it is written (a destination may be a
 * source). */
static void row_run(const struct row_task* k) {
  for (size_t i = 0; i < k->n; i++) {
    float acc = k->srcs[0][i], x[DIRECT_MAX_RANKS];
    for (int s = 1; s < k->nsrcs; s++) acc += k->srcs[s][i];
    for (int s = 0; s < k->nsrcs && k->tree; s++) x[s] = k->srcs[s][i];
    if (k->tree) acc = tree_sum(x, k->nsrcs, 0, pow2_above(k->nsrcs));
    for (int d = 0; d < k->ndsts; d++) k->dsts[d][i] = acc;
  }
}

/* Row `row` of a task of a rank on `node`: where its operands are; 0
 * where the row is skipped. */
static int task_row(struct world* w, int node, const struct direct_task* t, size_t row,
                    struct row_task* k) {
  struct direct_task one;
  memset(k, 0, sizeof(*k));
  if (!direct_task_row(t, row, &one)) return 0;
  k->nsrcs = one.nsrcs, k->ndsts = one.ndsts, k->n = one.n, k->tree = one.tree;
  for (int s = 0; s < one.nsrcs; s++) {
    k->srcs[s] = resolve(w, node, &one.srcs[s]);
    if (one.srcs[s].buf == DIRECT_SCRATCH)
      scratch_fits(w, node, one.srcs[s].rank, (ptrdiff_t)one.srcs[s].off, one.n);
  }
  for (int d = 0; d < one.ndsts; d++) {
    k->dsts[d] = resolve(w, node, &one.dsts[d]);
    if (one.dsts[d].buf == DIRECT_SCRATCH)
      scratch_fits(w, node, one.dsts[d].rank, (ptrdiff_t)one.dsts[d].off, one.n);
  }
  return 1;
}

static int spans_meet(const void* a, size_t na, const void* b, size_t nb) {
  const float *pa = a, *pb = b;
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

/* No row of ta (a rank's task) writes what a row of tb (another rank's of
 * the same node, which may run meanwhile) reads or writes. */
static void check_pair(struct world* w, int node, const struct direct_task* ta,
                       const struct direct_task* tb) {
  struct row_task ka, kb;
  for (size_t i = 0; i < ta->rows; i++)
    for (size_t j = 0; j < tb->rows; j++) {
      if (!task_row(w, node, ta, i, &ka) || !task_row(w, node, tb, j, &kb)) continue;
      for (int d = 0; d < ka.ndsts; d++) {
        for (int s = 0; s < kb.nsrcs; s++)
          if (spans_meet(ka.dsts[d], ka.n, kb.srcs[s], kb.n))
            fail_msg("coll %d ppn %d: a task writes what another rank's reads", w->coll, w->ppn);
        for (int e = 0; e < kb.ndsts; e++)
          if (spans_meet(ka.dsts[d], ka.n, kb.dsts[e], kb.n))
            fail_msg("coll %d ppn %d: two ranks' tasks write the same bytes", w->coll, w->ppn);
      }
    }
}

/* Every row, counting the writes to receive buffers. */
static void run_task(struct world* w, int node, const struct direct_task* t) {
  struct row_task k;
  assert_true(t->rows >= 1);
  for (size_t row = 0; row < t->rows; row++) {
    struct direct_task one;
    if (!task_row(w, node, t, row, &k)) continue;
    direct_task_row(t, row, &one);
    for (int d = 0; d < one.ndsts; d++) {
      int r = rank_at(w, node, one.dsts[d].rank);
      if (one.dsts[d].buf == DIRECT_SCRATCH) continue;
      assert_int_equal(one.dsts[d].buf, DIRECT_RECV);
      size_t at = (size_t)((float*)k.dsts[d] - w->recv[r]);
      for (size_t i = 0; i < t->n; i++) w->writes[r][at + i]++;
    }
    if (k.nsrcs > 0) row_run(&k);
  }
}

/* Element i's sum over the ranks: exact, or (canonical) the tree's. */
static float sum_at(struct world* w, size_t i) {
  float s = 0, x[MAX_RANKS];
  int n = nranks_of(w);
  for (int r = 0; r < n; r++) s += w->in[r][i], x[r] = w->in[r][i];
  return w->canonical ? tree_sum(x, n, 0, pow2_above(n)) : s;
}

static float expected(struct world* w, int r, size_t i) {
  size_t c = w->count;
  switch (w->coll) {
    case COLL_ALLREDUCE:
      return sum_at(w, i) + w->bonus;
    case COLL_REDUCE:
      return r == w->root ? sum_at(w, i) : NAN;
    case COLL_BROADCAST:
      return w->in[w->root][i] + w->bonus;
    case COLL_REDUCESCATTER:
      return sum_at(w, (size_t)r * c + i) + w->bonus;
    default: /* all-gather */
      return w->in[i / c][i % c] + w->bonus;
  }
}

static void check_outputs(struct world* w) {
  for (int r = 0; r < nranks_of(w); r++)
    for (size_t i = 0; i < w->recv_len; i++) {
      float want = expected(w, r, i);
      if (want != want) { /* a non-root's reduce output: untouched */
        assert_int_equal(w->writes[r][i], 0);
        continue;
      }
      if (w->writes[r][i] != 1 || w->recv[r][i] != want)
        fail_msg(
            "coll %d %dx%d count %zu root %d inplace %d: rank %d [%zu] = %g (written %d), "
            "want %g",
            w->coll, w->nnodes, w->ppn, w->count, w->root, w->inplace, r, i, w->recv[r][i],
            w->writes[r][i], want);
    }
}

static void test_direct_plans(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 7, 1001, MAXN};
  static const size_t aligns[] = {1, 4};
  struct world* w = calloc(1, sizeof(*w));
  struct direct_task t[DIRECT_MAX_RANKS];
  int cases = 0;
  w->nnodes = 1;
  for (w->ppn = 1; w->ppn <= DIRECT_MAX_RANKS; w->ppn++) {
    int n = w->ppn;
    world_place(w, NULL);
    for (w->coll = 0; w->coll < COLL_COUNT; w->coll++)
      for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
        for (size_t ai = 0; ai < 2; ai++)
          for (w->inplace = 0; w->inplace < 2; w->inplace++) {
            w->count = counts[ci];
            w->root = (int)(ci + ai) % n;
            world_setup(w);
            for (int r = 0; r < n; r++)
              assert_int_equal(direct_plan(w->coll, r, n, w->root, w->count, 0, aligns[ai], &t[r]),
                               ncclSuccess);
            for (int a = 0; a < n; a++)
              for (int b = 0; b < n; b++)
                if (a != b) check_pair(w, 0, &t[a], &t[b]);
            for (int r = n - 1; r >= 0; r--) run_task(w, 0, &t[r]);
            check_outputs(w);
            cases++;
          }
    sched_topo_free(&w->topo);
  }
  print_message("%d direct cases\n", cases);
  free(w);
}

/* ---- Hier's node stages (direct_plan_hier) ---- */

/* The stage between nodes, a stand-in: each plan's column collective
 * along each column on the scratches (send_off, recv_off, count, stride of
 * each member's plan), and + bonus on every result, which the outputs
 * must show. An all-gather in place writes every block, its own too. */
static void stage_between(struct world* w) {
  static float tmp[MAX_NODES][MAX_NODES * MAX_ROWS * HIER_SCRATCH];
  for (int l = 0; l < w->ppn; l++) {
    const struct direct_staged* st = &w->st[rank_at(w, 0, l)];
    int coll = st->column_coll, m = w->nnodes;
    size_t c = st->count, stride = st->stride ? st->stride : c;
    size_t out = coll == COLL_ALLGATHER ? (size_t)(m - 1) * stride + c : c;
    assert_true(out <= sizeof(tmp[0]) / sizeof(float));
    for (int j = 0; j < w->nnodes; j++) {
      const struct direct_staged* sj = &w->st[rank_at(w, j, l)];
      assert_true(sj->count == c && sj->column_coll == coll && sj->stride == st->stride);
      assert_true(coll != COLL_BROADCAST || sj->column_root == st->column_root);
    }
    for (int j = 0; j < m; j++) {
      const struct direct_staged* sj = &w->st[rank_at(w, j, l)];
      int from = rank_at(w, st->column_root, l); /* a broadcast's */
      for (size_t i = 0; i < out; i++) {
        float v = coll == COLL_BROADCAST ? w->scratch[from][w->st[from].send_off + i] : 0;
        for (int q = 0; q < m && coll != COLL_ALLGATHER && coll != COLL_BROADCAST; q++) {
          size_t at = coll == COLL_REDUCESCATTER ? (size_t)j * c + i : i;
          v += w->scratch[rank_at(w, q, l)][w->st[rank_at(w, q, l)].send_off + at];
        }
        if (coll == COLL_ALLGATHER) {
          int q = (int)(i / stride);
          if (i % stride >= c) { /* between blocks: left as it was */
            tmp[j][i] = w->scratch[rank_at(w, j, l)][sj->recv_off + i];
            continue;
          }
          v = w->scratch[rank_at(w, q, l)][w->st[rank_at(w, q, l)].send_off + i % stride];
        }
        tmp[j][i] = v + w->bonus;
      }
    }
    for (int j = 0; j < m; j++) {
      int r = rank_at(w, j, l);
      memcpy(w->scratch[r] + w->st[r].recv_off, tmp[j], out * sizeof(float));
    }
  }
}

/* The column's rank on the other node of step s of rank r. */
static int step_partner(struct world* w, int r, const struct direct_step* s) {
  return rank_at(w, s->member ? s->lower : s->upper, w->topo.local_of[r]);
}

/* Both ends agree on the step: nodes, sides, size, direction. */
static void step_check(const struct direct_step* s, const struct direct_step* q) {
  assert_true(q->lower == s->lower && q->upper == s->upper && q->member == 1 - s->member &&
              q->count == s->count && q->from == s->from && q->lower < q->upper);
  if (s->from < 0) assert_true(s->recv_off + (size_t)s->member * s->count == s->send_off);
}

/* What rank r receives in step s from p (at q): the partner's half of a
 * swap, beside its own (in place), or a one-way step's data. */
static void step_move(struct world* w, int r, const struct direct_step* s, int p,
                      const struct direct_step* q) {
  size_t at = s->recv_off + (s->from < 0 ? (size_t)q->member * s->count : 0);
  assert_true(at + s->count <= w->st[r].scratch && q->send_off + s->count <= w->st[p].scratch);
  if (s->from < 0 || s->from != s->member)
    memcpy(w->scratch[r] + at, w->scratch[p] + q->send_off, s->count * sizeof(float));
}

/* Every plan's steps (a fold's and a halving's), a rank and its partner
 * taking a step together once both reach it: both moves, then both
 * reduces. A step its partner never reaches fails (a real run would wait
 * for it forever). */
static void pair_steps(struct world* w) {
  int n = nranks_of(w), next[MAX_RANKS] = {0}, left = 1;
  while (left) {
    int progressed = 0;
    left = 0;
    for (int r = 0; r < n; r++) {
      if (next[r] >= w->st[r].nsteps) continue;
      left = 1;
      const struct direct_step* s = &w->st[r].steps[next[r]];
      if (s->from == DIRECT_STEP_LOCAL) { /* its reduce alone */
        assert_true(s->lower == w->topo.node_of[r] && s->upper == s->lower && s->count == 0);
        run_task(w, w->topo.node_of[r], &s->reduce);
        next[r]++, progressed = 1;
        continue;
      }
      int p = step_partner(w, r, s);
      const struct direct_step* q = next[p] < w->st[p].nsteps ? &w->st[p].steps[next[p]] : NULL;
      if (q == NULL || q->lower != s->lower || q->upper != s->upper) continue;
      step_check(s, q);
      step_move(w, r, s, p, q);
      step_move(w, p, q, r, s);
      if (s->reduce.rows) run_task(w, w->topo.node_of[r], &s->reduce);
      if (q->reduce.rows) run_task(w, w->topo.node_of[p], &q->reduce);
      next[r]++, next[p]++, progressed = 1;
    }
    assert_true(progressed || !left);
  }
}

/* A fold's last step (direct.h): the total back to the upper node. */
static void unfold_steps(struct world* w) {
  for (int r = 0; r < nranks_of(w); r++) {
    const struct direct_step* s = &w->st[r].unfold;
    if (!w->st[r].unfolds) continue;
    int p = step_partner(w, r, s);
    assert_true(w->st[p].unfolds);
    step_check(s, &w->st[p].unfold);
    assert_true(s->from == 0 && s->reduce.rows == 0);
    step_move(w, r, s, p, &w->st[p].unfold);
  }
}

/* Every rank's plan; its tasks checked against the others' of its node. */
static void plan_hier(struct world* w) {
  assert_true(direct_hier_rows_size(&w->topo) <= sizeof(w->rows[0]) / sizeof(int32_t));
  for (int node = 0; node < w->nnodes; node++) {
    int here = node_size(w, node);
    for (int l = 0; l < here; l++) {
      int r = rank_at(w, node, l);
      struct direct_hier h = {.coll = w->coll,
                              .local = l,
                              .nlocal = w->ppn,
                              .node_ranks = here,
                              .node = node,
                              .nnodes = w->nnodes,
                              .count = w->count,
                              .align = 4,
                              .gathered = w->gathered,
                              .canonical = w->canonical,
                              .root_node = w->topo.node_of[w->root],
                              .root_local = w->topo.local_of[w->root],
                              .topo = &w->topo,
                              .rows_at = w->rows[r]};
      direct_hier_rows(&w->topo, l, w->rows[r]);
      assert_int_equal(direct_plan_hier(&h, &w->st[r]), ncclSuccess);
      assert_true(w->st[r].scratch <= SCRATCH_ELEMS);
    }
    for (int a = 0; a < here; a++)
      for (int b = 0; b < here; b++) {
        const struct direct_staged *sa = &w->st[rank_at(w, node, a)],
                                   *sb = &w->st[rank_at(w, node, b)];
        if (a == b) continue;
        check_pair(w, node, &sa->before, &sb->before);
        check_pair(w, node, &sa->after, &sb->before);
        check_pair(w, node, &sb->before, &sa->after);
        check_pair(w, node, &sa->after, &sb->after);
      }
  }
}

/* Node of rank r of m nodes x ppn: node-major, round-robin, mirrored
 * (node j holds ranks j and 2m-1-j, ...: columns step up, then down), or
 * skewed (row q of m ranks shifted q nodes on: from 3 nodes, the columns
 * but the first are not evenly spaced, and their rows go by table). */
static int layout_node(int kind, int r, int m, int ppn) {
  if (kind == 0) return r / ppn;
  if (kind == 1) return r % m;
  if (kind == 2) return (r / m) % 2 ? m - 1 - r % m : r % m;
  return (r % m + r / m) % m;
}

/* The plans' checks and runs of test_direct_hier on the world as placed
 * (the ranks' tasks before, the steps, the stand-in, the unfold, the
 * tasks after). */
static void hier_run(struct world* w) {
  int n = nranks_of(w);
  world_setup(w);
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < SCRATCH_ELEMS; i++) w->scratch[r][i] = NAN;
  plan_hier(w);
  for (int r = n - 1; r >= 0; r--) run_task(w, w->topo.node_of[r], &w->st[r].before);
  pair_steps(w);
  stage_between(w);
  unfold_steps(w);
  for (int r = 0; r < n; r++) run_task(w, w->topo.node_of[r], &w->st[r].after);
  check_outputs(w);
}

/* Hier on every layout kind x 2..7 nodes x 1..4 ranks each x counts x in
 * place (a reduce's root moving), its stage between nodes reducing or only
 * moving data (gathered, the only way a reduce goes:
 * no bonus, the scratch NaN first, so a row the stage did not bring shows):
 * each node's tasks, a stand-in for the stage between nodes, the outputs
 * by definition, each written once. */
static void test_direct_hier(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 7, HIER_COUNT};
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_ALLGATHER, COLL_REDUCE,
                              COLL_BROADCAST};
  const int ncolls = (int)(sizeof(colls) / sizeof(colls[0]));
  struct world* w = calloc(1, sizeof(*w));
  int cases = 0;
  for (int kind = 0; kind < 4; kind++)
    for (w->nnodes = 2; w->nnodes <= 7; w->nnodes++)
      for (w->ppn = 1; w->ppn <= MAX_RANKS / w->nnodes && w->ppn <= 4; w->ppn++) {
        int node_of[MAX_RANKS], n = nranks_of(w);
        for (int r = 0; r < n; r++) node_of[r] = layout_node(kind, r, w->nnodes, w->ppn);
        world_place(w, node_of);
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
          for (int k = 0; k < 2 * ncolls; k++)
            for (w->inplace = 0; w->inplace < 2; w->inplace++) {
              w->coll = colls[k % ncolls];
              w->gathered = k >= ncolls;
              w->root = (int)(ci + (size_t)k) % n;
              if (w->coll == COLL_REDUCE && !w->gathered) continue;   /* gathered only */
              if (w->gathered && w->coll == COLL_ALLGATHER) continue; /* moves data anyway */
              if (w->gathered) assert_true(direct_hier_gathers(w->coll, w->nnodes));
              w->bonus = w->gathered ? 0.0f : 0.5f;
              w->count = counts[ci];
              hier_run(w);
              cases++;
            }
        sched_topo_free(&w->topo);
      }
  print_message("%d Hier cases\n", cases);
  free(w);
}

/* The deterministic mode's order (direct.h, `canonical`): all-reduce,
 * reduce-scatter and reduce on one node of 1 to 16 ranks (Direct's task
 * with the tree), and Hier on 2, 4 and 8 nodes of 1 to 8 ranks,
 * node-major, gathered, on inputs whose sums round by their order: every
 * output is the canonical tree's over the ranks, to the bit; the same
 * plans without the tree, or with the halving in its plain order, give
 * other bits. Other shapes are refused. */
static void test_direct_hier_canonical(void** state) {
  (void)state;
  static const size_t counts[] = {1, 7, HIER_COUNT};
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE};
  struct world* w = calloc(1, sizeof(*w));
  int cases = 0;
  w->canonical = w->gathered = 1;
  for (w->nnodes = 2; w->nnodes <= 8; w->nnodes *= 2)
    for (w->ppn = 1; w->nnodes * w->ppn <= MAX_RANKS; w->ppn *= 2) {
      int node_of[MAX_RANKS], n = nranks_of(w);
      for (int r = 0; r < n; r++) node_of[r] = r / w->ppn;
      world_place(w, node_of);
      for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
        for (int k = 0; k < 3; k++)
          for (w->inplace = 0; w->inplace < 2; w->inplace++, cases++) {
            w->coll = colls[k];
            w->count = counts[ci];
            w->root = (int)(ci + (size_t)k) % n;
            hier_run(w);
          }
      sched_topo_free(&w->topo);
    }
  w->nnodes = 1; /* one node: Direct's task with the tree */
  for (w->ppn = 1; w->ppn <= DIRECT_MAX_RANKS; w->ppn++) {
    struct direct_task t[DIRECT_MAX_RANKS];
    int n = w->ppn;
    world_place(w, NULL);
    for (int k = 0; k < 3; k++, cases++) {
      w->coll = colls[k], w->count = HIER_COUNT, w->root = k % n, w->inplace = k & 1;
      world_setup(w);
      for (int r = 0; r < n; r++) {
        assert_int_equal(direct_plan(w->coll, r, n, w->root, w->count, 0, 4, &t[r]), ncclSuccess);
        t[r].tree = 1;
      }
      for (int r = n - 1; r >= 0; r--) run_task(w, 0, &t[r]);
      check_outputs(w);
    }
    sched_topo_free(&w->topo);
  }
  print_message("%d canonical cases\n", cases);
  /* refused: 3 nodes, nodes of 3 ranks, a stage between nodes that reduces */
  struct direct_staged st;
  struct direct_hier h = {.coll = COLL_ALLREDUCE,
                          .nlocal = 2,
                          .nnodes = 3,
                          .count = 8,
                          .align = 4,
                          .gathered = 1,
                          .canonical = 1};
  assert_int_equal(direct_plan_hier(&h, &st), ncclInvalidArgument);
  h.nnodes = 2, h.nlocal = 3;
  assert_int_equal(direct_plan_hier(&h, &st), ncclInvalidArgument);
  h.nlocal = 2, h.gathered = 0;
  assert_int_equal(direct_plan_hier(&h, &st), ncclInvalidArgument);
  h.gathered = 1;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.before.tree && st.after.tree);
  free(w);
}

/* Nodes of unequal sizes (direct.h): the columns the smallest node's
 * indexes, the others' ranks past them with nothing to do, their inputs
 * read and outputs written by their node's columns (a reduce-scatter's
 * and an all-gather's as more rows of the column, some junk); 2 to 5
 * nodes (a fold on 3 and 5), the stage between nodes reducing or
 * gathered, node-major and round-robin, every root (a reduce's and a
 * broadcast's). */
static void test_direct_hier_uneven(void** state) {
  (void)state;
  static const int sizes[][6] = {{2, 1},          {1, 3}, {3, 2, 2}, {2, 4, 1, 3},
                                 {3, 3, 1, 2, 2}, {9, 3}, {3, 11}};
  static const size_t counts[] = {0, 1, 7, HIER_COUNT};
  struct world* w = calloc(1, sizeof(*w));
  int cases = 0;
  for (size_t li = 0; li < sizeof(sizes) / sizeof(sizes[0]); li++)
    for (int rr = 0; rr < 2; rr++) {
      int node_of[MAX_RANKS], left[6], n = 0;
      w->nnodes = 0, w->ppn = MAX_RANKS;
      for (int j = 0; j < 6 && sizes[li][j] > 0; j++, w->nnodes++) {
        left[j] = sizes[li][j];
        n += sizes[li][j];
        if (sizes[li][j] < w->ppn) w->ppn = sizes[li][j];
      }
      for (int r = 0, j = 0; r < n; r++, j = rr ? (j + 1) % w->nnodes : j) {
        while (left[j] == 0) j = (j + 1) % w->nnodes; /* round-robin over those with room */
        node_of[r] = j;
        left[j]--;
      }
      w->nranks = n;
      world_place(w, node_of);
      for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
        for (int k = 0; k < 7; k++)
          for (w->inplace = 0; w->inplace < 2; w->inplace++) {
            static const int colls[] = {COLL_ALLREDUCE,    COLL_REDUCESCATTER, COLL_ALLGATHER,
                                        COLL_ALLREDUCE,    COLL_REDUCE,        COLL_BROADCAST,
                                        COLL_REDUCESCATTER};
            w->coll = colls[k];
            w->gathered = k >= 3;
            w->bonus = w->gathered ? 0.0f : 0.5f;
            w->count = counts[ci];
            for (w->root = 0; w->root < (w->coll == COLL_ALLREDUCE ? 1 : n); w->root++, cases++)
              hier_run(w);
          }
      sched_topo_free(&w->topo);
    }
  print_message("%d uneven Hier cases\n", cases);
  free(w);
}

/* A layout of nodes by host, and index `local`'s rows' table on it. */
static int32_t* layout_rows(struct sched_topo* t, int n, const uint64_t* hosts, int local) {
  int32_t* at;
  assert_int_equal(sched_topo_init(t, n, hosts), ncclSuccess);
  at = calloc(direct_hier_rows_size(t), sizeof(int32_t));
  assert_non_null(at);
  direct_hier_rows(t, local, at);
  return at;
}

/* Index `local`'s rows on nnodes nodes of ppn ranks, node-major. */
static int32_t* node_major_rows(struct sched_topo* t, int nnodes, int ppn, int local) {
  int n = nnodes * ppn;
  uint64_t* hosts = malloc((size_t)n * sizeof(uint64_t));
  assert_non_null(hosts);
  for (int r = 0; r < n; r++) hosts[r] = 100 + (uint64_t)(r / ppn);
  int32_t* at = layout_rows(t, n, hosts, local);
  free(hosts);
  return at;
}

/* A reduce-scatter of 8 elements a block on `nnodes` nodes of layout t,
 * index 0 of `nlocal` columns on node 0, on whole vectors of 4. */
static struct direct_hier rs_hier(const struct sched_topo* t, int nlocal, int nnodes) {
  return (struct direct_hier){.coll = COLL_REDUCESCATTER,
                              .nlocal = nlocal,
                              .nnodes = nnodes,
                              .count = 8,
                              .align = 4,
                              .topo = t};
}

/* The rows' tables: evenly spaced columns (node-major, round-robin) give
 * plans that read none; a column out of step (nodes {0,1} {2,4} {3,5})
 * and nodes of unequal sizes ({0,1,2} {3}: three rows a node, node 1's
 * second and third junk) give tables the tasks read. */
static void test_direct_rows(void** state) {
  (void)state;
  static const uint64_t node_major[] = {7, 7, 8, 8, 9, 9}, round_robin[] = {7, 8, 9, 7, 8, 9};
  static const uint64_t skewed[] = {7, 7, 8, 9, 8, 9}, unequal[] = {7, 7, 7, 8};
  struct sched_topo t;
  struct direct_staged st;
  struct direct_hier h = rs_hier(&t, 2, 3);
  int32_t* at = layout_rows(&t, 6, node_major, 1);
  h.local = 1, h.node_ranks = 2;
  assert_true(direct_hier_rows_size(&t) == 9 && at[0] == 1 && at[1] == 3 && at[2] == 5);
  h.rows_at = at;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.before.src_at == NULL && st.before.srcs[0].off == 8 && st.before.src_row == 16);
  sched_topo_free(&t), free(at);
  at = layout_rows(&t, 6, round_robin, 1);
  assert_true(at[0] == 3 && at[1] == 4 && at[2] == 5);
  sched_topo_free(&t), free(at);
  at = layout_rows(&t, 6, skewed, 0);
  assert_true(at[0] == 0 && at[1] == 2 && at[2] == 3);
  h.rows_at = at, h.local = 0, h.coll = COLL_ALLGATHER;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.after.dst_at == at && st.after.rows == 3 && st.before.src_at == NULL);
  sched_topo_free(&t), free(at);
  at = layout_rows(&t, 4, unequal, 0);
  assert_true(direct_hier_rows_size(&t) == 18 && at[0] == 0 && at[1] == 1 && at[2] == 2 &&
              at[3] == 3 && at[4] == -1 && at[5] == -1);
  h.rows_at = at, h.nlocal = 1, h.nnodes = 2, h.node_ranks = 3, h.coll = COLL_REDUCESCATTER;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.before.src_at == at && st.before.rows == 6 && st.after.rows == 3 &&
              st.after.spread == DIRECT_SPREAD_DSTS && st.count == 3 * h.count);
  h.local = 2; /* past the column: nothing */
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.before.n == 0 && st.after.n == 0 && st.count == 0 && st.nsteps == 0);
  h.rows_at = NULL; /* a reduce-scatter needs them */
  assert_int_equal(direct_plan_hier(&h, &st), ncclInvalidArgument);
  sched_topo_free(&t), free(at);
}

static void test_direct_limits(void** state) {
  (void)state;
  struct direct_task t;
  assert_int_equal(direct_plan(COLL_ALLREDUCE, 0, DIRECT_MAX_RANKS + 1, 0, 10, 0, 1, &t),
                   ncclInvalidArgument);
  assert_int_equal(direct_plan(COLL_ALLREDUCE, 3, 2, 0, 10, 0, 1, &t), ncclInvalidArgument);
  /* slices start on the alignment: rank 1 of 3 over 10 elements, 4-aligned */
  assert_int_equal(direct_plan(COLL_ALLREDUCE, 1, 3, 0, 10, 0, 4, &t), ncclSuccess);
  assert_true(t.srcs[0].off == 4 && t.n == 4);
  assert_int_equal(direct_plan(COLL_ALLREDUCE, 2, 3, 0, 10, 0, 4, &t), ncclSuccess);
  assert_true(t.srcs[0].off == 8 && t.n == 2);
  /* gathered: a reduce-scatter swaps rows between 2 nodes, halves, or
   * folds: on 3 nodes node 0's task before writes rows 0 and 1 two rows
   * apart, a local step row 2 between them, node 2's pairs come, one
   * halving step, row 2 goes back; an all-reduce on 2 nodes has its task
   * after reduce a row per node */
  struct direct_staged st;
  struct sched_topo topo;
  struct direct_hier h = rs_hier(&topo, 2, 3);
  int32_t* at = node_major_rows(&topo, 3, 2, 0);
  h.gathered = 1;
  h.rows_at = at;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.before.rows == 2 && st.before.dst_row == 16 && st.nsteps == 3 &&
              st.steps[0].from == DIRECT_STEP_LOCAL && st.steps[0].reduce.rows == 1 &&
              st.steps[0].reduce.dsts[0].off == st.before.dsts[0].off + 8 &&
              st.steps[1].from == 1 && st.steps[2].from == -1 && st.post_task == 3 &&
              st.count == 0 && st.unfolds && st.unfold.count == 8 &&
              st.unfold.send_off == st.before.dsts[0].off + 8);
  h.node = 2;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.nsteps == 2 && st.steps[1].member == 1 && st.unfolds && st.post_task == -1 &&
              st.after.srcs[0].off == st.unfold.recv_off);
  h.node = 0;
  h.nnodes = DIRECT_MAX_NODES - 1; /* folds onto 8192: local, fold, 13 halvings */
  sched_topo_free(&topo), free(at);
  h.rows_at = at = node_major_rows(&topo, h.nnodes, 2, 0);
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.nsteps == 15 && st.post_task == 15 && st.before.src_at == NULL);
  h.coll = COLL_ALLREDUCE, h.nnodes = DIRECT_MAX_NODES + 1;
  assert_int_equal(direct_plan_hier(&h, &st), ncclInvalidArgument);
  h.nnodes = 2;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.column_coll == COLL_ALLGATHER && st.after.nsrcs == 2 && st.nsteps == 0 &&
              st.post_task == 1);
  /* 7 nodes fold onto 4: node 0 takes node 4's partial, halves twice,
   * doubles twice (swaps that reduce nothing) and sends node 4 the total;
   * node 3 only halves and doubles; node 5 sends its partial and gets the
   * total, divided */
  h.nnodes = 7, h.count = 1000;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.nsteps == 5 && st.steps[0].from == 1 && st.steps[0].member == 0 &&
              st.steps[0].upper == 4 && st.steps[0].reduce.n > 0 && st.steps[1].from == -1 &&
              st.post_task == 3 && st.steps[3].upper == 1 && st.steps[3].reduce.n == 0 &&
              st.steps[4].upper == 2 && st.steps[4].count == 2 * st.steps[3].count &&
              st.count == 0 && st.unfolds && st.unfold.from == 0 && st.unfold.upper == 4);
  h.node = 3;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.nsteps == 4 && !st.unfolds && st.post_task == 2);
  h.node = 5;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.nsteps == 1 && st.steps[0].member == 1 && st.steps[0].lower == 1 &&
              st.steps[0].reduce.n == 0 && st.count == 0 && st.unfolds && st.post_task == -1);
  h.node = 0;
  /* a power of two halves and doubles: 2 log2 steps, the last halving's
   * reduce divides */
  h.nnodes = DIRECT_MAX_NODES, h.node = DIRECT_MAX_NODES - 1, h.count = 1000;
  assert_int_equal(direct_plan_hier(&h, &st), ncclSuccess);
  assert_true(st.nsteps == DIRECT_MAX_STEPS && st.post_task == DIRECT_MAX_STEPS / 2 &&
              st.after.nsrcs == 1 && st.steps[0].member == 1 && st.steps[0].lower == h.node / 2);
  h.coll = COLL_REDUCESCATTER, h.nnodes = 2 * DIRECT_MAX_NODES;
  assert_int_equal(direct_plan_hier(&h, &st), ncclInvalidArgument);
  sched_topo_free(&topo), free(at);
}

/* Whether node `other` is among the partners direct_stage_partners gives
 * `node` (what a unit connects and asks to move device memory). */
static int is_partner(int coll, int n, int node, int other) {
  int nodes[DIRECT_MAX_PARTNERS], k = direct_stage_partners(coll, n, node, nodes);
  for (int i = 0; i < k; i++)
    if (nodes[i] == other) return 1;
  return 0;
}

/* Every node's gathered plan on `n` nodes of one rank, the steps taken as
 * pair_steps takes them, without data: each step meets its partner's
 * (same nodes, opposite sides, same size), among the partners the unit
 * connects, and none waits forever. */
static void steps_meet(int coll, int n) {
  struct direct_staged* st = calloc((size_t)n, sizeof(*st));
  int *next = calloc((size_t)n, sizeof(int)), left = 1;
  struct sched_topo topo;
  int32_t* at = node_major_rows(&topo, n, 1, 0);
  assert_non_null(st);
  assert_non_null(next);
  for (int j = 0; j < n; j++) {
    struct direct_hier h = {.coll = coll,
                            .nlocal = 1,
                            .node = j,
                            .nnodes = n,
                            .count = 5,
                            .align = 4,
                            .gathered = 1,
                            .root_node = n / 3,
                            .topo = &topo,
                            .rows_at = at};
    assert_int_equal(direct_plan_hier(&h, &st[j]), ncclSuccess);
  }
  while (left) {
    int progressed = 0;
    left = 0;
    for (int j = 0; j < n; j++) {
      if (next[j] >= st[j].nsteps) continue;
      left = 1;
      const struct direct_step* s = &st[j].steps[next[j]];
      if (s->from == DIRECT_STEP_LOCAL) {
        next[j]++, progressed = 1;
        continue;
      }
      int p = s->member ? s->lower : s->upper;
      const struct direct_step* q = next[p] < st[p].nsteps ? &st[p].steps[next[p]] : NULL;
      if (q == NULL || q->lower != s->lower || q->upper != s->upper) continue;
      step_check(s, q);
      assert_true(is_partner(coll, n, j, p) && is_partner(coll, n, p, j));
      next[j]++, next[p]++, progressed = 1;
    }
    assert_true(progressed || !left);
  }
  for (int j = 0; j < n; j++)
    if (st[j].unfolds) {
      int p = st[j].unfold.member ? st[j].unfold.lower : st[j].unfold.upper;
      step_check(&st[j].unfold, &st[p].unfold);
      assert_true(is_partner(coll, n, j, p));
    }
  free(next);
  free(st);
  free(at);
  sched_topo_free(&topo);
}

/* Past the node counts test_direct_hier runs with data: the steps of
 * every reduction still pair up, to a fold onto 512 of 1000 nodes. */
static void test_direct_hier_scale(void** state) {
  (void)state;
  int nodes[DIRECT_MAX_PARTNERS]; /* the most partners: 14 on 16384 nodes, 14 folding on 16383 */
  assert_int_equal(direct_stage_partners(COLL_ALLREDUCE, DIRECT_MAX_NODES, 5, nodes), 14);
  assert_int_equal(direct_stage_partners(COLL_REDUCESCATTER, DIRECT_MAX_NODES - 1, 0, nodes), 14);
  assert_int_equal(direct_stage_partners(COLL_ALLGATHER, 3, 0, nodes), 2);
  static const int counts[] = {64, 65, 100, 128, 1000};
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE};
  for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
    for (size_t k = 0; k < sizeof(colls) / sizeof(colls[0]); k++) steps_meet(colls[k], counts[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_direct_plans),          cmocka_unit_test(test_direct_hier),
      cmocka_unit_test(test_direct_hier_scale),     cmocka_unit_test(test_direct_rows),
      cmocka_unit_test(test_direct_limits),         cmocka_unit_test(test_direct_hier_uneven),
      cmocka_unit_test(test_direct_hier_canonical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
