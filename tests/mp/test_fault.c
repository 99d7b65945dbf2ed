/* Multi-process fault handling: a rank SIGKILLed before, during or after init
 * or mid all-reduce makes survivors fail (never hang); abort from a thread. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "launcher.h"

#define TIMEOUT_MS "5000"
#define FAULT_DEADLINE_S 60
#define LOOP_COUNT ((size_t)1 << 20)
#define SURVIVOR_ITERS 2000
#define VICTIM_ITERS 100000
#define ABORT_AFTER_MS 300
#define ABORT_PROMPT_S 2.5 /* well below BRAID_TIMEOUT_MS */

/* How the victim (the rank in `victim`) dies. */
enum how { DIE_BEFORE_INIT, DIE_AFTER_INIT, KILLED_DURING_INIT, KILLED_MID_LOOP, RAISE_MID_LOOP };

typedef struct scenario {
  enum how how;
  int victim;
  int iters_before; /* loop iterations before the victim dies or notifies */
} scenario;

static double timeout_s(void) {
  return atof(getenv("BRAID_TIMEOUT_MS")) / 1000.0;
}

static const char* rc_name(ncclResult_t rc) {
  return ncclGetErrorString(rc);
}

/* After a failed collective: the async error must be set, abort must work. */
static int after_error(const mp_env* env, ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  int bad = mp_expect_rc(env, comm, ncclCommGetAsyncError(comm, &async), ncclSuccess,
                         "ncclCommGetAsyncError");
  if (!bad && async == ncclSuccess) {
    mp_fail(env, "ncclCommGetAsyncError reports ncclSuccess after a failed all-reduce");
    bad++;
  } else if (!bad) {
    mp_log(env, "ncclCommGetAsyncError: %d (%s)", (int)async, rc_name(async));
  }
  bad += mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort");
  return bad;
}

/* All-reduces until one fails. 0 when one failed (as it must). */
static int survivor_loop(const mp_env* env, ncclComm_t comm) {
  float* buf = malloc(LOOP_COUNT * sizeof(float));
  if (!buf) return 1;
  for (size_t i = 0; i < LOOP_COUNT; i++) buf[i] = 1.0f;
  for (int it = 0; it < SURVIVOR_ITERS; it++) {
    double t0 = mp_now();
    ncclResult_t rc = ncclAllReduce(buf, buf, LOOP_COUNT, ncclFloat, ncclMin, comm, NULL);
    if (rc == ncclSuccess) continue;
    double dt = mp_now() - t0;
    mp_log(env, "all-reduce iteration %d returned %d (%s) after %.2f s (timeout %.1f s%s): \"%s\"",
           it, (int)rc, rc_name(rc), dt, timeout_s(), dt > timeout_s() + 1.0 ? ", EXCEEDED" : "",
           ncclGetLastError(comm));
    free(buf);
    return after_error(env, comm);
  }
  free(buf);
  mp_fail(env, "%d all-reduces succeeded although a peer was killed", SURVIVOR_ITERS);
  ncclCommAbort(comm);
  return 1;
}

static int survivor(const mp_env* env, const scenario* s) {
  ncclComm_t comm = NULL;
  double t0 = mp_now();
  ncclResult_t rc = ncclCommInitRank(&comm, env->nranks, env->id, env->rank);
  double dt = mp_now() - t0;
  if (rc != ncclSuccess) {
    mp_log(env, "ncclCommInitRank returned %d (%s) after %.2f s (timeout %.1f s): \"%s\"", (int)rc,
           rc_name(rc), dt, timeout_s(), ncclGetLastError(NULL));
    return 0;
  }
  if (s->how == DIE_BEFORE_INIT) {
    mp_fail(env, "ncclCommInitRank succeeded although rank %d never called it", s->victim);
    ncclCommAbort(comm);
    return 1;
  }
  return survivor_loop(env, comm);
}

