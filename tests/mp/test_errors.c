/* Multi-process argument checking: every invalid input returns its documented
 * code with a non-empty ncclGetLastError, and the comm still works afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "archeck.h"
#include "launcher.h"

#define GARBAGE_MAX_S 3.0 /* a rejected id must not wait for BRAID_TIMEOUT_MS */

/* What a check function may use. */
typedef struct ctx {
  const mp_env* env;
  ncclComm_t comm;
  float buf[16];
} ctx;

/* One invalid call: want (or want2 when not -1) is accepted; use_comm says
 * whether ncclGetLastError gets the comm or NULL. */
typedef struct check {
  const char* what;
  ncclResult_t (*fn)(ctx* c);
  ncclResult_t want;
  int want2;
  int use_comm;
} check;

static int run_check(ctx* c, const check* k) {
  ncclComm_t lc = k->use_comm ? c->comm : NULL;
  char before[512];
  snprintf(before, sizeof(before), "%s", ncclGetLastError(lc) ? ncclGetLastError(lc) : "");
  ncclResult_t got = k->fn(c);
  if (k->want2 >= 0 && got == (ncclResult_t)k->want2) return 0;
  if (mp_expect_rc(c->env, lc, got, k->want, k->what) != 0) return 1;
  if (mp_expect_last_error(c->env, lc, k->what) != 0) return 1;
  if (before[0] && strcmp(before, ncclGetLastError(lc)) == 0)
    mp_log(c->env, "warning: %s: last error unchanged by the call (\"%s\"), may be stale", k->what,
           before);
  return 0;
}

/* ---- before a comm exists ---- */

static ncclResult_t version_null(ctx* c) {
  (void)c;
  return ncclGetVersion(NULL);
}
static ncclResult_t uniqueid_null(ctx* c) {
  (void)c;
  return ncclGetUniqueId(NULL);
}
static ncclResult_t init_null_comm(ctx* c) {
  return ncclCommInitRank(NULL, c->env->nranks, c->env->id, c->env->rank);
}
static ncclResult_t init_nranks_0(ctx* c) {
  ncclComm_t comm = NULL;
  return ncclCommInitRank(&comm, 0, c->env->id, 0);
}
static ncclResult_t init_nranks_neg(ctx* c) {
  ncclComm_t comm = NULL;
  return ncclCommInitRank(&comm, -3, c->env->id, 0);
}
static ncclResult_t init_rank_neg(ctx* c) {
  ncclComm_t comm = NULL;
  return ncclCommInitRank(&comm, c->env->nranks, c->env->id, -1);
}
static ncclResult_t init_rank_eq_n(ctx* c) {
  ncclComm_t comm = NULL;
  return ncclCommInitRank(&comm, c->env->nranks, c->env->id, c->env->nranks);
}
static ncclResult_t init_rank_big(ctx* c) {
  ncclComm_t comm = NULL;
  return ncclCommInitRank(&comm, c->env->nranks, c->env->id, c->env->nranks + 100);
}
static ncclResult_t initall_null(ctx* c) {
  (void)c;
  return ncclCommInitAll(NULL, 2, NULL);
}
static ncclResult_t initall_zero(ctx* c) {
  (void)c;
  ncclComm_t comms[2] = {NULL, NULL};
  return ncclCommInitAll(comms, 0, NULL);
}
static ncclResult_t initall_neg(ctx* c) {
  (void)c;
  ncclComm_t comms[2] = {NULL, NULL};
  return ncclCommInitAll(comms, -2, NULL);
}

static const check kPreInit[] = {
    {"ncclGetVersion(NULL)", version_null, ncclInvalidArgument, -1, 0},
    {"ncclGetUniqueId(NULL)", uniqueid_null, ncclInvalidArgument, -1, 0},
    {"ncclCommInitRank(comm=NULL)", init_null_comm, ncclInvalidArgument, -1, 0},
    {"ncclCommInitRank(nranks=0)", init_nranks_0, ncclInvalidArgument, -1, 0},
    {"ncclCommInitRank(nranks=-3)", init_nranks_neg, ncclInvalidArgument, -1, 0},
    {"ncclCommInitRank(rank=-1)", init_rank_neg, ncclInvalidArgument, -1, 0},
    {"ncclCommInitRank(rank=nranks)", init_rank_eq_n, ncclInvalidArgument, -1, 0},
    {"ncclCommInitRank(rank=nranks+100)", init_rank_big, ncclInvalidArgument, -1, 0},
    {"ncclCommInitAll(comms=NULL)", initall_null, ncclInvalidArgument, -1, 0},
    {"ncclCommInitAll(ndev=0)", initall_zero, ncclInvalidArgument, -1, 0},
    {"ncclCommInitAll(ndev=-2)", initall_neg, ncclInvalidArgument, -1, 0},
};

