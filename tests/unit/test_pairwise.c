/*
 * The deterministic mode's promise, on the fake transport: every element of
 * a Pairwise all-reduce, reduce-scatter and reduce is bit for bit the
 * canonical pairwise tree of its n inputs (computed here serially with the
 * kernels' own pairwise calls), for every type and op, any rank count, chunk,
 * buffer size and offset, in and out of place; and the other algorithms do
 * differ from it on such inputs (so the check has teeth).
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
#include "common/order_inputs.h"
#include "common/sched_cases.h"
#include "engine/exec_cpu.h"
#include "kernels.h"
#include "layout.h"
#include "pairwise.h"
#include "sched_build.h"
#include "schedule.h"

#define MAXR FAKE_MAXR
#define SLOT_BYTES 8192

static const ncclDataType_t all_types[] = {
    ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
    ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
#define NTYPES (sizeof(all_types) / sizeof(all_types[0]))
#define OP_PREMUL ncclNumOps /* a PreMulSum by 0.75 (3 for integers) */
static const int all_ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, OP_PREMUL};
#define NOPS (sizeof(all_ops) / sizeof(all_ops[0]))

/* Rank r's input for element e (tests/common/order_inputs.h), with zeros,
 * infinities and NaNs among them. */
static void input_at(ncclDataType_t t, int r, uint64_t e, void* out) {
  order_input(t, 1, r, e, out);
}

/* The PreMulSum scalar in the type's encoding. */
static uint64_t premul_scalar(ncclDataType_t t) {
  uint64_t s = 0;
  float f = 0.75f;
  double d = 0.75;
  uint16_t h16;
  uint8_t h8;
  switch (t) {
    case ncclFloat32:
      memcpy(&s, &f, 4);
      return s;
    case ncclFloat64:
      memcpy(&s, &d, 8);
      return s;
    case ncclFloat16:
      h16 = kern_float_to_half(f);
      return h16;
    case ncclBfloat16:
      h16 = kern_float_to_bf16(f);
      return h16;
    case ncclFloat8e4m3:
      h8 = kern_float_to_e4m3(f);
      return h8;
    case ncclFloat8e5m2:
      h8 = kern_float_to_e5m2(f);
      return h8;
    default:
      return 3;
  }
}

static void call_args(struct exec_args* a, int n, int coll, int algo, int root, const void* send,
                      void* recv, size_t count, ncclDataType_t type, int op, size_t chunk) {
  fake_args(a, n, coll, algo, root, send, recv, count, type, op == OP_PREMUL ? ncclSum : op, chunk);
  if (op == OP_PREMUL) {
    a->redop.scalar = premul_scalar(type);
    a->pre = KERN_PRE;
  }
}

/* ---- The serial reference: the canonical tree, with the kernels' own
 * pairwise calls (inputs pre-multiplied alone, the post-divide fused into
 * the last combine) ---- */

static void canon_node(const struct kern_redop* rop, unsigned post, const uint8_t* leaves,
                       size_t es, int n, int base, int size, uint8_t* out) {
  if (size == 1) {
    memcpy(out, leaves + (size_t)base * es, es);
    return;
  }
  uint8_t a[8], b[8];
  int half = size / 2;
  if (base + half >= n) { /* the upper half holds no rank */
    canon_node(rop, post, leaves, es, n, base, half, out);
    return;
  }
  canon_node(rop, 0, leaves, es, n, base, half, a);
  canon_node(rop, 0, leaves, es, n, base + half, half, b);
  kern_reduce(rop, post, out, a, b, 1);
}

static void canon_value(const struct exec_args* a, int n, const uint8_t* inputs, uint8_t* out) {
  size_t es = kern_type_size(a->type);
  uint8_t leaves[MAXR * 8];
  if (n == 1) {
    kern_unary(&a->redop, a->pre | a->post, out, inputs, 1);
    return;
  }
  for (int r = 0; r < n; r++) kern_unary(&a->redop, a->pre, leaves + r * es, inputs + r * es, 1);
  int p = 1 << pairwise_levels(n);
  canon_node(&a->redop, a->post, leaves, es, n, 0, p, out);
}

