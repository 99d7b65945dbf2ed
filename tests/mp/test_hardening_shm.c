/* What a dead peer or a local stranger must not get away with through
 * shared memory (issue 47), on host buffers:
 *  - a rank SIGKILLed while it sleeps in epoll (it waits on a socket and a
 *    ring at once, so its shared-memory peers ring its bell pipe): the
 *    survivors' next ring, in a send or inside ncclCommAbort, must not
 *    raise SIGPIPE; a send gets ncclRemoteError, and the survivors shrink;
 *  - a stranger (uid nobody) that watches /dev/shm with inotify and
 *    creates every name it can derive from the segments it sees, while a
 *    4-rank job makes its connections: the job runs on, every result right. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "launcher.h"
#include "shm/shm.h"
#include "stranger.h"

#define DEADLINE_S 90
#define TIMEOUT_MS "20000"      /* BRAID_TIMEOUT_MS: every error here comes long before */
#define BIG_BYTES (16u << 20)   /* more than a ring holds (32 x 128 KiB): the send blocks */
#define NOTIFY_AFTER_MS 700     /* the victim is asleep in its wait by then */
#define FLAG_PID 10             /* shm: the victim's pid */
#define FLAG_WATCHING 11        /* shm: the stranger watches /dev/shm */
#define FLAG_JOB_DONE 12        /* shm: the job is over, the stranger may go */
#define STRANGER_SAW_NAMES 10   /* the stranger's exit code: it made siblings of what it saw */
#define STRANGER_SAW_NOTHING 11 /* it saw no segment: the test proves nothing */

/* One group sending `bytes` to every other rank and receiving as much from
 * each: every point-to-point connection of the comm exists after it. */
static int exchange_all(const mp_env* env, ncclComm_t comm, size_t bytes) {
  char* out = calloc(bytes ? bytes : 1, 1);
  char* in = malloc((bytes ? bytes : 1) * (size_t)env->nranks);
  int bad = out == NULL || in == NULL;
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int p = 0; !bad && p < env->nranks; p++) {
    if (p == env->rank) continue;
    bad += ncclSend(out, bytes, ncclUint8, p, comm, NULL) != ncclSuccess;
    bad += ncclRecv(in + (size_t)p * bytes, bytes, ncclUint8, p, comm, NULL) != ncclSuccess;
  }
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (exchange)");
  free(out);
  free(in);
  return bad;
}

/* ---- a rank killed while it sleeps in epoll ---- */

typedef struct sleeper_case {
  int abort_only; /* the survivors call ncclCommAbort at once, else they send first */
} sleeper_case;

static void* notify_later(void* arg) {
  (void)arg;
  mp_sleep_ms(NOTIFY_AFTER_MS);
  mp_notify_parent(); /* the parent SIGKILLs this rank */
  return NULL;
}

/* Rank 1: receives from rank 0 (TCP: rank 0 has no shared memory) and from
 * rank 2 (a ring) at once, which nobody sends, so it sleeps in epoll and
 * asks rank 2 to ring its bell pipe; it is killed there. */
static int killed_sleeper(const mp_env* env, ncclComm_t comm) {
  char in[2][64];
  pthread_t t;
  env->shm[FLAG_PID] = (int)getpid();
  pthread_create(&t, NULL, notify_later, NULL);
  ncclGroupStart();
  ncclRecv(in[0], sizeof(in[0]), ncclUint8, 0, comm, NULL);
  ncclRecv(in[1], sizeof(in[1]), ncclUint8, 2, comm, NULL);
  ncclResult_t rc = ncclGroupEnd();
  mp_fail(env, "the victim's receives returned %d instead of waiting to be killed", (int)rc);
  return 1;
}

/* Whether pid is gone or a zombie (its parent, the launcher, reaps it). */
static int pid_dead(int pid) {
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 1;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');
  return p && (p[2] == 'Z' || p[2] == 'X');
}

static int sleeper_survivor(const mp_env* env, const sleeper_case* k, ncclComm_t comm) {
  int bad = 0;
  double t0 = mp_now();
  while (!env->shm[FLAG_PID] || !pid_dead(env->shm[FLAG_PID]))
    if (mp_now() - t0 > 30) {
      mp_fail(env, "rank 1 is not dead after 30 s");
      return 1;
    } else {
      mp_sleep_ms(5);
    }
  if (k->abort_only) /* shm_shutdown rings the dead rank's bell */
    return mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort");
  char* big = calloc(BIG_BYTES, 1);
  ncclResult_t rc = ncclSend(big, BIG_BYTES, ncclUint8, 1, comm, NULL);
  free(big);
  bad += mp_expect_rc(env, comm, rc, ncclRemoteError, "ncclSend to the killed rank");
  ncclComm_t shrunk = NULL;
  int excluded = 1;
  rc = ncclCommShrink(comm, &excluded, 1, &shrunk, NULL, NCCL_SHRINK_ABORT);
  bad += mp_expect_rc(env, comm, rc, ncclSuccess, "ncclCommShrink after the kill");
  if (rc == ncclSuccess) {
    bad += mp_sum_ranks_exact(env, shrunk, 1.0f + 3.0f); /* ranks 0 and 2 of the old comm */
    bad += mp_expect_rc(env, shrunk, ncclCommDestroy(shrunk), ncclSuccess, "ncclCommDestroy");
  }
  return bad + mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort(parent)");
}