/* ---- garbage unique ids ---- */

static void garbage_id(ncclUniqueId* id, int which) {
  uint64_t x = 0x243f6a8885a308d3ull + (uint64_t)which;
  for (size_t i = 0; i < sizeof(id->internal); i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id->internal[i] = (char)(which == 1 ? 0 : which == 2 ? 0xff : (int)(x >> 56));
  }
}

static int check_garbage_id(const mp_env* env, int which) {
  static const char* const names[] = {"random bytes", "all zero", "all 0xff"};
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  char what[96];
  garbage_id(&id, which);
  snprintf(what, sizeof(what), "ncclCommInitRank(garbage id: %s)", names[which]);
  double t0 = mp_now();
  ncclResult_t rc = ncclCommInitRank(&comm, env->nranks, id, env->rank);
  double dt = mp_now() - t0;
  int bad = mp_expect_rc(env, NULL, rc, ncclInvalidArgument, what);
  if (!bad) bad = mp_expect_last_error(env, NULL, what);
  if (dt > GARBAGE_MAX_S) {
    mp_fail(env, "%s took %.2f s (> %.1f s): not rejected up front", what, dt, GARBAGE_MAX_S);
    bad++;
  }
  return bad;
}

/* ---- with a working comm ---- */

static ncclResult_t ar_null_comm(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, ncclFloat, ncclSum, NULL, NULL);
}
static ncclResult_t ar_null_send(ctx* c) {
  return ncclAllReduce(NULL, c->buf, 8, ncclFloat, ncclSum, c->comm, NULL);
}
static ncclResult_t ar_null_recv(ctx* c) {
  return ncclAllReduce(c->buf, NULL, 8, ncclFloat, ncclSum, c->comm, NULL);
}
static ncclResult_t ar_type_numtypes(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, (ncclDataType_t)ncclNumTypes, ncclSum, c->comm, NULL);
}
static ncclResult_t ar_type_neg(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, (ncclDataType_t)-1, ncclSum, c->comm, NULL);
}
static ncclResult_t ar_type_big(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, (ncclDataType_t)1000, ncclSum, c->comm, NULL);
}
static ncclResult_t ar_op_numops(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, ncclFloat, ncclNumOps, c->comm, NULL);
}
static ncclResult_t ar_op_neg(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, ncclFloat, (ncclRedOp_t)-1, c->comm, NULL);
}
static ncclResult_t ar_op_big(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, ncclFloat, (ncclRedOp_t)1000, c->comm, NULL);
}
static ncclResult_t ar_op_max(ctx* c) {
  return ncclAllReduce(c->buf, c->buf + 8, 8, ncclFloat, ncclMaxRedOp, c->comm, NULL);
}

/* Creates a premulsum op (float, 2.0) on c->comm; -1 when that fails. */
static int make_premul(ctx* c, ncclRedOp_t* op) {
  float s = 2.0f;
  ncclResult_t rc = ncclRedOpCreatePreMulSum(op, &s, ncclFloat, ncclScalarHostImmediate, c->comm);
  return mp_expect_rc(c->env, c->comm, rc, ncclSuccess, "ncclRedOpCreatePreMulSum") ? -1 : 0;
}

