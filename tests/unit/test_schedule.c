/*
 * Schedules without a network: every rank's schedule (ring, recursive
 * doubling) runs on the real
 * executor over an in-memory fake transport, all ranks in one thread, and
 * the results are checked element by element.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "kernels.h"
#include "schedule.h"

#define MAXR 8

/* One direction between two ranks: message k of the sender lands in
 * message k of the receiver once both are posted. */
struct fake_conn {
  struct transport_conn base;
  struct fake_conn* other;
  void* bufs[TRANSPORT_MAX_INFLIGHT];
  size_t lens[TRANSPORT_MAX_INFLIGHT];
  int mismatches;
};

static ncclResult_t fake_post(struct transport_conn* c, const struct transport_buf* b,
                              const struct transport_tag* tag) {
  (void)tag;
  struct fake_conn* f = (struct fake_conn*)c;
  f->bufs[c->posted % TRANSPORT_MAX_INFLIGHT] = b->ptr;
  f->lens[c->posted % TRANSPORT_MAX_INFLIGHT] = b->bytes;
  c->posted++;
  return ncclSuccess;
}

static ncclResult_t fake_progress(struct transport_conn* c, int* progressed) {
  struct fake_conn* s = (struct fake_conn*)c;
  struct fake_conn* r = s->other;
  if (!c->is_send) {
    r = s;
    s = s->other;
  }
  while (s->base.completed < s->base.posted && r->base.completed < r->base.posted) {
    size_t k = s->base.completed % TRANSPORT_MAX_INFLIGHT;
    if (s->lens[k] != r->lens[k]) s->mismatches++;
    memcpy(r->bufs[k], s->bufs[k], s->lens[k] < r->lens[k] ? s->lens[k] : r->lens[k]);
    s->base.completed++;
    r->base.completed++;
    *progressed = 1;
  }
  return ncclSuccess;
}

static void fake_nop(struct transport_conn* c) {
  (void)c;
}

static const struct transport fake_transport = {.name = "fake",
                                                .caps = TRANSPORT_CAP_HOST_MEM,
                                                .post = fake_post,
                                                .progress = fake_progress,
                                                .shutdown = fake_nop,
                                                .close = fake_nop};

struct world {
  int n;
  struct ncclComm comms[MAXR];
  struct transport_conn* send[MAXR][MAXR];
  struct transport_conn* recv[MAXR][MAXR];
  struct fake_conn conns[MAXR][MAXR][2]; /* [from][to][send=0/recv=1] */
};

/* `hosts` (NULL: one node) places the ranks on nodes. */
static void world_init(struct world* w, int n, size_t slot_bytes, int window,
                       const uint64_t* hosts) {
  memset(w, 0, sizeof(*w));
  w->n = n;
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      struct fake_conn* s = &w->conns[a][b][0];
      struct fake_conn* r = &w->conns[a][b][1];
      s->base = (struct transport_conn){.ops = &fake_transport, .peer = b, .is_send = 1};
      r->base = (struct transport_conn){.ops = &fake_transport, .peer = a, .is_send = 0};
      s->other = r;
      r->other = s;
      w->send[a][b] = &s->base;
      w->recv[b][a] = &r->base;
    }
  for (int r = 0; r < n; r++) {
    struct ncclComm* c = &w->comms[r];
    c->magic = COMM_MAGIC;
    c->rank = r;
    c->nranks = n;
    c->send_conns = w->send[r];
    c->recv_conns = w->recv[r];
    c->tctx.timeout_ms = 60000;
    if (hosts) assert_int_equal(sched_topo_init(&c->layout, n, hosts), ncclSuccess);
    assert_int_equal(exec_init(&c->exec, window, slot_bytes), ncclSuccess);
  }
}

static void world_free(struct world* w) {
  for (int r = 0; r < w->n; r++) {
    exec_free(&w->comms[r].exec);
    sched_free(&w->comms[r].sched);
    sched_topo_free(&w->comms[r].layout);
  }
}

