/*
 * The progress engine's waiting half: one epoll set per comm holding its
 * transport fds (edge-triggered) and a wake-up eventfd, so an idle rank
 * sleeps in the kernel instead of spinning, and abort can wake it.
 */
#ifndef BRAID_PROGRESS_H_
#define BRAID_PROGRESS_H_

#include "nccl.h"

struct progress {
  int epoll_fd;
  int wake_fd;
};

ncclResult_t progress_init(struct progress* p);
void progress_destroy(struct progress* p);
/* Wake every thread sleeping on this engine (abort, error). */
void progress_wake(struct progress* p);
/* Sleep until any of the engines has an event, or timeout_ms passes. */
ncclResult_t progress_wait(struct progress* const* engines, int n, int timeout_ms);

#endif /* BRAID_PROGRESS_H_ */
