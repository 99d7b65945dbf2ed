/*
 * The schedule cases (sched_cases.h): the matrices, the inputs every rank
 * starts from and the output every rank must end with.
 */
#include "sched_cases.h"
#include "engine/exec_cpu.h"
#include "layout.h"
#include "sched_build.h"
#include "sched_algos.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One case; `L` its layout (NULL: one node of n ranks, bound nowhere). */
static void emit(sched_case_fn fn, void* arg, const struct sched_layout* L, int coll, int algo,
                 int n, size_t count, ncclDataType_t type, ncclRedOp_t op, int root, int inplace,
                 size_t chunk, int window) {
  struct sched_case c = {L ? L->hosts : NULL,
                         L ? sched_layout_cache(L) : NULL,
                         coll,
                         algo,
                         n,
                         count,
                         type,
                         op,
                         root,
                         inplace,
                         chunk,
                         window};
  fn(&c, arg);
}

void sched_cases_allreduce(sched_case_fn fn, void* arg) {
  static const size_t counts[] = {0, 1, 2, 7, 1023, 20011};
  static const ncclDataType_t types[] = {ncclFloat, ncclInt32, ncclDouble};
  static const ncclRedOp_t ops[] = {ncclSum, ncclMax, ncclAvg};
  for (int n = 1; n <= FAKE_MAXR; n++)
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
      for (int t = 0; t < 3; t++)
        for (int o = 0; o < 3; o++)
          for (int ip = 0; ip < 2; ip++)
            for (int algo = 0; algo < ALGO_COUNT; algo++)
              emit(fn, arg, NULL, COLL_ALLREDUCE, algo, n, counts[c], types[t], ops[o], 0, ip, 4096,
                   4);
}

/* Every other collective with every algorithm that implements it, every
 * root, in and out of place. */