/* Run one collective on every rank, interleaving their progress. */
static void world_run(struct world* w, int coll, int algo, int root, void* const* send,
                      void* const* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                      size_t chunk) {
  int done[MAXR] = {0}, left = w->n;
  for (int r = 0; r < w->n; r++) {
    struct exec_args a;
    memset(&a, 0, sizeof(a));
    assert_int_equal(redop_resolve(&w->comms[r], op, type, "test", &a), ncclSuccess);
    a.coll = coll;
    a.root = root;
    a.sendbuff = send[r];
    a.recvbuff = recv[r];
    a.count = count;
    a.type = type;
    a.algo = algo;
    a.chunk_bytes = chunk;
    assert_int_equal(exec_start(&w->comms[r], &a), ncclSuccess);
  }
  for (int spins = 0; left > 0; spins++) {
    assert_true(spins < 10000000);
    for (int r = 0; r < w->n; r++) {
      int progressed = 0;
      if (done[r]) continue;
      assert_int_equal(exec_progress(&w->comms[r], &done[r], &progressed), ncclSuccess);
      if (done[r]) left--;
    }
  }
  for (int a = 0; a < w->n; a++)
    for (int b = 0; b < w->n; b++) assert_int_equal(w->conns[a][b][0].mismatches, 0);
}

static double value_of(int rank, size_t i) {
  return (double)((rank + 3 * i) % 5);
}

static double get_elem(const void* buf, ncclDataType_t type, size_t i) {
  return type == ncclFloat   ? ((const float*)buf)[i]
         : type == ncclInt32 ? ((const int32_t*)buf)[i]
                             : ((const double*)buf)[i];
}

static void put_elem(void* buf, ncclDataType_t type, size_t i, double v) {
  if (type == ncclFloat) ((float*)buf)[i] = (float)v;
  if (type == ncclInt32) ((int32_t*)buf)[i] = (int32_t)v;
  if (type == ncclDouble) ((double*)buf)[i] = v;
}

#define POISON -77.0

/* The reduction over ranks of input element i, as the type computes it. */
static double reduced(int n, ncclDataType_t type, ncclRedOp_t op, size_t i) {
  double e = op == ncclMax ? -1e9 : 0;
  for (int q = 0; q < n; q++) {
    double v = value_of(q, i) - (type == ncclInt32 ? 2 : 0);
    e = op == ncclMax ? (v > e ? v : e) : e + v;
  }
  if (op == ncclAvg) e /= n;
  if (type == ncclInt32 && op == ncclAvg) e = (double)(int64_t)e;
  if (type == ncclFloat && op == ncclAvg) e = (float)e;
  return e;
}

/* What rank r's output element i must hold (POISON: left untouched). */
static double expected(int coll, int n, int r, int root, size_t count, ncclDataType_t type,
                       ncclRedOp_t op, size_t i) {
  double shift = type == ncclInt32 ? 2 : 0;
  switch (coll) {
    case COLL_ALLREDUCE:
      return reduced(n, type, op, i);
    case COLL_REDUCE:
      return r == root ? reduced(n, type, op, i) : POISON;
    case COLL_BROADCAST:
      return value_of(root, i) - shift;
    case COLL_ALLGATHER:
      return value_of((int)(i / count), i % count) - shift;
    default:
      return reduced(n, type, op, (size_t)r * count + i); /* reduce-scatter */
  }
}

