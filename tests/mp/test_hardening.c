/* What a stranger on the host or a careless caller must not get away with
 * (issue 31), on host buffers:
 *  - a control message forged by a process that is not the member it
 *    names, even one holding the comm's secret, as another user or as
 *    this user: refused, and the shrink it tried to hijack succeeds;
 *  - ncclCommAbort or ncclCommDestroy while ncclCommShrink or
 *    ncclCommGrow waits on the comm: the waiting call fails at once,
 *    nothing is used after it is freed (this binary also runs under ASan);
 *  - a refused ncclCommGrow leaves nothing behind: the retry works;
 *  - the calls a finalized, suspended or oversized request must refuse,
 *    and an id from ncclCommGetUniqueId that is never used holds nothing
 *    once its comm is destroyed. */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "comm/comm_ctrl.h"
#include "launcher.h"
#include "socket.h"
#include "stranger.h"

#define WAIT_DEADLINE_S 60       /* a call that waits for the timeout fails the test here */
#define LONG_TIMEOUT_MS "600000" /* BRAID_TIMEOUT_MS: no wait may end by it */
#define FLAG_STRANGERS 10        /* shm: the forgeries were refused (1) or taken (2) */
#define FLAG_DONE 11             /* shm: the rank that waits in a call has left it */
#define ID_SLOT 20               /* shm: a grow id for the new rank */

/* ---- a forged control message ---- */

typedef struct forgery {
  union socket_addr to; /* the victim's control listener */
  struct ctrl_msg msg;
} forgery;

/* Connect, send the message, read the answer: 0 when refused (the
 * listener closed without taking it), 1 when it was taken. */
static int forge_send(void* arg) {
  const forgery* f = arg;
  char ack = 0;
  int s = socket(f->to.sa.sa_family, SOCK_STREAM, 0);
  if (s < 0 || connect(s, &f->to.sa, socket_addr_len(&f->to)) != 0) return 0;
  if (send(s, &f->msg, sizeof(f->msg), MSG_NOSIGNAL) != (ssize_t)sizeof(f->msg)) return 0;
  return recv(s, &ack, 1, 0) == 1;
}

/* A membership call made on a thread of its own: a shrink excluding rank
 * 2 (so rank 0 leads), or a parent's grow to 4 ranks waiting for its id. */
struct member_call {
  ncclComm_t comm;
  int grow;
  int flags; /* the shrink's */
  ncclComm_t out;
  ncclResult_t rc;
};

static void* member_thread(void* p) {
  struct member_call* c = p;
  int excluded = 2;
  if (c->grow)
    c->rc = ncclCommGrow(c->comm, 4, NULL, -1, &c->out, NULL);
  else
    c->rc = ncclCommShrink(c->comm, &excluded, 1, &c->out, NULL, c->flags);
  return NULL;
}

/* Four forgeries of the leader's (rank 0's) shrink message to rank 1: the
 * secret where the proof goes and a true proof, each from another user
 * and from another process of this user. */
static int forge_all(const mp_env* env, ncclComm_t comm) {
  forgery f;
  pid_t kids[4];
  int taken = 0;
  memset(&f, 0, sizeof(f));
  if (socket_addr_from_wire(&comm->peers[1].ctrl, &f.to) != 0) return 1;
  f.msg = (struct ctrl_msg){CTRL_MAGIC, CTRL_SHRINK, 0, 1, 0, 0, {{0}}};
  memset(f.msg.id.internal, 0x5a, sizeof(f.msg.id.internal)); /* the stranger's comm */
  for (int k = 0; k < 4; k++) {
    if (k < 2)
      f.msg.proof = comm->tctx.secret; /* how a message was vouched for before */
    else
      ctrl_msg_seal(&f.msg, comm->tctx.secret);
    if (stranger_run(env, k % 2 ? getuid() : STRANGER_UID, forge_send, &f, 0, &kids[k]) != 0)
      return 1;
  }
  for (int k = 0; k < 4; k++) {
    int r = stranger_join(env, kids[k]);
    if (r != 0) mp_fail(env, "forgery %d was %s", k, r < 0 ? "not made" : "taken"), taken++;
  }
  return taken;
}

