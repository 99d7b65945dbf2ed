/*
 * Schedules without a network: every rank's schedule (ring, tree,
 * recursive doubling, hierarchical) runs on the real executor over the
 * in-memory fake transport (tests/common), all ranks in one thread, tasks
 * on the CPU backend, and the results are checked element by element.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fake_transport.h"
#include "common/sched_cases.h"
#include "engine/exec_cpu.h"
#include "kernels.h"
#include "layout.h"
#include "ring.h"
#include "sched_build.h"
#include "schedule.h"
#include "tree.h"

#define MAXR FAKE_MAXR

static void run_cpu(const struct sched_case* c, void* arg) {
  struct sched_run run;
  (void)arg;
  sched_case_run(c, &exec_backend_cpu, NULL, &run);
  sched_run_free(&run);
}

static void test_allreduce_fake_transport(void** state) {
  (void)state;
  sched_cases_allreduce(run_cpu, NULL);
}

static void test_collectives_fake_transport(void** state) {
  (void)state;
  sched_cases_collectives(run_cpu, NULL);
}

/* Double binary tree: every rank has one parent (or is a root) and is
 * interior in at most one of the two trees; links are mutual. */
static void test_double_tree_shape(void** state) {
  (void)state;
  for (int n = 1; n <= 64; n++) {
    for (int r = 0; r < n; r++) {
      int interior = 0;
      for (int t = 0; t < 2; t++) {
        int parent, child[2], pp, pc[2];
        tree_links(r, n, t, &parent, child);
        interior += child[0] >= 0 || child[1] >= 0;
        for (int i = 0; i < 2; i++)
          if (child[i] >= 0) {
            tree_links(child[i], n, t, &pp, pc);
            assert_int_equal(pp, r);
          }
        if (parent >= 0) {
          tree_links(parent, n, t, &pp, pc);
          assert_true(pc[0] == r || pc[1] == r);
        }
      }
      assert_true(interior <= 1 || n <= 2);
    }
    assert_true(tree_depth(n) <= 8);
  }
}

/* Recursive doubling: partners combine lower-rank data first, so max of
 * +0 and -0 gives the same bits on both. */
static void test_rd_signed_zero_identical(void** state) {
  (void)state;
  for (int n = 2; n <= MAXR; n++) {
    struct fake_world* w = calloc(1, sizeof(*w));
    float in[MAXR][4], out[MAXR][4];
    struct exec_args args[MAXR];
    fake_world_init(w, n, 8192, 4, NULL, &exec_backend_cpu, NULL);
    for (int r = 0; r < n; r++) {
      for (int i = 0; i < 4; i++) in[r][i] = ((r + i) & 1) ? -0.0f : 0.0f;
      fake_args(&args[r], n, COLL_ALLREDUCE, ALGO_RD, 0, in[r], out[r], 4, ncclFloat, ncclMax,
                4096);
    }
    fake_world_run(w, args);
    for (int r = 1; r < n; r++) assert_memory_equal(out[0], out[r], sizeof(out[0]));
    fake_world_free(w);
    free(w);
  }
}

static void test_any_window_rendezvous(void** state) {
  (void)state;
  sched_cases_windows(run_cpu, NULL);
}

/* Every element of the output is covered exactly once by a final step and
 * the schedule length is what the ring promises. */
static void test_ring_schedule_shape(void** state) {
  (void)state;
  for (int n = 2; n <= MAXR; n++)
    for (int r = 0; r < n; r++) {
      struct schedule s = {0};
      struct sched_key k = {.coll = COLL_ALLREDUCE,
                            .algo = ALGO_RING,
                            .rank = r,
                            .nranks = n,
                            .count = 100003,
                            .elem_size = 4,
                            .chunk_bytes = 4096,
                            .slices_per_step = 2};
      assert_int_equal(sched_build(&s, &k), ncclSuccess);
      unsigned char* seen = calloc(k.count, 1);
      for (size_t i = 0; i < s.nsteps; i++) {
        const struct sched_step* st = &s.steps[i];
        int writes_y = st->prim == PRIM_RECV || st->prim == PRIM_RECV_COPY_SEND ||
                       st->prim == PRIM_RECV_REDUCE_COPY_SEND;
        assert_true(st->count > 0 && st->yoff + st->count <= k.count);
        assert_true(st->count * k.elem_size <= k.chunk_bytes);
        for (size_t e = 0; writes_y && e < st->count; e++) seen[st->yoff + e]++;
      }
      for (size_t e = 0; e < k.count; e++) assert_int_equal(seen[e], 1);
      free(seen);
      sched_free(&s);
    }
}

