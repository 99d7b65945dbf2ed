/* Multi-process tests: the fork launcher. Children never return into cmocka:
 * each runs its body and _exits; the parent reaps them under a deadline.
 *
 * Every fork happens in a process with one thread. A fork copies the locks
 * that other threads hold at that instant and none of those threads, so the
 * child waits on them forever. ncclGetUniqueId starts a root thread that
 * accepts, allocates and logs while later ranks are forked (and, when ranks
 * never arrive, until BRAID_TIMEOUT_MS, through later tests); under ASan
 * (clang 14, whose allocator takes no lock around fork) a rank forked while
 * that thread was refilling a size class hung in its first allocation of
 * that class, e.g. in pthread_create, and its peers timed out. With plain
 * glibc the same can happen on the library's own log mutex. So the ids come
 * from a root holder process forked first, which keeps its root threads
 * until the ranks are reaped, and the launcher refuses to fork from a
 * process that has other threads. */
#include "launcher.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Under AddressSanitizer a rank checks for leaks before it _exits (which
 * skips LeakSanitizer's atexit check): a rank is where comms live and die. */
#if defined(__SANITIZE_ADDRESS__) /* gcc */
#define MP_LEAK_CHECK 1
#elif defined(__has_feature) /* clang */
#if __has_feature(address_sanitizer)
#define MP_LEAK_CHECK 1
#endif
#endif
#ifdef MP_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif

static int g_notify_fd = -1;
static int g_rank = -1;
static int g_hold_fd = -1; /* the root holder lives until this closes */

double mp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mp_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int mp_verbose(void) {
  const char* v = getenv("MP_VERBOSE");
  return v != NULL && v[0] != '\0' && v[0] != '0';
}

static void vlog(const mp_env* env, const char* tag, const char* fmt, va_list ap) {
  char msg[2048];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  int rank = env ? env->rank : g_rank;
  int nranks = env ? env->nranks : 0;
  fprintf(stderr, "[rank %d/%d pid %d] %s%s\n", rank, nranks, (int)getpid(), tag, msg);
}

void mp_log(const mp_env* env, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(env, "", fmt, ap);
  va_end(ap);
}

void mp_fail(const mp_env* env, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(env, "FAIL: ", fmt, ap);
  va_end(ap);
}

static const char* last_error(ncclComm_t comm) {
  const char* s = ncclGetLastError(comm);
  return s ? s : "(null)";
}

int mp_expect_rc(const mp_env* env, ncclComm_t comm, ncclResult_t got, ncclResult_t want,
                 const char* what) {
  if (got == want) return 0;
  mp_fail(env, "%s: returned %d (%s), expected %d (%s); last error: \"%s\"", what, (int)got,
          ncclGetErrorString(got), (int)want, ncclGetErrorString(want), last_error(comm));
  return 1;
}

int mp_sendrecv(const mp_env* env, ncclComm_t comm, const void* out, void* in, size_t bytes, int to,
                int from) {
  int bad = mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  bad += mp_expect_rc(env, comm, ncclSend(out, bytes, ncclUint8, to, comm, NULL), ncclSuccess,
                      "ncclSend");
  bad += mp_expect_rc(env, comm, ncclRecv(in, bytes, ncclUint8, from, comm, NULL), ncclSuccess,
                      "ncclRecv");
  return bad + mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
}

int mp_expect_last_error(const mp_env* env, ncclComm_t comm, const char* what) {
  const char* s = ncclGetLastError(comm);
  if (s != NULL && s[0] != '\0') {
    if (mp_verbose()) mp_log(env, "%s: last error \"%s\"", what, s);
    return 0;
  }
  mp_fail(env, "%s: ncclGetLastError(%s) is %s", what, comm ? "comm" : "NULL",
          s ? "empty" : "NULL");
  return 1;
}

int mp_sum_ranks_exact(const mp_env* env, ncclComm_t comm, float want) {
  float buf[1001];
  for (int i = 0; i < 1001; i++) buf[i] = (float)(env->rank + 1);
  ncclResult_t rc = ncclAllReduce(buf, buf, 1001, ncclFloat, ncclSum, comm, NULL);
  if (mp_expect_rc(env, comm, rc, ncclSuccess, "ncclAllReduce")) return 1;
  for (int i = 0; i < 1001; i++)
    if (buf[i] != want) {
      mp_fail(env, "all-reduce: [%d] = %g, expected %g", i, buf[i], want);
      return 1;
    }
  return 0;
}