/* ---- One call on the fake transport ---- */

struct pw_call {
  int coll, algo, n, root, inplace, op;
  ncclDataType_t type;
  size_t count, chunk;
  uint64_t first;        /* the notional index of element 0 */
  const uint64_t* hosts; /* the ranks' nodes; NULL: one node */
  const int* cache;      /* the caches the ranks are bound inside; NULL: none */
};

struct pw_bufs {
  uint8_t* send[MAXR];
  uint8_t* recv[MAXR];
};

static size_t send_elems(const struct pw_call* c) {
  return c->coll == COLL_REDUCESCATTER ? c->count * (size_t)c->n : c->count;
}

/* The executor's window for the calls (4, its floor; 16, the default,
 * where groups of 8 blocks and skewed slices run). */
static int g_window = 4;

/* Runs `c`; the outputs stay in `b` (free with bufs_free). */
static void pw_run(const struct pw_call* c, struct pw_bufs* b) {
  size_t es = kern_type_size(c->type), ns = send_elems(c);
  struct fake_world* w = calloc(1, sizeof(*w));
  struct exec_args args[MAXR];
  fake_world_init(w, c->n, SLOT_BYTES, g_window, c->hosts, &exec_backend_cpu, NULL);
  if (c->cache) fake_world_place(w, c->cache);
  for (int r = 0; r < c->n; r++) {
    b->send[r] = malloc(ns * es + 1);
    b->recv[r] = c->inplace ? b->send[r] : malloc(ns * es + 1);
    for (size_t i = 0; i < ns; i++) input_at(c->type, r, c->first + i, b->send[r] + i * es);
    /* in place, a reduce-scatter's output is the rank's own block */
    void* recv = c->inplace && c->coll == COLL_REDUCESCATTER ? b->send[r] + r * c->count * es
                                                             : (void*)b->recv[r];
    call_args(&args[r], c->n, c->coll, c->algo, c->root, b->send[r], recv, c->count, c->type, c->op,
              c->chunk);
  }
  fake_world_run(w, args);
  fake_world_free(w);
  free(w);
}

static void bufs_free(const struct pw_call* c, struct pw_bufs* b) {
  for (int r = 0; r < c->n; r++) {
    if (b->recv[r] != b->send[r]) free(b->recv[r]);
    free(b->send[r]);
  }
}

/* Where rank r finds element i of its result, or NULL when it has none. */
static const uint8_t* result_at(const struct pw_call* c, const struct pw_bufs* b, int r, size_t i,
                                size_t* elem) {
  size_t es = kern_type_size(c->type);
  if (c->coll == COLL_REDUCE && r != c->root) return NULL;
  if (c->coll != COLL_REDUCESCATTER) return *elem = i, b->recv[r] + i * es;
  size_t block = (size_t)r * c->count; /* rank r's block of the input */
  if (i < block || i >= block + c->count) return NULL;
  *elem = i;
  return (c->inplace ? b->send[r] + block * es : b->recv[r]) + (i - block) * es;
}

/* Elements whose result differs from the canonical value. */
static size_t count_differences(const struct pw_call* c, const struct pw_bufs* b) {
  size_t es = kern_type_size(c->type), bad = 0;
  struct exec_args a;
  call_args(&a, c->n, c->coll, c->algo, c->root, NULL, NULL, c->count, c->type, c->op, c->chunk);
  for (size_t i = 0; i < send_elems(c); i++) {
    uint8_t inputs[MAXR * 8], want[8];
    for (int r = 0; r < c->n; r++) input_at(c->type, r, c->first + i, inputs + r * es);
    canon_value(&a, c->n, inputs, want);
    for (int r = 0; r < c->n; r++) {
      size_t e;
      const uint8_t* got = result_at(c, b, r, i, &e);
      if (got && memcmp(got, want, es) != 0) bad++;
    }
  }
  return bad;
}

