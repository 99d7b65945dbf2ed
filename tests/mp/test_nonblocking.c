/* Non-blocking comms (config.blocking = 0: ncclInProgress, then poll
 * ncclCommGetAsyncError; braidCommSetBlocking), ncclMemAlloc, buffer
 * registration, InitRankScalable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "braid.h"
#include "collcheck.h"
#include "launcher.h"

#define READY_TIMEOUT_S 30.0
#define LATE_MS 600

/* Polls ncclCommGetAsyncError until it is no longer ncclInProgress; it must
 * then be ncclSuccess. *polls counts the ncclInProgress answers. 0 on success. */
static int wait_ready(const mp_env* env, ncclComm_t comm, const char* what, int* polls) {
  double end = mp_now() + READY_TIMEOUT_S;
  ncclResult_t state = ncclInProgress;
  int n = 0;
  while (1) {
    ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (mp_expect_rc(env, comm, rc, ncclSuccess, "ncclCommGetAsyncError")) return 1;
    if (state != ncclInProgress) break;
    n++;
    if (mp_now() > end) {
      mp_fail(env, "%s: still ncclInProgress after %.0f s", what, READY_TIMEOUT_S);
      return 1;
    }
    mp_sleep_ms(1);
  }
  if (polls) *polls += n;
  if (state == ncclSuccess) return 0;
  mp_fail(env, "%s: ncclCommGetAsyncError settled on %d (%s), expected ncclSuccess: \"%s\"", what,
          (int)state, ncclGetErrorString(state), ncclGetLastError(comm));
  return 1;
}

/* A call on a non-blocking comm: ncclSuccess or ncclInProgress, then ready. */
static int nb_done(const mp_env* env, ncclComm_t comm, ncclResult_t rc, const char* what,
                   int* polls) {
  if (rc != ncclSuccess && rc != ncclInProgress) {
    mp_fail(env, "%s returned %d (%s), expected ncclSuccess or ncclInProgress: \"%s\"", what,
            (int)rc, ncclGetErrorString(rc), ncclGetLastError(comm));
    return 1;
  }
  return wait_ready(env, comm, what, polls);
}

static int nb_init(const mp_env* env, ncclComm_t* comm, int* polls) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  *comm = NULL;
  ncclResult_t rc = ncclCommInitRankConfig(comm, env->nranks, env->id, env->rank, &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    mp_fail(env, "ncclCommInitRankConfig(blocking=0) returned %d (%s): \"%s\"", (int)rc,
            ncclGetErrorString(rc), ncclGetLastError(NULL));
    return 1;
  }
  if (*comm == NULL) {
    mp_fail(env, "ncclCommInitRankConfig(blocking=0) returned %d but left *comm NULL", (int)rc);
    return 1;
  }
  return wait_ready(env, *comm, "ncclCommInitRankConfig(blocking=0)", polls);
}

