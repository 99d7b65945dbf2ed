/* Multi-process correctness of every collective: all types x ops x counts x
 * roots x placements on 1..8 forked ranks, and mixed collectives in a group. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collcheck.h"
#include "dtypes.h"
#include "launcher.h"

#define BIG_COUNT ((size_t)(1u << 20) + 3)

static const size_t kCounts[] = {0, 1, 7, 1023};
#define NCOUNTS (sizeof(kCounts) / sizeof(kCounts[0]))

/* Big counts for a few types only (one per element size) to stay fast. */
static const ncclDataType_t kBigTypes[] = {ncclFloat8e5m2, ncclBfloat16, ncclInt32, ncclFloat64};
#define NBIGTYPES (sizeof(kBigTypes) / sizeof(kBigTypes[0]))

typedef struct matrix_state {
  const mp_env* env;
  ncclComm_t comm;
  ncclRedOp_t premul[ncclNumTypes];
  int calls;
  int wrong;
  int ncalls_per_coll[CC_NCOLLS];
} matrix_state;

/* Distinct roots among 0, nranks-1 and nranks/2. */
static int roots_of(int nranks, int* roots) {
  int n = 0, cand[3] = {0, nranks - 1, nranks / 2};
  for (int i = 0; i < 3; i++) {
    int dup = 0;
    for (int j = 0; j < n; j++) dup |= roots[j] == cand[i];
    if (!dup) roots[n++] = cand[i];
  }
  return n;
}

static ncclRedOp_t op_for(matrix_state* s, ncclDataType_t type, int kind) {
  ncclRedOp_t op = ncclSum;
  if (kind == AR_PREMUL) return s->premul[type];
  ar_op_create(s->env, s->comm, type, kind, &op);
  return op;
}

/* One call: 0 exact, 1 wrong, -1 failed. */
static int one(matrix_state* s, int coll, ncclDataType_t type, int kind, size_t count, int root,
               int ip) {
  cc_call c = {.coll = coll, .type = type, .kind = kind, .count = count, .root = root};
  c.inplace = ip;
  c.salt = (uint64_t)s->calls++;
  if (cc_is_reduction(coll)) c.op = op_for(s, type, kind);
  s->ncalls_per_coll[coll]++;
  int r = cc_run(&c, s->env, s->comm);
  if (r > 0) s->wrong++;
  return r < 0 ? -1 : 0;
}

/* All kinds, roots and placements of one (collective, type, count). */
static int sweep(matrix_state* s, int coll, ncclDataType_t type, size_t count) {
  int roots[3], nroots = cc_has_root(coll) ? roots_of(s->env->nranks, roots) : 1;
  if (!cc_has_root(coll)) roots[0] = 0;
  int nkinds = cc_is_reduction(coll) ? AR_NKINDS : 1;
  for (int ri = 0; ri < nroots; ri++)
    for (int k = 0; k < nkinds; k++)
      for (int ip = coll == CC_BCAST; ip < 2; ip++)
        if (one(s, coll, type, k, count, roots[ri], ip) < 0) return -1;
  return 0;
}

static int small_matrix(matrix_state* s) {
  for (int coll = 0; coll < CC_NCOLLS; coll++)
    for (int t = 0; t < ncclNumTypes; t++)
      for (size_t ci = 0; ci < NCOUNTS; ci++)
        if (sweep(s, coll, (ncclDataType_t)t, kCounts[ci]) < 0) return -1;
  return 0;
}

/* Big counts: every collective and placement, kinds and roots rotating. */
static int big_matrix(matrix_state* s) {
  int roots[3], nroots = roots_of(s->env->nranks, roots), i = 0;
  size_t big = mp_big_count(BIG_COUNT);
  for (int coll = 0; coll < CC_NCOLLS; coll++)
    for (size_t t = 0; t < NBIGTYPES; t++)
      for (int ip = coll == CC_BCAST; ip < 2; ip++, i++) {
        int kind = cc_is_reduction(coll) ? (i * 5 + coll) % AR_NKINDS : AR_SUM;
        if (one(s, coll, kBigTypes[t], kind, big, roots[i % nroots], ip) < 0) return -1;
      }
  return 0;
}

