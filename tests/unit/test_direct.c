/*
 * The direct algorithm's plans (algorithms/direct.c) run on host buffers:
 * every collective x 1..8 ranks x counts x alignments x roots, in place
 * and not. The ranks' tasks run one after another in reverse rank order,
 * and the outputs must equal the collective's definition; every output
 * element is written by exactly one task, and no task writes memory that
 * another rank's task reads or writes (so they may run at once: on a GPU
 * they do). The staged all-reduce (Hier's intra-node stages on devices)
 * is run the same way around a stand-in for the stage between nodes.
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

/* The staged all-reduce: every rank's reduce into its scratch, the stage
 * between nodes (here: + 0.5 on every scratch element, which the outputs
 * must show), every rank's spread. A rank's spread may run while another
 * still reduces: they must not touch each other's bytes. */
static void test_direct_staged(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 7, 1001, MAXN};
  struct world* w = calloc(1, sizeof(*w));
  struct direct_task red[DIRECT_MAX_RANKS], spr[DIRECT_MAX_RANKS];
  size_t lo[DIRECT_MAX_RANKS];
  w->coll = COLL_ALLREDUCE;
  for (w->n = 1; w->n <= DIRECT_MAX_RANKS; w->n++)
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
      for (w->inplace = 0; w->inplace < 2; w->inplace++) {
        w->count = counts[ci];
        world_setup(w);
        for (int r = 0; r < w->n; r++)
          assert_int_equal(direct_plan_staged(r, w->n, w->count, 4, &red[r], &spr[r], &lo[r]),
                           ncclSuccess);
        for (int a = 0; a < w->n; a++)
          for (int b = 0; b < w->n; b++)
            if (a != b) {
              check_pair(w, &spr[a], a, &red[b], b);
              check_pair(w, &red[b], b, &spr[a], a);
            }
        for (int r = w->n - 1; r >= 0; r--) run_task(w, &red[r]);
        for (int r = 0; r < w->n; r++)
          for (size_t i = 0; i < red[r].n; i++) {
            assert_true(w->scratch[r][i] == sum_at(w, lo[r] + i));
            w->scratch[r][i] += 0.5f;
          }
        for (int r = 0; r < w->n; r++) run_task(w, &spr[r]);
        for (int r = 0; r < w->n; r++)
          for (size_t i = 0; i < w->count; i++)
            if (w->writes[r][i] != 1 || w->recv[r][i] != sum_at(w, i) + 0.5f)
              fail_msg("staged n %d count %zu inplace %d: rank %d [%zu] = %g (written %d)", w->n,
                       w->count, w->inplace, r, i, w->recv[r][i], w->writes[r][i]);
      }
  free(w);
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
      cmocka_unit_test(test_direct_staged),
      cmocka_unit_test(test_direct_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