static int nb_end(const mp_env* env, ncclComm_t comm, int bad, int* polls) {
  if (bad) {
    ncclCommAbort(comm);
    return 1;
  }
  bad += nb_done(env, comm, ncclCommFinalize(comm), "ncclCommFinalize (non-blocking)", polls);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

/* One collective of c on the non-blocking comm: issue, wait, verify. */
static int nb_coll(const mp_env* env, ncclComm_t comm, cc_call* c, int* polls) {
  char d[160];
  if (cc_is_reduction(c->coll)) ar_op_create(env, comm, c->type, c->kind, &c->op);
  if (cc_prepare(c, env) != 0) return 1;
  cc_describe(c, d, sizeof(d));
  int bad = nb_done(env, comm, cc_issue(c, comm, NULL), d, polls);
  if (!bad) bad += cc_verify(c, env);
  cc_release(c);
  return bad;
}

static int nb_body(const mp_env* env) {
  ncclComm_t comm;
  int polls = 0, bad = 0, n = env->nranks;
  if (nb_init(env, &comm, &polls) != 0) return 1;
  int count = -1, rank = -1;
  bad += mp_expect_rc(env, comm, ncclCommCount(comm, &count), ncclSuccess, "ncclCommCount");
  bad += mp_expect_rc(env, comm, ncclCommUserRank(comm, &rank), ncclSuccess, "ncclCommUserRank");
  if (count != n || rank != env->rank)
    mp_fail(env, "count %d rank %d, expected %d and %d", count, rank, n, env->rank), bad++;
  static const size_t counts[] = {1, 1023, 300007};
  for (int coll = 0; coll < CC_NCOLLS && !bad; coll++)
    for (size_t ci = 0; ci < 3 && !bad; ci++) {
      cc_call c = {.coll = coll, .type = (ncclDataType_t)((coll * 3 + (int)ci) % ncclNumTypes)};
      c.count = counts[ci];
      c.kind = (coll + (int)ci) % (AR_NKINDS - 1);
      c.root = (int)ci % n;
      c.inplace = (int)ci & 1;
      c.salt = (uint64_t)(coll * 10) + ci;
      bad += nb_coll(env, comm, &c, &polls);
    }
  /* a group of collectives and send/recv: ncclGroupEnd may return ncclInProgress */
  if (!bad) {
    cc_call g[2] = {{.coll = CC_ALLREDUCE, .type = ncclFloat32, .kind = AR_SUM, .count = 99999},
                    {.coll = CC_ALLGATHER, .type = ncclUint8, .count = 4099}};
    int32_t sendv[64], recvv[64];
    int right = (env->rank + 1) % n, left = (env->rank + n - 1) % n;
    for (int i = 0; i < 64; i++) sendv[i] = env->rank * 1000 + i, recvv[i] = -1;
    for (int i = 0; i < 2; i++) g[i].salt = 50u + (uint64_t)i, cc_prepare(&g[i], env);
    ncclGroupStart();
    ncclResult_t r1 = cc_issue(&g[0], comm, NULL);
    ncclResult_t r2 = ncclSend(sendv, 64, ncclInt32, right, comm, NULL);
    ncclResult_t r3 = ncclRecv(recvv, 64, ncclInt32, left, comm, NULL);
    ncclResult_t r4 = cc_issue(&g[1], comm, NULL);
    ncclResult_t rg = ncclGroupEnd();
    if (r1 != ncclSuccess || r2 != ncclSuccess || r3 != ncclSuccess || r4 != ncclSuccess) {
      mp_fail(env, "group calls returned %d %d %d %d", (int)r1, (int)r2, (int)r3, (int)r4);
      bad++;
    }
    bad += nb_done(env, comm, rg, "ncclGroupEnd (non-blocking comm)", &polls);
    for (int i = 0; i < 64 && !bad; i++)
      if (recvv[i] != left * 1000 + i)
        mp_fail(env, "group recv from %d: [%d] expected %d got %d", left, i, left * 1000 + i,
                recvv[i]),
            bad++;
    for (int i = 0; i < 2; i++) {
      if (!bad) bad += cc_verify(&g[i], env);
      cc_release(&g[i]);
    }
  }
  if (env->rank == 0 || bad)
    mp_log(env, "non-blocking comm: %d ncclInProgress answers while polling, %d failed", polls,
           bad);
  return nb_end(env, comm, bad, &polls);
}

static void test_nonblocking_comm(void** state) {
  (void)state;
  static const int sizes[] = {1, 2, 4};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    assert_int_equal(mp_launch(sizes[i], nb_body, NULL, NULL), 0);
}

/* A late peer: rank 1 issues LATE_MS after the others. A call that returned
 * ncclInProgress must keep reporting ncclInProgress until the peer came, and
 * the data must be complete once it reports ncclSuccess. */
static int late_body(const mp_env* env) {
  ncclComm_t comm;
  int polls = 0, bad = 0;
  if (nb_init(env, &comm, &polls) != 0) return 1;
  cc_call c = {.coll = CC_ALLREDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 100003, .salt = 7};
  if (cc_prepare(&c, env) != 0) return nb_end(env, comm, 1, &polls);
  /* every rank is ready: line up, then rank 1 waits */
  __atomic_fetch_add((int*)&env->shm[0], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n((int*)&env->shm[0], __ATOMIC_SEQ_CST) < env->nranks) mp_sleep_ms(1);
  if (env->rank == 1) mp_sleep_ms(LATE_MS);
  double t0 = mp_now();
  ncclResult_t rc = cc_issue(&c, comm, NULL);
  double t_ret = mp_now() - t0;
  if (rc == ncclInProgress && env->rank == 0) {
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(comm, &st);
    double t_q = mp_now() - t0;
    if (st != ncclInProgress && t_q < LATE_MS / 2000.0) {
      mp_fail(env,
              "allreduce returned ncclInProgress, but %.3f s later (peer %d ms late) the "
              "comm reports %d (%s)",
              t_q, LATE_MS, (int)st, ncclGetErrorString(st));
      bad++;
    }
  }
  bad += nb_done(env, comm, rc, "allreduce with a late peer", &polls);
  double t_done = mp_now() - t0;
  if (!bad) bad += cc_verify(&c, env);
  cc_release(&c);
  if (env->rank == 0)
    mp_log(env, "late peer: call returned %d after %.3f s, done after %.3f s (%d polls)", (int)rc,
           t_ret, t_done, polls);
  if (env->rank == 0 && t_done < LATE_MS / 2000.0) {
    mp_fail(env, "the allreduce reported completion before the late peer joined");
    bad++;
  }
  return nb_end(env, comm, bad, &polls);
}

static void test_nonblocking_late_peer(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, late_body, NULL, NULL), 0);
}

