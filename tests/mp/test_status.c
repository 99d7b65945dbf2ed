/* What braid-status says of a job held up (issue 50), checked against what
 * the test made happen: every case runs a comm of N ranks and one more
 * process, the inspector, that asks a rank (braidStatusAsk, as the
 * braid-status command does, and the command itself) while the job is
 * stuck, then lets it go on; each verdict must name the culprit:
 *  - a rank that never calls the collective the others wait in (8 ranks,
 *    and 4 on device buffers of the simulated driver); a stranger (uid
 *    nobody) asking is refused; the job then completes, every result right;
 *  - a rank stopped with SIGSTOP;
 *  - a rank killed: live, and from the dumps the survivors wrote
 *    (BRAID_TRACE_DIR) when they failed;
 *  - a slow rank, which must be called slow, not stuck;
 *  - a rank that calls another collective than the others;
 *  - a tagged receive (PyTorch's recv) whose sender has not sent. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "braid.h"
#include "devmem.h"
#include "launcher.h"
#include "stranger.h"

#define DEADLINE_S 120
#define CALLS 4        /* collectives every rank makes before the one that hangs */
#define COUNT 1001     /* floats of each all-reduce */
#define SETTLE_MS 1000 /* the others wait this long in the hung call before the inspector asks */
#define SLOW_MS 1000   /* the slow rank's pause before each call */
#define SLOW_CALLS 6
#define WAIT_MS 60000      /* a flag the test sets comes within this */
#define ANSWER_BYTES 65536 /* of a status's text the checks read */
#define SHM_PID 0          /* shm[SHM_PID + r]: rank r's pid */
#define SHM_DONE 64        /* shm[SHM_DONE + r]: the calls rank r completed */
#define SHM_GO 200         /* the inspector is done: the job may go on */
#define SHM_OVER 201       /* ranks done with their comm */

typedef struct status_case status_case;
struct status_case {
  const char* name;
  int nranks;  /* the comm's; the inspector is rank nranks of the launch */
  int culprit; /* the rank the verdict must name */
  int device;  /* device buffers (the simulated driver) */
  const char* timeout_ms;
  int (*rank)(const mp_env* env, ncclComm_t comm, const status_case* c);
  int (*inspect)(const mp_env* env, const status_case* c);
  char dumps[64]; /* BRAID_TRACE_DIR of the ranks, "" when none */
};

/* ---- the ranks' side ---- */

typedef struct dev_ctx {
  cudaStream_t stream;
  float* buf;
} dev_ctx;

static dev_ctx g_dev; /* this rank process's device buffer, when the case has one */

static float sum_of_ranks(int n) {
  return (float)n * (float)(n + 1) / 2;
}

/* One all-reduce of rank + 1, checked exact, and counted in shm. */
static int allreduce_exact(const mp_env* env, ncclComm_t comm, const status_case* c) {
  float host[COUNT];
  for (int i = 0; i < COUNT; i++) host[i] = (float)(env->rank + 1);
  void* buf = c->device ? (void*)g_dev.buf : (void*)host;
  if (c->device && dev_copy(env, g_dev.buf, host, sizeof(host))) return 1;
  ncclResult_t rc = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, g_dev.stream);
  if (c->device && rc == ncclSuccess && dev_sync(env, g_dev.stream)) return 1;
  if (mp_expect_rc(env, comm, rc, ncclSuccess, "ncclAllReduce")) return 1;
  if (c->device && dev_copy(env, host, g_dev.buf, sizeof(host))) return 1;
  for (int i = 0; i < COUNT; i++)
    if (host[i] != sum_of_ranks(c->nranks)) {
      mp_fail(env, "all-reduce: [%d] = %g, expected %g", i, host[i], sum_of_ranks(c->nranks));
      return 1;
    }
  env->shm[SHM_DONE + env->rank]++;
  return 0;
}

static int wait_go(const mp_env* env) {
  if (mp_wait_flag(&env->shm[SHM_GO], WAIT_MS)) return 0;
  mp_fail(env, "the inspector never let the job go on");
  return 1;
}

/* Every rank but the culprit calls collective CALLS + 1 at once; the
 * culprit only when the inspector is done: all must come out right. */
static int rank_late(const mp_env* env, ncclComm_t comm, const status_case* c) {
  int bad = 0;
  for (int i = 0; i < CALLS && !bad; i++) bad += allreduce_exact(env, comm, c);
  if (!bad && env->rank == c->culprit) bad += wait_go(env);
  return bad + (bad ? 0 : allreduce_exact(env, comm, c));
}