static int finish(const mp_env* env, ncclComm_t comm, int fatal) {
  if (fatal) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static int matrix_body(const mp_env* env) {
  matrix_state s = {.env = env};
  if (mp_comm_init(env, &s.comm) != 0) return 1;
  for (int t = 0; t < ncclNumTypes; t++)
    if (ar_op_create(env, s.comm, (ncclDataType_t)t, AR_PREMUL, &s.premul[t]) != 0)
      return finish(env, s.comm, 1);
  double t0 = mp_now();
  int fatal = small_matrix(&s) < 0;
  double t1 = mp_now();
  if (!fatal) fatal = big_matrix(&s) < 0;
  for (int t = 0; t < ncclNumTypes && !fatal; t++)
    s.wrong += ar_op_destroy(env, s.comm, AR_PREMUL, s.premul[t]);
  if (env->rank == 0 || s.wrong || fatal)
    mp_log(env,
           "matrix: %d calls (allreduce %d, broadcast %d, bcast %d, reduce %d, allgather %d, "
           "reducescatter %d, alltoall %d, gather %d, scatter %d), %d wrong%s; small %.1f s, "
           "big %.1f s",
           s.calls, s.ncalls_per_coll[CC_ALLREDUCE], s.ncalls_per_coll[CC_BROADCAST],
           s.ncalls_per_coll[CC_BCAST], s.ncalls_per_coll[CC_REDUCE],
           s.ncalls_per_coll[CC_ALLGATHER], s.ncalls_per_coll[CC_REDUCESCATTER],
           s.ncalls_per_coll[CC_ALLTOALL], s.ncalls_per_coll[CC_GATHER],
           s.ncalls_per_coll[CC_SCATTER], s.wrong, fatal ? ", stopped by a failed call" : "",
           t1 - t0, mp_now() - t1);
  return finish(env, s.comm, fatal) + (s.wrong != 0);
}

/* The matrix on as many ranks as the test's state says. */
static void test_matrix(void** state) {
  assert_int_equal(mp_launch(*(const int*)*state, matrix_body, NULL, NULL), 0);
}

static const int k_ranks[] = {1, 2, 3, 5, 8};

/* ---- every collective at once in one group, several rounds ---- */

typedef struct group_spec {
  int coll;
  ncclDataType_t type;
  int kind;
  size_t count;
  int inplace;
} group_spec;

static const group_spec kGroup[] = {
    {CC_BROADCAST, ncclFloat32, AR_SUM, 100003, 0},
    {CC_REDUCE, ncclInt8, AR_PROD, 7, 1},
    {CC_ALLGATHER, ncclFloat16, AR_SUM, 4099, 0},
    {CC_REDUCESCATTER, ncclInt64, AR_MAX, 1023, 1},
    {CC_ALLREDUCE, ncclBfloat16, AR_PREMUL, 5000, 0},
    {CC_BCAST, ncclUint32, AR_SUM, 65536, 1},
    {CC_REDUCE, ncclFloat8e4m3, AR_AVG, 3000, 0},
    {CC_ALLGATHER, ncclUint8, AR_SUM, 0, 1},
    {CC_REDUCESCATTER, ncclFloat64, AR_AVG, 20000, 0},
    {CC_BROADCAST, ncclUint64, AR_SUM, 1, 1},
    {CC_REDUCESCATTER, ncclFloat8e5m2, AR_SUM, 77, 0},
    {CC_ALLREDUCE, ncclInt32, AR_MIN, 9000, 1},
};
#define NGROUP (sizeof(kGroup) / sizeof(kGroup[0]))

static int group_round(const mp_env* env, ncclComm_t comm, int round) {
  cc_call calls[NGROUP];
  int bad = 0, prepared = 0;
  for (size_t i = 0; i < NGROUP && bad == 0; i++, prepared++) {
    const group_spec* g = &kGroup[i];
    cc_call c = {.coll = g->coll, .type = g->type, .kind = g->kind, .count = g->count};
    c.inplace = g->inplace;
    c.root = (int)((i + (size_t)round) % (size_t)env->nranks);
    c.salt = 7000u + (uint64_t)round * 100u + i;
    if (cc_is_reduction(c.coll) && ar_op_create(env, comm, c.type, c.kind, &c.op) != 0) bad++;
    calls[i] = c;
    if (!bad && cc_prepare(&calls[i], env) != 0) bad++;
  }
  if (!bad) {
    bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
    for (size_t i = 0; i < NGROUP; i++) {
      ncclResult_t rc = cc_issue(&calls[i], comm, NULL);
      if (rc != ncclSuccess) cc_report_rc(&calls[i], env, comm, rc), bad++;
    }
    bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (mixed collectives)");
  }
  for (int i = 0; i < prepared; i++) {
    if (!bad) bad += cc_verify(&calls[i], env);
    if (cc_is_reduction(calls[i].coll)) ar_op_destroy(env, comm, calls[i].kind, calls[i].op);
    cc_release(&calls[i]);
  }
  return bad;
}

static int group_body(const mp_env* env) {
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0;
  for (int round = 0; round < 3 && !bad; round++) bad += group_round(env, comm, round);
  /* and a plain call afterwards */
  if (!bad) {
    cc_call c = {.coll = CC_REDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 4099, .root = 1};
    c.root %= env->nranks;
    ar_op_create(env, comm, c.type, c.kind, &c.op);
    bad += cc_run(&c, env, comm) != 0;
  }
  return finish(env, comm, bad != 0) + (bad != 0);
}

static void test_group_mixed(void** state) {
  (void)state;
  static const int sizes[] = {1, 3, 4};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    assert_int_equal(mp_launch(sizes[i], group_body, NULL, NULL), 0);
}

/* ---- placement chosen per rank: in place on some ranks, not on others ---- */

static int mixed_body(const mp_env* env) {
  static const size_t counts[] = {1, 1023, 100003};
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0, fatal = 0, i = 0, n = env->nranks;
  for (int coll = 0; coll < CC_NCOLLS && !fatal; coll++) {
    if (coll == CC_BCAST) continue; /* always in place */
    for (size_t ci = 0; ci < 3 && !fatal; ci++)
      for (int v = 0; v < 2 && !fatal; v++, i++) {
        cc_call c = {.coll = coll, .type = (ncclDataType_t)((i * 5 + 2) % ncclNumTypes)};
        c.count = counts[ci];
        c.kind = i % (AR_NKINDS - 1);
        c.root = (v ? n - 1 : i) % n;
        c.inplace = (env->rank + v) & 1;
        c.salt = 900u + (uint64_t)i;
        if (cc_is_reduction(coll)) ar_op_create(env, comm, c.type, c.kind, &c.op);
        int r = cc_run(&c, env, comm);
        if (r != 0) mp_fail(env, "(in place on %s ranks only)", v ? "odd" : "even");
        fatal = r < 0;
        bad += r > 0;
      }
  }
  return finish(env, comm, fatal) + (bad != 0);
}

static void test_mixed_placement(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, mixed_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(4, mixed_body, NULL, NULL), 0);
}