static int sleeper_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  if (env->rank == 0) setenv("NCCL_SHM_DISABLE", "1", 1); /* so rank 1 waits on a socket too */
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (exchange_all(env, comm, 64) != 0) return 1;
  if (env->rank == 1) return killed_sleeper(env, comm);
  /* env->rank is 0 or 2; rank 2 rings rank 1's bell */
  return sleeper_survivor(env, env->arg, comm);
}

static void test_killed_sleeper(void** state) {
  (void)state;
  static const sleeper_case cases[] = {{0}, {1}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    mp_opts o = MP_OPTS_INIT;
    o.deadline_s = DEADLINE_S;
    o.victim = 1;
    o.kill_on_notify = 1;
    if (mp_launch(3, sleeper_body, (void*)&cases[i], &o) != 0)
      fail_msg("survivors of a rank killed asleep, %s", cases[i].abort_only ? "abort" : "send");
  }
}

/* ---- a stranger that creates the names it can derive ---- */

/* Every name the stranger can derive from a segment name it saw: the old
 * scheme's siblings ("braid-<pid>-<domain>-<tag>-<receiver>-<channel>",
 * every receiver and channel) and, whatever the scheme, the name with its
 * last field's neighbours. Returns how many it created. */
static int stranger_make_siblings(const char* seen) {
  char name[2 * NAME_MAX], stem[NAME_MAX + 2];
  int made = 0, used = 0;
  int pid, recv, chan;
  unsigned dom;
  unsigned long long tag;
  if (sscanf(seen, "braid-%d-%8x-%llx%n", &pid, &dom, &tag, &used) == 3) {
    for (int r = 0; r < 8; r++)
      for (int c = 0; c < 4; c++) {
        snprintf(name, sizeof(name), "/braid-%d-%08x-%llx-%d-%d", pid, dom, tag, r, c);
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, (r + c) % 2 ? 0600 : 0666);
        if (fd >= 0) made++, close(fd);
      }
  }
  const char* last = strrchr(seen, '-');
  if (last == NULL) return made;
  snprintf(stem, sizeof(stem), "%.*s", (int)(last - seen), seen);
  unsigned long long v = strtoull(last + 1, NULL, 16);
  (void)sscanf(seen, "braid-%*d-%*x-%*x-%d-%d", &recv, &chan);
  for (int d = -2; d <= 2; d++) {
    if (d == 0) continue;
    snprintf(name, sizeof(name), "/%s-%llx", stem, v + (unsigned long long)d);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) made++, close(fd);
  }
  return made;
}

/* The names the stranger made, to remove when it goes (its files: the
 * sticky /dev/shm lets only it, or root, remove them). */
static void stranger_cleanup(void) {
  char path[NAME_MAX + 16];
  DIR* d = opendir("/dev/shm");
  for (struct dirent* e; d && (e = readdir(d)) != NULL;) {
    snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
    struct stat st;
    if (strncmp(e->d_name, "braid-", 6) == 0 && stat(path, &st) == 0 && st.st_uid == geteuid())
      unlink(path);
  }
  if (d) closedir(d);
}

