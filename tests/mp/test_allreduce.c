/* Multi-process all-reduce correctness: every type x op x count x placement on
 * 1..8 forked ranks, comm reuse across sizes, and groups on one comm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "archeck.h"
#include "comm/comm.h" /* the schedule cache's build counter */
#include "dtypes.h"
#include "launcher.h"

#define BIG_COUNT ((size_t)(1u << 20) + 3)

/* The last one is lowered by MP_BIG_COUNT (mp_big_count). */
static const size_t kCounts[] = {0, 1, 7, 1023, BIG_COUNT};
#define NCOUNTS (sizeof(kCounts) / sizeof(kCounts[0]))

/* Two buffers big enough for any call of the matrix. */
typedef struct bufs {
  unsigned char* a;
  unsigned char* b;
} bufs;

static int bufs_alloc(const mp_env* env, bufs* b, size_t count) {
  size_t bytes = count * 8 + AR_GUARD;
  b->a = malloc(bytes);
  b->b = malloc(bytes);
  if (b->a && b->b) return 0;
  mp_fail(env, "out of memory (%zu bytes)", 2 * bytes);
  return -1;
}

static void bufs_free(bufs* b) {
  free(b->a);
  free(b->b);
}

static int premul_create_all(const mp_env* env, ncclComm_t comm, ncclRedOp_t* ops) {
  for (int t = 0; t < ncclNumTypes; t++)
    if (ar_op_create(env, comm, (ncclDataType_t)t, AR_PREMUL, &ops[t]) != 0) return -1;
  return 0;
}

static int premul_destroy_all(const mp_env* env, ncclComm_t comm, const ncclRedOp_t* ops) {
  int bad = 0;
  for (int t = 0; t < ncclNumTypes; t++) bad += ar_op_destroy(env, comm, AR_PREMUL, ops[t]);
  return bad;
}

/* Runs one call on the shared buffers: 0 exact, 1 wrong data, -1 call failed. */
static int run_shared(const mp_env* env, ncclComm_t comm, const bufs* b, ar_call* c) {
  c->send = b->a;
  c->recv = c->inplace ? b->a : b->b;
  return ar_run(c, env, comm);
}