/* The culprit is stopped (by the inspector) before its call CALLS + 1. */
static int rank_stopped(const mp_env* env, ncclComm_t comm, const status_case* c) {
  return rank_late(env, comm, c);
}

/* The culprit dies before call CALLS + 1; the others fail in it. */
static int rank_killed(const mp_env* env, ncclComm_t comm, const status_case* c) {
  int bad = 0;
  for (int i = 0; i < CALLS && !bad; i++) bad += allreduce_exact(env, comm, c);
  if (bad) return bad;
  if (env->rank == c->culprit) {
    mp_notify_parent(); /* the launcher SIGKILLs this rank */
    for (;;) pause();
  }
  float buf[COUNT] = {0};
  ncclResult_t rc = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  if (rc == ncclSuccess) {
    mp_fail(env, "the all-reduce with a dead rank succeeded");
    return 1;
  }
  return wait_go(env);
}

/* The culprit pauses SLOW_MS before each call: slow, never stuck. */
static int rank_slow(const mp_env* env, ncclComm_t comm, const status_case* c) {
  int bad = 0;
  for (int i = 0; i < SLOW_CALLS && !bad; i++) {
    if (env->rank == c->culprit) mp_sleep_ms(SLOW_MS);
    bad += allreduce_exact(env, comm, c);
  }
  return bad;
}

/* The culprit calls a broadcast where the others call an all-reduce. */
static int rank_mismatched(const mp_env* env, ncclComm_t comm, const status_case* c) {
  int bad = 0;
  for (int i = 0; i < CALLS && !bad; i++) bad += allreduce_exact(env, comm, c);
  if (bad) return bad;
  float buf[COUNT] = {0};
  if (env->rank == c->culprit)
    (void)ncclBroadcast(buf, buf, COUNT, ncclFloat, 0, comm, NULL);
  else
    (void)ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  return wait_go(env); /* whatever the calls returned: the verdict is what is checked */
}

static void tagged_done(void* arg, ncclResult_t status) {
  __atomic_store_n((int*)arg, status == ncclSuccess ? 1 : -1, __ATOMIC_RELEASE);
}

/* Rank 0 waits in a tagged receive (braid.h, what PyTorch's recv uses)
 * from the culprit, which sends only once the inspector is done. */
static int rank_tagged(const mp_env* env, ncclComm_t comm, const status_case* c) {
  int bad = allreduce_exact(env, comm, c), got = 0;
  static char buf[4096];
  if (bad) return bad;
  if (env->rank == 0 && braidTaggedRecv(buf, sizeof(buf), ncclUint8, c->culprit, 7, comm,
                                        tagged_done, &got) != ncclSuccess)
    return 1;
  if (env->rank == c->culprit) {
    if (wait_go(env)) return 1;
    if (braidTaggedSend(buf, sizeof(buf), ncclUint8, 0, 7, comm, tagged_done, &got) != ncclSuccess)
      return 1;
  }
  if (env->rank != 0 && env->rank != c->culprit) return wait_go(env); /* stays in the comm */
  double end = mp_now() + WAIT_MS / 1000.0;
  while (__atomic_load_n(&got, __ATOMIC_ACQUIRE) == 0 && mp_now() < end) mp_sleep_ms(5);
  if (got != 1) mp_fail(env, "the tagged %s did not complete", env->rank ? "send" : "receive");
  return got != 1;
}

static int comm_rank(const mp_env* env, const status_case* c) {
  ncclComm_t comm = NULL;
  int bad = 0;
  g_dev.stream = NULL;
  env->shm[SHM_PID + env->rank] = (int)getpid();
  if (c->device && (dev_open(env, 0) || (g_dev.stream = dev_stream(env)) == NULL ||
                    ncclMemAlloc((void**)&g_dev.buf, COUNT * sizeof(float)) != ncclSuccess))
    return 1;
  if (ncclCommInitRank(&comm, c->nranks, env->id, env->rank) != ncclSuccess) {
    mp_fail(env, "ncclCommInitRank failed");
    return 1;
  }
  bad += c->rank(env, comm, c);
  if (bad == 0 && ncclCommDestroy(comm) == ncclSuccess)
    comm = NULL;
  else
    ncclCommAbort(comm);
  if (c->device) ncclMemFree(g_dev.buf);
  __atomic_add_fetch(&env->shm[SHM_OVER], 1, __ATOMIC_SEQ_CST);
  return bad;
}

