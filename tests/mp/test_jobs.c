/* Jobs and strangers never mix. Two jobs on one NCCL_COMM_ID either keep
 * apart (their job keys differ: WORLD_SIZE, BRAID_JOB_ID) or, when nothing
 * tells them apart, fail loudly on every rank the collision touches -
 * never a success with the other job's data. A process that knows the
 * address but not the job cannot take a rank's place at the root, open a
 * data connection, or stall the job with absurd fields, idle connections
 * or a byte a second. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "launcher.h"
#include "tcp/tcp.h"

#define JOB_COUNT 1024
#define JOB_DEADLINE_S 60
/* Far above any wait a refusal or a collision may take; below the
 * launcher's deadline, so that a job left to time out fails the test. */
#define JOB_TIMEOUT_MS "40000"

/* ---- one process's part: a rank of some job ---- */

typedef struct job_rank {
  int job;            /* 0 = A, 1 = B: what this rank contributes */
  int rank;           /* in its job */
  int nranks;         /* its job's size, and its WORLD_SIZE */
  int delay_ms;       /* before it starts */
  const char* job_id; /* BRAID_JOB_ID, or NULL */
} job_rank;

typedef struct job_case {
  const char* name;
  int port;
  int nprocs;
  job_rank ranks[8];
  int must_fail[8]; /* 1: init or the all-reduce must fail; 0: must succeed exactly */
} job_case;

static void set_job_env(const job_case* k, const job_rank* me) {
  char v[64];
  setenv("NCCL_SOCKET_IFNAME", "lo", 1); /* data listeners on 127.0.0.1, where strangers call */
  snprintf(v, sizeof(v), "127.0.0.1:%d", k->port);
  setenv("NCCL_COMM_ID", v, 1);
  snprintf(v, sizeof(v), "%d", me->nranks);
  setenv("WORLD_SIZE", v, 1);
  if (me->job_id)
    setenv("BRAID_JOB_ID", me->job_id, 1);
  else
    unsetenv("BRAID_JOB_ID");
}

/* Init and one all-reduce whose sum tells which ranks took part: 0 when
 * it succeeded exactly, 1 when a call failed, 2 when it "succeeded" with
 * data that is not this job's. */
static int job_try(const mp_env* env, const job_rank* me) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  static int32_t buf[JOB_COUNT];
  int32_t want = 0;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  ncclResult_t rc = ncclCommInitRank(&comm, me->nranks, id, me->rank);
  if (rc != ncclSuccess) {
    mp_log(env, "job %c rank %d: init failed: %s", 'A' + me->job, me->rank, ncclGetLastError(NULL));
    return 1;
  }
  for (int i = 0; i < JOB_COUNT; i++) buf[i] = 1000 * me->job + me->rank + 1;
  for (int r = 0; r < me->nranks; r++) want += 1000 * me->job + r + 1;
  rc = ncclAllReduce(buf, buf, JOB_COUNT, ncclInt32, ncclSum, comm, NULL);
  int result = rc != ncclSuccess ? 1 : 0;
  for (int i = 0; i < JOB_COUNT && result == 0; i++)
    if (buf[i] != want) result = 2;
  if (result == 2)
    mp_fail(env, "job %c rank %d: all-reduce gave %d, its job sums to %d", 'A' + me->job, me->rank,
            (int)buf[0], (int)want);
  if (result == 0)
    ncclCommDestroy(comm);
  else
    ncclCommAbort(comm);
  return result;
}

