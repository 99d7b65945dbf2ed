/* Changing a communicator's membership: ncclCommShrink of a healthy comm,
 * and recovering from a rank SIGKILLed at a random point of an all-reduce
 * (3, 4 and 5 ranks, 21 trials: every survivor gets an error, shrinks
 * excluding the dead rank and all-reduces exactly on the new comm, none
 * hangs); ncclCommRevoke of work in flight; ncclCommGrow with new ranks;
 * and the arguments these refuse. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "launcher.h"

#define TIMEOUT_MS "5000"
#define SHRINK_DEADLINE_S 60
#define LOOP_COUNT ((size_t)1 << 18)
#define SURVIVOR_ITERS 4000
#define VICTIM_ITERS 100000
#define CHECK_COUNT 100003

/* All-reduce (sum) of rank + 1 on `comm`, checked on every element: the
 * ranks of `comm` are the parent ranks listed in `members`. */
static int allreduce_exact(const mp_env* env, ncclComm_t comm, const int* members, int n) {
  int rank = -1, count = -1, bad = 0;
  bad += mp_expect_rc(env, comm, ncclCommUserRank(comm, &rank), ncclSuccess, "ncclCommUserRank");
  bad += mp_expect_rc(env, comm, ncclCommCount(comm, &count), ncclSuccess, "ncclCommCount");
  if (count != n || rank < 0 || rank >= n || members[rank] != env->rank) {
    mp_fail(env, "new comm: rank %d of %d, expected rank of parent rank %d among %d", rank, count,
            env->rank, n);
    return 1;
  }
  double want = 0;
  for (int i = 0; i < n; i++) want += members[i] + 1;
  double* buf = malloc(sizeof(double) * CHECK_COUNT);
  for (size_t i = 0; i < CHECK_COUNT; i++) buf[i] = env->rank + 1 + (double)(i % 7) * 1024;
  ncclResult_t rc = ncclAllReduce(buf, buf, CHECK_COUNT, ncclDouble, ncclSum, comm, NULL);
  bad += mp_expect_rc(env, comm, rc, ncclSuccess, "ncclAllReduce on the shrunk comm");
  for (size_t i = 0; rc == ncclSuccess && i < CHECK_COUNT; i++) {
    double w = want + (double)(i % 7) * 1024 * n;
    if (buf[i] != w) {
      mp_fail(env, "shrunk comm all-reduce [%zu] = %g, expected %g", i, buf[i], w);
      bad++;
      break;
    }
  }
  free(buf);
  return bad;
}

/* The survivors of `excluded` (a mask over n ranks), in order. */
static int survivors_of(const unsigned char* excluded, int n, int* out) {
  int k = 0;
  for (int r = 0; r < n; r++)
    if (!excluded[r]) out[k++] = r;
  return k;
}

/* ---- a healthy comm ---- */

typedef struct healthy_case {
  int nexcl;
  int excl[3];
} healthy_case;

static int healthy_body(const mp_env* env) {
  const healthy_case* hc = env->arg;
  unsigned char excluded[MP_MAX_RANKS] = {0};
  int members[MP_MAX_RANKS];
  for (int i = 0; i < hc->nexcl; i++) excluded[hc->excl[i]] = 1;
  int n = survivors_of(excluded, env->nranks, members);
  ncclComm_t comm = NULL, shrunk = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int all[MP_MAX_RANKS];
  for (int r = 0; r < env->nranks; r++) all[r] = r;
  int bad = allreduce_exact(env, comm, all, env->nranks); /* connections exist */
  if (excluded[env->rank]) /* excluded ranks do not call; they let go of the parent */
    return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  ncclResult_t rc =
      ncclCommShrink(comm, (int*)hc->excl, hc->nexcl, &shrunk, NULL, NCCL_SHRINK_DEFAULT);
  bad += mp_expect_rc(env, comm, rc, ncclSuccess, "ncclCommShrink(healthy)");
  if (rc == ncclSuccess) {
    bad += allreduce_exact(env, shrunk, members, n);
    bad += mp_expect_rc(env, shrunk, ncclCommDestroy(shrunk), ncclSuccess, "ncclCommDestroy(new)");
  }
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy(parent)");
  return bad != 0;
}