static ncclResult_t ar_op_destroyed(ctx* c) {
  ncclRedOp_t op;
  if (make_premul(c, &op) != 0) return ncclInternalError;
  if (mp_expect_rc(c->env, c->comm, ncclRedOpDestroy(op, c->comm), ncclSuccess, "ncclRedOpDestroy"))
    return ncclInternalError;
  return ncclAllReduce(c->buf, c->buf + 8, 8, ncclFloat, op, c->comm, NULL);
}
static ncclResult_t premul_null_op(ctx* c) {
  float s = 2.0f;
  return ncclRedOpCreatePreMulSum(NULL, &s, ncclFloat, ncclScalarHostImmediate, c->comm);
}
static ncclResult_t premul_null_scalar(ctx* c) {
  ncclRedOp_t op;
  return ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat, ncclScalarHostImmediate, c->comm);
}
static ncclResult_t premul_bad_type(ctx* c) {
  ncclRedOp_t op;
  float s = 2.0f;
  return ncclRedOpCreatePreMulSum(&op, &s, (ncclDataType_t)ncclNumTypes, ncclScalarHostImmediate,
                                  c->comm);
}
static ncclResult_t premul_null_comm(ctx* c) {
  (void)c;
  ncclRedOp_t op;
  float s = 2.0f;
  return ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, ncclScalarHostImmediate, NULL);
}
static ncclResult_t premul_bad_residence(ctx* c) {
  ncclRedOp_t op;
  float s = 2.0f;
  return ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, (ncclScalarResidence_t)7, c->comm);
}
static ncclResult_t destroy_builtin(ctx* c) {
  return ncclRedOpDestroy(ncclSum, c->comm);
}
static ncclResult_t destroy_twice(ctx* c) {
  ncclRedOp_t op;
  if (make_premul(c, &op) != 0) return ncclInternalError;
  if (mp_expect_rc(c->env, c->comm, ncclRedOpDestroy(op, c->comm), ncclSuccess, "ncclRedOpDestroy"))
    return ncclInternalError;
  return ncclRedOpDestroy(op, c->comm);
}
static ncclResult_t destroy_null_comm(ctx* c) {
  ncclRedOp_t op;
  if (make_premul(c, &op) != 0) return ncclInternalError;
  ncclResult_t rc = ncclRedOpDestroy(op, NULL);
  ncclRedOpDestroy(op, c->comm);
  return rc;
}
static ncclResult_t count_null_comm(ctx* c) {
  (void)c;
  int n;
  return ncclCommCount(NULL, &n);
}
static ncclResult_t count_null_out(ctx* c) {
  return ncclCommCount(c->comm, NULL);
}
static ncclResult_t rank_null_comm(ctx* c) {
  (void)c;
  int r;
  return ncclCommUserRank(NULL, &r);
}
static ncclResult_t rank_null_out(ctx* c) {
  return ncclCommUserRank(c->comm, NULL);
}
static ncclResult_t dev_null_comm(ctx* c) {
  (void)c;
  int d;
  return ncclCommCuDevice(NULL, &d);
}
static ncclResult_t dev_null_out(ctx* c) {
  return ncclCommCuDevice(c->comm, NULL);
}
static ncclResult_t async_null_comm(ctx* c) {
  (void)c;
  ncclResult_t r;
  return ncclCommGetAsyncError(NULL, &r);
}
static ncclResult_t async_null_out(ctx* c) {
  return ncclCommGetAsyncError(c->comm, NULL);
}
static ncclResult_t finalize_null(ctx* c) {
  (void)c;
  return ncclCommFinalize(NULL);
}
static ncclResult_t destroy_null(ctx* c) {
  (void)c;
  return ncclCommDestroy(NULL);
}
static ncclResult_t abort_null(ctx* c) {
  (void)c;
  return ncclCommAbort(NULL);
}
static ncclResult_t group_end_unmatched(ctx* c) {
  (void)c;
  return ncclGroupEnd();
}

