/*
 * The progress engine's waiting half: one epoll set per comm holding its
 * transport fds (edge-triggered) and a wake-up eventfd, so an idle rank
 * sleeps in the kernel instead of spinning, and abort can wake it. When
 * only shared-memory connections are blocked, it sleeps on their futex
 * words instead (all at once, with futex_waitv), plus the comm's own wake
 * word for abort. When sockets and shared memory are both blocked it sleeps
 * in epoll, and the shared-memory peers ring its bell: a pipe in the epoll
 * set that peers on the host open through /proc/<pid>/fd (a futex cannot
 * wake epoll, and a socket cannot wake a futex).
 */
#ifndef BRAID_PROGRESS_H_
#define BRAID_PROGRESS_H_

#include <stdatomic.h>
#include <stdint.h>

#include "nccl.h"
#include "transport.h"

struct progress {
  int epoll_fd;
  int wake_fd;
  int bell_fd[2];             /* pipe: [0] in the epoll set, [1] keeps it open */
  uint64_t bell_ino;          /* its inode: peers check they opened this pipe */
  _Atomic uint32_t wake_word; /* bumped (and futex-woken) by progress_wake */
  uint32_t wake_seen;         /* its value when the current pass began */
};

ncclResult_t progress_init(struct progress* p);
void progress_destroy(struct progress* p);
/* Wake every thread sleeping on this engine (abort, error). */
void progress_wake(struct progress* p);
/* A pass over the engine's work begins: forget what blocked last time. */
void progress_pass_begin(struct progress* p, struct transport_waits* w);
/* Sleep until something the last pass found blocked can move (or an
 * engine is woken), or timeout_ms passes. */
ncclResult_t progress_wait(struct progress* const* engines, struct transport_waits* const* waits,
                           int n, int timeout_ms);

#endif /* BRAID_PROGRESS_H_ */
