/*
 * The direct algorithm's plans (algorithms/direct.c) run on host buffers:
 * every collective x 1..8 ranks x counts x alignments x roots, in place
 * and not. The ranks' tasks run one after another in reverse rank order,
 * and the outputs must equal the collective's definition; every output
 * element is written by exactly one task, and no task writes memory that
 * another rank's task reads or writes (so they may run at once: on a GPU
 * they do). Hier's node stages on devices (all-reduce, reduce-scatter,
 * all-gather, on several layouts) run the same way around a stand-in for
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
#include "kernels.h"
#include "schedule.h"

#define MAXN 1030

struct world {
  int coll, n, root, inplace;
  size_t count, send_len, recv_len;
  float mem[DIRECT_MAX_RANKS][2 * DIRECT_MAX_RANKS * MAXN];
  float* send[DIRECT_MAX_RANKS];
  float* recv[DIRECT_MAX_RANKS];
  float in[DIRECT_MAX_RANKS][DIRECT_MAX_RANKS * MAXN]; /* the inputs, kept */
  unsigned char writes[DIRECT_MAX_RANKS][DIRECT_MAX_RANKS * MAXN];
  float scratch[DIRECT_MAX_RANKS][MAXN];
};

static float* resolve(struct world* w, const struct direct_ref* r) {
  if (r->buf == DIRECT_SCRATCH) return w->scratch[r->rank] + r->off;
  return (r->buf == DIRECT_SEND ? w->send[r->rank] : w->recv[r->rank]) + r->off;
}

static void world_setup(struct world* w) {
  size_t c = w->count, n = (size_t)w->n;
  w->send_len = w->coll == COLL_REDUCESCATTER ? n * c : c;
  w->recv_len = w->coll == COLL_ALLGATHER ? n * c : c;
  memset(w->writes, 0, sizeof(w->writes));
  for (int r = 0; r < w->n; r++) {
    w->send[r] = w->mem[r];
    w->recv[r] = w->mem[r] + DIRECT_MAX_RANKS * MAXN;
    if (w->inplace && w->coll == COLL_ALLGATHER) w->send[r] = w->recv[r] + (size_t)r * c;
    if (w->inplace && w->coll == COLL_REDUCESCATTER) w->recv[r] = w->send[r] + (size_t)r * c;
    if (w->inplace && w->coll != COLL_ALLGATHER && w->coll != COLL_REDUCESCATTER)
      w->recv[r] = w->send[r];
    for (size_t i = 0; i < w->recv_len; i++) w->recv[r][i] = -1.0f;
    for (size_t i = 0; i < w->send_len; i++)
      w->in[r][i] = w->send[r][i] = (float)(r * 1000 + (int)(i % 997));
  }
}