static int jobs_body(const mp_env* env) {
  const job_case* k = env->arg;
  const job_rank* me = &k->ranks[env->rank];
  set_job_env(k, me);
  mp_sleep_ms(me->delay_ms);
  int r = job_try(env, me);
  if (r == 2) return 1; /* another job's data: the one thing never allowed */
  if (r == 1 && me->rank == 0) mp_sleep_ms(3000); /* its failed root tells late ranks why */
  if (r == 1 && !k->must_fail[env->rank]) {
    mp_fail(env, "%s: job %c rank %d failed but its job should have run", k->name, 'A' + me->job,
            me->rank);
    return 1;
  }
  if (r == 0 && k->must_fail[env->rank]) {
    mp_fail(env, "%s: job %c rank %d succeeded: the collision went unnoticed", k->name,
            'A' + me->job, me->rank);
    return 1;
  }
  return 0;
}

static void run_jobs(job_case* k) {
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  o.deadline_s = JOB_DEADLINE_S;
  k->port = mp_free_port(AF_INET);
  assert_int_not_equal(k->port, 0);
  fprintf(stderr, "case: %s\n", k->name);
  assert_int_equal(mp_launch(k->nprocs, jobs_body, k, &o), 0);
}

/* Nothing tells two 3-rank jobs apart. A's ranks 0 and 2 have registered
 * when B's rank 2 comes: the root has seen rank 2 twice, and everyone
 * fails - A's late rank 1 included. (The root used to refuse the second
 * rank 2 and go on; a later A rank 2 was refused while A's 0, 1 and B's 2
 * ran together.) */
static void test_same_key_rank_twice(void** state) {
  (void)state;
  job_case k = {
      "same key, a rank registers twice",
      0,
      4,
      {{0, 0, 3, 0, NULL}, {0, 1, 3, 1500, NULL}, {0, 2, 3, 0, NULL}, {1, 2, 3, 400, NULL}},
      {1, 1, 1, 1}};
  run_jobs(&k);
}

/* A second rank 0 with the same key finds the address taken: it tells the
 * root there, whose job then fails too - A's late rank 2 included. */
static void test_same_key_second_root(void** state) {
  (void)state;
  job_case k = {
      "same key, a second rank 0",
      0,
      4,
      {{0, 0, 3, 0, NULL}, {0, 1, 3, 0, NULL}, {0, 2, 3, 1500, NULL}, {1, 0, 3, 400, NULL}},
      {1, 1, 1, 1}};
  run_jobs(&k);
}

/* Jobs of different sizes have different keys: B is refused at once (its
 * rank 0 cannot serve the address, its rank 1 is a stranger at A's root),
 * A runs. */
static void test_other_world_size(void** state) {
  (void)state;
  job_case k = {"different WORLD_SIZE",
                0,
                5,
                {{0, 0, 3, 0, NULL},
                 {0, 1, 3, 0, NULL},
                 {0, 2, 3, 1500, NULL},
                 {1, 0, 2, 300, NULL},
                 {1, 1, 2, 300, NULL}},
                {0, 0, 0, 1, 1}};
  run_jobs(&k);
}

/* Same size, different BRAID_JOB_ID: the same. */
static void test_other_job_id(void** state) {
  (void)state;
  job_case k = {"different BRAID_JOB_ID",
                0,
                4,
                {{0, 0, 2, 0, "train-a"},
                 {0, 1, 2, 1500, "train-a"},
                 {1, 0, 2, 300, "train-b"},
                 {1, 1, 2, 300, "train-b"}},
                {0, 0, 1, 1}};
  run_jobs(&k);
}

/* ---- a stranger who knows the address ---- */

/* A connection to 127.0.0.1:port, retried for up to `seconds`. */
static int connect_loopback_for(int port, double seconds) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (double end = mp_now() + seconds; mp_now() < end; mp_sleep_ms(10)) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr*)&a, sizeof(a)) == 0) return fd;
    close(fd);
  }
  return -1;
}

static int connect_loopback(int port) {
  return connect_loopback_for(port, 10.0);
}

/* The job key an address-knower can compute: the job's NCCL_COMM_ID and
 * WORLD_SIZE, without its BRAID_JOB_ID. */