/* ---- the inspector's side ---- */

/* What process pid answers braidStatusAsk in `format`, into out; 0 when it
 * answered. */
static int ask(const mp_env* env, int pid, braidStatusFormat_t format, char* out, size_t cap,
               double* seconds) {
  int fd = memfd_create("braid-status", MFD_CLOEXEC);
  double t0 = mp_now();
  out[0] = '\0';
  if (fd < 0) return 1;
  ncclResult_t rc = braidStatusAsk(pid, format, fd);
  if (seconds) *seconds = mp_now() - t0;
  ssize_t n = pread(fd, out, cap - 1, 0);
  close(fd);
  out[n > 0 ? n : 0] = '\0';
  if (rc != ncclSuccess) {
    mp_fail(env, "braidStatusAsk(%d) returned %s", pid, ncclGetErrorString(rc));
    return 1;
  }
  return 0;
}

/* The braid-status command (next to this test: ../bin) with `args`. */
static int run_tool(const mp_env* env, const char* args, char* out, size_t cap) {
  char self[512], cmd[1024];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  *strrchr(self, '/') = '\0';
  snprintf(cmd, sizeof(cmd), "%s/../bin/braid-status %s", self, args);
  FILE* p = popen(cmd, "r");
  if (p == NULL) return 1;
  size_t got = fread(out, 1, cap - 1, p);
  out[got] = '\0';
  int rc = pclose(p);
  if (rc != 0) mp_fail(env, "'%s' exited with status 0x%x:\n%s", cmd, rc, out);
  return rc != 0;
}

/* Whether the text holds each needle; prints the text when not. */
static int expect_all(const mp_env* env, const char* what, const char* text, ...) {
  va_list ap;
  int bad = 0;
  va_start(ap, text);
  for (const char* needle; (needle = va_arg(ap, const char*)) != NULL;)
    if (strstr(text, needle) == NULL) {
      mp_fail(env, "%s: no \"%s\" in:\n%s", what, needle, text);
      bad++;
    }
  va_end(ap);
  if (!bad && mp_verbose()) mp_log(env, "%s:\n%s", what, text);
  return bad;
}

/* Until every rank completed `calls` (the culprit at least `culprit_calls`). */
static int wait_calls(const mp_env* env, const status_case* c, int calls) {
  double end = mp_now() + WAIT_MS / 1000.0;
  for (int r = 0; r < c->nranks; r++)
    while (env->shm[SHM_DONE + r] < calls)
      if (mp_now() > end) {
        mp_fail(env, "rank %d made %d calls, not %d", r, env->shm[SHM_DONE + r], calls);
        return 1;
      } else {
        mp_sleep_ms(10);
      }
  return 0;
}

static int release(const mp_env* env, const status_case* c) {
  env->shm[SHM_GO] = 1;
  double end = mp_now() + WAIT_MS / 1000.0;
  int over = c->nranks - (c->rank == rank_killed); /* the killed one never comes */
  while (env->shm[SHM_OVER] < over)
    if (mp_now() > end)
      return 1;
    else
      mp_sleep_ms(10);
  return 0;
}

/* "ranks 0-1, 3-7" for every rank but the culprit */
static void others(const status_case* c, char* out, size_t cap) {
  size_t o = 0;
  int first = 1;
  for (int lo = 0; lo < c->nranks; lo++) {
    if (lo == c->culprit) continue;
    int hi = lo;
    while (hi + 1 < c->nranks && hi + 1 != c->culprit) hi++;
    o += (size_t)snprintf(out + o, cap - o, "%s%d", first ? "" : ", ", lo);
    if (hi > lo) o += (size_t)snprintf(out + o, cap - o, "%s%d", hi == lo + 1 ? ", " : "-", hi);
    first = 0;
    lo = hi;
  }
}

static int stranger_asks(void* arg) {
  int pid = *(int*)arg, fd = memfd_create("stranger", 0);
  ncclResult_t rc = braidStatusAsk(pid, braidStatusText, fd);
  off_t got = lseek(fd, 0, SEEK_END);
  return rc == ncclSuccess || got > 0 ? 1 : 0; /* 0: refused, nothing told */
}