/* The all-reduce's blocks as ring.c cuts them: sizes differ by one at most. */
static struct ring_block even_block(const void* ctx, int j) {
  const struct sched_key* k = ctx;
  size_t n = (size_t)k->nranks, base = k->count / n, rem = k->count % n, jj = (size_t)j;
  size_t off = jj * base + (jj < rem ? jj : rem);
  return (struct ring_block){off, off, base + (jj < rem)};
}

/* A ring all-reduce of fewer elements than ranks walks only the hops of
 * its non-empty blocks: the very steps, in the same order, as the walk of
 * all 2n-1 hops (ring_reduce_phase, then ring_gather_phase). */
static void test_ring_few_elements(void** state) {
  static const int sizes[] = {2, 3, 4, 5, 7, 8, 13, 64, 257};
  (void)state;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    int n = sizes[i];
    for (int count = 1; count < n; count += count < 9 ? 1 : n / 7)
      for (int r = 0; r < n; r++) {
        struct schedule got = {0}, want = {0};
        struct sched_key k = {.coll = COLL_ALLREDUCE,
                              .algo = ALGO_RING,
                              .rank = r,
                              .nranks = n,
                              .count = (size_t)count,
                              .elem_size = 4,
                              .chunk_bytes = 4096,
                              .slices_per_step = 2};
        struct ring g = {.n = n,
                         .pos = r,
                         .prev = (r + n - 1) % n,
                         .next = (r + 1) % n,
                         .block = even_block,
                         .ctx = &k,
                         .chunk = 1024,
                         .span = 2048,
                         .post = 1};
        assert_int_equal(sched_build(&got, &k), ncclSuccess);
        assert_int_equal(ring_reduce_phase(&want, &g, r + 1, PRIM_RECV_REDUCE_COPY_SEND, 0),
                         ncclSuccess);
        assert_int_equal(ring_gather_phase(&want, &g, r + 1, 0), ncclSuccess);
        assert_true(want.nsteps > 0 || count < n);
        assert_int_equal(got.nsteps, want.nsteps);
        for (size_t t = 0; t < got.nsteps; t++) {
          const struct sched_step *a = &got.steps[t], *b = &want.steps[t];
          assert_true(a->prim == b->prim && a->flags == b->flags);
          assert_true(a->recv_peer == b->recv_peer && a->send_peer == b->send_peer);
          assert_true(a->xoff == b->xoff && a->yoff == b->yoff && a->count == b->count);
        }
        sched_free(&got);
        sched_free(&want);
      }
  }
}

static void test_schedule_reuse_and_names(void** state) {
  (void)state;
  struct schedule s = {0};
  struct sched_key k = {.coll = COLL_ALLREDUCE,
                        .algo = ALGO_RING,
                        .rank = 1,
                        .nranks = 3,
                        .count = 10,
                        .elem_size = 4,
                        .chunk_bytes = 4096,
                        .slices_per_step = 2};
  assert_int_equal(sched_build(&s, &k), ncclSuccess);
  struct sched_step* first = s.steps;
  size_t n = s.nsteps;
  assert_int_equal(sched_build(&s, &k), ncclSuccess);
  assert_ptr_equal(first, s.steps);
  assert_int_equal(n, s.nsteps);
  assert_string_equal(sched_prim_name(PRIM_RECV_REDUCE_SEND), "recvReduceSend");
  sched_free(&s);
}

static void test_layouts_fake_transport(void** state) {
  (void)state;
  sched_cases_layouts(run_cpu, NULL);
}