/* ncclCommSplit from a non-blocking comm with a non-blocking config. */
static int nb_split_body(const mp_env* env) {
  ncclComm_t comm, child = NULL;
  int polls = 0, bad = 0;
  if (nb_init(env, &comm, &polls) != 0) return 1;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  int color = env->rank % 2, key = -env->rank;
  ncclResult_t rc = ncclCommSplit(comm, color, key, &child, &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    mp_fail(env, "ncclCommSplit(blocking=0) returned %d (%s)", (int)rc, ncclGetErrorString(rc));
    return nb_end(env, comm, 1, &polls);
  }
  bad += wait_ready(env, comm, "parent after ncclCommSplit", &polls);
  if (child == NULL) {
    mp_fail(env, "ncclCommSplit(blocking=0) returned %d but newcomm is NULL", (int)rc);
    return nb_end(env, comm, 1, &polls);
  }
  bad += wait_ready(env, child, "ncclCommSplit(blocking=0) child", &polls);
  mp_env sub = *env;
  int m = 0;
  for (int r = 0; r < env->nranks; r++) m += r % 2 == color;
  ncclCommCount(child, &sub.nranks);
  ncclCommUserRank(child, &sub.rank);
  int want_rank = 0; /* keys -rank: higher old ranks first */
  for (int r = env->rank + 1; r < env->nranks; r++) want_rank += r % 2 == color;
  if (sub.nranks != m || sub.rank != want_rank)
    mp_fail(env, "split child: rank %d of %d, expected %d of %d", sub.rank, sub.nranks, want_rank,
            m),
        bad++;
  cc_call c = {.coll = CC_REDUCESCATTER, .type = ncclFloat16, .kind = AR_SUM, .count = 1234};
  c.salt = 11u + (uint64_t)color;
  if (!bad) bad += nb_coll(&sub, child, &c, &polls);
  cc_call p = {.coll = CC_BROADCAST, .type = ncclInt64, .count = 5000, .root = 1, .salt = 3};
  if (!bad) bad += nb_coll(env, comm, &p, &polls);
  bad += nb_end(&sub, child, bad, &polls);
  return nb_end(env, comm, bad, &polls);
}

static void test_nonblocking_split(void** state) {
  (void)state;
  assert_int_equal(mp_launch(5, nb_split_body, NULL, NULL), 0);
}