static uint64_t guessed_key(void) {
  ncclUniqueId id;
  struct bootstrap_id b;
  unsetenv("BRAID_JOB_ID");
  if (ncclGetUniqueId(&id) != ncclSuccess) return 0;
  memcpy(&b, id.internal, sizeof(b));
  return b.key;
}

/* Hellos with absurd fields, then a real init as rank 1: all refused. */
static int stranger_at_root(const mp_env* env, int port) {
  struct root_hello h = {.magic = BOOTSTRAP_MAGIC,
                         .version = BOOTSTRAP_VERSION,
                         .key = guessed_key(),
                         .rank = 1,
                         .nranks = BOOTSTRAP_MAX_RANKS,
                         .nroots = 1};
  for (int i = 0; i < 3; i++) {
    int fd = connect_loopback(port);
    if (fd < 0) return 1;
    h.rank = i == 0 ? 1 : 1 << 30;
    h.nranks = i == 2 ? -5 : BOOTSTRAP_MAX_RANKS;
    if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h)) return 1;
    close(fd);
  }
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  ncclResult_t rc = ncclCommInitRank(&comm, 3, id, 1);
  if (rc == ncclSuccess) {
    mp_fail(env, "a stranger took rank 1's place at the root");
    ncclCommAbort(comm);
    return 1;
  }
  return 0;
}

static int take_place_body(const mp_env* env) {
  const job_case* k = env->arg;
  if (env->rank == 3) {
    job_rank stranger = {1, 1, 3, 0, NULL};
    set_job_env(k, &stranger);
    return stranger_at_root(env, k->port);
  }
  return jobs_body(env);
}

/* The job has a BRAID_JOB_ID; the stranger does not know it. Its rank 1
 * arrives late, after the stranger tried to take that place. */
static void test_stranger_takes_place(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  job_case k = {
      "a stranger at the root",
      mp_free_port(AF_INET),
      4,
      {{0, 0, 3, 0, "secret-job"}, {0, 1, 3, 1500, "secret-job"}, {0, 2, 3, 0, "secret-job"}},
      {0, 0, 0, 0}};
  o.no_id = 1;
  o.deadline_s = JOB_DEADLINE_S;
  assert_int_equal(mp_launch(4, take_place_body, &k, &o), 0);
}

/* ---- a forged data connection ---- */

/* This rank's data listener port (the test peeks into the comm). */
static int data_port(ncclComm_t comm) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getsockname(((struct ncclComm*)comm)->tctx.listen_fd, (struct sockaddr*)&ss, &len) != 0)
    return 0;
  return ntohs(((struct sockaddr_in*)&ss)->sin_port);
}

/* Rank 1's data listener gets sockets that claim to be rank 0's, opened
 * with the secret an address-knower can compute, and garbage behind them;
 * rank 0's real connection comes after. The all-reduce must be exact. */