#define IA ncclInvalidArgument
static const check kWithComm[] = {
    {"ncclAllReduce(comm=NULL)", ar_null_comm, IA, -1, 0},
    {"ncclAllReduce(sendbuff=NULL, count=8)", ar_null_send, IA, -1, 1},
    {"ncclAllReduce(recvbuff=NULL, count=8)", ar_null_recv, IA, -1, 1},
    {"ncclAllReduce(datatype=ncclNumTypes)", ar_type_numtypes, IA, -1, 1},
    {"ncclAllReduce(datatype=-1)", ar_type_neg, IA, -1, 1},
    {"ncclAllReduce(datatype=1000)", ar_type_big, IA, -1, 1},
    {"ncclAllReduce(op=ncclNumOps, no premulsum created)", ar_op_numops, IA, -1, 1},
    {"ncclAllReduce(op=-1)", ar_op_neg, IA, -1, 1},
    {"ncclAllReduce(op=1000)", ar_op_big, IA, -1, 1},
    {"ncclAllReduce(op=ncclMaxRedOp)", ar_op_max, IA, -1, 1},
    {"ncclAllReduce(op=destroyed premulsum)", ar_op_destroyed, IA, -1, 1},
    {"ncclRedOpCreatePreMulSum(op=NULL)", premul_null_op, IA, -1, 1},
    {"ncclRedOpCreatePreMulSum(scalar=NULL)", premul_null_scalar, IA, -1, 1},
    {"ncclRedOpCreatePreMulSum(datatype=ncclNumTypes)", premul_bad_type, IA, -1, 1},
    {"ncclRedOpCreatePreMulSum(comm=NULL)", premul_null_comm, IA, -1, 0},
    {"ncclRedOpCreatePreMulSum(residence=7)", premul_bad_residence, IA, ncclInvalidUsage, 1},
    {"ncclRedOpDestroy(ncclSum)", destroy_builtin, IA, ncclInvalidUsage, 1},
    {"ncclRedOpDestroy(op destroyed twice)", destroy_twice, IA, ncclInvalidUsage, 1},
    {"ncclRedOpDestroy(comm=NULL)", destroy_null_comm, IA, -1, 0},
    {"ncclCommCount(comm=NULL)", count_null_comm, IA, -1, 0},
    {"ncclCommCount(count=NULL)", count_null_out, IA, -1, 1},
    {"ncclCommUserRank(comm=NULL)", rank_null_comm, IA, -1, 0},
    {"ncclCommUserRank(rank=NULL)", rank_null_out, IA, -1, 1},
    {"ncclCommCuDevice(comm=NULL)", dev_null_comm, IA, -1, 0},
    {"ncclCommCuDevice(device=NULL)", dev_null_out, IA, -1, 1},
    {"ncclCommGetAsyncError(comm=NULL)", async_null_comm, IA, -1, 0},
    {"ncclCommGetAsyncError(asyncError=NULL)", async_null_out, IA, -1, 1},
    {"ncclCommFinalize(NULL)", finalize_null, IA, -1, 0},
    {"ncclCommDestroy(NULL) (NCCL returns success)", destroy_null, IA, ncclSuccess, 0},
    {"ncclCommAbort(NULL) (NCCL returns success)", abort_null, IA, ncclSuccess, 0},
    {"ncclGroupEnd() without ncclGroupStart()", group_end_unmatched, ncclInvalidUsage, -1, 0},
};
#define NCHECKS(a) (sizeof(a) / sizeof((a)[0]))

/* ---- counts no buffer can hold ---- */

enum {
  ABS_ALLREDUCE,
  ABS_BROADCAST,
  ABS_BCAST,
  ABS_REDUCE,
  ABS_ALLGATHER,
  ABS_REDUCESCATTER,
  ABS_SEND,
  ABS_RECV,
  ABS_GROUPED_P2P,
  ABS_NCALLS
};
static const char* const kAbsNames[ABS_NCALLS] = {
    "ncclAllReduce", "ncclBroadcast", "ncclBcast",
    "ncclReduce",    "ncclAllGather", "ncclReduceScatter",
    "ncclSend",      "ncclRecv",      "grouped ncclSend+ncclRecv"};

/* The call with `count` floats on tiny buffers: it must be refused before
 * anything reads them. A grouped send/recv reports at ncclGroupEnd too. */
static ncclResult_t absurd_call(ctx* c, int call, size_t count) {
  int peer = (c->env->rank + 1) % c->env->nranks;
  float *s = c->buf, *r = c->buf + 8;
  switch (call) {
    case ABS_ALLREDUCE:
      return ncclAllReduce(s, r, count, ncclFloat, ncclSum, c->comm, NULL);
    case ABS_BROADCAST:
      return ncclBroadcast(s, r, count, ncclFloat, 0, c->comm, NULL);
    case ABS_BCAST:
      return ncclBcast(r, count, ncclFloat, 0, c->comm, NULL);
    case ABS_REDUCE:
      return ncclReduce(s, r, count, ncclFloat, ncclSum, 0, c->comm, NULL);
    case ABS_ALLGATHER:
      return ncclAllGather(s, r, count, ncclFloat, c->comm, NULL);
    case ABS_REDUCESCATTER:
      return ncclReduceScatter(s, r, count, ncclFloat, ncclSum, c->comm, NULL);
    case ABS_SEND:
      return ncclSend(s, count, ncclFloat, peer, c->comm, NULL);
    case ABS_RECV:
      return ncclRecv(r, count, ncclFloat, peer, c->comm, NULL);
    default: {
      ncclResult_t a, b, e;
      ncclGroupStart();
      a = ncclSend(s, count, ncclFloat, peer, c->comm, NULL);
      b = ncclRecv(r, 8, ncclFloat, peer, c->comm, NULL); /* valid, but its group failed */
      e = ncclGroupEnd();
      if (b != ncclSuccess) return b;
      return a != e ? ncclInternalError : e; /* GroupEnd must report the refused call */
    }
  }
}

