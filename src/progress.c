/*
 * Progress engine waits: epoll for one comm, poll over several comms' epoll
 * fds when a group spans communicators. Transports register their sockets
 * edge-triggered, so the executor must drain them before calling wait.
 */
#include "progress.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
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
  if (write(p->wake_fd, &one, sizeof(one)) < 0) { /* counter full: already awake */
  }
}

ncclResult_t progress_wait(struct progress* const* engines, int n, int timeout_ms) {
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