static void run_on(const uint64_t* hosts, int coll, int algo, int n, size_t count,
                   ncclDataType_t type, ncclRedOp_t op, int root, int inplace, size_t chunk,
                   int window) {
  struct world* w = calloc(1, sizeof(*w));
  void *send[MAXR] = {0}, *recv[MAXR] = {0}, *mem[MAXR] = {0};
  size_t nsend = coll == COLL_REDUCESCATTER ? n * count : count;
  size_t nrecv = coll == COLL_ALLGATHER ? n * count : count;
  world_init(w, n, 8192, window, hosts);
  for (int r = 0; r < n; r++) {
    size_t big = (nsend > nrecv ? nsend : nrecv) + 1;
    mem[r] = calloc(2 * big, 8);
    send[r] = mem[r];
    recv[r] = (char*)mem[r] + big * 8;
    size_t es = type == ncclDouble ? 8 : 4;
    if (inplace && coll == COLL_ALLGATHER) send[r] = (char*)recv[r] + (size_t)r * count * es;
    if (inplace && coll == COLL_REDUCESCATTER) recv[r] = (char*)send[r] + (size_t)r * count * es;
    if (inplace && coll != COLL_ALLGATHER && coll != COLL_REDUCESCATTER) recv[r] = send[r];
    for (size_t i = 0; i < nrecv && !inplace; i++) put_elem(recv[r], type, i, POISON);
    for (size_t i = 0; i < nsend; i++) /* the input as this rank sees it */
      put_elem(send[r], type, i, value_of(r, i) - (type == ncclInt32 ? 2 : 0));
  }
  if (getenv("TEST_TRACE"))
    fprintf(stderr, "case %s %s n=%d count=%zu chunk=%zu window=%d hosts=%d\n",
            sched_coll_name(coll), sched_algo_name(algo), n, count, chunk, window, hosts != NULL);
  world_run(w, coll, algo, root, send, recv, count, type, op, chunk);
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < nrecv; i++) {
      double want = expected(coll, n, r, root, count, type, op, i);
      if (want == POISON && inplace) continue; /* non-root reduce in place: input stays */
      double got = get_elem(recv[r], type, i);
      if (got != want) {
        fprintf(stderr,
                "%s%s %s n=%d count=%zu type=%d op=%d root=%d inplace=%d rank %d [%zu]: %g != %g\n",
                hosts ? "layout " : "", sched_coll_name(coll), sched_algo_name(algo), n, count,
                type, op, root, inplace, r, i, got, want);
        fail();
      }
    }
  for (int r = 0; r < n; r++) free(mem[r]);
  world_free(w);
  free(w);
}

static void run_case(int coll, int algo, int n, size_t count, ncclDataType_t type, ncclRedOp_t op,
                     int root, int inplace, size_t chunk, int window) {
  run_on(NULL, coll, algo, n, count, type, op, root, inplace, chunk, window);
}

static void test_allreduce_fake_transport(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 2, 7, 1023, 20011};
  static const ncclDataType_t types[] = {ncclFloat, ncclInt32, ncclDouble};
  static const ncclRedOp_t ops[] = {ncclSum, ncclMax, ncclAvg};
  for (int n = 1; n <= MAXR; n++)
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
      for (int t = 0; t < 3; t++)
        for (int o = 0; o < 3; o++)
          for (int ip = 0; ip < 2; ip++)
            for (int algo = 0; algo < ALGO_COUNT; algo++)
              run_case(COLL_ALLREDUCE, algo, n, counts[c], types[t], ops[o], 0, ip, 4096, 4);
}

/* Every other collective with every algorithm that implements it, every
 * root, in and out of place. */
static void test_collectives_fake_transport(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 5, 1023, 9001};
  for (int coll = COLL_ALLGATHER; coll < COLL_COUNT; coll++)
    for (int algo = 0; algo < ALGO_COUNT; algo++) {
      if (!sched_supports(coll, algo)) continue;
      for (int n = 1; n <= MAXR; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
          for (int root = 0; root < n; root += (coll >= COLL_BROADCAST ? 1 : n))
            for (int ip = 0; ip < 2; ip++) {
              run_case(coll, algo, n, counts[c], ncclFloat, ncclSum, root, ip, 4096, 4);
              run_case(coll, algo, n, counts[c], ncclInt32, ncclAvg, root, ip, 4096, 4);
            }
    }
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
    struct world* w = calloc(1, sizeof(*w));
    float in[MAXR][4], out[MAXR][4];
    void *send[MAXR], *recv[MAXR];
    world_init(w, n, 8192, 4, NULL);
    for (int r = 0; r < n; r++) {
      for (int i = 0; i < 4; i++) in[r][i] = ((r + i) & 1) ? -0.0f : 0.0f;
      send[r] = in[r];
      recv[r] = out[r];
    }
    world_run(w, COLL_ALLREDUCE, ALGO_RD, 0, send, recv, 4, ncclFloat, ncclMax, 4096);
    for (int r = 1; r < n; r++) assert_memory_equal(out[0], out[r], sizeof(out[0]));
    world_free(w);
    free(w);
  }
}