/* The victim's all-reduces; notifies or dies after iters_before. */
static int victim_loop(const mp_env* env, const scenario* s, ncclComm_t comm) {
  float* buf = calloc(LOOP_COUNT, sizeof(float));
  ncclResult_t rc = ncclSuccess;
  int it = 0;
  for (; buf && it < VICTIM_ITERS && rc == ncclSuccess; it++) {
    if (it == s->iters_before && s->how == RAISE_MID_LOOP) raise(SIGKILL);
    if (it == s->iters_before && s->how == KILLED_MID_LOOP) mp_notify_parent();
    rc = ncclAllReduce(buf, buf, LOOP_COUNT, ncclFloat, ncclMin, comm, NULL);
  }
  mp_fail(env, "victim still alive after %d all-reduces (last returned %d (%s): \"%s\")", it,
          (int)rc, rc_name(rc), rc == ncclSuccess ? "" : ncclGetLastError(comm));
  return 1;
}

static int victim(const mp_env* env, const scenario* s) {
  ncclComm_t comm = NULL;
  if (s->how == DIE_BEFORE_INIT) raise(SIGKILL);
  if (s->how == KILLED_DURING_INIT) mp_notify_parent();
  ncclResult_t rc = ncclCommInitRank(&comm, env->nranks, env->id, env->rank);
  if (s->how == DIE_AFTER_INIT) raise(SIGKILL);
  if (rc != ncclSuccess) {
    mp_fail(env, "victim: ncclCommInitRank returned %d (%s)", (int)rc, rc_name(rc));
    return 1;
  }
  return victim_loop(env, s, comm);
}

static int fault_body(const mp_env* env) {
  const scenario* s = env->arg;
  return env->rank == s->victim ? victim(env, s) : survivor(env, s);
}

static void run_scenario(int nranks, enum how how, int victim_rank, int iters_before) {
  scenario s = {how, victim_rank, iters_before};
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = FAULT_DEADLINE_S;
  o.victim = victim_rank;
  o.kill_on_notify = how == KILLED_DURING_INIT || how == KILLED_MID_LOOP;
  assert_int_equal(mp_launch(nranks, fault_body, &s, &o), 0);
}

static void test_dies_before_init(void** state) {
  (void)state;
  run_scenario(3, DIE_BEFORE_INIT, 1, 0);
}

static void test_dies_after_init(void** state) {
  (void)state;
  run_scenario(3, DIE_AFTER_INIT, 0, 0);
}

static void test_killed_during_init(void** state) {
  (void)state;
  run_scenario(4, KILLED_DURING_INIT, 3, 0);
}

static void test_killed_mid_allreduce(void** state) {
  (void)state;
  run_scenario(4, KILLED_MID_LOOP, 2, 3);
}

static void test_raise_mid_allreduce(void** state) {
  (void)state;
  run_scenario(3, RAISE_MID_LOOP, 0, 5);
}

/* ---- ncclCommAbort from a second thread ---- */

typedef struct aborter {
  ncclComm_t comm;
  ncclResult_t rc;
} aborter;

static void* abort_thread(void* p) {
  aborter* a = p;
  mp_sleep_ms(ABORT_AFTER_MS);
  a->rc = ncclCommAbort(a->comm);
  return NULL;
}

/* Blocks in an all-reduce the idle rank never joins; a thread aborts. */
static int blocked_rank(const mp_env* env, ncclComm_t comm) {
  static float buf[4096];
  aborter a = {comm, ncclInternalError};
  pthread_t th;
  if (pthread_create(&th, NULL, abort_thread, &a) != 0) return 1;
  double t0 = mp_now();
  ncclResult_t rc = ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL);
  double dt = mp_now() - t0;
  pthread_join(th, NULL);
  __atomic_add_fetch(&env->shm[0], 1, __ATOMIC_SEQ_CST);
  int bad = mp_expect_rc(env, NULL, a.rc, ncclSuccess, "ncclCommAbort from a second thread");
  mp_log(env, "blocked all-reduce returned %d (%s) after %.2f s", (int)rc, rc_name(rc), dt);
  if (rc == ncclSuccess) mp_fail(env, "all-reduce succeeded although a rank never joined");
  if (dt > ABORT_PROMPT_S)
    mp_fail(env, "all-reduce returned %.2f s after start, abort came at %.2f s", dt,
            ABORT_AFTER_MS / 1000.0);
  return bad + (rc == ncclSuccess) + (dt > ABORT_PROMPT_S);
}