/* The layout itself: nodes by lowest rank, rank order inside a node. */
static void test_layout_grouping(void** state) {
  (void)state;
  uint64_t hosts[7] = {3, 1, 2, 3, 1, 2, 1};
  struct sched_topo t;
  assert_int_equal(sched_topo_init(&t, 7, hosts), ncclSuccess);
  static const int order[7] = {0, 3, 1, 4, 6, 2, 5}, node_of[7] = {0, 1, 2, 0, 1, 2, 1};
  assert_int_equal(t.nnodes, 3);
  assert_int_equal(t.min_ppn, 2);
  assert_int_equal(t.max_ppn, 3);
  for (int i = 0; i < 7; i++) {
    assert_int_equal(t.order[i], order[i]);
    assert_int_equal(t.pos_of[order[i]], i);
    assert_int_equal(t.node_of[i], node_of[i]);
  }
  assert_int_equal(t.local_of[6], 2);
  assert_int_equal(t.node_start[3], 7);
  sched_topo_free(&t);
}

/* Ranks bound inside caches: each node's order groups them by L3, then
 * L2, rank order within, unbound ranks first; index and position follow.
 * Ranks 0..6 on nodes {0 2 4 6} {1 3 5}; the first node's bound
 * round-robin over two L2s of one L3; on the second rank 3 is unbound,
 * rank 1 in L3 9 (its L2 0), rank 5 in L3 8 (its L2 5): by L3 5 before 1,
 * where by L2 alone 1 would go first. */
static void test_layout_by_cache(void** state) {
  (void)state;
  uint64_t hosts[7] = {1, 2, 1, 2, 1, 2, 1};
  static const int l2[7] = {0, 0, 1, -1, 0, 5, 1}, l3[7] = {4, 9, 4, -1, 4, 8, 4};
  static const int order[7] = {0, 4, 2, 6, 3, 5, 1};
  struct sched_topo t;
  assert_int_equal(sched_topo_init(&t, 7, hosts), ncclSuccess);
  sched_topo_place(&t, l2, l3);
  for (int i = 0; i < 7; i++) {
    int r = order[i], node = t.node_of[r];
    assert_int_equal(t.order[i], r);
    assert_int_equal(t.pos_of[r], i);
    assert_int_equal(t.local_of[r], i - t.node_start[node]);
  }
  sched_topo_place(&t, NULL, NULL); /* nothing known: rank order again */
  for (int i = 0; i < 7; i++) assert_int_equal(t.order[i], i < 4 ? 2 * i : 2 * (i - 4) + 1);
  sched_topo_free(&t);
}

/* Peer lists are mutual on every layout: connections are made pairwise. */
static void test_peers_mutual(void** state) {
  (void)state;
  for (size_t l = 0; l < sched_nlayouts; l++) {
    struct sched_topo t;
    const struct sched_layout* L = &sched_layouts[l];
    assert_int_equal(sched_topo_init(&t, L->n, L->hosts), ncclSuccess);
    sched_topo_place(&t, sched_layout_cache(L), NULL);
    for (int algo = 0; algo < ALGO_COUNT; algo++)
      for (int r = 0; r < L->n; r++) {
        struct sched_key k = {.topo = &t,
                              .coll = COLL_ALLREDUCE,
                              .algo = algo,
                              .rank = r,
                              .nranks = L->n,
                              .count = 1000,
                              .elem_size = 4,
                              .chunk_bytes = 4096,
                              .slices_per_step = 2};
        int peers[64], m = sched_peers(&k, peers, 64);
        for (int i = 0; i < m; i++) {
          int back[64], mb, found = 0;
          k.rank = peers[i];
          mb = sched_peers(&k, back, 64);
          for (int j = 0; j < mb; j++) found |= back[j] == r;
          assert_true(found);
          k.rank = r;
        }
      }
    sched_topo_free(&t);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_schedule_shape),
      cmocka_unit_test(test_ring_few_elements),
      cmocka_unit_test(test_schedule_reuse_and_names),
      cmocka_unit_test(test_allreduce_fake_transport),
      cmocka_unit_test(test_collectives_fake_transport),
      cmocka_unit_test(test_double_tree_shape),
      cmocka_unit_test(test_any_window_rendezvous),
      cmocka_unit_test(test_rd_signed_zero_identical),
      cmocka_unit_test(test_layout_grouping),
      cmocka_unit_test(test_layout_by_cache),
      cmocka_unit_test(test_peers_mutual),
      cmocka_unit_test(test_layouts_fake_transport),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