/* ---- ncclMemAlloc / ncclMemFree and ncclCommRegister / ncclCommDeregister ---- */

static int is_arg_error(ncclResult_t rc) {
  return rc == ncclInvalidArgument || rc == ncclInvalidUsage;
}

static int expect_arg_error(const mp_env* env, ncclComm_t comm, ncclResult_t rc, const char* what) {
  if (!is_arg_error(rc)) {
    mp_fail(env, "%s returned %d (%s), expected ncclInvalidArgument or ncclInvalidUsage", what,
            (int)rc, ncclGetErrorString(rc));
    return 1;
  }
  return mp_expect_last_error(env, comm, what);
}

/* These write their ncclMemAlloc buffers from the host, so they run where
 * ncclMemAlloc gives host memory: without a CUDA driver (device buffers
 * are mp_test_device's). */
static int mem_checks(const mp_env* env) {
  setenv("BRAID_CUDA_LIB", "none", 1);
  static const size_t sizes[] = {1, 4096, 100003, (size_t)(1u << 20) + 3};
  int bad = 0;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    void* p = NULL;
    char what[64];
    snprintf(what, sizeof(what), "ncclMemAlloc(%zu bytes)", sizes[i]);
    if (mp_expect_rc(env, NULL, ncclMemAlloc(&p, sizes[i]), ncclSuccess, what)) {
      bad++;
      continue;
    }
    if (p == NULL || ((uintptr_t)p & 4095) != 0) {
      mp_fail(env, "%s gave %p: NULL or not page-aligned", what, p);
      bad++;
      continue;
    }
    memset(p, 0x3c, sizes[i]);
    bad += mp_expect_rc(env, NULL, ncclMemFree(p), ncclSuccess, "ncclMemFree");
  }
  bad += expect_arg_error(env, NULL, ncclMemAlloc(NULL, 64), "ncclMemAlloc(ptr=NULL)");
  return bad;
}