/* Ends the comm: destroy when healthy, abort after a failed call. */
static int finish(const mp_env* env, ncclComm_t comm, int fatal) {
  if (fatal) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

/* All types, ops and placements for one count. Returns #wrong, or -1. */
static int matrix_count(const mp_env* env, ncclComm_t comm, const bufs* b, const ncclRedOp_t* pm,
                        size_t count, int* calls) {
  int bad = 0;
  for (int t = 0; t < ncclNumTypes; t++) {
    for (int k = 0; k < AR_NKINDS; k++) {
      for (int ip = 0; ip < 2; ip++) {
        ar_call c = {.type = (ncclDataType_t)t, .kind = k, .count = count, .inplace = ip};
        if (k == AR_PREMUL)
          c.op = pm[t];
        else
          ar_op_create(env, comm, c.type, k, &c.op);
        c.salt = (uint64_t)(*calls)++;
        int r = run_shared(env, comm, b, &c);
        if (r < 0) return -1;
        bad += r;
      }
    }
  }
  return bad;
}

static int matrix_body(const mp_env* env) {
  ncclComm_t comm;
  ncclRedOp_t pm[ncclNumTypes];
  bufs b;
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (premul_create_all(env, comm, pm) != 0 || bufs_alloc(env, &b, BIG_COUNT) != 0)
    return finish(env, comm, 1);
  double t0 = mp_now();
  int bad = 0, calls = 0, fatal = 0;
  for (size_t ci = 0; ci < NCOUNTS && !fatal; ci++) {
    size_t count = ci == NCOUNTS - 1 ? mp_big_count(BIG_COUNT) : kCounts[ci];
    int r = matrix_count(env, comm, &b, pm, count, &calls);
    fatal = r < 0;
    bad += r < 0 ? 0 : r;
  }
  bufs_free(&b);
  if (!fatal) bad += premul_destroy_all(env, comm, pm);
  if (env->rank == 0 || bad)
    mp_log(env, "matrix: %d calls, %d wrong, %.1f s", calls, bad, mp_now() - t0);
  return finish(env, comm, fatal) + (bad != 0);
}

/* The matrix on as many ranks as the test's state says. */
static void test_matrix(void** state) {
  assert_int_equal(mp_launch(*(const int*)*state, matrix_body, NULL, NULL), 0);
}

static const int k_ranks[] = {1, 2, 3, 4, 5, 8};

/* Back-to-back calls of changing sizes on one comm and the same buffers:
 * stale data from the previous call must never leak into the next. */
static int reuse_body(const mp_env* env) {
  static const size_t sizes[] = {BIG_COUNT, 1, 65536, 0, 7, BIG_COUNT, 1023, 3, 4099 * 2 + 5};
  ncclComm_t comm;
  bufs b;
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (bufs_alloc(env, &b, BIG_COUNT) != 0) return finish(env, comm, 1);
  int bad = 0, fatal = 0, n = (int)(sizeof(sizes) / sizeof(sizes[0]));
  for (int i = 0; i < 3 * n && !fatal; i++) {
    ar_call c = {.type = (ncclDataType_t)((i * 5) % ncclNumTypes),
                 .kind = i % (AR_NKINDS - 1), /* builtins */
                 .count = sizes[i % n],
                 .inplace = i & 1,
                 .salt = 1000u + (uint64_t)i};
    ar_op_create(env, comm, c.type, c.kind, &c.op);
    int r = run_shared(env, comm, &b, &c);
    fatal = r < 0;
    bad += r > 0;
  }
  bufs_free(&b);
  return finish(env, comm, fatal) + (bad != 0);
}

static void test_reuse_sizes(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, reuse_body, NULL, NULL), 0);
}

/* Calls that alternate three sizes and types on one comm build their
 * schedules in the first round and none after: the comm's schedule cache
 * (read through the internal header) holds all of them. */
static int cache_body(const mp_env* env) {
  static const ar_call kinds[] = {{.type = ncclFloat32, .kind = AR_SUM, .count = 100003},
                                  {.type = ncclInt8, .kind = AR_MAX, .count = 7},
                                  {.type = ncclFloat16, .kind = AR_AVG, .count = 4099}};
  ncclComm_t comm;
  uint64_t first = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0, fatal = 0;
  for (int round = 0; round < 4 && !fatal; round++) {
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]) && !fatal; i++) {
      ar_call c = kinds[i];
      c.inplace = round & 1;
      c.salt = 2000u + (uint64_t)(round * 10) + i;
      fatal = ar_op_create(env, comm, c.type, c.kind, &c.op) != 0 || ar_alloc(&c) != 0;
      int r = fatal ? -1 : ar_run(&c, env, comm);
      fatal = r < 0;
      bad += r > 0;
    }
    uint64_t builds = comm->exec.cache.builds;
    if (round == 0) first = builds;
    if (!fatal && (builds != first || first == 0)) {
      mp_fail(env, "round %d: %llu schedules built so far, %llu after the first round", round,
              (unsigned long long)builds, (unsigned long long)first);
      bad++;
    }
  }
  return finish(env, comm, fatal) + (bad != 0);
}

static void test_schedule_cache(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, cache_body, NULL, NULL), 0);
}

typedef struct group_spec {
  ncclDataType_t type;
  int kind;
  size_t count;
  int inplace;
} group_spec;

static const group_spec kGroup[] = {
    {ncclFloat32, AR_SUM, 100003, 0},       {ncclInt8, AR_PROD, 7, 1},
    {ncclFloat16, AR_AVG, 4099 * 3 + 1, 0}, {ncclInt64, AR_MAX, 0, 1},
    {ncclBfloat16, AR_PREMUL, 1023, 1},     {ncclUint32, AR_MIN, 65536, 0},
    {ncclFloat8e4m3, AR_SUM, 5000, 1},      {ncclFloat64, AR_AVG, 1, 0},
    {ncclUint8, AR_AVG, 300000, 1},         {ncclFloat8e5m2, AR_PREMUL, 77, 0},
};
#define NGROUP (sizeof(kGroup) / sizeof(kGroup[0]))