/* Whether two refs' element ranges share memory. */
static int refs_overlap(struct world* w, const struct direct_ref* a, size_t na,
                        const struct direct_ref* b, size_t nb) {
  const float *pa = resolve(w, a), *pb = resolve(w, b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

/* Task ta (rank a's) writes nothing task tb (rank b's) reads or writes. */
static void check_pair(struct world* w, const struct direct_task* ta, int a,
                       const struct direct_task* tb, int b) {
  for (int d = 0; d < ta->ndsts; d++) {
    for (int s = 0; s < tb->nsrcs; s++)
      if (refs_overlap(w, &ta->dsts[d], ta->n, &tb->srcs[s], tb->n))
        fail_msg("coll %d n %d: rank %d writes what rank %d reads", w->coll, w->n, a, b);
    for (int e = 0; e < tb->ndsts; e++)
      if (refs_overlap(w, &ta->dsts[d], ta->n, &tb->dsts[e], tb->n))
        fail_msg("coll %d n %d: ranks %d and %d write the same bytes", w->coll, w->n, a, b);
  }
}

/* No task writes what another rank's task reads or writes. */
static void check_disjoint(struct world* w, const struct direct_task* t) {
  for (int a = 0; a < w->n; a++)
    for (int b = 0; b < w->n; b++)
      if (a != b) check_pair(w, &t[a], a, &t[b], b);
}

static void run_task(struct world* w, const struct direct_task* t) {
  struct kern_task k;
  memset(&k, 0, sizeof(k));
  k.redop.type = ncclFloat32;
  k.redop.op = KERN_SUM;
  k.nsrcs = t->nsrcs;
  k.ndsts = t->ndsts;
  k.n = t->n;
  for (int s = 0; s < t->nsrcs; s++) k.srcs[s] = resolve(w, &t->srcs[s]);
  for (int d = 0; d < t->ndsts; d++) {
    k.dsts[d] = resolve(w, &t->dsts[d]);
    const struct direct_ref* r = &t->dsts[d];
    if (r->buf == DIRECT_SCRATCH) continue;
    assert_int_equal(r->buf, DIRECT_RECV);
    for (size_t i = 0; i < t->n; i++) w->writes[r->rank][r->off + i]++;
  }
  kern_task_run(&k);
}

static float sum_at(struct world* w, size_t i) {
  float s = 0;
  for (int k = 0; k < w->n; k++) s += w->in[k][i];
  return s;
}

static float expected(struct world* w, int r, size_t i) {
  size_t c = w->count;
  switch (w->coll) {
    case COLL_ALLREDUCE:
      return sum_at(w, i);
    case COLL_REDUCE:
      return r == w->root ? sum_at(w, i) : NAN;
    case COLL_BROADCAST:
      return w->in[w->root][i];
    case COLL_REDUCESCATTER:
      return sum_at(w, (size_t)r * c + i);
    default: /* all-gather */
      return w->in[i / c][i % c];
  }
}

static void check_outputs(struct world* w) {
  for (int r = 0; r < w->n; r++)
    for (size_t i = 0; i < w->recv_len; i++) {
      float want = expected(w, r, i);
      if (want != want) { /* a non-root's reduce output: untouched */
        assert_int_equal(w->writes[r][i], 0);
        continue;
      }
      if (w->writes[r][i] != 1 || w->recv[r][i] != want)
        fail_msg(
            "coll %d n %d count %zu root %d inplace %d: rank %d [%zu] = %g (written %d), want "
            "%g",
            w->coll, w->n, w->count, w->root, w->inplace, r, i, w->recv[r][i], w->writes[r][i],
            want);
    }
}

static void test_direct_plans(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 7, 1001, MAXN};
  static const size_t aligns[] = {1, 4};
  struct world* w = calloc(1, sizeof(*w));
  struct direct_task t[DIRECT_MAX_RANKS];
  int cases = 0;
  for (w->coll = 0; w->coll < COLL_COUNT; w->coll++)
    for (w->n = 1; w->n <= DIRECT_MAX_RANKS; w->n++)
      for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
        for (size_t ai = 0; ai < 2; ai++)
          for (w->inplace = 0; w->inplace < 2; w->inplace++) {
            w->count = counts[ci];
            w->root = (int)(ci + ai) % w->n;
            world_setup(w);
            for (int r = 0; r < w->n; r++)
              assert_int_equal(
                  direct_plan(w->coll, r, w->n, w->root, w->count, 0, aligns[ai], &t[r]),
                  ncclSuccess);
            check_disjoint(w, t);
            for (int r = w->n - 1; r >= 0; r--) run_task(w, &t[r]);
            check_outputs(w);
            cases++;
          }
  print_message("%d direct cases\n", cases);
  free(w);
}

/* ---- Hier's node stages (direct_plan_hier) ---- */

#define HMAX_NODES 3
#define HMAX_PPN 4
#define HMAX_RANKS (HMAX_NODES * HMAX_PPN)
#define HMAXC 67

/* Every rank of nnodes x ppn, placed by `hosts` (node of each rank). */
struct hworld {
  int coll, nnodes, ppn, inplace;
  size_t count;
  struct sched_topo topo;
  float mem[HMAX_RANKS][2 * HMAX_RANKS * HMAXC];
  float* send[HMAX_RANKS];
  float* recv[HMAX_RANKS];
  float in[HMAX_RANKS][HMAX_RANKS * HMAXC];
  unsigned char writes[HMAX_RANKS][HMAX_RANKS * HMAXC];
  float scratch[HMAX_RANKS][HMAX_NODES * HMAXC];
  struct direct_staged st[HMAX_RANKS];
};

static int hrank(const struct hworld* w, int node, int local) {
  return w->topo.order[w->topo.node_start[node] + local];
}

/* A ref of rank r's node (refs name ranks by their index there). */
static float* hresolve(struct hworld* w, int node, const struct direct_ref* ref) {
  int r = hrank(w, node, ref->rank);
  if (ref->buf == DIRECT_SCRATCH) return w->scratch[r] + ref->off;
  return (ref->buf == DIRECT_SEND ? w->send[r] : w->recv[r]) + ref->off;
}

static void hworld_setup(struct hworld* w) {
  size_t n = (size_t)(w->nnodes * w->ppn), c = w->count;
  size_t send_len = w->coll == COLL_REDUCESCATTER ? n * c : c;
  size_t recv_len = w->coll == COLL_ALLGATHER ? n * c : c;
  memset(w->writes, 0, sizeof(w->writes));
  for (size_t r = 0; r < n; r++) {
    w->send[r] = w->mem[r];
    w->recv[r] = w->mem[r] + HMAX_RANKS * HMAXC;
    if (w->inplace && w->coll == COLL_ALLGATHER) w->send[r] = w->recv[r] + r * c;
    if (w->inplace && w->coll == COLL_REDUCESCATTER) w->recv[r] = w->send[r] + r * c;
    if (w->inplace && w->coll == COLL_ALLREDUCE) w->recv[r] = w->send[r];
    for (size_t i = 0; i < recv_len; i++) w->recv[r][i] = -1.0f;
    for (size_t i = 0; i < send_len; i++) w->in[r][i] = w->send[r][i] = (float)(r * 1000 + i % 997);
  }
}

/* One row of a task: where its sources and destinations are. */
static void hrow(struct hworld* w, int node, const struct direct_task* t, size_t row,
                 struct kern_task* k) {
  memset(k, 0, sizeof(*k));
  k->redop.type = ncclFloat32;
  k->redop.op = KERN_SUM;
  k->nsrcs = t->nsrcs, k->ndsts = t->ndsts, k->n = t->n;
  for (int s = 0; s < t->nsrcs; s++)
    k->srcs[s] = hresolve(w, node, &t->srcs[s]) + (ptrdiff_t)row * t->src_row;
  for (int d = 0; d < t->ndsts; d++)
    k->dsts[d] = hresolve(w, node, &t->dsts[d]) + (ptrdiff_t)row * t->dst_row;
}

static int spans_meet(const void* a, const void* b, size_t n) {
  const float *pa = a, *pb = b;
  return n > 0 && pa < pb + n && pb < pa + n;
}

/* No row of ta (a rank's) writes what a row of tb (another rank's, which
 * may run meanwhile) reads or writes. */
static void hcheck_pair(struct hworld* w, int node, const struct direct_task* ta,
                        const struct direct_task* tb) {
  struct kern_task ka, kb;
  for (size_t i = 0; i < ta->rows; i++)
    for (size_t j = 0; j < tb->rows; j++) {
      hrow(w, node, ta, i, &ka);
      hrow(w, node, tb, j, &kb);
      for (int d = 0; d < ka.ndsts; d++) {
        for (int s = 0; s < kb.nsrcs; s++)
          if (spans_meet(ka.dsts[d], kb.srcs[s], ka.n))
            fail_msg("coll %d: a task writes what another rank's reads", w->coll);
        for (int e = 0; e < kb.ndsts; e++)
          if (spans_meet(ka.dsts[d], kb.dsts[e], ka.n))
            fail_msg("coll %d: two ranks' tasks write the same bytes", w->coll);
      }
    }
}

static void hrun(struct hworld* w, int node, const struct direct_task* t) {
  struct kern_task k;
  assert_true(t->rows >= 1);
  for (size_t row = 0; row < t->rows; row++) {
    hrow(w, node, t, row, &k);
    for (int d = 0; d < t->ndsts; d++) {
      int r = hrank(w, node, t->dsts[d].rank);
      if (t->dsts[d].buf == DIRECT_SCRATCH) continue;
      size_t at = (size_t)((float*)k.dsts[d] - w->recv[r]);
      for (size_t i = 0; i < t->n; i++) w->writes[r][at + i]++;
    }
    kern_task_run(&k);
  }
}

/* The stage between nodes, a stand-in: the collective along each column
 * on the scratches (send_off, recv_off, count of each member's plan), and
 * + 0.5 on every result, which the outputs must show. */
static void hcolumns(struct hworld* w) {
  float tmp[HMAX_NODES][HMAX_NODES * HMAXC];
  int m = w->nnodes;
  for (int l = 0; l < w->ppn; l++) {
    const struct direct_staged* st = &w->st[hrank(w, 0, l)];
    size_t c = st->count, out = w->coll == COLL_ALLGATHER ? (size_t)m * c : c;
    for (int j = 0; j < m; j++) {
      assert_true(w->st[hrank(w, j, l)].count == c);
      for (size_t i = 0; i < out; i++) {
        float v = 0;
        for (int q = 0; q < m && w->coll != COLL_ALLGATHER; q++) {
          size_t at = w->coll == COLL_REDUCESCATTER ? (size_t)j * c + i : i;
          v += w->scratch[hrank(w, q, l)][st->send_off + at];
        }
        if (w->coll == COLL_ALLGATHER)
          v = w->scratch[hrank(w, (int)(i / c), l)]
                        [w->st[hrank(w, (int)(i / c), l)].send_off + i % c];
        tmp[j][i] = v + 0.5f;
      }
    }
    for (int j = 0; j < m; j++) {
      int r = hrank(w, j, l);
      memcpy(w->scratch[r] + w->st[r].recv_off, tmp[j], out * sizeof(float));
    }
  }
}

static float hsum(struct hworld* w, size_t i) {
  float s = 0;
  for (int r = 0; r < w->nnodes * w->ppn; r++) s += w->in[r][i];
  return s;
}

static void hcheck_outputs(struct hworld* w) {
  size_t n = (size_t)(w->nnodes * w->ppn), c = w->count;
  size_t len = w->coll == COLL_ALLGATHER ? n * c : c;
  for (size_t r = 0; r < n; r++)
    for (size_t i = 0; i < len; i++) {
      float want = w->coll == COLL_ALLREDUCE       ? hsum(w, i) + 0.5f
                   : w->coll == COLL_REDUCESCATTER ? hsum(w, r * c + i) + 0.5f
                                                   : w->in[i / c][i % c] + 0.5f;
      if (w->writes[r][i] != 1 || w->recv[r][i] != want)
        fail_msg(
            "hier coll %d %dx%d count %zu inplace %d: rank %zu [%zu] = %g (written %d), "
            "want %g",
            w->coll, w->nnodes, w->ppn, w->count, w->inplace, r, i, w->recv[r][i], w->writes[r][i],
            want);
    }
}

/* Every rank's plan; its tasks checked against the others' of its node. */
static void hplan(struct hworld* w) {
  for (int node = 0; node < w->nnodes; node++) {
    for (int l = 0; l < w->ppn; l++) {
      int r = hrank(w, node, l);
      struct direct_hier h = {.coll = w->coll,
                              .local = l,
                              .nlocal = w->ppn,
                              .node = node,
                              .nnodes = w->nnodes,
                              .count = w->count,
                              .align = 4};
      assert_true(direct_column(&w->topo, l, &h.column0, &h.column_step));
      assert_int_equal(direct_plan_hier(&h, &w->st[r]), ncclSuccess);
      assert_true(w->st[r].scratch <= HMAX_NODES * HMAXC);
    }
    for (int a = 0; a < w->ppn; a++)
      for (int b = 0; b < w->ppn; b++) {
        const struct direct_staged *sa = &w->st[hrank(w, node, a)], *sb = &w->st[hrank(w, node, b)];
        if (a == b) continue;
        hcheck_pair(w, node, &sa->before, &sb->before);
        hcheck_pair(w, node, &sa->after, &sb->before);
        hcheck_pair(w, node, &sb->before, &sa->after);
        hcheck_pair(w, node, &sa->after, &sb->after);
      }
  }
}

/* Node of rank r of nnodes x ppn: node-major, round-robin, or mirrored
 * (node j holds ranks j and 2m-1-j, ...: columns step up, then down). */
static int layout_node(int kind, int r, int m, int ppn) {
  if (kind == 0) return r / ppn;
  if (kind == 1) return r % m;
  return (r / m) % 2 ? m - 1 - r % m : r % m;
}

/* Hier on every layout kind x 2..3 nodes x 1..4 ranks each x counts x in
 * place: each node's tasks, a stand-in for the stage between nodes, the
 * outputs by definition, each written once. */
static void test_direct_hier(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 7, HMAXC};
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_ALLGATHER};
  struct hworld* w = calloc(1, sizeof(*w));
  int cases = 0;
  for (int kind = 0; kind < 3; kind++)
    for (w->nnodes = 2; w->nnodes <= HMAX_NODES; w->nnodes++)
      for (w->ppn = 1; w->ppn <= HMAX_PPN; w->ppn++) {
        uint64_t hosts[HMAX_RANKS];
        int n = w->nnodes * w->ppn;
        for (int r = 0; r < n; r++)
          hosts[r] = 100 + (uint64_t)layout_node(kind, r, w->nnodes, w->ppn);
        assert_int_equal(sched_topo_init(&w->topo, n, hosts), ncclSuccess);
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
          for (int k = 0; k < 3; k++)
            for (w->inplace = 0; w->inplace < 2; w->inplace++, cases++) {
              w->coll = colls[k];
              w->count = counts[ci];
              hworld_setup(w);
              hplan(w);
              for (int r = n - 1; r >= 0; r--) hrun(w, w->topo.node_of[r], &w->st[r].before);
              hcolumns(w);
              for (int r = 0; r < n; r++) hrun(w, w->topo.node_of[r], &w->st[r].after);
              hcheck_outputs(w);
            }
        sched_topo_free(&w->topo);
      }
  print_message("%d Hier cases\n", cases);
  free(w);
}