static void check_canonical(const struct pw_call* c) {
  struct pw_bufs b;
  if (getenv("PW_TRACE"))
    fprintf(stderr, "%s n %d type %d op %d count %zu chunk %zu\n", sched_coll_name(c->coll), c->n,
            (int)c->type, c->op, c->count, c->chunk);
  pw_run(c, &b);
  size_t bad = count_differences(c, &b);
  if (bad)
    fail_msg("%s n %d type %d op %d count %zu chunk %zu first %llu inplace %d root %d: %zu differ",
             sched_coll_name(c->coll), c->n, (int)c->type, c->op, c->count, c->chunk,
             (unsigned long long)c->first, c->inplace, c->root, bad);
  bufs_free(c, &b);
}

/* Every type x op x collective x rank count, odd counts, in and out of
 * place, two chunks (one element per slice, and whole slots). */
static void test_every_type_and_op(void** state) {
  (void)state;
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE};
  for (int n = 1; n <= MAXR; n++)
    for (size_t t = 0; t < NTYPES; t++)
      for (size_t o = 0; o < NOPS; o++)
        for (int ci = 0; ci < 3; ci++) {
          size_t es = kern_type_size(all_types[t]);
          struct pw_call c = {colls[ci],  ALGO_PAIRWISE, n,  n - 1,  (int)(o & 1),
                              all_ops[o], all_types[t],  37, 3 * es, 11,
                              NULL,       NULL};
          check_canonical(&c);
          c.chunk = SLOT_BYTES, c.root = 0, c.inplace = !c.inplace;
          check_canonical(&c);
        }
}

static void run_sizes_offsets_chunks(void) {
  static const size_t counts[] = {1, 5, 1000, 4099, 20011};
  static const size_t chunks[] = {4, 1024, SLOT_BYTES};
  static const uint64_t firsts[] = {0, 1, 999};
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE};
  for (int n = 2; n <= MAXR; n++)
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
      for (size_t ch = 0; ch < sizeof(chunks) / sizeof(chunks[0]); ch++)
        for (int ci = 0; ci < 3; ci++) {
          struct pw_call c = {colls[ci], ALGO_PAIRWISE, n,         (int)k % n, (int)ch & 1,
                              ncclSum,   ncclFloat32,   counts[k], chunks[ch], firsts[(k + ch) % 3],
                              NULL,      NULL};
          check_canonical(&c);
        }
}

/* The same element gets the same bits whatever buffer it sits in, at any
 * offset, cut in any chunks, under the smallest window and the default
 * one; whole-buffer exchanges (small all-reduces on 2, 4, 8 ranks) and
 * the tree agree. */
static void test_any_size_offset_chunk(void** state) {
  (void)state;
  for (g_window = 4; g_window <= 16; g_window *= 4) run_sizes_offsets_chunks();
  g_window = 4;
}

/* Across nodes: where nodes hold aligned blocks of ranks, small
 * all-reduces cross them from each node's first rank only and large ones
 * run segments in a pipeline; elsewhere the flat schedules run. Every
 * layout the schedule tests use, every type and op, still the canonical
 * tree. */
static void test_node_layouts(void** state) {
  (void)state;
  static const size_t counts[] = {5, 4099};
  for (size_t l = 0; l < sched_nlayouts; l++)
    for (size_t t = 0; t < NTYPES; t++)
      for (size_t o = 0; o < NOPS; o++)
        for (size_t k = 0; k < 2; k++) {
          const struct sched_layout* L = &sched_layouts[l];
          struct pw_call c = {
              COLL_ALLREDUCE, ALGO_PAIRWISE, L->n, 0, (int)((o + k) & 1), all_ops[o],
              all_types[t],   counts[k],     1024, 7, L->hosts,           sched_layout_cache(L)};
          check_canonical(&c);
        }
}