int mp_comm_init(const mp_env* env, ncclComm_t* comm) {
  *comm = NULL;
  ncclResult_t rc = ncclCommInitRank(comm, env->nranks, env->id, env->rank);
  if (rc == ncclSuccess) return 0;
  mp_fail(env, "ncclCommInitRank(nranks=%d, rank=%d) returned %d (%s): \"%s\"", env->nranks,
          env->rank, (int)rc, ncclGetErrorString(rc), last_error(NULL));
  return 1;
}

void mp_notify_parent(void) {
  unsigned char b = (unsigned char)g_rank;
  if (g_notify_fd < 0) return;
  while (write(g_notify_fd, &b, 1) < 0 && errno == EINTR) {
  }
}

int mp_wait_flag(volatile int* flag, int timeout_ms) {
  double end = mp_now() + timeout_ms / 1000.0;
  int v;
  while ((v = __atomic_load_n(flag, __ATOMIC_SEQ_CST)) == 0 && mp_now() < end) mp_sleep_ms(2);
  return v;
}

size_t mp_big_count(size_t dflt) {
  const char* v = getenv("MP_BIG_COUNT");
  char* end;
  if (v == NULL || *v == '\0') return dflt;
  unsigned long long n = strtoull(v, &end, 10);
  return *end == '\0' && n >= 1 && n < dflt ? (size_t)n : dflt;
}

void mp_default_env(const char* name, const char* value) {
  setenv(name, value, 0);
}

int mp_bind_rank(const mp_env* env, int index) {
  cpu_set_t allowed, one;
  int cpus[CPU_SETSIZE], n = 0;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return 1;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
  if (n == 0) return 1;
  CPU_ZERO(&one);
  CPU_SET(cpus[index % n], &one);
  if (sched_setaffinity(0, sizeof(one), &one) == 0) return 0;
  mp_fail(env, "binding to CPU %d failed", cpus[index % n]);
  return 1;
}

/* The lowest port of the kernel's ephemeral range (32768 where it cannot
 * be read). */
static int ephemeral_low(void) {
  FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  int low = 0;
  if (f != NULL) {
    if (fscanf(f, "%d", &low) != 1) low = 0;
    fclose(f);
  }
  return low > 1024 ? low : 32768;
}

/* Whether `port` binds on the loopback address of family. */
static int port_binds(int family, int port) {
  int fd = socket(family, SOCK_STREAM, 0), ok;
  if (fd < 0) return 0;
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  socklen_t len;
  if (family == AF_INET6) {
    struct sockaddr_in6* a = (struct sockaddr_in6*)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
    a->sin6_port = htons((uint16_t)port);
    len = sizeof(*a);
  } else {
    struct sockaddr_in* a = (struct sockaddr_in*)&ss;
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a->sin_port = htons((uint16_t)port);
    len = sizeof(*a);
  }
  ok = bind(fd, (struct sockaddr*)&ss, len) == 0;
  close(fd);
  return ok;
}

/* Below the ephemeral range: a port bind(0) picks lies inside it, where
 * any process's next connect() may take it before the test's root binds
 * it (the torch tests saw EADDRINUSE so in CI); below, only another
 * explicit bind can, and the random start keeps concurrent tests apart. */
int mp_free_port(int family) {
  int low = ephemeral_low(), first = low / 2 > 20000 ? 20000 : low / 2, span = low - first;
  unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)(uint64_t)(mp_now() * 1e6);
  for (int i = 0; i < 200; i++) {
    int port = first + (int)((seed + (unsigned)i * 7919u) % (unsigned)span);
    if (port_binds(family, port)) return port;
  }
  return 0;
}

/* Inherited copies of the parent's root sockets would keep its connections
 * open after the root closes them; a child never uses them. */
static void close_if_socket(int fd, int keep) {
  struct stat st;
  if (fd > 2 && fd != keep && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) close(fd);
}

/* The open descriptors are listed in /proc/self/fd (read whole before
 * closing any); without /proc, every number up to the limit is tried
 * (tens of thousands of fstat calls per rank). */