/* Collectives on ncclMemAlloc'ed, registered buffers; deregistration. */
static int reg_body(const mp_env* env) {
  ncclComm_t comm;
  int n = env->nranks, bad = mem_checks(env);
  if (mp_comm_init(env, &comm) != 0) return 1;
  size_t count = 262147, bytes = count * sizeof(float);
  float *a = NULL, *b = NULL;
  void *ha = NULL, *hb = NULL, *hc = NULL;
  if (mp_expect_rc(env, NULL, ncclMemAlloc((void**)&a, bytes), ncclSuccess, "ncclMemAlloc") ||
      mp_expect_rc(env, NULL, ncclMemAlloc((void**)&b, bytes * (size_t)n), ncclSuccess,
                   "ncclMemAlloc")) {
    ncclCommAbort(comm);
    return 1;
  }
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, a, bytes, &ha), ncclSuccess,
                      "ncclCommRegister(a)");
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, b, bytes * (size_t)n, &hb), ncclSuccess,
                      "ncclCommRegister(b)");
  /* a second, overlapping registration of part of b */
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, b + 10, bytes / 2, &hc), ncclSuccess,
                      "ncclCommRegister(part of b)");
  if (!ha || !hb || !hc) mp_fail(env, "ncclCommRegister returned a NULL handle"), bad++;
  if (!bad) {
    for (size_t i = 0; i < count; i++) a[i] = (float)((env->rank + 1) * (int)(i % 1000));
    bad += mp_expect_rc(env, comm, ncclAllReduce(a, a, count, ncclFloat, ncclSum, comm, NULL),
                        ncclSuccess, "allreduce on registered memory");
    float f = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < count && !bad; i++)
      if (a[i] != f * (float)(i % 1000))
        mp_fail(env, "allreduce on registered memory: [%zu] expected %g got %g", i,
                f * (float)(i % 1000), a[i]),
            bad++;
    bad += mp_expect_rc(env, comm, ncclAllGather(a, b, count, ncclFloat, comm, NULL), ncclSuccess,
                        "allgather into registered memory");
    for (size_t i = 0; i < count * (size_t)n && !bad; i++)
      if (b[i] != a[i % count])
        mp_fail(env, "allgather into registered memory: [%zu] expected %g got %g", i, a[i % count],
                b[i]),
            bad++;
  }
  /* deregister out of order; then unknown handles are errors */
  bad +=
      mp_expect_rc(env, comm, ncclCommDeregister(comm, hb), ncclSuccess, "ncclCommDeregister(b)");
  bad +=
      mp_expect_rc(env, comm, ncclCommDeregister(comm, ha), ncclSuccess, "ncclCommDeregister(a)");
  bad +=
      mp_expect_rc(env, comm, ncclCommDeregister(comm, hc), ncclSuccess, "ncclCommDeregister(c)");
  ncclResult_t rc = ncclCommDeregister(comm, ha);
  if (rc == ncclSuccess)
    mp_fail(env, "ncclCommDeregister of a handle already deregistered succeeded"), bad++;
  else
    bad += mp_expect_last_error(env, comm, "ncclCommDeregister(stale handle)");
  int local;
  rc = ncclCommDeregister(comm, &local);
  if (rc == ncclSuccess)
    mp_fail(env, "ncclCommDeregister of an unknown handle succeeded"), bad++;
  else
    bad += mp_expect_last_error(env, comm, "ncclCommDeregister(unknown handle)");
  void* h = NULL;
  bad += expect_arg_error(env, NULL, ncclCommRegister(NULL, a, bytes, &h),
                          "ncclCommRegister(comm=NULL)");
  bad += expect_arg_error(env, comm, ncclCommRegister(comm, a, bytes, NULL),
                          "ncclCommRegister(handle=NULL)");
  bad += expect_arg_error(env, comm, ncclCommRegister(comm, NULL, bytes, &h),
                          "ncclCommRegister(buff=NULL)");
  bad += expect_arg_error(env, NULL, ncclCommDeregister(NULL, ha), "ncclCommDeregister(comm=NULL)");
  /* the comm still works, the buffers too, unregistered */
  if (!bad) {
    int32_t* x = (int32_t*)a;
    for (int i = 0; i < 1000; i++) x[i] = env->rank == n - 1 ? i * 3 : -1;
    bad += mp_expect_rc(env, comm, ncclBcast(x, 1000, ncclInt32, n - 1, comm, NULL), ncclSuccess,
                        "bcast after deregistration");
    for (int i = 0; i < 1000 && !bad; i++)
      if (x[i] != i * 3) mp_fail(env, "bcast: [%d] expected %d got %d", i, i * 3, x[i]), bad++;
  }
  bad += mp_expect_rc(env, NULL, ncclMemFree(a), ncclSuccess, "ncclMemFree(a)");
  bad += mp_expect_rc(env, NULL, ncclMemFree(b), ncclSuccess, "ncclMemFree(b)");
  if (env->rank == 0 || bad) mp_log(env, "memory and registration: %d failed", bad);
  if (bad) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_mem_register(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, reg_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(1, reg_body, NULL, NULL), 0);
}

/* ---- ncclCommInitRankScalable ---- */

typedef struct scalable_arg {
  int nid;
  int blocking;
} scalable_arg;