/* Teeth: on these inputs the other algorithms' float sums are not the
 * canonical ones (they combine in other orders), so a check that passed
 * for any algorithm would prove nothing. */
static void test_other_algorithms_differ(void** state) {
  (void)state;
  static const int algos[] = {ALGO_RING, ALGO_TREE, ALGO_RD};
  for (int n = 3; n <= MAXR; n++) {
    size_t differ = 0;
    for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++) {
      struct pw_call c = {COLL_ALLREDUCE, algos[a], n,          0, 0,    ncclSum,
                          ncclFloat32,    4099,     SLOT_BYTES, 0, NULL, NULL};
      struct pw_bufs b;
      pw_run(&c, &b);
      size_t d = count_differences(&c, &b);
      differ += d > 0;
      bufs_free(&c, &b);
    }
    assert_true(differ >= 1); /* at n = 4 and 8 recursive doubling happens to be canonical */
    if (n != 4 && n != 8) assert_int_equal(differ, 3);
  }
}

/* Rank k->rank's schedule names only its peers, and it is its peers'. */
static void check_peers(const struct sched_key* k) {
  struct schedule s = {0};
  int peers[64], mine[64];
  int m = sched_peers(k, peers, 64);
  assert_int_equal(sched_build(&s, k), ncclSuccess);
  for (size_t i = 0; i < s.nsteps; i++) {
    int p[2] = {s.steps[i].recv_peer, s.steps[i].send_peer}, found[2] = {p[0] < 0, p[1] < 0};
    for (int j = 0; j < m; j++) found[0] |= peers[j] == p[0], found[1] |= peers[j] == p[1];
    assert_true(found[0] && found[1]);
  }
  for (int j = 0; j < m; j++) { /* I am my peer's peer */
    struct sched_key pk = *k;
    int found = 0;
    pk.rank = peers[j];
    int pm = sched_peers(&pk, mine, 64);
    for (int i = 0; i < pm; i++) found |= mine[i] == k->rank;
    assert_true(found);
  }
  sched_free(&s);
}

static struct sched_key peers_key(const struct sched_topo* t, int coll, int r, int n) {
  struct sched_key k = {.topo = t,
                        .coll = coll,
                        .algo = ALGO_PAIRWISE,
                        .rank = r,
                        .nranks = n,
                        .root = n / 2,
                        .count = 100003,
                        .elem_size = 4,
                        .chunk_bytes = 65536,
                        .slices_per_step = 2};
  return k;
}

/* A schedule's peers are symmetric and cover every rank it names. */
static void test_peers_cover_schedule(void** state) {
  (void)state;
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE};
  for (int n = 2; n <= 37; n++)
    for (int ci = 0; ci < 3; ci++)
      for (int r = 0; r < n; r++) {
        struct sched_key k = peers_key(NULL, colls[ci], r, n);
        check_peers(&k);
      }
}

/* Caches of 8 ranks (the first 4 for 4 ranks): popcount(r) mod 2, where
 * no canonical partners share one (re-paired at every level but 0); the
 * other placements of 2 caches (rank order as it is); 4 caches, mirrored
 * (re-paired at level 2 by 7, several bits); some ranks bound nowhere. */
static const int placements[][8] = {
    {0, 1, 1, 0, 1, 0, 0, 1}, {0, 0, 1, 1, 0, 0, 1, 1},   {0, 1, 0, 1, 0, 1, 0, 1},
    {0, 1, 2, 3, 3, 2, 1, 0}, {5, -1, 5, 7, -1, 7, 5, 7},
};
#define NPLACEMENTS (sizeof(placements) / sizeof(placements[0]))