/* ---- many calls in one group ---- */

#define MANY 256

static int many_body(const mp_env* env) {
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  cc_call* c = calloc(MANY, sizeof(cc_call));
  int bad = c == NULL, n = env->nranks;
  for (int i = 0; i < MANY && !bad; i++) {
    cc_call t = {.coll = (i * 7) % CC_NCOLLS, .type = (ncclDataType_t)((i * 5) % ncclNumTypes)};
    t.kind = i % (AR_NKINDS - 1);
    t.count = (size_t)((i * 37) % 300);
    t.root = i % n;
    t.inplace = (i / 3) & 1;
    t.salt = 20000u + (uint64_t)i;
    c[i] = t;
    if (cc_is_reduction(t.coll)) ar_op_create(env, comm, t.type, t.kind, &c[i].op);
    bad += cc_prepare(&c[i], env) != 0;
  }
  if (!bad) {
    bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
    for (int i = 0; i < MANY; i++) {
      ncclResult_t rc = cc_issue(&c[i], comm, NULL);
      if (rc != ncclSuccess) cc_report_rc(&c[i], env, comm, rc), bad++;
    }
    bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (256 calls)");
  }
  for (int i = 0; c && i < MANY; i++) {
    if (!bad) bad += cc_verify(&c[i], env);
    cc_release(&c[i]);
  }
  free(c);
  return finish(env, comm, bad != 0) + (bad != 0);
}

static void test_group_many(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, many_body, NULL, NULL), 0);
}

/* ---- one thread, ncclCommInitAll comms, every collective in one group ---- */