/* SIZE_MAX, byte sizes that overflow size_t, and sizes just past what any
 * machine addresses (2^56 bytes), also only once multiplied by nranks. */
static int absurd_counts(ctx* c) {
  size_t n = (size_t)c->env->nranks;
  const size_t counts[] = {SIZE_MAX, SIZE_MAX / 4 + 1, ((size_t)1 << 54) + 1,
                           ((size_t)1 << 54) / n + 1};
  int bad = 0;
  for (int call = 0; call < ABS_NCALLS; call++)
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
      int blocked = call == ABS_ALLGATHER || call == ABS_REDUCESCATTER;
      if (i == 3 && (!blocked || n == 1)) continue; /* within limits unless times nranks */
      char what[128];
      snprintf(what, sizeof(what), "%s(count=%zu floats)", kAbsNames[call], counts[i]);
      ncclResult_t got = absurd_call(c, call, counts[i]);
      if (mp_expect_rc(c->env, c->comm, got, ncclInvalidArgument, what) ||
          mp_expect_last_error(c->env, c->comm, what))
        bad++;
    }
  return bad;
}

/* A checked all-reduce after rejected call i. -1 when the call failed. */
static int still_works(ctx* c, size_t i) {
  ar_call call = {.type = (ncclDataType_t)(i % ncclNumTypes),
                  .kind = (int)(i % (AR_NKINDS - 1)),
                  .count = 1023 + i,
                  .inplace = (int)(i & 1),
                  .salt = 77u + i};
  if (ar_alloc(&call) != 0) return -1;
  ar_op_create(c->env, c->comm, call.type, call.kind, &call.op);
  int r = ar_run(&call, c->env, c->comm);
  if (r != 0)
    mp_fail(c->env, "the comm no longer works after the rejected call \"%s\"", kWithComm[i].what);
  return r;
}

static int error_strings(const mp_env* env) {
  int bad = 0;
  for (int r = 0; r <= ncclNumResults; r++) {
    const char* s = ncclGetErrorString((ncclResult_t)r);
    if (s && s[0]) continue;
    mp_fail(env, "ncclGetErrorString(%d) is %s", r, s ? "empty" : "NULL");
    bad++;
  }
  if (ncclGetErrorString((ncclResult_t)12345) == NULL) {
    mp_fail(env, "ncclGetErrorString(12345) is NULL");
    bad++;
  }
  return bad;
}

static int pre_init_body(const mp_env* env, ctx* c) {
  int bad = error_strings(env);
  for (size_t i = 0; i < NCHECKS(kPreInit); i++) bad += run_check(c, &kPreInit[i]);
  for (int g = 0; g < 3; g++) bad += check_garbage_id(env, g);
  return bad;
}

static int errors_body(const mp_env* env) {
  ctx c = {.env = env};
  memset(c.buf, 0, sizeof(c.buf));
  int bad = pre_init_body(env, &c);
  if (mp_comm_init(env, &c.comm) != 0) return 1;
  int fatal = 0;
  for (size_t i = 0; i < NCHECKS(kWithComm) && !fatal; i++) {
    bad += run_check(&c, &kWithComm[i]);
    int r = still_works(&c, i);
    fatal = r < 0;
    bad += r > 0;
  }
  if (!fatal) bad += absurd_counts(&c);
  if (!fatal) {
    int r = still_works(&c, 0);
    fatal = r < 0;
    bad += r > 0;
  }
  if (fatal) {
    ncclCommAbort(c.comm);
    return 1;
  }
  bad += mp_expect_rc(env, c.comm, ncclCommDestroy(c.comm), ncclSuccess, "ncclCommDestroy");
  if (env->rank == 0 || bad) mp_log(env, "%d failed checks", bad);
  return bad != 0;
}

static void test_invalid_arguments(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, errors_body, NULL, NULL), 0);
}

/* The single-rank case: a comm of one rank rejects the same inputs. */
static void test_invalid_arguments_1rank(void** state) {
  (void)state;
  assert_int_equal(mp_launch(1, errors_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "10000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_invalid_arguments),
      cmocka_unit_test(test_invalid_arguments_1rank),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