static void test_shrink_healthy(void** state) {
  (void)state;
  static const healthy_case cases[] = {{1, {1}}, {2, {0, 3}}, {0, {0}}, {3, {0, 1, 2}}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    assert_int_equal(mp_launch(4, healthy_body, (void*)&cases[i], NULL), 0);
}

/* ---- a rank SIGKILLed mid all-reduce ---- */

typedef struct kill_case {
  int victim;
  int iters_before;
} kill_case;

static int killed_victim(const mp_env* env, const kill_case* k, ncclComm_t comm) {
  float* buf = calloc(LOOP_COUNT, sizeof(float));
  ncclResult_t rc = ncclSuccess;
  int it = 0;
  for (; buf && it < VICTIM_ITERS && rc == ncclSuccess; it++) {
    if (it == k->iters_before) mp_notify_parent(); /* the parent kills us in flight */
    rc = ncclAllReduce(buf, buf, LOOP_COUNT, ncclFloat, ncclSum, comm, NULL);
  }
  mp_fail(env, "victim still alive after %d all-reduces", it);
  return 1;
}

static int killed_survivor(const mp_env* env, const kill_case* k, ncclComm_t comm) {
  float* buf = calloc(LOOP_COUNT, sizeof(float));
  ncclResult_t rc = ncclSuccess;
  int it = 0, bad = 0;
  double t0 = mp_now();
  for (; it < SURVIVOR_ITERS && rc == ncclSuccess; it++)
    rc = ncclAllReduce(buf, buf, LOOP_COUNT, ncclFloat, ncclSum, comm, NULL);
  free(buf);
  if (rc == ncclSuccess) {
    mp_fail(env, "%d all-reduces succeeded although rank %d was killed", it, k->victim);
    ncclCommAbort(comm);
    return 1;
  }
  double t1 = mp_now();
  ncclComm_t shrunk = NULL;
  int excl = k->victim;
  rc = ncclCommShrink(comm, &excl, 1, &shrunk, NULL, NCCL_SHRINK_ABORT);
  double t2 = mp_now();
  bad += mp_expect_rc(env, comm, rc, ncclSuccess, "ncclCommShrink(NCCL_SHRINK_ABORT) after a kill");
  if (rc == ncclSuccess) {
    unsigned char excluded[MP_MAX_RANKS] = {0};
    int members[MP_MAX_RANKS];
    excluded[k->victim] = 1;
    bad += allreduce_exact(env, shrunk, members, survivors_of(excluded, env->nranks, members));
    bad += mp_expect_rc(env, shrunk, ncclCommDestroy(shrunk), ncclSuccess, "ncclCommDestroy(new)");
  }
  bad += mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort(parent)");
  if (mp_verbose() || bad)
    mp_log(env, "iteration %d failed after %.2f s; shrink took %.2f s", it - 1, t1 - t0, t2 - t1);
  return bad != 0;
}

static int kill_body(const mp_env* env) {
  const kill_case* k = env->arg;
  ncclComm_t comm = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  return env->rank == k->victim ? killed_victim(env, k, comm) : killed_survivor(env, k, comm);
}

/* 21 trials: 7 each on 3, 4 and 5 ranks, the victim and the moment drawn
 * from a seed that is logged (BRAID_SHRINK_SEED replays one). */
static void test_shrink_after_kill(void** state) {
  (void)state;
  const char* s = getenv("BRAID_SHRINK_SEED");
  unsigned seed = s ? (unsigned)strtoul(s, NULL, 0) : (unsigned)time(NULL);
  fprintf(stderr, "shrink after kill: seed %u\n", seed);
  srand(seed);
  static const int sizes[] = {3, 4, 5};
  for (int t = 0; t < 21; t++) {
    int n = sizes[t % 3];
    kill_case k = {rand() % n, rand() % 6};
    mp_opts o = MP_OPTS_INIT;
    o.deadline_s = SHRINK_DEADLINE_S;
    o.victim = k.victim;
    o.kill_on_notify = 1;
    if (mp_launch(n, kill_body, &k, &o) != 0)
      fail_msg("trial %d: %d ranks, rank %d killed after %d all-reduces (seed %u)", t, n, k.victim,
               k.iters_before, seed);
  }
}

/* ---- revoke ---- */

typedef struct revoker {
  ncclComm_t comm;
  ncclResult_t rc;
} revoker;

static void* revoke_thread(void* p) {
  revoker* r = p;
  mp_sleep_ms(300);
  r->rc = ncclCommRevoke(r->comm, NCCL_REVOKE_DEFAULT);
  return NULL;
}

/* Ranks but the last block in an all-reduce the last never joins; a
 * thread revokes. The call returns an error at once, new calls are
 * refused, and the survivors shrink the idle rank away. */
static int revoke_body(const mp_env* env) {
  ncclComm_t comm = NULL, shrunk = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int idle = env->nranks - 1, bad = 0;
  if (env->rank == idle) {
    mp_wait_flag(&env->shm[0], 30000);
    return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy(idle)");
  }
  static float buf[4096];
  revoker r = {comm, ncclInternalError};
  pthread_t th;
  if (pthread_create(&th, NULL, revoke_thread, &r) != 0) return 1;
  double t0 = mp_now();
  ncclResult_t rc = ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL);
  double dt = mp_now() - t0;
  pthread_join(th, NULL);
  bad += mp_expect_rc(env, comm, r.rc, ncclSuccess, "ncclCommRevoke from a second thread");
  if (rc == ncclSuccess || dt > 2.5)
    mp_fail(env, "blocked all-reduce returned %d after %.2f s (revoked at 0.3 s)", (int)rc, dt),
        bad++;
  bad += mp_expect_rc(env, comm, ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, NULL),
                      ncclInvalidUsage, "ncclAllReduce on a revoked comm");
  bad += mp_expect_rc(env, comm, ncclCommRevoke(comm, 7), ncclInvalidArgument,
                      "ncclCommRevoke(flags 7)");
  rc = ncclCommShrink(comm, &idle, 1, &shrunk, NULL, NCCL_SHRINK_ABORT);
  bad += mp_expect_rc(env, comm, rc, ncclSuccess, "ncclCommShrink after revoke");
  if (rc == ncclSuccess) {
    int members[MP_MAX_RANKS];
    for (int i = 0; i < idle; i++) members[i] = i;
    bad += allreduce_exact(env, shrunk, members, idle);
    bad += mp_expect_rc(env, shrunk, ncclCommDestroy(shrunk), ncclSuccess, "ncclCommDestroy(new)");
  }
  if (__atomic_add_fetch(&env->shm[1], 1, __ATOMIC_SEQ_CST) == idle)
    __atomic_store_n(&env->shm[0], 1, __ATOMIC_SEQ_CST);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy(revoked)");
  return bad != 0;
}