static int inspect_late(const mp_env* env, const status_case* c) {
  char* text = malloc(ANSWER_BYTES);
  char want[192], list[96], args[64];
  int bad = 0, pid0;
  double took = 0;
  bad += wait_calls(env, c, CALLS);
  /* read once the ranks have called: rank 0 writes its pid as it starts,
   * and the inspector may start first (it asked pid 0 under load) */
  pid0 = __atomic_load_n(&env->shm[SHM_PID + 0], __ATOMIC_ACQUIRE);
  mp_sleep_ms(SETTLE_MS);
  others(c, list, sizeof(list));
  snprintf(want, sizeof(want),
           "rank %d has not called all_reduce #%d (3.9 KiB float); ranks %s have waited",
           c->culprit, CALLS + 1, list);
  bad += ask(env, pid0, braidStatusText, text, ANSWER_BYTES, &took);
  mp_log(env, "braidStatusAsk answered in %.2f s (%d ranks)", took, c->nranks);
  bad += expect_all(env, "the verdict", text, want, "is outside Braid", NULL);
  snprintf(args, sizeof(args), "--json %d", pid0);
  bad += run_tool(env, args, text, ANSWER_BYTES) ||
         expect_all(env, "braid-status --json", text, "{\"comm\":\"", "\"verdict\":[\"comm ", want,
                    "\"state\":\"running\"", NULL);
  snprintf(args, sizeof(args), "--prometheus %d", pid0);
  bad += run_tool(env, args, text, ANSWER_BYTES) ||
         expect_all(env, "braid-status --prometheus", text, "# TYPE braid_ops_total counter",
                    "braid_rank_up{comm=\"", "braid_oldest_wait_seconds{", NULL);
  int refused = stranger_run(env, STRANGER_UID, stranger_asks, &pid0, 1, NULL);
  if (refused != 0) {
    mp_fail(env, "a stranger (uid %d) was told the status (%d)", STRANGER_UID, refused);
    bad++;
  }
  free(text);
  return bad + release(env, c);
}

static int inspect_stopped(const mp_env* env, const status_case* c) {
  char* text = malloc(ANSWER_BYTES);
  char want[64];
  int bad = wait_calls(env, c, CALLS);
  int victim = env->shm[SHM_PID + c->culprit];
  kill(victim, SIGSTOP);
  mp_sleep_ms(SETTLE_MS);
  snprintf(want, sizeof(want), "rank %d does not answer", c->culprit);
  bad += ask(env, env->shm[SHM_PID + 0], braidStatusText, text, ANSWER_BYTES, NULL) ||
         expect_all(env, "the verdict", text, want, "is stopped (SIGSTOP?)", NULL);
  kill(victim, SIGCONT);
  free(text);
  return bad + release(env, c);
}

/* Whether process pid has exited (gone, or a zombie the launcher reaps). */
static int exited(int pid) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = fopen(path, "re");
  if (f == NULL) return 1;
  const char* paren = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
  fclose(f);
  return paren && paren[2] == 'Z';
}

static int inspect_killed(const mp_env* env, const status_case* c) {
  char* text = malloc(ANSWER_BYTES);
  char want[64], args[96];
  int bad = wait_calls(env, c, CALLS);
  double end = mp_now() + WAIT_MS / 1000.0;
  while (!exited(env->shm[SHM_PID + c->culprit]) && mp_now() < end) mp_sleep_ms(10);
  mp_sleep_ms(SETTLE_MS / 2);
  snprintf(want, sizeof(want), "rank %d is gone", c->culprit);
  bad += ask(env, env->shm[SHM_PID + 0], braidStatusText, text, ANSWER_BYTES, NULL) ||
         expect_all(env, "the verdict", text, want, NULL);
  bad += release(env, c); /* the survivors abort: their dumps are written */
  snprintf(args, sizeof(args), "--dumps %s", c->dumps);
  bad += run_tool(env, args, text, ANSWER_BYTES) ||
         expect_all(env, "braid-status --dumps", text, want, "it left no dump", NULL);
  free(text);
  return bad;
}

static int inspect_slow(const mp_env* env, const status_case* c) {
  char* text = malloc(ANSWER_BYTES);
  char want[64];
  int bad = wait_calls(env, c, 3); /* the slow rank's pace is known after a few */
  snprintf(want, sizeof(want), "rank %d is slow, not stuck", c->culprit);
  bad += ask(env, env->shm[SHM_PID + 0], braidStatusText, text, ANSWER_BYTES, NULL) ||
         expect_all(env, "the verdict", text, want, NULL);
  if (strstr(text, "has not called")) {
    mp_fail(env, "a slow rank was called stuck:\n%s", text);
    bad++;
  }
  free(text);
  return bad + release(env, c);
}