static void close_inherited_sockets(int keep) {
  int fds[1024], nfds = 0, complete = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d != NULL) {
    struct dirent* e;
    complete = 1;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      if (nfds == (int)(sizeof(fds) / sizeof(fds[0]))) complete = 0;
      if (nfds < (int)(sizeof(fds) / sizeof(fds[0]))) fds[nfds++] = atoi(e->d_name);
    }
    closedir(d); /* its own descriptor was in the list: gone now, fstat fails */
  }
  if (complete) {
    for (int i = 0; i < nfds; i++) close_if_socket(fds[i], keep);
    return;
  }
  long max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
  for (int fd = 3; fd < max; fd++) close_if_socket(fd, keep);
}

/* A child dies of its faults: cmocka's handlers, inherited from the parent,
 * would catch them and go on running the parent's tests in the child. */
static void child_default_signals(void) {
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) signal(sigs[i], SIG_DFL);
}

__attribute__((noreturn)) static void child_main(mp_env env, int rank, mp_body_fn body, int rfd,
                                                 int wfd, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(98);
  child_default_signals();
  close(rfd);
  if (g_hold_fd >= 0) close(g_hold_fd);
  close_inherited_sockets(wfd);
  g_notify_fd = wfd;
  g_rank = rank;
  env.rank = rank;
  /* Keep freed buffers in the heap: the matrices allocate and free megabytes
   * per call, and glibc's default gives each back to the kernel, so every
   * call paid page faults and zeroing (a third of their time). */
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1024 << 20);
  int rc = body(&env);
#ifdef MP_LEAK_CHECK
  if (__lsan_do_recoverable_leak_check() != 0 && rc == 0) rc = 1;
#endif
  fflush(stdout);
  fflush(stderr);
  _exit(rc == 0 ? 0 : 1);
}

typedef struct reaper {
  int n;
  pid_t pid[MP_MAX_RANKS];
  int status[MP_MAX_RANKS];
  int done[MP_MAX_RANKS];
  int ndone;
  int timed_out;
} reaper;

static void reap_some(reaper* rp) {
  for (int r = 0; r < rp->n; r++) {
    if (rp->done[r]) continue;
    if (waitpid(rp->pid[r], &rp->status[r], WNOHANG) == rp->pid[r]) {
      rp->done[r] = 1;
      rp->ndone++;
    }
  }
}

static void kill_remaining(reaper* rp) {
  for (int r = 0; r < rp->n; r++)
    if (!rp->done[r]) kill(rp->pid[r], SIGKILL);
  for (int r = 0; r < rp->n; r++) {
    if (rp->done[r]) continue;
    while (waitpid(rp->pid[r], &rp->status[r], 0) < 0 && errno == EINTR) {
    }
    rp->done[r] = 1;
    rp->ndone++;
  }
}

/* Reads notifications; SIGKILLs the victim when it asks. Returns the fd, or
 * -1 once every child has closed its end. */
static int handle_notify(reaper* rp, const mp_opts* o, int rfd) {
  struct pollfd p = {rfd, POLLIN, 0};
  if (rfd < 0) {
    mp_sleep_ms(10);
    return rfd;
  }
  if (poll(&p, 1, 10) <= 0) return rfd;
  unsigned char buf[64];
  ssize_t got = read(rfd, buf, sizeof(buf));
  if (got == 0) return -1;
  for (ssize_t i = 0; i < got; i++) {
    int r = buf[i];
    if (o->kill_on_notify && r == o->victim && r < rp->n && !rp->done[r]) {
      fprintf(stderr, "[launcher] SIGKILL rank %d (pid %d) on its request\n", r, (int)rp->pid[r]);
      kill(rp->pid[r], SIGKILL);
    }
  }
  return rfd;
}

static void wait_all(reaper* rp, const mp_opts* o, int rfd) {
  double end = mp_now() + o->deadline_s;
  while (rp->ndone < rp->n) {
    rfd = handle_notify(rp, o, rfd);
    reap_some(rp);
    if (rp->ndone < rp->n && mp_now() > end) {
      fprintf(stderr, "[launcher] deadline of %d s passed: SIGKILL the %d remaining ranks\n",
              o->deadline_s, rp->n - rp->ndone);
      rp->timed_out = 1;
      for (int r = 0; r < rp->n; r++)
        if (!rp->done[r]) fprintf(stderr, "[launcher]   rank %d still running\n", r);
      kill_remaining(rp);
    }
  }
}