/* The fake transport is rendezvous (a send completes only when the peer
 * has posted the receive): any window must still finish without deadlock. */
static void test_any_window_rendezvous(void** state) {
  (void)state;
  for (int window = 1; window <= 9; window++) {
    for (int n = 2; n <= MAXR; n += 3)
      for (int coll = 0; coll < COLL_COUNT; coll++)
        for (int algo = 0; algo < ALGO_COUNT; algo++)
          if (sched_supports(coll, algo))
            run_case(coll, algo, n, 50021, ncclFloat, ncclSum, n - 1, 0, 1024, window);
  }
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

/* Node layouts the issue names, plus ranks placed round-robin over nodes
 * (so ring order differs from rank order). */
static const struct layout {
  int n;
  uint64_t hosts[MAXR];
} layouts[] = {
    {4, {1, 1, 1, 1}},          {4, {1, 1, 2, 2}},
    {6, {1, 1, 1, 2, 2, 2}},    {7, {1, 1, 1, 2, 2, 3, 3}},
    {4, {1, 2, 3, 4}},          {4, {1, 2, 1, 2}},
    {7, {3, 1, 2, 3, 1, 2, 1}}, {8, {1, 1, 1, 1, 2, 2, 2, 2}},
    {5, {1, 1, 1, 1, 2}},
};

/* Every collective with every algorithm on every layout: hierarchical
 * schedules, node-ordered rings and trees all give the exact answer. */
static void test_layouts_fake_transport(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 5, 1023, 20011};
  for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++) {
    const struct layout* L = &layouts[l];
    struct sched_topo t;
    assert_int_equal(sched_topo_init(&t, L->n, L->hosts), ncclSuccess);
    for (int coll = 0; coll < COLL_COUNT; coll++)
      for (int algo = 0; algo < ALGO_COUNT; algo++) {
        if (!sched_supports_on(&t, coll, algo)) continue;
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
          for (int ip = 0; ip < 2; ip++) {
            int root = L->n - 2;
            run_on(L->hosts, coll, algo, L->n, counts[c], ncclFloat, ncclSum, root, ip, 4096, 4);
            run_on(L->hosts, coll, algo, L->n, counts[c], ncclInt32, ncclAvg, root, ip, 1024, 6);
            run_on(L->hosts, coll, algo, L->n, counts[c], ncclDouble, ncclMax, root, ip, 512, 9);
            /* Wide windows: Hier all-reduce pipelines its rounds there. */
            run_on(L->hosts, coll, algo, L->n, counts[c], ncclFloat, ncclSum, root, ip, 256, 32);
          }
      }
    sched_topo_free(&t);
  }
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

/* Peer lists are mutual on every layout: connections are made pairwise. */
static void test_peers_mutual(void** state) {
  (void)state;
  for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++) {
    struct sched_topo t;
    const struct layout* L = &layouts[l];
    assert_int_equal(sched_topo_init(&t, L->n, L->hosts), ncclSuccess);
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
      cmocka_unit_test(test_schedule_reuse_and_names),
      cmocka_unit_test(test_allreduce_fake_transport),
      cmocka_unit_test(test_collectives_fake_transport),
      cmocka_unit_test(test_double_tree_shape),
      cmocka_unit_test(test_any_window_rendezvous),
      cmocka_unit_test(test_rd_signed_zero_identical),
      cmocka_unit_test(test_layout_grouping),
      cmocka_unit_test(test_peers_mutual),
      cmocka_unit_test(test_layouts_fake_transport),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