static int scalable_body(const mp_env* env) {
  scalable_arg* a = env->arg;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = a->blocking;
  ncclComm_t comm = NULL;
  int polls = 0, bad = 0;
  char what[96];
  snprintf(what, sizeof(what), "ncclCommInitRankScalable(nId=%d, blocking=%d)", a->nid,
           a->blocking);
  ncclUniqueId ids[MP_MAX_IDS];
  memcpy(ids, env->ids, sizeof(ids));
  ncclResult_t rc = ncclCommInitRankScalable(&comm, env->nranks, env->rank, a->nid, ids, &cfg);
  if (a->blocking) {
    if (mp_expect_rc(env, NULL, rc, ncclSuccess, what)) return 1;
  } else if (rc != ncclSuccess && rc != ncclInProgress) {
    mp_fail(env, "%s returned %d (%s): \"%s\"", what, (int)rc, ncclGetErrorString(rc),
            ncclGetLastError(NULL));
    return 1;
  }
  if (!comm) {
    mp_fail(env, "%s: *newcomm is NULL", what);
    return 1;
  }
  if (wait_ready(env, comm, what, &polls)) return 1;
  int count = -1, rank = -1;
  ncclCommCount(comm, &count);
  ncclCommUserRank(comm, &rank);
  if (count != env->nranks || rank != env->rank)
    mp_fail(env, "%s: count %d rank %d, expected %d and %d", what, count, rank, env->nranks,
            env->rank),
        bad++;
  static const int colls[] = {CC_ALLGATHER, CC_ALLREDUCE, CC_REDUCE};
  for (int i = 0; i < 3 && !bad; i++) {
    cc_call c = {.coll = colls[i], .type = ncclInt32, .kind = AR_SUM, .count = 5003};
    c.root = env->nranks - 1;
    c.salt = (uint64_t)i;
    bad += nb_coll(env, comm, &c, &polls);
  }
  if (bad) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

/* The ids come from the launcher's root holder: this process must not start
 * the root threads itself (see mp_launch). */
static void run_scalable(int nranks, int nid, int blocking) {
  scalable_arg a = {.nid = nid, .blocking = blocking};
  mp_opts o = MP_OPTS_INIT;
  o.nids = nid;
  assert_int_equal(mp_launch(nranks, scalable_body, &a, &o), 0);
}

static void test_scalable(void** state) {
  (void)state;
  run_scalable(4, 1, 1);
  run_scalable(5, 2, 1);
  run_scalable(2, 2, 1);
  run_scalable(1, 1, 1);
  run_scalable(4, 2, 0);
  /* the table relayed down trees of two (bootstrap_relay.h), in 3 and 4 blocks */
  setenv("BRAID_BOOTSTRAP_FANOUT", "2", 1);
  run_scalable(9, 3, 1);
  run_scalable(10, 4, 0);
  run_scalable(6, 1, 1);
  setenv("BRAID_BOOTSTRAP_FANOUT", "1", 1); /* a chain */
  run_scalable(5, 1, 1);
  unsetenv("BRAID_BOOTSTRAP_FANOUT");
}

static int scalable_bad_body(const mp_env* env) {
  ncclUniqueId ids[1] = {env->id};
  ncclComm_t comm = NULL;
  int n = env->nranks, r = env->rank, bad = 0;
  bad += expect_arg_error(env, NULL, ncclCommInitRankScalable(&comm, n, r, 0, ids, NULL),
                          "ncclCommInitRankScalable(nId=0)");
  bad += expect_arg_error(env, NULL, ncclCommInitRankScalable(&comm, n, r, -1, ids, NULL),
                          "ncclCommInitRankScalable(nId=-1)");
  bad += expect_arg_error(env, NULL, ncclCommInitRankScalable(&comm, n, r, 1, NULL, NULL),
                          "ncclCommInitRankScalable(commIds=NULL)");
  bad += expect_arg_error(env, NULL, ncclCommInitRankScalable(NULL, n, r, 1, ids, NULL),
                          "ncclCommInitRankScalable(newcomm=NULL)");
  bad += expect_arg_error(env, NULL, ncclCommInitRankScalable(&comm, n, n, 1, ids, NULL),
                          "ncclCommInitRankScalable(myrank=nranks)");
  bad += expect_arg_error(env, NULL, ncclCommInitRankScalable(&comm, 0, 0, 1, ids, NULL),
                          "ncclCommInitRankScalable(nranks=0)");
  /* the ids are still good after all that */
  ncclResult_t rc = ncclCommInitRankScalable(&comm, n, r, 1, ids, NULL);
  if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitRankScalable after bad calls"))
    return 1;
  cc_call c = {.coll = CC_ALLREDUCE, .type = ncclFloat64, .kind = AR_AVG, .count = 777, .salt = 1};
  ar_op_create(env, comm, c.type, c.kind, &c.op);
  bad += cc_run(&c, env, comm) != 0;
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_scalable_bad(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, scalable_bad_body, NULL, NULL), 0);
}