static void test_revoke(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = SHRINK_DEADLINE_S;
  assert_int_equal(mp_launch(3, revoke_body, NULL, &o), 0);
}

/* ---- grow ---- */

#define GROW_OLD 3 /* ranks 0..2 make the parent; ranks 3 and 4 join */
#define GROW_ID_SLOT 60

/* Rank 0 makes the grow id and leaves it in env->shm for the new ranks. */
static void share_grow_id(const mp_env* env, const ncclUniqueId* id) {
  memcpy((void*)(env->shm + GROW_ID_SLOT + 1), id, sizeof(*id));
  __atomic_store_n(&env->shm[GROW_ID_SLOT], 1, __ATOMIC_SEQ_CST);
}

static int grow_body(const mp_env* env) {
  ncclComm_t parent = NULL, grown = NULL;
  ncclUniqueId id;
  int bad = 0, all[MP_MAX_RANKS];
  for (int r = 0; r < env->nranks; r++) all[r] = r;
  if (env->rank >= GROW_OLD) { /* a new rank: the id, then its place */
    if (!mp_wait_flag(&env->shm[GROW_ID_SLOT], 30000)) return 1;
    memcpy(&id, (const void*)(env->shm + GROW_ID_SLOT + 1), sizeof(id));
    ncclResult_t rc = ncclCommGrow(NULL, env->nranks, &id, env->rank, &grown, NULL);
    if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommGrow (new rank)")) return 1;
    bad += allreduce_exact(env, grown, all, env->nranks);
    return bad + mp_expect_rc(env, grown, ncclCommDestroy(grown), ncclSuccess, "ncclCommDestroy");
  }
  ncclResult_t rc = ncclCommInitRank(&parent, GROW_OLD, env->id, env->rank);
  if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitRank (parent of 3)")) return 1;
  bad += allreduce_exact(env, parent, all, GROW_OLD);
  const ncclUniqueId* mine = NULL;
  if (env->rank == 0) {
    rc = ncclCommGetUniqueId(parent, &id);
    bad += mp_expect_rc(env, parent, rc, ncclSuccess, "ncclCommGetUniqueId");
    bad += mp_expect_rc(env, parent, ncclCommGetUniqueId(parent, &id), ncclInvalidUsage,
                        "ncclCommGetUniqueId while one is unconsumed");
    share_grow_id(env, &id);
    mine = &id;
  }
  rc = ncclCommGrow(parent, env->nranks, mine, -1, &grown, NULL);
  bad += mp_expect_rc(env, parent, rc, ncclSuccess, "ncclCommGrow (parent rank)");
  if (rc == ncclSuccess) {
    bad += allreduce_exact(env, grown, all, env->nranks);
    bad += mp_expect_rc(env, grown, ncclCommDestroy(grown), ncclSuccess, "ncclCommDestroy(grown)");
  }
  bad += allreduce_exact(env, parent, all, GROW_OLD); /* the parent still works */
  bad += mp_expect_rc(env, parent, ncclCommGrow(parent, 2, NULL, -1, &grown, NULL),
                      ncclInvalidArgument, "ncclCommGrow to fewer ranks");
  bad += mp_expect_rc(env, parent, ncclCommDestroy(parent), ncclSuccess, "ncclCommDestroy(parent)");
  return bad != 0;
}