static int abort_body(const mp_env* env) {
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (env->rank != env->nranks - 1) return blocked_rank(env, comm);
  /* the idle rank: never calls the collective, waits for the others */
  for (double end = mp_now() + 20.0; mp_now() < end;) {
    if (__atomic_load_n(&env->shm[0], __ATOMIC_SEQ_CST) >= env->nranks - 1) break;
    mp_sleep_ms(5);
  }
  return mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort (idle rank)");
}

static void test_abort_from_thread(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = FAULT_DEADLINE_S;
  assert_int_equal(mp_launch(3, abort_body, NULL, &o), 0);
}

/* ---- segments of a rank killed during connection setup ---- */

/* A segment of pid in /dev/shm ("braid-<pid>-..."): 1 when there. */
static int has_segment(int pid) {
  char prefix[32];
  int found = 0;
  snprintf(prefix, sizeof(prefix), "braid-%d-", pid);
  DIR* d = opendir("/dev/shm");
  for (struct dirent* e; d && !found && (e = readdir(d)) != NULL;)
    found = strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (d) closedir(d);
  return found;
}

/* Rank 1 sends to rank 0, which never receives: the segment it made is
 * never mapped, so only its close would unlink it - and rank 1 is
 * SIGKILLed first. Its pid goes to the launcher's parent through a file. */
static int stale_body(const mp_env* env) {
  static char buf[64 << 10];
  const char* pidfile = env->arg;
  ncclComm_t comm = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (env->rank == 0) {
    mp_wait_flag(&env->shm[1], 30000); /* rank 1's segment exists */
    return 0;
  }
  if (mp_expect_rc(env, comm, ncclSend(buf, sizeof(buf), ncclChar, 0, comm, NULL), ncclSuccess,
                   "ncclSend into the slots"))
    return 1;
  FILE* f = fopen(pidfile, "w");
  if (!has_segment((int)getpid()) || f == NULL) {
    mp_fail(env, "no segment of mine in /dev/shm after the send, or no pid file");
    return 1;
  }
  fprintf(f, "%d\n", (int)getpid());
  fclose(f);
  __atomic_store_n(&env->shm[1], 1, __ATOMIC_SEQ_CST);
  mp_notify_parent(); /* SIGKILLed here, with the segment in /dev/shm */
  mp_sleep_ms(30000);
  return 1;
}

/* The next Braid process on the host: its first comm sweeps. */
static int sweeper_body(const mp_env* env) {
  const int* victim_pid = env->arg;
  ncclComm_t comm = NULL;
  if (!has_segment(*victim_pid)) {
    mp_fail(env, "the dead rank's segment is not there to sweep: the test proves nothing");
    return 1;
  }
  if (mp_expect_rc(env, NULL, ncclCommInitAll(&comm, 1, NULL), ncclSuccess, "ncclCommInitAll"))
    return 1;
  ncclCommDestroy(comm);
  if (has_segment(*victim_pid)) {
    mp_fail(env, "segment of dead pid %d still in /dev/shm", *victim_pid);
    return 1;
  }
  return 0;
}

static void test_stale_segments_swept(void** state) {
  (void)state;
  char pidfile[] = "/tmp/mp_stale_XXXXXX";
  int fd = mkstemp(pidfile), victim_pid = 0;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = FAULT_DEADLINE_S;
  o.victim = 1;
  o.kill_on_notify = 1;
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(mp_launch(2, stale_body, pidfile, &o), 0);
  FILE* f = fopen(pidfile, "r");
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%d", &victim_pid), 1);
  fclose(f);
  unlink(pidfile);
  assert_int_equal(mp_launch(1, sweeper_body, &victim_pid, NULL), 0);
}

int main(void) {
  /* before any library call: the library reads it once per process */
  mp_default_env("BRAID_TIMEOUT_MS", TIMEOUT_MS);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dies_before_init),     cmocka_unit_test(test_dies_after_init),
      cmocka_unit_test(test_killed_during_init),   cmocka_unit_test(test_killed_mid_allreduce),
      cmocka_unit_test(test_raise_mid_allreduce),  cmocka_unit_test(test_abort_from_thread),
      cmocka_unit_test(test_stale_segments_swept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
