/*
 * Progress engine waits: epoll for one comm, poll over several comms' epoll
 * fds when a group spans communicators. Transports register their sockets
 * edge-triggered, so the executor must drain them before calling wait.
 */
#include "engine/progress.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

#define PROGRESS_MAX_POLL 64
/* A waiter's nap where only polled connections block (a net plugin's). */
#define PROGRESS_NAP_US 50

/* Tags of the engine's own fds in its epoll set (transport fds carry 0). */
#define PROGRESS_TAG_WAKE 1u
#define PROGRESS_TAG_BELL 2u

static ncclResult_t progress_watch(struct progress* p, int fd, uint32_t tag) {
  /* Level-triggered: once woken for abort, every later wait returns too;
   * the bell stays readable until drained. */
  struct epoll_event ev = {.events = EPOLLIN, .data = {.u32 = tag}};
  if (epoll_ctl(p->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    WARN("Progress engine: epoll_ctl failed: %s", strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t progress_init(struct progress* p) {
  struct stat st;
  p->bell_fd[0] = p->bell_fd[1] = -1;
  p->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->epoll_fd < 0 || p->wake_fd < 0 || pipe2(p->bell_fd, O_NONBLOCK | O_CLOEXEC) != 0 ||
      fstat(p->bell_fd[0], &st) != 0) {
    WARN("Progress engine: cannot create epoll/eventfd/pipe: %s", strerror(errno));
    progress_destroy(p);
    return ncclSystemError;
  }
  p->bell_ino = (uint64_t)st.st_ino;
  if (progress_watch(p, p->wake_fd, PROGRESS_TAG_WAKE) != ncclSuccess ||
      progress_watch(p, p->bell_fd[0], PROGRESS_TAG_BELL) != ncclSuccess) {
    progress_destroy(p);
    return ncclSystemError;
  }
  return ncclSuccess;
}

void progress_destroy(struct progress* p) {
  if (p->epoll_fd >= 0) close(p->epoll_fd);
  if (p->wake_fd >= 0) close(p->wake_fd);
  for (int i = 0; i < 2; i++)
    if (p->bell_fd[i] >= 0) close(p->bell_fd[i]);
  p->epoll_fd = p->wake_fd = p->bell_fd[0] = p->bell_fd[1] = -1;
}

/* Empty the bell pipe once epoll reported it, so the next wait can block. */
static void progress_bell_drain(struct progress* p, const struct epoll_event* evs, int n) {
  for (int i = 0; i < n; i++)
    if (evs[i].data.u32 == PROGRESS_TAG_BELL) {
      char buf[64];
      while (read(p->bell_fd[0], buf, sizeof(buf)) > 0) {
      }
      return;
    }
}

void progress_wake(struct progress* p) {
  uint64_t one = 1;
  atomic_fetch_add(&p->wake_word, 1);
  syscall(SYS_futex, &p->wake_word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
  if (write(p->wake_fd, &one, sizeof(one)) < 0) { /* counter full: already awake */
  }
}

void progress_pass_begin(struct progress* p, struct transport_waits* w) {
  p->wake_seen = atomic_load(&p->wake_word);
  w->nfutex = 0;
  w->nfd = 0;
  w->npoll = 0;
}

/* Lower a sleeper count this thread raised. Below one, the peer wrote it
 * (every sleeper lowers only its own raise): put it back where it was and
 * tell the connection, which naps from then on (transport.h). */
static void sleeper_lower(_Atomic uint32_t* count, _Atomic int* miscounted) {
  if (atomic_fetch_sub(count, 1) != 0) return;
  atomic_fetch_add(count, 1);
  if (miscounted) atomic_store(miscounted, 1);
}

/* Sleep on every blocked shared-memory word and every engine's wake word
 * at once. Each word's peer wakes it only when it sees a sleeper, so the
 * sleeper counts go up first (and the kernel rechecks every word). */
static ncclResult_t futex_sleep(struct progress* const* engines, struct transport_waits* const* w,
                                int n, int timeout_ms) {
  struct futex_waitv v[FUTEX_WAITV_MAX];
  int counted[FUTEX_WAITV_MAX][2]; /* (comm, entry) whose sleeper count went up */
  int m = 0, nc = 0;
  for (int i = 0; i < n && m < FUTEX_WAITV_MAX; i++)
    v[m++] = (struct futex_waitv){.val = engines[i]->wake_seen,
                                  .uaddr = (uintptr_t)&engines[i]->wake_word,
                                  .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG};
  for (int i = 0; i < n; i++)
    for (int j = 0; j < w[i]->nfutex && m < FUTEX_WAITV_MAX; j++) {
      atomic_fetch_add(w[i]->futex[j].sleepers, 1);
      counted[nc][0] = i, counted[nc++][1] = j;
      v[m++] = (struct futex_waitv){
          .val = w[i]->futex[j].seen, .uaddr = (uintptr_t)w[i]->futex[j].word, .flags = FUTEX_32};
    }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  long rc = syscall(SYS_futex_waitv, v, (unsigned)m, 0, &ts, CLOCK_MONOTONIC);
  int err = errno;
  for (int k = 0; k < nc; k++) {
    const struct transport_waits* wi = w[counted[k][0]];
    sleeper_lower(wi->futex[counted[k][1]].sleepers, wi->futex[counted[k][1]].miscounted);
  }
  if (rc < 0 && err == ENOSYS) { /* kernel before 5.16: nap briefly and poll */
    struct timespec nap = {0, 200000};
    nanosleep(&nap, NULL);
  } else if (rc < 0 && err != EAGAIN && err != ETIMEDOUT && err != EINTR) {
    WARN("Progress engine: futex_waitv failed: %s", strerror(err));
    return ncclSystemError;
  }
  return ncclSuccess;
}

static ncclResult_t epoll_sleep(struct progress* const* engines, int n, int timeout_ms);

/* Ask every blocked shared-memory peer to ring our bell pipe. 0 (nothing
 * raised) when one of them cannot: it failed to open the pipe. */
static int fd_bells_raise(struct transport_waits* const* w, int n) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < w[i]->nfutex; j++)
      if (w[i]->futex[j].fd_sleepers == NULL) return 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < w[i]->nfutex; j++) atomic_fetch_add(w[i]->futex[j].fd_sleepers, 1);
  return 1;
}

static void fd_bells_lower(struct transport_waits* const* w, int n) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < w[i]->nfutex; j++)
      sleeper_lower(w[i]->futex[j].fd_sleepers, w[i]->futex[j].miscounted);
}