static void test_grow(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = SHRINK_DEADLINE_S;
  assert_int_equal(mp_launch(GROW_OLD + 2, grow_body, NULL, &o), 0);
}

/* ---- what shrink refuses ---- */

static int refuse_body(const mp_env* env) {
  ncclComm_t comm = NULL, out = (ncclComm_t)0x1;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0, self = env->rank, other = 1 - env->rank, big = 5, twice[2] = {other, other};
  bad += mp_expect_rc(env, comm, ncclCommShrink(comm, &self, 1, &out, NULL, 0), ncclInvalidArgument,
                      "ncclCommShrink(excluding itself)");
  bad += mp_expect_last_error(env, comm, "ncclCommShrink(excluding itself)");
  bad += mp_expect_rc(env, comm, ncclCommShrink(comm, &big, 1, &out, NULL, 0), ncclInvalidArgument,
                      "ncclCommShrink(rank 5 of 2)");
  bad += mp_expect_rc(env, comm, ncclCommShrink(comm, twice, 2, &out, NULL, 0), ncclInvalidArgument,
                      "ncclCommShrink(a rank twice)");
  bad += mp_expect_rc(env, comm, ncclCommShrink(comm, &other, 1, &out, NULL, 0x10),
                      ncclInvalidArgument, "ncclCommShrink(flags 0x10)");
  bad += mp_expect_rc(env, comm, ncclCommShrink(comm, &other, 1, NULL, NULL, 0),
                      ncclInvalidArgument, "ncclCommShrink(newcomm NULL)");
  bad += mp_expect_rc(env, NULL, ncclCommShrink(NULL, &other, 1, &out, NULL, 0),
                      ncclInvalidArgument, "ncclCommShrink(NULL comm)");
  int all[2] = {0, 1};
  bad += mp_expect_rc(env, comm, ncclCommShrink(comm, all, 2, &out, NULL, 0), ncclInvalidArgument,
                      "ncclCommShrink(excluding everyone)");
  bad += allreduce_exact(env, comm, all, 2); /* the refusals left the comm as it was */
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_shrink_refusals(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, refuse_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", TIMEOUT_MS);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shrink_refusals),
      cmocka_unit_test(test_shrink_healthy),
      cmocka_unit_test(test_revoke),
      cmocka_unit_test(test_grow),
      cmocka_unit_test(test_shrink_after_kill),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