/* 0 when rank r ended as expected, else prints why and returns 1. */
static int judge(const reaper* rp, const mp_opts* o, int r) {
  int st = rp->status[r];
  int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  if (r == o->victim) {
    if (sig == SIGKILL) return 0;
    fprintf(stderr, "[launcher] rank %d (victim) was expected to die by SIGKILL, but %s %d\n", r,
            sig ? "died by signal" : "exited with", sig ? sig : WEXITSTATUS(st));
    return 1;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  if (sig)
    fprintf(stderr, "[launcher] rank %d died by signal %d (%s)%s\n", r, sig, strsignal(sig),
            rp->timed_out && sig == SIGKILL ? " (deadline)" : "");
  else
    fprintf(stderr, "[launcher] rank %d exited with status %d\n", r, WEXITSTATUS(st));
  return 1;
}

static int spawn(reaper* rp, mp_env* env, mp_body_fn body, int pfd[2]) {
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < rp->n; r++) {
    pid_t pid = fork();
    if (pid == 0) child_main(*env, r, body, pfd[0], pfd[1], parent);
    if (pid < 0) {
      perror("[launcher] fork");
      rp->n = r;
      kill_remaining(rp);
      return -1;
    }
    rp->pid[r] = pid;
  }
  return 0;
}

/* Threads of this process (/proc/self/task entries); -1 if unknown. */
static int thread_count(void) {
  DIR* d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static int single_threaded(void) {
  int n = thread_count();
  if (n <= 1) return 1;
  fprintf(stderr,
          "[launcher] this process has %d threads: a rank forked now would inherit the locks "
          "they hold; make library calls in rank bodies, and ask for ids with mp_opts.nids\n",
          n);
  return 0;
}

static int read_full(int fd, void* buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, (char*)buf + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

/* The root holder: calls ncclGetUniqueId nids times, sends the ids up and
 * waits, its root threads serving the bootstrap, until the launcher closes
 * the hold pipe. Then _exit: the roots have nothing left to serve. */
__attribute__((noreturn)) static void holder_main(int nids, int idfd, int holdfd, pid_t parent) {
  ncclUniqueId ids[MP_MAX_IDS];
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(98);
  child_default_signals();
  close_inherited_sockets(-1);
  for (int i = 0; i < nids; i++) {
    ncclResult_t rc = ncclGetUniqueId(&ids[i]);
    if (rc != ncclSuccess) {
      fprintf(stderr, "[launcher] ncclGetUniqueId returned %d (%s): %s\n", (int)rc,
              ncclGetErrorString(rc), ncclGetLastError(NULL));
      _exit(1);
    }
  }
  size_t len = sizeof(ncclUniqueId) * (size_t)nids, off = 0;
  while (off < len) {
    ssize_t n = write(idfd, (const char*)ids + off, len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(1);
    off += (size_t)n;
  }
  close(idfd);
  char c;
  while (read(holdfd, &c, 1) < 0 && errno == EINTR) {
  }
  _exit(0);
}

/* Forks the root holder and reads its ids into env; g_hold_fd keeps it. */
static int holder_start(mp_env* env, int nids, pid_t* pid) {
  int idp[2], holdp[2];
  if (pipe(idp) != 0) return -1;
  if (pipe(holdp) != 0) {
    close(idp[0]);
    close(idp[1]);
    return -1;
  }
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  *pid = fork();
  if (*pid == 0) {
    close(idp[0]);
    close(holdp[1]);
    holder_main(nids, idp[1], holdp[0], parent);
  }
  close(idp[1]);
  close(holdp[0]);
  int ok = *pid > 0 && read_full(idp[0], env->ids, sizeof(ncclUniqueId) * (size_t)nids) == 0;
  close(idp[0]);
  if (*pid < 0) perror("[launcher] fork (root holder)");
  g_hold_fd = holdp[1];
  if (ok) return 0;
  fprintf(stderr, "[launcher] the root holder sent no unique ids\n");
  return -1;
}

/* Lets the root holder go and reaps it. */
static void holder_stop(pid_t pid) {
  if (g_hold_fd >= 0) close(g_hold_fd);
  g_hold_fd = -1;
  if (pid <= 0) return;
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
}

static int prepare_env(mp_env* env, int nranks, void* arg, const mp_opts* o, pid_t* holder) {
  memset(env, 0, sizeof(*env));
  env->rank = -1;
  env->nranks = nranks;
  env->arg = arg;
  if (!o->no_id) {
    if (holder_start(env, o->nids, holder) != 0) return -1;
    env->id = env->ids[0];
    env->has_id = 1;
  }
  void* shm = mmap(NULL, MP_SHM_INTS * sizeof(int), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) return -1;
  env->shm = shm;
  return 0;
}

int mp_launch(int nranks, mp_body_fn body, void* arg, const mp_opts* opts) {
  mp_opts o = MP_OPTS_INIT;
  if (opts) o = *opts;
  if (o.deadline_s <= 0) o.deadline_s = MP_DEFAULT_DEADLINE_S;
  if (o.nids <= 0) o.nids = 1;
  if (nranks < 1 || nranks > MP_MAX_RANKS || o.nids > MP_MAX_IDS) return 1;
  if (!single_threaded()) return nranks;
  mp_env env;
  pid_t holder = -1;
  if (prepare_env(&env, nranks, arg, &o, &holder) != 0) {
    holder_stop(holder);
    return nranks;
  }
  int pfd[2];
  if (pipe(pfd) != 0) {
    holder_stop(holder);
    return nranks;
  }
  reaper rp;
  memset(&rp, 0, sizeof(rp));
  rp.n = nranks;
  double t0 = mp_now();
  int bad = nranks;
  if (spawn(&rp, &env, body, pfd) == 0) {
    close(pfd[1]);
    pfd[1] = -1;
    wait_all(&rp, &o, pfd[0]);
    bad = 0;
    for (int r = 0; r < nranks; r++) bad += judge(&rp, &o, r);
  }
  holder_stop(holder);
  fprintf(stderr, "[launcher] %d ranks done in %.2f s, %d failed\n", nranks, mp_now() - t0, bad);
  close(pfd[0]);
  if (pfd[1] >= 0) close(pfd[1]);
  munmap((void*)env.shm, MP_SHM_INTS * sizeof(int));
  return bad;
}

int mp_capture_begin(mp_capture* cap) {
  snprintf(cap->path, sizeof(cap->path), "/tmp/mp_capture_XXXXXX");
  int fd = mkstemp(cap->path);
  if (fd < 0) return -1;
  fflush(stdout);
  fflush(stderr);
  cap->saved[0] = dup(1);
  cap->saved[1] = dup(2);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
  return 0;
}

int mp_capture_debug(mp_capture* cap, const char* subsys) {
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", subsys, 1);
  ncclResetDebugInit();
  return mp_capture_begin(cap);
}

/* Whether `line` holds the parts of `pattern` between its '*'s, in order. */
static int line_matches(const char* line, const char* pattern) {
  char part[256];
  while (*pattern) {
    size_t n = strcspn(pattern, "*");
    if (n >= sizeof(part)) return 0;
    memcpy(part, pattern, n);
    part[n] = '\0';
    const char* at = strstr(line, part);
    if (at == NULL) return 0;
    line = at + n;
    pattern += n + (pattern[n] == '*');
  }
  return 1;
}

/* Lines of the capture holding `needle`; each echoed to `echo` if set,
 * but for NCCL INFO lines where `echo_info` is 0. */
static int capture_lines(const mp_capture* cap, const char* needle, FILE* echo, int echo_info) {
  char line[1024];
  int n = 0;
  fflush(stdout);
  fflush(stderr);
  FILE* f = fopen(cap->path, "r");
  while (f && fgets(line, sizeof(line), f)) {
    if (echo && (echo_info || strstr(line, " NCCL INFO ") == NULL)) fputs(line, echo);
    n += line_matches(line, needle);
  }
  if (f) fclose(f);
  return n;
}

int mp_capture_count(const mp_capture* cap, const char* needle) {
  return capture_lines(cap, needle, NULL, 0);
}

/* Restore stdout and stderr; echo the capture to stderr and remove it. */
static int capture_finish(mp_capture* cap, const char* needle, int echo_info) {
  fflush(stdout);
  fflush(stderr);
  dup2(cap->saved[0], 1);
  dup2(cap->saved[1], 2);
  close(cap->saved[0]);
  close(cap->saved[1]);
  int n = capture_lines(cap, needle, stderr, echo_info);
  unlink(cap->path);
  return n;
}

int mp_capture_end(mp_capture* cap, const char* needle) {
  return capture_finish(cap, needle, 1);
}

void mp_capture_end_quiet(mp_capture* cap) {
  capture_finish(cap, "", 0);
}