static int stranger_watch(void* arg) {
  const mp_env* env = arg;
  char buf[64 * 1024] __attribute__((aligned(8)));
  int seen = 0, made = 0;
  int in = inotify_init1(IN_CLOEXEC);
  if (in < 0 || inotify_add_watch(in, "/dev/shm", IN_CREATE) < 0) return 1;
  env->shm[FLAG_WATCHING] = 1;
  double t0 = mp_now();
  while (!env->shm[FLAG_JOB_DONE] && mp_now() - t0 < DEADLINE_S) {
    struct pollfd p = {in, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t n = read(in, buf, sizeof(buf));
    for (ssize_t off = 0; off < n;) {
      const struct inotify_event* e = (const struct inotify_event*)(buf + off);
      off += (ssize_t)(sizeof(*e) + e->len);
      if (e->len == 0 || strncmp(e->name, "braid-", 6) != 0) continue;
      struct stat st;
      char path[NAME_MAX + 16];
      snprintf(path, sizeof(path), "/dev/shm/%s", e->name);
      if (stat(path, &st) == 0 && st.st_uid == geteuid()) continue; /* one of its own */
      seen++;
      made += stranger_make_siblings(e->name);
    }
  }
  stranger_cleanup();
  close(in);
  return seen > 0 && made > 0 ? STRANGER_SAW_NAMES : STRANGER_SAW_NOTHING;
}

/* The job: an all-reduce (its first segments show), a pause in which the
 * stranger makes what it derives, then every pair's connection and more
 * collectives, all checked. */
static int watched_job(const mp_env* env) {
  ncclComm_t comm = NULL;
  int bad = 0;
  float want = (float)(env->nranks * (env->nranks + 1) / 2);
  if (mp_wait_flag(&env->shm[FLAG_WATCHING], 30000) != 1) return 1;
  if (mp_comm_init(env, &comm) != 0) return 1;
  bad += mp_sum_ranks_exact(env, comm, want);
  mp_sleep_ms(500);
  bad += exchange_all(env, comm, 4096);
  for (int i = 0; i < 3 && !bad; i++) bad += mp_sum_ranks_exact(env, comm, want);
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static int watched_body(const mp_env* env) {
  pid_t stranger = -1;
  if (env->rank == 0 && stranger_run(env, STRANGER_UID, stranger_watch, (void*)env, 0, &stranger))
    return 1;
  int bad = watched_job(env);
  if (env->rank != 0) return bad;
  env->shm[FLAG_JOB_DONE] = 1;
  int r = stranger_join(env, stranger);
  if (r != STRANGER_SAW_NAMES) {
    mp_fail(env, "the stranger %s", r == STRANGER_SAW_NOTHING ? "saw no segment" : "failed");
    bad++;
  }
  return bad;
}

static void test_stranger_makes_siblings(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = DEADLINE_S;
  assert_int_equal(mp_launch(4, watched_body, NULL, &o), 0);
}

/* ---- a peer that zeroes the sleeper counts ---- */

#define ZERO_CALLS 300

struct zeroer {
  _Atomic int stop;
  pthread_t thread;
};

/* The headers of every segment this process has mapped: found through
 * /proc/self/maps (their names are unlinked by now: "(deleted)"). */
static int mapped_headers(struct shm_header** out, int max) {
  char line[512];
  int n = 0;
  FILE* f = fopen("/proc/self/maps", "re");
  while (f && n < max && fgets(line, sizeof(line), f)) {
    unsigned long lo;
    if (strstr(line, "/dev/shm/braid-") && sscanf(line, "%lx-", &lo) == 1)
      out[n++] = (struct shm_header*)lo;
  }
  if (f) fclose(f);
  return n;
}

/* Plays a faulty peer: zeroes every count of this process's segments. */
static void* zeroer_main(void* arg) {
  struct zeroer* z = arg;
  struct shm_header* h[16];
  while (!atomic_load(&z->stop)) {
    int n = mapped_headers(h, 16);
    for (int k = 0; k < 200 * n && !atomic_load(&z->stop); k++) {
      struct shm_header* x = h[k % n];
      atomic_store(&x->sleepers, 0);
      atomic_store(&x->fd_sleepers[0], 0);
      atomic_store(&x->fd_sleepers[1], 0);
      usleep(20);
    }
  }
  return NULL;
}

/* ZERO_CALLS small all-reduces over shared memory while rank 1 zeroes the
 * counts and comes late now and then, so that rank 0 sleeps: every result
 * right, rank 0 says it slept through a skipped wake-up (NCCL_DEBUG=WARN
 * prints it), and the calls go on by polling instead of sleeping a slice
 * each (the time is printed, not asserted). */
static int zeroed_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  struct zeroer z = {0};
  int bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  bad += mp_sum_ranks_exact(env, comm, 3.0f); /* the segments exist */
  if (env->rank == 1) pthread_create(&z.thread, NULL, zeroer_main, &z);
  mp_capture cap;
  if (mp_capture_begin(&cap) != 0) return 1;
  double t0 = mp_now();
  for (int i = 0; i < ZERO_CALLS && !bad; i++) {
    if (i % 10 == 0 && env->rank == 1) mp_sleep_ms(2); /* late now and then: rank 0 sleeps */
    bad += mp_sum_ranks_exact(env, comm, 3.0f);
  }
  double dt = mp_now() - t0;
  int told = mp_capture_end(&cap, "fell below this rank's own");
  if (env->rank == 1) {
    atomic_store(&z.stop, 1);
    pthread_join(z.thread, NULL);
  }
  mp_log(env, "%d all-reduces with the counts zeroed: %.2f s; told %d times", ZERO_CALLS, dt, told);
  if (env->rank == 0 && told < 1) {
    mp_fail(env, "slept through skipped wake-ups without a word");
    bad++;
  }
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_zeroed_counts(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = DEADLINE_S;
  assert_int_equal(mp_launch(2, zeroed_body, NULL, &o), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", TIMEOUT_MS);
  mp_default_env("NCCL_DEBUG", "WARN"); /* test_zeroed_counts reads what the rank said */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_sleeper),
      cmocka_unit_test(test_stranger_makes_siblings),
      cmocka_unit_test(test_zeroed_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