static int inspect_mismatched(const mp_env* env, const status_case* c) {
  char* text = malloc(ANSWER_BYTES);
  char want[192], list[96];
  int bad = wait_calls(env, c, CALLS);
  mp_sleep_ms(SETTLE_MS);
  others(c, list, sizeof(list));
  snprintf(want, sizeof(want),
           "rank %d called broadcast #%d (3.9 KiB float) where ranks %s called all_reduce #%d",
           c->culprit, CALLS + 1, list, CALLS + 1);
  bad += ask(env, env->shm[SHM_PID + 0], braidStatusText, text, ANSWER_BYTES, NULL) ||
         expect_all(env, "the verdict", text, want, "the calls do not match", NULL);
  free(text);
  return bad + release(env, c);
}

static int inspect_tagged(const mp_env* env, const status_case* c) {
  char* text = malloc(ANSWER_BYTES);
  char want[128], then[96];
  int bad = wait_calls(env, c, 1);
  mp_sleep_ms(SETTLE_MS);
  snprintf(want, sizeof(want), "rank 0 waits in recv from rank %d (4.0 KiB, tag 7)", c->culprit);
  snprintf(then, sizeof(then), "rank %d has no send to rank 0 pending: it has not called it",
           c->culprit);
  bad += ask(env, env->shm[SHM_PID + 0], braidStatusText, text, ANSWER_BYTES, NULL) ||
         expect_all(env, "the verdict", text, want, then, NULL);
  free(text);
  return bad + release(env, c);
}

/* ---- the cases ---- */

static int body(const mp_env* env) {
  const status_case* c = env->arg;
  return env->rank == c->nranks ? c->inspect(env, c) : comm_rank(env, c);
}

static void run_case(status_case* c, int victim) {
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = DEADLINE_S;
  o.victim = victim;
  o.kill_on_notify = victim >= 0;
  setenv("BRAID_TIMEOUT_MS", c->timeout_ms ? c->timeout_ms : "30000", 1);
  if (c->dumps[0]) {
    snprintf(c->dumps, sizeof(c->dumps), "/tmp/braid-status-test.XXXXXX");
    assert_non_null(mkdtemp(c->dumps));
    setenv("BRAID_TRACE_DIR", c->dumps, 1);
  }
  int failed = mp_launch(c->nranks + 1, body, c, &o);
  unsetenv("BRAID_TRACE_DIR");
  if (c->dumps[0]) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dumps);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", c->dumps);
  }
  assert_int_equal(failed, 0);
}

static void test_never_calls(void** state) {
  (void)state;
  status_case c = {"never calls", 8, 5, 0, NULL, rank_late, inspect_late, ""};
  run_case(&c, -1);
}

static void test_never_calls_device(void** state) {
  (void)state;
  if (access(getenv("BRAID_CUDA_LIB"), R_OK) != 0) skip(); /* built without CUDA */
  status_case c = {"never calls, device", 4, 1, 1, NULL, rank_late, inspect_late, ""};
  run_case(&c, -1);
}

static void test_stopped(void** state) {
  (void)state;
  status_case c = {"stopped", 4, 2, 0, NULL, rank_stopped, inspect_stopped, ""};
  run_case(&c, -1);
}

static void test_killed(void** state) {
  (void)state;
  status_case c = {"killed", 4, 3, 0, "5000", rank_killed, inspect_killed, "yes"};
  run_case(&c, 3);
}

static void test_slow(void** state) {
  (void)state;
  status_case c = {"slow", 4, 1, 0, NULL, rank_slow, inspect_slow, ""};
  run_case(&c, -1);
}

static void test_mismatched(void** state) {
  (void)state;
  status_case c = {"mismatched", 4, 2, 0, "5000", rank_mismatched, inspect_mismatched, ""};
  run_case(&c, -1);
}

static void test_tagged_unmatched(void** state) {
  (void)state;
  status_case c = {"tagged", 3, 2, 0, NULL, rank_tagged, inspect_tagged, ""};
  run_case(&c, -1);
}

int main(void) {
  mp_default_env("BRAID_CUDA_LIB", "build/tests/libcudasim.so");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_never_calls),
      cmocka_unit_test(test_never_calls_device),
      cmocka_unit_test(test_stopped),
      cmocka_unit_test(test_killed),
      cmocka_unit_test(test_slow),
      cmocka_unit_test(test_mismatched),
      cmocka_unit_test(test_tagged_unmatched),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
