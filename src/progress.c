/*
 * Progress engine waits: epoll for one comm, poll over several comms' epoll
 * fds when a group spans communicators. Transports register their sockets
 * edge-triggered, so the executor must drain them before calling wait.
 */
#include "progress.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

#define PROGRESS_MAX_POLL 64

ncclResult_t progress_init(struct progress* p) {
  p->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->epoll_fd < 0 || p->wake_fd < 0) {
    WARN("Progress engine: cannot create epoll/eventfd: %s", strerror(errno));
    progress_destroy(p);
    return ncclSystemError;
  }
  /* Level-triggered: once woken for abort, every later wait returns too. */
  struct epoll_event ev = {.events = EPOLLIN, .data = {0}};
  if (epoll_ctl(p->epoll_fd, EPOLL_CTL_ADD, p->wake_fd, &ev) != 0) {
    WARN("Progress engine: epoll_ctl failed: %s", strerror(errno));
    progress_destroy(p);
    return ncclSystemError;
  }
  return ncclSuccess;
}

void progress_destroy(struct progress* p) {
  if (p->epoll_fd >= 0) close(p->epoll_fd);
  if (p->wake_fd >= 0) close(p->wake_fd);
  p->epoll_fd = p->wake_fd = -1;
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
}

/* Sleep on every blocked shared-memory word and every engine's wake word
 * at once. Each word's peer wakes it only when it sees a sleeper, so the
 * sleeper counts go up first (and the kernel rechecks every word). */
static ncclResult_t futex_sleep(struct progress* const* engines, struct transport_waits* const* w,
                                int n, int timeout_ms) {
  struct futex_waitv v[FUTEX_WAITV_MAX];
  _Atomic uint32_t* counted[FUTEX_WAITV_MAX]; /* sleeper counts raised, to lower again */
  int m = 0, nc = 0;
  for (int i = 0; i < n && m < FUTEX_WAITV_MAX; i++)
    v[m++] = (struct futex_waitv){.val = engines[i]->wake_seen,
                                  .uaddr = (uintptr_t)&engines[i]->wake_word,
                                  .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG};
  for (int i = 0; i < n; i++)
    for (int j = 0; j < w[i]->nfutex && m < FUTEX_WAITV_MAX; j++) {
      atomic_fetch_add(w[i]->futex[j].sleepers, 1);
      counted[nc++] = w[i]->futex[j].sleepers;
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
  for (int i = 0; i < nc; i++) atomic_fetch_sub(counted[i], 1);
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

ncclResult_t progress_wait(struct progress* const* engines, struct transport_waits* const* waits,
                           int n, int timeout_ms) {
  int nfutex = 0, nfd = 0;
  for (int i = 0; i < n; i++) nfutex += waits[i]->nfutex, nfd += waits[i]->nfd;
  if (nfutex > 0 && nfd == 0) return futex_sleep(engines, waits, n, timeout_ms);
  /* Sockets and shared memory both pending: nothing wakes on both, so
   * sleep on the sockets in short naps and look at shared memory between. */
  if (nfutex > 0) timeout_ms = MIN(timeout_ms, 1);
  return epoll_sleep(engines, n, timeout_ms);
}

static ncclResult_t epoll_sleep(struct progress* const* engines, int n, int timeout_ms) {
  if (n == 1) {
    struct epoll_event evs[16];
    int rc = epoll_wait(engines[0]->epoll_fd, evs, 16, timeout_ms);
    if (rc < 0 && errno != EINTR) {
      WARN("Progress engine: epoll_wait failed: %s", strerror(errno));
      return ncclSystemError;
    }
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
      epoll_wait(engines[i]->epoll_fd, evs, 16, 0);
    }
  return ncclSuccess;
}