/* Columns: evenly spaced on node-major and round-robin layouts, not on
 * one where a node's ranks are out of step (nodes {0,1} {2,4} {3,5}). */
static void test_direct_column(void** state) {
  (void)state;
  static const uint64_t node_major[] = {7, 7, 8, 8, 9, 9}, round_robin[] = {7, 8, 9, 7, 8, 9};
  static const uint64_t uneven[] = {7, 7, 8, 9, 8, 9};
  struct sched_topo t;
  int first, step;
  assert_int_equal(sched_topo_init(&t, 6, node_major), ncclSuccess);
  assert_true(direct_column(&t, 1, &first, &step) && first == 1 && step == 2);
  assert_false(direct_column(&t, 2, &first, &step)); /* no node has a third rank */
  sched_topo_free(&t);
  assert_int_equal(sched_topo_init(&t, 6, round_robin), ncclSuccess);
  assert_true(direct_column(&t, 1, &first, &step) && first == 3 && step == 1);
  sched_topo_free(&t);
  assert_int_equal(sched_topo_init(&t, 6, uneven), ncclSuccess);
  assert_false(direct_column(&t, 0, &first, &step));
  sched_topo_free(&t);
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
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_direct_plans),
      cmocka_unit_test(test_direct_hier),
      cmocka_unit_test(test_direct_column),
      cmocka_unit_test(test_direct_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
