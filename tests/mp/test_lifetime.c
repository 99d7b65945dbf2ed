/* Lifetime of a communicator: ncclCommAbort / ncclCommDestroy while a
 * non-blocking init waits for a rank that never comes return promptly
 * (and free NCCL_COMM_ID's address for the next job); a destroyed handle
 * passed again is refused; work queued on a host stream when its comm is
 * aborted fails instead of touching freed memory. Run under
 * AddressSanitizer too (make test), where the last two were seen. */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "archeck.h"
#include "braid.h"
#include "launcher.h"

/* Far longer than the launcher's deadline: an abort that waited for it
 * would be killed there, and the test fail. */
#define LONG_TIMEOUT_MS "600000"
#define PENDING_DEADLINE_S 60

/* ---- abort / destroy during a non-blocking init ---- */

typedef struct pending_case {
  int use_comm_id; /* rank 0 serves NCCL_COMM_ID itself */
  int port;
  int destroy; /* ncclCommDestroy instead of ncclCommAbort */
} pending_case;

/* Rank 0 of 2 starts a non-blocking init; rank 1 never does. (env is not
 * used: no rank but this one takes part.) */
static ncclResult_t start_pending(ncclComm_t* comm) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclUniqueId id;
  cfg.blocking = 0;
  if (ncclGetUniqueId(&id) != ncclSuccess) return ncclInternalError; /* a root here, or rank 0's */
  return ncclCommInitRankConfig(comm, 2, id, 0, &cfg);
}

static int end_pending(const mp_env* env, const pending_case* k, ncclComm_t comm,
                       const char* what) {
  ncclResult_t async = ncclSuccess;
  mp_sleep_ms(300); /* the init now waits in the bootstrap */
  if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async != ncclInProgress) {
    mp_fail(env, "%s: init is not pending (%d)", what, (int)async);
    return 1;
  }
  double t0 = mp_now();
  ncclResult_t rc = k->destroy ? ncclCommDestroy(comm) : ncclCommAbort(comm);
  mp_log(env, "%s: %s returned after %.3f s", what,
         k->destroy ? "ncclCommDestroy" : "ncclCommAbort", mp_now() - t0);
  return mp_expect_rc(env, NULL, rc, ncclSuccess, what);
}

static int pending_body(const mp_env* env) {
  const pending_case* k = env->arg;
  char v[64];
  ncclComm_t comm = NULL;
  int bad = 0;
  if (env->rank == 1) return 0; /* the missing rank */
  if (k->use_comm_id) {
    snprintf(v, sizeof(v), "127.0.0.1:%d", k->port);
    setenv("NCCL_COMM_ID", v, 1);
  }
  /* Twice: with NCCL_COMM_ID the first root must have let go of the
   * address, or the second init fails to serve it. */
  for (int round = 0; round < 2 && bad == 0; round++) {
    ncclResult_t rc = start_pending(&comm);
    bad += mp_expect_rc(env, NULL, rc, ncclInProgress, "non-blocking init");
    if (bad == 0) bad += end_pending(env, k, comm, round ? "second pending init" : "pending init");
  }
  return bad;
}

static void test_end_pending_init(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = PENDING_DEADLINE_S;
  for (int use_comm_id = 0; use_comm_id < 2; use_comm_id++)
    for (int destroy = 0; destroy < 2; destroy++) {
      pending_case k = {use_comm_id, mp_free_port(AF_INET), destroy};
      o.no_id = 1;
      assert_int_equal(mp_launch(2, pending_body, &k, &o), 0);
    }
}

/* ---- a destroyed handle ---- */

static int destroyed_body(const mp_env* env) {
  ncclComm_t comm = NULL, aborted = NULL;
  float x[4] = {0};
  int n = 0, bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  bad += mp_expect_rc(env, comm, ncclCommSplit(comm, 0, env->rank, &aborted, NULL), ncclSuccess,
                      "ncclCommSplit");
  bad += mp_expect_rc(env, NULL, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  bad += mp_expect_rc(env, NULL, ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL),
                      ncclInvalidArgument, "ncclAllReduce on a destroyed comm");
  bad += mp_expect_rc(env, NULL, ncclCommCount(comm, &n), ncclInvalidArgument,
                      "ncclCommCount on a destroyed comm");
  bad +=
      mp_expect_rc(env, NULL, ncclCommDestroy(comm), ncclInvalidArgument, "ncclCommDestroy twice");
  bad += mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclInvalidArgument,
                      "ncclCommAbort after ncclCommDestroy");
  bad += mp_expect_rc(env, NULL, ncclCommAbort(aborted), ncclSuccess, "ncclCommAbort");
  bad += mp_expect_rc(env, NULL, ncclSend(x, 4, ncclFloat, 0, aborted, NULL), ncclInvalidArgument,
                      "ncclSend on an aborted comm");
  return bad;
}

static void test_destroyed_handle(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, destroyed_body, NULL, NULL), 0);
}

/* ---- abort with work queued on a host stream ---- */

#define QUEUED 8

/* On rank 1's host stream an all-reduce on comm B waits for rank 0, which
 * never joins; behind it QUEUED all-reduces on comm A wait their turn.
 * Rank 1 aborts A (nothing of A runs: it returns at once), then B: the
 * stream moves on to A's calls, which must fail without touching A's
 * freed memory (they ran on it before). */
static int queued_abort_body(const mp_env* env) {
  ncclComm_t a = NULL, b = NULL;
  cudaStream_t s = NULL;
  static float x[QUEUED + 1][64];
  int bad = 0;
  if (mp_comm_init(env, &a) != 0) return 1;
  if (mp_expect_rc(env, a, ncclCommSplit(a, 0, env->rank, &b, NULL), ncclSuccess, "ncclCommSplit"))
    return 1;
  if (env->rank == 0) { /* never joins: rank 1's call on B waits for it */
    mp_wait_flag(&env->shm[0], 30000);
    ncclCommAbort(b);
    return mp_expect_rc(env, NULL, ncclCommAbort(a), ncclSuccess, "ncclCommAbort (rank 0)");
  }
  bad += mp_expect_rc(env, NULL, braidStreamCreate(&s), ncclSuccess, "braidStreamCreate");
  bad += mp_expect_rc(env, b, ncclAllReduce(x[0], x[0], 64, ncclFloat, ncclSum, b, s), ncclSuccess,
                      "ncclAllReduce on B");
  for (int i = 1; i <= QUEUED && bad == 0; i++)
    bad += mp_expect_rc(env, a, ncclAllReduce(x[i], x[i], 64, ncclFloat, ncclSum, a, s),
                        ncclSuccess, "ncclAllReduce on A behind it");
  mp_sleep_ms(200);
  bad += mp_expect_rc(env, NULL, ncclCommAbort(a), ncclSuccess, "ncclCommAbort(A), work queued");
  bad += mp_expect_rc(env, NULL, ncclCommAbort(b), ncclSuccess, "ncclCommAbort(B)");
  ncclResult_t sync = braidStreamSynchronize(s);
  if (sync == ncclSuccess) {
    mp_fail(env, "the stream's work on the aborted comms reported success");
    bad++;
  }
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  __atomic_store_n(&env->shm[0], 1, __ATOMIC_SEQ_CST);
  return bad;
}

static void test_abort_with_queued_work(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, queued_abort_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", LONG_TIMEOUT_MS);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_end_pending_init),
      cmocka_unit_test(test_destroyed_handle),
      cmocka_unit_test(test_abort_with_queued_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
