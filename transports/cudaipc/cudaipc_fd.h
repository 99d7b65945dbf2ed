/*
 * File descriptors between processes of one node: cuMem allocations are
 * shared as POSIX fds, which only a Unix socket carries (SCM_RIGHTS). Each
 * rank listens on an abstract socket named by its role (who uses the
 * links: "direct", "p2p"), the comm's secret and its rank; a link opens
 * with the secret, the connecting rank and a tag the role gives meaning
 * to, and carries fixed-size messages, each with at most one fd beside it.
 */
#ifndef BRAID_CUDAIPC_FD_H_
#define BRAID_CUDAIPC_FD_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Listen as `rank` of the comm with `secret`; *fd is the listener. */
ncclResult_t cudaipc_fd_listen(uint64_t secret, const char* role, int rank, int* fd);
/* Connect to `peer`'s listener of `role` as `rank` (a hello with `tag`
 * the acceptor checks); waits, up to timeout_ms, for it to listen. */
ncclResult_t cudaipc_fd_connect(uint64_t secret, const char* role, int rank, int peer, int tag,
                                int64_t timeout_ms, _Atomic int* aborted, int* fd);
/* Take the next link from the listener: *peer is the rank on the other
 * end, *tag its hello's; a link whose hello is wrong is closed, and the
 * wait goes on. */
ncclResult_t cudaipc_fd_accept(int listen_fd, uint64_t secret, int64_t timeout_ms,
                               _Atomic int* aborted, int* fd, int* peer, int* tag);

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