void sched_cases_collectives(sched_case_fn fn, void* arg) {
  static const size_t counts[] = {0, 1, 5, 1023, 9001};
  for (int coll = COLL_ALLGATHER; coll < COLL_COUNT; coll++)
    for (int algo = 0; algo < ALGO_COUNT; algo++) {
      if (!sched_supports(coll, algo)) continue;
      for (int n = 1; n <= FAKE_MAXR; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
          for (int root = 0; root < n; root += (coll >= COLL_BROADCAST ? 1 : n))
            for (int ip = 0; ip < 2; ip++) {
              emit(fn, arg, NULL, coll, algo, n, counts[c], ncclFloat, ncclSum, root, ip, 4096, 4);
              emit(fn, arg, NULL, coll, algo, n, counts[c], ncclInt32, ncclAvg, root, ip, 4096, 4);
            }
    }
}

/* The fake transport is rendezvous (a send completes only when the peer
 * has posted the receive): any window must still finish without deadlock. */
void sched_cases_windows(sched_case_fn fn, void* arg) {
  for (int window = 1; window <= 9; window++)
    for (int n = 2; n <= FAKE_MAXR; n += 3)
      for (int coll = 0; coll < COLL_COUNT; coll++)
        for (int algo = 0; algo < ALGO_COUNT; algo++)
          if (sched_supports(coll, algo))
            emit(fn, arg, NULL, coll, algo, n, 50021, ncclFloat, ncclSum, n - 1, 0, 1024, window);
}

const struct sched_layout sched_layouts[] = {
    {.n = 4, .hosts = {1, 1, 1, 1}},
    {.n = 4, .hosts = {1, 1, 2, 2}},
    {.n = 6, .hosts = {1, 1, 1, 2, 2, 2}},
    {.n = 7, .hosts = {1, 1, 1, 2, 2, 3, 3}},
    {.n = 4, .hosts = {1, 2, 3, 4}},
    {.n = 4, .hosts = {1, 2, 1, 2}},
    {.n = 7, .hosts = {3, 1, 2, 3, 1, 2, 1}},
    {.n = 8, .hosts = {1, 1, 1, 1, 2, 2, 2, 2}},
    {.n = 5, .hosts = {1, 1, 1, 1, 2}},
    /* bound round-robin over two caches a node: each node's order 0 2 .. 1 3 .. */
    {.n = 8, .hosts = {1, 1, 1, 1, 1, 1, 1, 1}, .bound = 1, .cache = {0, 1, 0, 1, 0, 1, 0, 1}},
    {.n = 8, .hosts = {1, 1, 1, 1, 2, 2, 2, 2}, .bound = 1, .cache = {0, 1, 0, 1, 2, 3, 2, 3}},
    /* orders 2 1 0 | 4 5 3, and 2 6 0 4 | 3 1 5 */
    {.n = 6, .hosts = {1, 1, 1, 2, 2, 2}, .bound = 1, .cache = {1, 0, -1, 5, 4, 4}},
    {.n = 7, .hosts = {1, 2, 1, 2, 1, 2, 1}, .bound = 1, .cache = {3, 1, 2, 0, 3, 1, 2}},
};
const size_t sched_nlayouts = sizeof(sched_layouts) / sizeof(sched_layouts[0]);

const int* sched_layout_cache(const struct sched_layout* L) {
  return L->bound ? L->cache : NULL;
}

/* Every collective with every algorithm on every layout: hierarchical
 * schedules, node-ordered rings and trees all give the exact answer. */
void sched_cases_layouts(sched_case_fn fn, void* arg) {
  static const size_t counts[] = {0, 1, 5, 1023, 20011};
  for (size_t l = 0; l < sched_nlayouts; l++) {
    const struct sched_layout* L = &sched_layouts[l];
    struct sched_topo t;
    assert_int_equal(sched_topo_init(&t, L->n, L->hosts), ncclSuccess);
    sched_topo_place(&t, sched_layout_cache(L), NULL);
    for (int coll = 0; coll < COLL_COUNT; coll++)
      for (int algo = 0; algo < ALGO_COUNT; algo++) {
        if (!sched_supports_on(&t, coll, algo)) continue;
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
          for (int ip = 0; ip < 2; ip++) {
            int root = L->n - 2;
            emit(fn, arg, L, coll, algo, L->n, counts[c], ncclFloat, ncclSum, root, ip, 4096, 4);
            emit(fn, arg, L, coll, algo, L->n, counts[c], ncclInt32, ncclAvg, root, ip, 1024, 6);
            emit(fn, arg, L, coll, algo, L->n, counts[c], ncclDouble, ncclMax, root, ip, 512, 9);
            /* Wide windows: Hier all-reduce pipelines its rounds there. */
            emit(fn, arg, L, coll, algo, L->n, counts[c], ncclFloat, ncclSum, root, ip, 256, 32);
          }
      }
    sched_topo_free(&t);
  }
}

/* Input element i of `rank`: (rank + 3i) mod 5, so every value, and every
 * reduction over ranks, repeats with period 5 in i. */
#define VALUE_PERIOD 5
static double value_of(int rank, size_t i) {
  return (double)((rank + 3 * i) % VALUE_PERIOD);
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

/* The expected values of one case, by element index modulo the period. */
struct case_expect {
  double reduced[VALUE_PERIOD];
  double input[VALUE_PERIOD][FAKE_MAXR]; /* [i mod period][rank] */
};

static void expect_init(const struct sched_case* c, struct case_expect* x) {
  double shift = c->type == ncclInt32 ? 2 : 0;
  for (size_t k = 0; k < VALUE_PERIOD; k++) {
    x->reduced[k] = reduced(c->n, c->type, c->op, k);
    for (int r = 0; r < c->n; r++) x->input[k][r] = value_of(r, k) - shift;
  }
}

/* What rank r's output element i must hold (POISON: left untouched). */
static double expected(const struct sched_case* c, const struct case_expect* x, int r, size_t i) {
  switch (c->coll) {
    case COLL_ALLREDUCE:
      return x->reduced[i % VALUE_PERIOD];
    case COLL_REDUCE:
      return r == c->root ? x->reduced[i % VALUE_PERIOD] : POISON;
    case COLL_BROADCAST:
      return x->input[i % VALUE_PERIOD][c->root];
    case COLL_ALLGATHER:
      return x->input[i % c->count % VALUE_PERIOD][i / c->count];
    default:
      return x->reduced[((size_t)r * c->count + i) % VALUE_PERIOD]; /* reduce-scatter */
  }
}

void sched_case_describe(const struct sched_case* c, char* buf, size_t len) {
  snprintf(buf, len,
           "%s%s%s %s n=%d count=%zu type=%d op=%d root=%d inplace=%d chunk=%zu window=%d",
           c->hosts ? "layout " : "", c->cache ? "bound " : "", sched_coll_name(c->coll),
           sched_algo_name(c->algo), c->n, c->count, c->type, c->op, c->root, c->inplace, c->chunk,
           c->window);
}

/* Each rank's buffers: in place as NCCL defines it, inputs set, outputs
 * poisoned. */
static void run_buffers(const struct sched_case* c, struct sched_run* run) {
  size_t n = (size_t)c->n, count = c->count, es = c->type == ncclDouble ? 8 : 4;
  size_t nsend = c->coll == COLL_REDUCESCATTER ? n * count : count;
  size_t nrecv = c->coll == COLL_ALLGATHER ? n * count : count;
  size_t big = (nsend > nrecv ? nsend : nrecv) + 1;
  memset(run, 0, sizeof(*run));
  run->n = c->n;
  run->recv_bytes = nrecv * es;
  for (int r = 0; r < c->n; r++) {
    run->mem[r] = calloc(2 * big, 8);
    assert_non_null(run->mem[r]);
    run->send[r] = run->mem[r];
    run->recv[r] = (char*)run->mem[r] + big * 8;
    if (c->inplace && c->coll == COLL_ALLGATHER)
      run->send[r] = (char*)run->recv[r] + (size_t)r * count * es;
    if (c->inplace && c->coll == COLL_REDUCESCATTER)
      run->recv[r] = (char*)run->send[r] + (size_t)r * count * es;
    if (c->inplace && c->coll != COLL_ALLGATHER && c->coll != COLL_REDUCESCATTER)
      run->recv[r] = run->send[r];
    for (size_t i = 0; i < nrecv && !c->inplace; i++) put_elem(run->recv[r], c->type, i, POISON);
    for (size_t i = 0; i < nsend; i++) /* the input as this rank sees it */
      put_elem(run->send[r], c->type, i, value_of(r, i) - (c->type == ncclInt32 ? 2 : 0));
  }
}

static void run_check(const struct sched_case* c, const struct sched_run* run) {
  size_t es = c->type == ncclDouble ? 8 : 4;
  struct case_expect x;
  expect_init(c, &x);
  for (int r = 0; r < c->n; r++)
    for (size_t i = 0; i < run->recv_bytes / es; i++) {
      double want = expected(c, &x, r, i);
      if (want == POISON && c->inplace) continue; /* non-root reduce in place: input stays */
      double got = get_elem(run->recv[r], c->type, i);
      if (got != want) {
        char what[160];
        sched_case_describe(c, what, sizeof(what));
        fail_msg("%s rank %d [%zu]: %g != %g", what, r, i, got, want);
      }
    }
}

/* Run `c`, its tasks on `backend` either as the host backend or (staged)
 * as the device backend of buffers labelled device memory. */
static void case_run(const struct sched_case* c, const struct exec_backend* backend,
                     void* const* states, int staged, int lend, int check, struct sched_run* run) {
  struct fake_world* w = calloc(1, sizeof(*w));
  struct exec_args args[FAKE_MAXR];
  assert_non_null(w);
  run_buffers(c, run);
  fake_world_init(w, c->n, 8192, c->window, c->hosts, staged ? &exec_backend_cpu : backend,
                  staged ? NULL : states);
  if (c->cache) fake_world_place(w, c->cache);
  if (lend) fake_world_lend(w, 8192);
  for (int r = 0; r < c->n; r++) {
    fake_args(&args[r], c->n, c->coll, c->algo, c->root, run->send[r], run->recv[r], c->count,
              c->type, c->op, c->chunk);
    if (staged) {
      args[r].mem = MEM_DEVICE;
      exec_set_device_backend(&w->ex[r], backend, states ? states[r] : NULL);
    }
  }
  if (getenv("TEST_TRACE")) {
    char what[160];
    sched_case_describe(c, what, sizeof(what));
    fprintf(stderr, "case %s%s%s\n", what, staged ? " staged" : "", lend ? " lending" : "");
  }
  fake_world_run(w, args);
  if (check) run_check(c, run);
  fake_world_lend_counts(w, &run->lent, &run->in_place);
  fake_world_free(w);
  free(w);
}

void sched_case_run(const struct sched_case* c, const struct exec_backend* backend,
                    void* const* states, struct sched_run* run) {
  case_run(c, backend, states, 0, 0, 1, run);
}

void sched_case_run_lending(const struct sched_case* c, const struct exec_backend* backend,
                            void* const* states, struct sched_run* run) {
  case_run(c, backend, states, 0, 1, 1, run);
}

void sched_case_run_staged(const struct sched_case* c, const struct exec_backend* backend,
                           void* const* states, struct sched_run* run) {
  case_run(c, backend, states, 1, 0, 1, run);
}

void sched_case_run_reference(const struct sched_case* c, struct sched_run* run) {
  case_run(c, &exec_backend_cpu, NULL, 0, 0, 0, run);
}

void sched_run_free(struct sched_run* run) {
  for (int r = 0; r < run->n; r++) free(run->mem[r]);
  memset(run, 0, sizeof(*run));
}