/* ---- GetAsyncError on a blocking comm, bad config ---- */

static int blocking_body(const mp_env* env) {
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  ncclResult_t st = ncclInternalError;
  int bad = mp_expect_rc(env, comm, ncclCommGetAsyncError(comm, &st), ncclSuccess,
                         "ncclCommGetAsyncError");
  bad += mp_expect_rc(env, comm, st, ncclSuccess, "async state of a healthy blocking comm");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_blocking_async_state(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, blocking_body, NULL, NULL), 0);
}

/* ---- braidCommSetBlocking: a non-blocking comm, once ready, blocks ---- */

/* An all-reduce of rank + 1 on a NULL stream must return `want` (the mode)
 * and, once complete, hold the sum. */
static int sum_returns(const mp_env* env, ncclComm_t comm, ncclResult_t want, const char* what) {
  float buf[257];
  for (int i = 0; i < 257; i++) buf[i] = (float)(env->rank + 1);
  ncclResult_t rc = ncclAllReduce(buf, buf, 257, ncclFloat, ncclSum, comm, NULL);
  int bad = mp_expect_rc(env, comm, rc, want, what);
  if (rc == ncclInProgress) bad += wait_ready(env, comm, what, NULL);
  float sum = (float)(env->nranks * (env->nranks + 1) / 2);
  for (int i = 0; i < 257 && !bad; i++)
    if (buf[i] != sum) {
      mp_fail(env, "%s: [%d] = %g, expected %g", what, i, buf[i], sum);
      bad++;
    }
  return bad;
}

static int set_blocking_body(const mp_env* env) {
  ncclComm_t comm, blocking;
  int bad = 0;
  if (nb_init(env, &comm, NULL) != 0) return 1;
  bad += sum_returns(env, comm, ncclInProgress, "all-reduce, non-blocking");
  bad += mp_expect_rc(env, comm, braidCommSetBlocking(comm, 1), ncclSuccess, "set blocking");
  bad += sum_returns(env, comm, ncclSuccess, "all-reduce, set blocking");
  bad += mp_expect_rc(env, comm, braidCommSetBlocking(comm, 0), ncclSuccess, "set non-blocking");
  bad += sum_returns(env, comm, ncclInProgress, "all-reduce, non-blocking again");
  bad += mp_expect_rc(env, comm, braidCommSetBlocking(comm, 2), ncclInvalidArgument, "mode 2");
  bad += mp_expect_rc(env, NULL, braidCommSetBlocking(NULL, 1), ncclInvalidArgument, "NULL comm");
  bad += nb_end(env, comm, bad, NULL);
  if (mp_expect_rc(env, NULL, ncclCommInitRank(&blocking, env->nranks, env->ids[1], env->rank),
                   ncclSuccess, "ncclCommInitRank (blocking)"))
    return 1;
  bad += mp_expect_rc(env, blocking, braidCommSetBlocking(blocking, 0), ncclInvalidUsage,
                      "a comm made blocking");
  return bad + mp_expect_rc(env, blocking, ncclCommDestroy(blocking), ncclSuccess, "destroy");
}

static void test_set_blocking(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.nids = 2;
  assert_int_equal(mp_launch(3, set_blocking_body, NULL, &o), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nonblocking_comm),
      cmocka_unit_test(test_nonblocking_late_peer),
      cmocka_unit_test(test_nonblocking_split),
      cmocka_unit_test(test_mem_register),
      cmocka_unit_test(test_scalable),
      cmocka_unit_test(test_scalable_bad),
      cmocka_unit_test(test_blocking_async_state),
      cmocka_unit_test(test_set_blocking),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