static int group_prepare(const mp_env* env, ncclComm_t comm, ar_call* calls, size_t n, int round) {
  for (size_t i = 0; i < n; i++) {
    const group_spec* s = &kGroup[i];
    ar_call c = {.type = s->type, .kind = s->kind, .count = s->count, .inplace = s->inplace};
    c.salt = 500u + (uint64_t)(round * 100) + i;
    calls[i] = c;
    if (ar_op_create(env, comm, c.type, c.kind, &calls[i].op) != 0) return -1;
    if (ar_alloc(&calls[i]) != 0 || ar_prepare(&calls[i], env) != 0) return -1;
  }
  return 0;
}

static int group_issue(const mp_env* env, ncclComm_t comm, ar_call* calls, size_t n) {
  int bad = mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (size_t i = 0; i < n; i++) {
    char d[128];
    ar_describe(&calls[i], d, sizeof(d));
    bad += mp_expect_rc(env, comm, ar_issue(&calls[i], comm), ncclSuccess, d);
  }
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
  return bad;
}

static int group_finish(const mp_env* env, ncclComm_t comm, ar_call* calls, size_t n, int check) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (check) bad += ar_verify(&calls[i], env);
    ar_op_destroy(env, comm, calls[i].kind, calls[i].op);
    ar_release(&calls[i]);
  }
  return bad;
}

static int group_body(const mp_env* env) {
  ncclComm_t comm;
  ar_call calls[NGROUP];
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0, fatal = 0;
  for (int round = 0; round < 3 && !fatal; round++) {
    if (group_prepare(env, comm, calls, NGROUP, round) != 0) return finish(env, comm, 1);
    fatal = group_issue(env, comm, calls, NGROUP) != 0;
    bad += group_finish(env, comm, calls, NGROUP, !fatal);
  }
  return finish(env, comm, fatal) + (bad != 0);
}

static void test_group_same_comm(void** state) {
  (void)state;
  assert_int_equal(mp_launch(4, group_body, NULL, NULL), 0);
}

/* Start(Start(a) End, b) End: inner End must not launch; all complete at the
 * outer End. Then a plain call still works. */
static int nested_issue(const mp_env* env, ncclComm_t comm, ar_call* calls) {
  int bad = mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "outer ncclGroupStart");
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "inner ncclGroupStart");
  bad += mp_expect_rc(env, comm, ar_issue(&calls[0], comm), ncclSuccess, "allreduce a");
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "inner ncclGroupEnd");
  bad += mp_expect_rc(env, comm, ar_issue(&calls[1], comm), ncclSuccess, "allreduce b");
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "outer ncclGroupEnd");
  return bad;
}

static int nested_body(const mp_env* env) {
  ncclComm_t comm;
  ar_call calls[2];
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (group_prepare(env, comm, calls, 2, 7) != 0) return finish(env, comm, 1);
  int fatal = nested_issue(env, comm, calls) != 0;
  int bad = group_finish(env, comm, calls, 2, !fatal);
  if (!fatal) {
    ar_call c = {.type = ncclInt32, .kind = AR_SUM, .count = 4099, .salt = 9};
    fatal = ar_alloc(&c) != 0 || ar_op_create(env, comm, c.type, c.kind, &c.op) != 0;
    int r = fatal ? -1 : ar_run(&c, env, comm);
    fatal = r < 0;
    bad += r > 0;
  }
  return finish(env, comm, fatal) + (bad != 0);
}

static void test_group_nested(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, nested_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[0]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[1]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[2]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[3]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[4]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[5]),
      cmocka_unit_test(test_reuse_sizes),
      cmocka_unit_test(test_schedule_cache),
      cmocka_unit_test(test_group_same_comm),
      cmocka_unit_test(test_group_nested),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
