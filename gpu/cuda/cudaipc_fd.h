/*
 * Messages on the fd links between ranks of one node (cudaipc_fd.c): fixed
 * size, each with at most one fd beside it (SCM_RIGHTS: how a cuMem
 * allocation's POSIX fd reaches another process). The links are made by
 * cudaipc_fd_link.h.
 */
#ifndef BRAID_CUDAIPC_FD_H_
#define BRAID_CUDAIPC_FD_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* One message of `bytes` and, unless `fd` < 0, a copy of fd beside it;
 * waits (for room) at most timeout_ms, and not past an abort. */
ncclResult_t cudaipc_fd_send(int link, const void* msg, size_t bytes, int fd, int64_t timeout_ms,
                             _Atomic int* aborted);
/* One message now if the link has room, no fd, no wait, no WARN: for a
 * last word to a peer that may be gone. 0 if sent. */
int cudaipc_fd_try_send(int link, const void* msg, size_t bytes);
/* Whether the other end has closed the link (nothing left to read). */
int cudaipc_fd_closed(int link);
/* The next message; *fd its fd (the caller's to close) or -1. Waits at
 * most timeout_ms, and not past an abort. */
ncclResult_t cudaipc_fd_recv(int link, void* msg, size_t bytes, int* fd, int64_t timeout_ms,
                             _Atomic int* aborted);

/* Without waiting: send one message (and fd, unless < 0) if the link has
 * room (1), or not (0); -1 on an error (with a WARN). */
int cudaipc_fd_post(int link, const void* msg, size_t bytes, int fd);
/* Without waiting: the next message if one is there (1; *fd its fd or
 * -1), none yet (0), or -1: the link closed or failed, or a message of
 * another size came (WARN). */
int cudaipc_fd_poll(int link, void* msg, size_t bytes, int* fd);

#endif /* BRAID_CUDAIPC_FD_H_ */