static int forged_shrink_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  int bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (env->rank == 2) { /* excluded: it leaves */
    return mp_expect_rc(env, comm, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort");
  }
  struct member_call c = {comm, 0, NCCL_SHRINK_ABORT, NULL, ncclInternalError};
  pthread_t t;
  if (env->rank == 1) {
    pthread_create(&t, NULL, member_thread, &c); /* it waits for the leader's message */
    bad += forge_all(env, comm);
    __atomic_store_n(&env->shm[FLAG_STRANGERS], 1 + bad, __ATOMIC_SEQ_CST);
    pthread_join(t, NULL);
  } else {
    if (mp_wait_flag(&env->shm[FLAG_STRANGERS], 30000) != 1) bad++;
    member_thread(&c);
  }
  bad += mp_expect_rc(env, comm, c.rc, ncclSuccess, "ncclCommShrink after the forgeries");
  if (c.rc == ncclSuccess) {
    bad += mp_sum_ranks_exact(env, c.out, 3.0f);
    bad += mp_expect_rc(env, c.out, ncclCommDestroy(c.out), ncclSuccess, "ncclCommDestroy(new)");
  }
  bad += mp_expect_rc(env, comm, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort(parent)");
  return bad != 0;
}

static void test_forged_control(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = WAIT_DEADLINE_S;
  assert_int_equal(mp_launch(3, forged_shrink_body, NULL, &o), 0);
}

/* ---- teardown while a call waits ---- */

typedef struct teardown_case {
  int grow;    /* the waiting call: ncclCommGrow, else ncclCommShrink */
  int destroy; /* the teardown: ncclCommDestroy, else ncclCommAbort */
} teardown_case;

/* Rank 1 waits in a call for a message nobody sends (its shrink's leader
 * is rank 0, which does not call; its grow's id never comes) while its
 * main thread tears the comm down: the call must fail at once. */
static int teardown_body(const mp_env* env) {
  const teardown_case* k = env->arg;
  ncclComm_t comm = NULL;
  int bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (env->rank != 1) { /* stays until rank 1 is done, so nothing fails for want of it */
    mp_wait_flag(&env->shm[FLAG_DONE], WAIT_DEADLINE_S * 1000);
    return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  }
  struct member_call w = {comm, k->grow, 0, (ncclComm_t)0x1, ncclSuccess};
  pthread_t t;
  pthread_create(&t, NULL, member_thread, &w); /* rank 0 leads the shrink, and never calls */
  mp_sleep_ms(300); /* in its wait by now (else it is refused at entry: an error too) */
  ncclResult_t rc = k->destroy ? ncclCommDestroy(comm) : ncclCommAbort(comm);
  bad += mp_expect_rc(env, NULL, rc, ncclSuccess, k->destroy ? "ncclCommDestroy" : "ncclCommAbort");
  pthread_join(t, NULL);
  if (w.rc == ncclSuccess || w.out != NULL) {
    mp_fail(env, "%s returned %d (comm %p) while its comm was torn down",
            k->grow ? "ncclCommGrow" : "ncclCommShrink", (int)w.rc, (void*)w.out);
    bad++;
  }
  __atomic_store_n(&env->shm[FLAG_DONE], 1, __ATOMIC_SEQ_CST);
  return bad != 0;
}

static void test_teardown_wakes_calls(void** state) {
  (void)state;
  static const teardown_case cases[] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = WAIT_DEADLINE_S;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    assert_int_equal(mp_launch(3, teardown_body, (void*)&cases[i], &o), 0);
}

/* ---- a refused grow, then the right one ---- */

static int grow_retry_body(const mp_env* env) {
  ncclComm_t parent = NULL, grown = NULL;
  ncclUniqueId id;
  int bad = 0;
  if (env->rank == 2) { /* the new rank */
    if (!mp_wait_flag(&env->shm[ID_SLOT], 30000)) return 1;
    memcpy(&id, (const void*)(env->shm + ID_SLOT + 1), sizeof(id));
    ncclResult_t rc = ncclCommGrow(NULL, 3, &id, 2, &grown, NULL);
    if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommGrow (new rank)")) return 1;
    bad += mp_sum_ranks_exact(env, grown, 6.0f);
    return bad + mp_expect_rc(env, grown, ncclCommDestroy(grown), ncclSuccess, "ncclCommDestroy");
  }
  if (mp_expect_rc(env, NULL, ncclCommInitRank(&parent, 2, env->id, env->rank), ncclSuccess,
                   "ncclCommInitRank (parent of 2)"))
    return 1;
  const ncclUniqueId* mine = NULL;
  if (env->rank == 0) {
    ncclUniqueId wrong;
    bad += mp_expect_rc(env, parent, ncclCommGetUniqueId(parent, &id), ncclSuccess,
                        "ncclCommGetUniqueId");
    memcpy(&wrong, &id, sizeof(id));
    wrong.internal[40] ^= 1;
    bad += mp_expect_rc(env, parent, ncclCommGrow(parent, 3, &wrong, -1, &grown, NULL),
                        ncclInvalidArgument, "ncclCommGrow with an id it did not make");
    memcpy((void*)(env->shm + ID_SLOT + 1), &id, sizeof(id));
    __atomic_store_n(&env->shm[ID_SLOT], 1, __ATOMIC_SEQ_CST);
    mine = &id;
  }
  ncclResult_t rc = ncclCommGrow(parent, 3, mine, -1, &grown, NULL);
  bad += mp_expect_rc(env, parent, rc, ncclSuccess, "ncclCommGrow after a refused one");
  if (rc == ncclSuccess) {
    bad += mp_sum_ranks_exact(env, grown, 6.0f);
    bad += mp_expect_rc(env, grown, ncclCommDestroy(grown), ncclSuccess, "ncclCommDestroy(grown)");
  }
  return bad + mp_expect_rc(env, parent, ncclCommDestroy(parent), ncclSuccess, "ncclCommDestroy");
}

static void test_grow_refused_then_retried(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = WAIT_DEADLINE_S;
  assert_int_equal(mp_launch(3, grow_retry_body, NULL, &o), 0);
}

/* ---- what the smaller calls refuse ---- */

/* Entries of a /proc/self folder (threads: task, descriptors: fd). */
static int proc_count(const char* what) {
  char path[64];
  int n = 0;
  snprintf(path, sizeof(path), "/proc/self/%s", what);
  DIR* d = opendir(path);
  for (struct dirent* e; d && (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static int refusals_body(const mp_env* env) {
  ncclComm_t comm = NULL, out = NULL;
  char buf[64];
  void* handle = NULL;
  int bad = 0, other = 1 - env->rank;
  if (mp_comm_init(env, &comm) != 0) return 1;
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, buf, SIZE_MAX, &handle),
                      ncclInvalidArgument, "ncclCommRegister(SIZE_MAX bytes)");
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, (void*)(UINTPTR_MAX - 15), 64, &handle),
                      ncclInvalidArgument, "ncclCommRegister(a range that wraps)");
  bad += mp_expect_rc(env, comm, ncclCommSuspend(comm, 0), ncclSuccess, "ncclCommSuspend");
  bad += mp_expect_rc(env, comm, ncclCommSplit(comm, 0, env->rank, &out, NULL), ncclInvalidUsage,
                      "ncclCommSplit(suspended)");
  bad += mp_expect_rc(env, comm, ncclCommResume(comm), ncclSuccess, "ncclCommResume");
  bad += mp_expect_rc(env, comm, ncclCommFinalize(comm), ncclSuccess, "ncclCommFinalize");
  bad += mp_expect_rc(env, comm, ncclCommShrink(comm, &other, 1, &out, NULL, 0), ncclInvalidUsage,
                      "ncclCommShrink(finalized)");
  bad += mp_expect_rc(env, comm, ncclCommSuspend(comm, 0), ncclInvalidUsage,
                      "ncclCommSuspend(finalized)");
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, buf, sizeof(buf), &handle),
                      ncclInvalidUsage, "ncclCommRegister(finalized)");
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void* do_nothing(void* arg) {
  return arg;
}

/* An id for a grow that never happens: its root (a thread, a listener)
 * goes with the comm, not BRAID_TIMEOUT_MS later. A sanitizer's runtime
 * may start a thread of its own at a process's first pthread_create
 * (ThreadSanitizer does): one made and joined first puts it in the count
 * before the comm too. */
static int unused_id_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  ncclUniqueId id;
  pthread_t first;
  if (pthread_create(&first, NULL, do_nothing, NULL) == 0) pthread_join(first, NULL);
  int threads = proc_count("task"), fds = proc_count("fd"), bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  bad +=
      mp_expect_rc(env, comm, ncclCommGetUniqueId(comm, &id), ncclSuccess, "ncclCommGetUniqueId");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  int t = proc_count("task"), f = proc_count("fd");
  if (t != threads || f != fds) {
    mp_fail(env, "after destroy: %d threads and %d fds, %d and %d before the comm", t, f, threads,
            fds);
    bad++;
  }
  return bad;
}

static void test_refusals(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, refusals_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(1, unused_id_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", LONG_TIMEOUT_MS);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_grow_refused_then_retried),
      cmocka_unit_test(test_teardown_wakes_calls),
      cmocka_unit_test(test_forged_control),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