/* The levels the layout re-pairs, and the peers that follow. */
static void test_placement_repairs(void** state) {
  (void)state;
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE};
  uint64_t hosts[8] = {0};
  struct sched_topo t;
  assert_int_equal(sched_topo_init(&t, 4, hosts), ncclSuccess);
  sched_topo_place(&t, placements[0], NULL);
  assert_int_equal(t.pair_xor[1], 3); /* 0 with 3, 1 with 2: the ranks of one cache */
  assert_int_equal(t.pair_shared[0], 0);
  assert_int_equal(t.pair_shared[1], 8); /* 4 ranks sharing an L2 */
  struct sched_key k = peers_key(&t, COLL_REDUCESCATTER, 0, 4);
  int peers[8], m = sched_peers(&k, peers, 8), has3 = 0, has2 = 0;
  for (int i = 0; i < m; i++) has3 |= peers[i] == 3, has2 |= peers[i] == 2;
  assert_true(has3 && !has2);
  sched_topo_free(&t);
  assert_int_equal(sched_topo_init(&t, 8, hosts), ncclSuccess);
  sched_topo_place(&t, placements[3], NULL);
  assert_int_equal(t.pair_xor[1], 0); /* no pair at distance 2 or 3 shares */
  assert_int_equal(t.pair_xor[2], 7);
  /* a core each (its own L2), sockets (the L3s) taken in turn: the
   * canonical partners above level 0 share a socket, and only the gather
   * changes (level 0 first); by popcount, re-paired as the L2s above */
  static const int own_l2[8] = {0, 1, 2, 3, 4, 5, 6, 7}, by_turn[8] = {0, 1, 0, 1, 0, 1, 0, 1};
  sched_topo_place(&t, own_l2, by_turn);
  for (int l = 0; l < 3; l++) assert_int_equal(t.pair_xor[l], 0);
  assert_int_equal(t.pair_shared[0], 0);
  assert_int_equal(t.pair_shared[1], 8);
  assert_int_equal(t.pair_shared[2], 8);
  sched_topo_place(&t, own_l2, placements[0]);
  assert_int_equal(t.pair_xor[1], 3);
  assert_int_equal(t.pair_xor[2], 5);
  for (size_t p = 0; p < NPLACEMENTS; p++) {
    sched_topo_place(&t, placements[p], NULL);
    for (int ci = 0; ci < 3; ci++)
      for (int r = 0; r < 8; r++) {
        k = peers_key(&t, colls[ci], r, 8);
        check_peers(&k);
      }
  }
  sched_topo_free(&t);
}

/* Re-paired, every collective still computes the canonical tree: every
 * placement, type and op, one element per slice and whole slots, under
 * the smallest window (a full ring: the re-paired levels cannot deadlock)
 * and the default one. */
static void test_placements_canonical(void** state) {
  (void)state;
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE};
  for (g_window = 4; g_window <= 16; g_window *= 4)
    for (size_t p = 0; p < NPLACEMENTS; p++)
      for (int n = 4; n <= 8; n += 4)
        for (size_t t = 0; t < NTYPES; t++)
          for (int ci = 0; ci < 3; ci++) {
            size_t o = (t + p + (size_t)ci) % NOPS, es = kern_type_size(all_types[t]);
            struct pw_call c = {colls[ci],
                                ALGO_PAIRWISE,
                                n,
                                (int)(p + t) % n,
                                (int)(t & 1),
                                all_ops[o],
                                all_types[t],
                                4099,
                                t & 1 ? 3 * es : SLOT_BYTES,
                                5,
                                NULL,
                                placements[p]};
            check_canonical(&c);
          }
  g_window = 4;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_type_and_op),    cmocka_unit_test(test_any_size_offset_chunk),
      cmocka_unit_test(test_node_layouts),         cmocka_unit_test(test_other_algorithms_differ),
      cmocka_unit_test(test_peers_cover_schedule), cmocka_unit_test(test_placement_repairs),
      cmocka_unit_test(test_placements_canonical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