static int initall_body(const mp_env* env) {
  int n = *(const int*)env->arg, bad = 0;
  enum { NC = 5 };
  ncclComm_t comms[8] = {NULL};
  cc_call c[8][NC];
  mp_env envs[8];
  static const int colls[NC] = {CC_BROADCAST, CC_REDUCE, CC_ALLGATHER, CC_REDUCESCATTER, CC_BCAST};
  if (mp_expect_rc(env, NULL, ncclCommInitAll(comms, n, NULL), ncclSuccess, "ncclCommInitAll"))
    return 1;
  memset(c, 0, sizeof(c));
  for (int r = 0; r < n; r++) {
    envs[r] = *env;
    envs[r].rank = r;
    envs[r].nranks = n;
    for (int k = 0; k < NC && !bad; k++) {
      cc_call t = {.coll = colls[k], .type = (ncclDataType_t)((k * 4 + 1) % ncclNumTypes)};
      t.kind = k % (AR_NKINDS - 1);
      t.count = 4099 + (size_t)k * 1000;
      t.root = (k + 1) % n;
      t.inplace = k & 1;
      t.salt = 300u + (uint64_t)k;
      c[r][k] = t;
      if (cc_is_reduction(t.coll)) ar_op_create(&envs[r], comms[r], t.type, t.kind, &c[r][k].op);
      bad += cc_prepare(&c[r][k], &envs[r]) != 0;
    }
  }
  if (!bad) {
    bad += mp_expect_rc(env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
    for (int k = 0; k < NC; k++)
      for (int r = 0; r < n; r++) {
        ncclResult_t rc = cc_issue(&c[r][k], comms[r], NULL);
        if (rc != ncclSuccess) cc_report_rc(&c[r][k], &envs[r], comms[r], rc), bad++;
      }
    bad += mp_expect_rc(env, NULL, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (InitAll comms)");
  }
  for (int r = 0; r < n; r++)
    for (int k = 0; k < NC; k++) {
      if (!bad) bad += cc_verify(&c[r][k], &envs[r]);
      cc_release(&c[r][k]);
    }
  for (int r = 0; r < n; r++) {
    if (bad)
      ncclCommAbort(comms[r]);
    else
      bad += mp_expect_rc(env, comms[r], ncclCommDestroy(comms[r]), ncclSuccess, "Destroy");
  }
  return bad != 0;
}

static void test_group_initall(void** state) {
  (void)state;
  static const int sizes[] = {2, 3, 4};
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    assert_int_equal(mp_launch(1, initall_body, (void*)&sizes[i], &o), 0);
}

/* ---- bad arguments every rank rejects alike (so none is left waiting) ---- */

typedef struct bad_ctx {
  const mp_env* env;
  ncclComm_t comm;
  float buf[64];
  ncclRedOp_t dead; /* a destroyed premulsum */
} bad_ctx;

typedef struct bad_check {
  const char* what;
  ncclResult_t (*fn)(bad_ctx* c);
  int use_comm;
  int coll; /* run afterwards to show the comm still works */
} bad_check;

#define B(c) ((c)->buf)
#define B2(c) ((c)->buf + 32)
#define N(c) ((c)->env->nranks)
static ncclResult_t bc_null_comm(bad_ctx* c) {
  return ncclBroadcast(B(c), B2(c), 8, ncclFloat, 0, NULL, NULL);
}
static ncclResult_t bc_null_recv(bad_ctx* c) {
  return ncclBroadcast(B(c), NULL, 8, ncclFloat, 0, c->comm, NULL);
}
static ncclResult_t bc_root_neg(bad_ctx* c) {
  return ncclBroadcast(B(c), B2(c), 8, ncclFloat, -1, c->comm, NULL);
}
static ncclResult_t bc_root_n(bad_ctx* c) {
  return ncclBroadcast(B(c), B2(c), 8, ncclFloat, N(c), c->comm, NULL);
}
static ncclResult_t bc_type(bad_ctx* c) {
  return ncclBroadcast(B(c), B2(c), 8, (ncclDataType_t)ncclNumTypes, 0, c->comm, NULL);
}
static ncclResult_t bcast_null(bad_ctx* c) {
  return ncclBcast(NULL, 8, ncclFloat, 0, c->comm, NULL);
}
static ncclResult_t bcast_root_big(bad_ctx* c) {
  return ncclBcast(B(c), 8, ncclFloat, 1000, c->comm, NULL);
}
static ncclResult_t bcast_null_comm(bad_ctx* c) {
  return ncclBcast(B(c), 8, ncclFloat, 0, NULL, NULL);
}
static ncclResult_t red_null_send(bad_ctx* c) {
  return ncclReduce(NULL, B2(c), 8, ncclFloat, ncclSum, 0, c->comm, NULL);
}
static ncclResult_t red_root_neg(bad_ctx* c) {
  return ncclReduce(B(c), B2(c), 8, ncclFloat, ncclSum, -1, c->comm, NULL);
}
static ncclResult_t red_root_n(bad_ctx* c) {
  return ncclReduce(B(c), B2(c), 8, ncclFloat, ncclSum, N(c), c->comm, NULL);
}
static ncclResult_t red_type(bad_ctx* c) {
  return ncclReduce(B(c), B2(c), 8, (ncclDataType_t)-1, ncclSum, 0, c->comm, NULL);
}
static ncclResult_t red_op(bad_ctx* c) {
  return ncclReduce(B(c), B2(c), 8, ncclFloat, ncclNumOps, 0, c->comm, NULL);
}
static ncclResult_t red_op_dead(bad_ctx* c) {
  return ncclReduce(B(c), B2(c), 8, ncclFloat, c->dead, 0, c->comm, NULL);
}
static ncclResult_t red_null_comm(bad_ctx* c) {
  return ncclReduce(B(c), B2(c), 8, ncclFloat, ncclSum, 0, NULL, NULL);
}
static ncclResult_t ag_null_send(bad_ctx* c) {
  return ncclAllGather(NULL, B2(c), 2, ncclFloat, c->comm, NULL);
}
static ncclResult_t ag_null_recv(bad_ctx* c) {
  return ncclAllGather(B(c), NULL, 2, ncclFloat, c->comm, NULL);
}
static ncclResult_t ag_type(bad_ctx* c) {
  return ncclAllGather(B(c), B2(c), 2, (ncclDataType_t)1000, c->comm, NULL);
}
static ncclResult_t ag_null_comm(bad_ctx* c) {
  return ncclAllGather(B(c), B2(c), 2, ncclFloat, NULL, NULL);
}
static ncclResult_t rs_null_send(bad_ctx* c) {
  return ncclReduceScatter(NULL, B2(c), 2, ncclFloat, ncclSum, c->comm, NULL);
}
static ncclResult_t rs_null_recv(bad_ctx* c) {
  return ncclReduceScatter(B(c), NULL, 2, ncclFloat, ncclSum, c->comm, NULL);
}
static ncclResult_t rs_type(bad_ctx* c) {
  return ncclReduceScatter(B(c), B2(c), 2, (ncclDataType_t)ncclNumTypes, ncclSum, c->comm, NULL);
}
static ncclResult_t rs_op(bad_ctx* c) {
  return ncclReduceScatter(B(c), B2(c), 2, ncclFloat, (ncclRedOp_t)-1, c->comm, NULL);
}
static ncclResult_t rs_op_dead(bad_ctx* c) {
  return ncclReduceScatter(B(c), B2(c), 2, ncclFloat, c->dead, c->comm, NULL);
}
static ncclResult_t rs_null_comm(bad_ctx* c) {
  return ncclReduceScatter(B(c), B2(c), 2, ncclFloat, ncclSum, NULL, NULL);
}

static const bad_check kBad[] = {
    {"ncclBroadcast(comm=NULL)", bc_null_comm, 0, CC_BROADCAST},
    {"ncclBroadcast(recvbuff=NULL, count=8)", bc_null_recv, 1, CC_BROADCAST},
    {"ncclBroadcast(root=-1)", bc_root_neg, 1, CC_BROADCAST},
    {"ncclBroadcast(root=nranks)", bc_root_n, 1, CC_BROADCAST},
    {"ncclBroadcast(datatype=ncclNumTypes)", bc_type, 1, CC_BROADCAST},
    {"ncclBcast(buff=NULL, count=8)", bcast_null, 1, CC_BCAST},
    {"ncclBcast(root=1000)", bcast_root_big, 1, CC_BCAST},
    {"ncclBcast(comm=NULL)", bcast_null_comm, 0, CC_BCAST},
    {"ncclReduce(sendbuff=NULL, count=8)", red_null_send, 1, CC_REDUCE},
    {"ncclReduce(root=-1)", red_root_neg, 1, CC_REDUCE},
    {"ncclReduce(root=nranks)", red_root_n, 1, CC_REDUCE},
    {"ncclReduce(datatype=-1)", red_type, 1, CC_REDUCE},
    {"ncclReduce(op=ncclNumOps)", red_op, 1, CC_REDUCE},
    {"ncclReduce(op=destroyed premulsum)", red_op_dead, 1, CC_REDUCE},
    {"ncclReduce(comm=NULL)", red_null_comm, 0, CC_REDUCE},
    {"ncclAllGather(sendbuff=NULL, count=2)", ag_null_send, 1, CC_ALLGATHER},
    {"ncclAllGather(recvbuff=NULL, count=2)", ag_null_recv, 1, CC_ALLGATHER},
    {"ncclAllGather(datatype=1000)", ag_type, 1, CC_ALLGATHER},
    {"ncclAllGather(comm=NULL)", ag_null_comm, 0, CC_ALLGATHER},
    {"ncclReduceScatter(sendbuff=NULL, count=2)", rs_null_send, 1, CC_REDUCESCATTER},
    {"ncclReduceScatter(recvbuff=NULL, count=2)", rs_null_recv, 1, CC_REDUCESCATTER},
    {"ncclReduceScatter(datatype=ncclNumTypes)", rs_type, 1, CC_REDUCESCATTER},
    {"ncclReduceScatter(op=-1)", rs_op, 1, CC_REDUCESCATTER},
    {"ncclReduceScatter(op=destroyed premulsum)", rs_op_dead, 1, CC_REDUCESCATTER},
    {"ncclReduceScatter(comm=NULL)", rs_null_comm, 0, CC_REDUCESCATTER},
};
#define NBAD (sizeof(kBad) / sizeof(kBad[0]))

static int bad_one(bad_ctx* c, size_t i) {
  const bad_check* k = &kBad[i];
  ncclComm_t lc = k->use_comm ? c->comm : NULL;
  ncclResult_t rc = k->fn(c);
  int bad = 0;
  if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) {
    mp_fail(c->env, "%s returned %d (%s), expected ncclInvalidArgument or ncclInvalidUsage",
            k->what, (int)rc, ncclGetErrorString(rc));
    bad++;
  } else {
    bad += mp_expect_last_error(c->env, lc, k->what);
  }
  /* inside a group: the call and/or ncclGroupEnd reports it */
  ncclGroupStart();
  rc = k->fn(c);
  ncclResult_t end = ncclGroupEnd();
  int ok_rc = rc == ncclSuccess || rc == ncclInvalidArgument || rc == ncclInvalidUsage;
  int ok_end = end == ncclSuccess || end == ncclInvalidArgument || end == ncclInvalidUsage;
  if (!ok_rc || !ok_end || (rc == ncclSuccess && end == ncclSuccess)) {
    mp_fail(c->env, "in a group: %s returned %d (%s), ncclGroupEnd %d (%s)", k->what, (int)rc,
            ncclGetErrorString(rc), (int)end, ncclGetErrorString(end));
    bad++;
  }
  cc_call ok = {.coll = k->coll, .type = (ncclDataType_t)(i % ncclNumTypes), .count = 1000 + i};
  ok.kind = (int)(i % (AR_NKINDS - 1));
  ok.root = (int)i % c->env->nranks;
  ok.salt = 31u * i;
  if (cc_is_reduction(ok.coll)) ar_op_create(c->env, c->comm, ok.type, ok.kind, &ok.op);
  int r = cc_run(&ok, c->env, c->comm);
  if (r != 0) {
    mp_fail(c->env, "the comm no longer works after the rejected call \"%s\"", k->what);
    return -1;
  }
  return bad;
}

static int bad_body(const mp_env* env) {
  bad_ctx c = {.env = env};
  memset(c.buf, 0, sizeof(c.buf));
  if (mp_comm_init(env, &c.comm) != 0) return 1;
  float two = 2.0f;
  ncclResult_t rc =
      ncclRedOpCreatePreMulSum(&c.dead, &two, ncclFloat, ncclScalarHostImmediate, c.comm);
  if (mp_expect_rc(env, c.comm, rc, ncclSuccess, "ncclRedOpCreatePreMulSum") ||
      mp_expect_rc(env, c.comm, ncclRedOpDestroy(c.dead, c.comm), ncclSuccess, "ncclRedOpDestroy"))
    return finish(env, c.comm, 1);
  int bad = 0;
  for (size_t i = 0; i < NBAD; i++) {
    int r = bad_one(&c, i);
    if (r < 0) return finish(env, c.comm, 1);
    bad += r;
  }
  if (env->rank == 0 || bad) mp_log(env, "%zu bad-argument checks, %d failed", NBAD, bad);
  return finish(env, c.comm, 0) + (bad != 0);
}

static void test_bad_args(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, bad_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(1, bad_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[0]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[1]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[2]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[3]),
      cmocka_unit_test_prestate(test_matrix, (void*)&k_ranks[4]),
      cmocka_unit_test(test_group_mixed),
      cmocka_unit_test(test_mixed_placement),
      cmocka_unit_test(test_group_many),
      cmocka_unit_test(test_group_initall),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