static int forger(const mp_env* env, int port) {
  static char junk[JOB_COUNT * 4 + 4096];
  uint64_t key = guessed_key();
  int fds[2];
  memset(junk, 0x5a, sizeof(junk));
  for (int s = 0; s < 2; s++) {
    struct tcp_hello h = {TCP_MAGIC, TCP_VERSION, key, 0, 1, s, 2, 0, 0};
    if ((fds[s] = connect_loopback(port)) < 0) return 1;
    if (send(fds[s], &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h)) return 1;
    if (send(fds[s], junk, sizeof(junk), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
      mp_log(env, "forger: rank 1 closed the forged socket");
  }
  mp_sleep_ms(300); /* the listener has read the hellos */
  __atomic_store_n(&env->shm[1], 1, __ATOMIC_SEQ_CST);
  mp_wait_flag(&env->shm[2], 30000);
  close(fds[0]);
  close(fds[1]);
  return 0;
}

static int forged_body(const mp_env* env) {
  const job_case* k = env->arg;
  job_rank me = {0, env->rank, 2, 0, NULL};
  set_job_env(k, &me);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  if (env->rank == 2) {
    int port = mp_wait_flag(&env->shm[0], 30000);
    return port ? forger(env, port) : 1;
  }
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  static int32_t buf[JOB_COUNT];
  if (ncclGetUniqueId(&id) != ncclSuccess ||
      ncclCommInitRank(&comm, 2, id, env->rank) != ncclSuccess)
    return 1;
  if (env->rank == 1) __atomic_store_n(&env->shm[0], data_port(comm), __ATOMIC_SEQ_CST);
  if (!mp_wait_flag(&env->shm[1], 30000)) return 1; /* the forged sockets are in */
  for (int i = 0; i < JOB_COUNT; i++) buf[i] = env->rank + 1;
  ncclResult_t rc = ncclAllReduce(buf, buf, JOB_COUNT, ncclInt32, ncclSum, comm, NULL);
  int bad = mp_expect_rc(env, comm, rc, ncclSuccess, "all-reduce beside forged sockets");
  for (int i = 0; i < JOB_COUNT && bad == 0; i++)
    if (buf[i] != 3) {
      mp_fail(env, "element %d is %d, not 3: forged bytes were taken", i, (int)buf[i]);
      bad++;
    }
  __atomic_add_fetch(&env->shm[2], 1, __ATOMIC_SEQ_CST);
  if (bad)
    ncclCommAbort(comm);
  else
    bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_forged_data_connection(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  job_case k = {"forged data connection", mp_free_port(AF_INET), 3, {{0}}, {0}};
  o.no_id = 1;
  o.deadline_s = JOB_DEADLINE_S;
  assert_int_equal(mp_launch(3, forged_body, &k, &o), 0);
}

/* ---- idle and slow connections ---- */

#define IDLE_CONNS 200
#define SLOW_CONNS 40
#define FLOOD_SECONDS 50 /* past JOB_TIMEOUT_MS: a root that read hellos one by one times out */

/* IDLE_CONNS connections that never speak and SLOW_CONNS that send a byte
 * a second (reconnecting when dropped) to `port`; *ready once all are
 * open; until *stop. */
static void flood(int port, volatile int* ready, volatile int* stop) {
  int idle[IDLE_CONNS], slow[SLOW_CONNS];
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the rank that forked it */
  for (int i = 0; i < IDLE_CONNS; i++) idle[i] = connect_loopback_for(port, 1.0);
  for (int i = 0; i < SLOW_CONNS; i++) slow[i] = connect_loopback_for(port, 1.0);
  __atomic_add_fetch(ready, 1, __ATOMIC_SEQ_CST);
  for (double end = mp_now() + FLOOD_SECONDS; mp_now() < end && !*stop; mp_sleep_ms(1000))
    for (int i = 0; i < SLOW_CONNS; i++)
      if (slow[i] < 0 || send(slow[i], "x", 1, MSG_NOSIGNAL) != 1) {
        if (slow[i] >= 0) close(slow[i]);
        slow[i] = connect_loopback_for(port, 0.1);
      }
  for (int i = 0; i < IDLE_CONNS; i++) close(idle[i]);
  for (int i = 0; i < SLOW_CONNS; i++) close(slow[i]);
}

typedef struct flood_case {
  job_case job;
  int attack; /* 0: the baseline, measured the same way */
} flood_case;

enum { F_PORTS = 0, F_ROOT_READY = 8, F_LISTENERS_READY = 9, F_STOP = 10, F_DONE = 11 };

/* The attacker: floods the root (which rank 0's init has opened) before
 * ranks 1 and 2 register, then every rank's data listener before their
 * first all-reduce connects. */
static int flooder(const mp_env* env, const flood_case* f) {
  struct rlimit rl;
  volatile int* shm = env->shm;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) rl.rlim_cur = rl.rlim_max, setrlimit(RLIMIT_NOFILE, &rl);
  if (fork() == 0) {
    flood(f->job.port, &shm[F_ROOT_READY], &shm[F_STOP]);
    _exit(0);
  }
  for (int r = 0; r < 3; r++) mp_wait_flag(&shm[F_PORTS + r], 30000);
  for (int r = 0; r < 3; r++)
    if (fork() == 0) {
      flood(shm[F_PORTS + r], &shm[F_LISTENERS_READY], &shm[F_STOP]);
      _exit(0);
    }
  for (double end = mp_now() + 30; mp_now() < end && shm[F_LISTENERS_READY] < 3;) mp_sleep_ms(10);
  __atomic_store_n(&shm[F_LISTENERS_READY], 100, __ATOMIC_SEQ_CST);
  for (double end = mp_now() + 30; mp_now() < end && shm[F_DONE] < 3;) mp_sleep_ms(10);
  __atomic_store_n(&shm[F_STOP], 1, __ATOMIC_SEQ_CST);
  while (wait(NULL) > 0) { /* the four flooders */
  }
  return 0;
}

/* Ranks 0..2: init and a first all-reduce over TCP, timed. */
static int flood_body(const mp_env* env) {
  const flood_case* f = env->arg;
  volatile int* shm = env->shm;
  job_rank me = {0, env->rank, 3, 0, NULL};
  set_job_env(&f->job, &me);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  if (env->rank == 3) return f->attack ? flooder(env, f) : 0;
  if (f->attack && env->rank > 0) mp_wait_flag(&shm[F_ROOT_READY], 30000); /* the root is flooded */
  double t0 = mp_now();
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  static int32_t buf[JOB_COUNT];
  if (ncclGetUniqueId(&id) != ncclSuccess ||
      ncclCommInitRank(&comm, 3, id, env->rank) != ncclSuccess)
    return 1;
  double t_init = mp_now() - t0;
  __atomic_store_n(&shm[F_PORTS + env->rank], data_port(comm), __ATOMIC_SEQ_CST);
  if (f->attack) /* the listeners are flooded */
    for (double end = mp_now() + 30; mp_now() < end && shm[F_LISTENERS_READY] < 100;)
      mp_sleep_ms(5);
  for (int i = 0; i < JOB_COUNT; i++) buf[i] = env->rank;
  double t1 = mp_now();
  int bad =
      mp_expect_rc(env, comm, ncclAllReduce(buf, buf, JOB_COUNT, ncclInt32, ncclSum, comm, NULL),
                   ncclSuccess, "first all-reduce");
  double t_first = mp_now() - t1;
  for (int i = 0; i < JOB_COUNT && bad == 0; i++) bad += buf[i] != 3;
  mp_log(env, "%s: init %.3f s (rank 0 from before the flood), first all-reduce %.3f s",
         f->attack ? "flooded" : "baseline", t_init, t_first);
  __atomic_add_fetch(&shm[F_DONE], 1, __ATOMIC_SEQ_CST);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

/* With each connection read one after another for up to 2 s, 200 silent
 * ones kept the root (and each data listener) busy for 400 s: the job
 * timed out. Read side by side, it runs; the log shows by how much it was
 * delayed against the baseline. */
static void test_idle_and_slow_connections(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  o.deadline_s = JOB_DEADLINE_S;
  for (int attack = 0; attack < 2; attack++) {
    flood_case f = {{"flood", mp_free_port(AF_INET), 4, {{0}}, {0}}, attack};
    assert_int_equal(mp_launch(4, flood_body, &f, &o), 0);
  }
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", JOB_TIMEOUT_MS);
  mp_default_env("NCCL_DEBUG", "WARN");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_key_rank_twice),
      cmocka_unit_test(test_same_key_second_root),
      cmocka_unit_test(test_other_world_size),
      cmocka_unit_test(test_other_job_id),
      cmocka_unit_test(test_stranger_takes_place),
      cmocka_unit_test(test_forged_data_connection),
      cmocka_unit_test(test_idle_and_slow_connections),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