/* Did a word move since the pass looked? After the raise, a peer moving it
 * later sees the raise and rings (the seq_cst pair of shm's bell ring). */
static int futex_words_moved(struct transport_waits* const* w, int n) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < w[i]->nfutex; j++)
      if (atomic_load(w[i]->futex[j].word) != w[i]->futex[j].seen) return 1;
  return 0;
}

ncclResult_t progress_wait(struct progress* const* engines, struct transport_waits* const* waits,
                           int n, int timeout_ms) {
  int nfutex = 0, nfd = 0, npoll = 0;
  for (int i = 0; i < n; i++)
    nfutex += waits[i]->nfutex, nfd += waits[i]->nfd, npoll += waits[i]->npoll;
  /* Something blocked that nothing wakes: look again soon. Where that is
   * all (a net plugin's connections: polled only), soon is a nap of
   * PROGRESS_NAP_US, not epoll's millisecond, which took most of a
   * pipeline's time (docs/net-plugins.md, "Progress"). */
  if (npoll > 0 && nfd == 0 && nfutex == 0) {
    usleep(PROGRESS_NAP_US);
    return ncclSuccess;
  }
  if (npoll > 0) timeout_ms = MIN(timeout_ms, 1);
  if (nfutex > 0 && nfd == 0) return futex_sleep(engines, waits, n, timeout_ms);
  if (nfutex == 0) return epoll_sleep(engines, n, timeout_ms);
  /* Sockets and shared memory both blocked: sleep in epoll, rung by the
   * shared-memory peers; where one cannot ring, nap and look again. */
  if (!fd_bells_raise(waits, n)) return epoll_sleep(engines, n, MIN(timeout_ms, 1));
  ncclResult_t res =
      futex_words_moved(waits, n) ? ncclSuccess : epoll_sleep(engines, n, timeout_ms);
  fd_bells_lower(waits, n);
  return res;
}

static ncclResult_t epoll_sleep(struct progress* const* engines, int n, int timeout_ms) {
  if (n == 1) {
    struct epoll_event evs[16];
    int rc = epoll_wait(engines[0]->epoll_fd, evs, 16, timeout_ms);
    if (rc < 0 && errno != EINTR) {
      WARN("Progress engine: epoll_wait failed: %s", strerror(errno));
      return ncclSystemError;
    }
    progress_bell_drain(engines[0], evs, rc);
    return ncclSuccess;
  }
  /* Several comms: an epoll fd is itself readable when it has events. */
  struct pollfd p[PROGRESS_MAX_POLL];
  int m = MIN(n, PROGRESS_MAX_POLL);
  for (int i = 0; i < m; i++) p[i] = (struct pollfd){engines[i]->epoll_fd, POLLIN, 0};
  if (n > PROGRESS_MAX_POLL) timeout_ms = MIN(timeout_ms, 1); /* the rest are polled by retry */
  if (poll(p, (nfds_t)m, timeout_ms) < 0 && errno != EINTR) {
    WARN("Progress engine: poll failed: %s", strerror(errno));
    return ncclSystemError;
  }
  /* Drain pending edge events so the next epoll-based poll can block. */
  for (int i = 0; i < m; i++)
    if (p[i].revents) {
      struct epoll_event evs[16];
      progress_bell_drain(engines[i], evs, epoll_wait(engines[i]->epoll_fd, evs, 16, 0));
    }
  return ncclSuccess;
}
