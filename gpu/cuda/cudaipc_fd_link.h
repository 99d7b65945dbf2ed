/*
 * Making the fd links between processes of one node (cudaipc_fd_link.c;
 * their messages: cudaipc_fd.h). cuMem allocations are
 * shared as POSIX fds, which only a Unix socket carries (SCM_RIGHTS). Each
 * rank listens on an abstract socket named by its role (who uses the
 * links: "direct", "p2p"), its rank and a keyed hash of the comm's secret:
 * /proc/net/unix shows every name to every user, so a name must not tell
 * the secret, and it must not be guessable before it is bound.
 *
 * Neither end takes anyone's word: the connecting rank checks who holds
 * the listener (SO_PEERCRED: this user, and the pid the peer table gives
 * the rank it wants) before it sends a byte, and the listener checks the
 * same of each connecting process against the rank its hello claims,
 * besides the hello's tag of the secret. A name someone else already
 * holds is an error at once, never a wait. A link carries fixed-size
 * messages, each with at most one fd beside it.
 */
#ifndef BRAID_CUDAIPC_FD_LINK_H_
#define BRAID_CUDAIPC_FD_LINK_H_

#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "nccl.h"

struct peer_info;
struct cudaipc_listener;

/* Listen as `rank` of the comm with `secret` whose nranks ranks are
 * `peers` (their pids are the only processes whose links it takes); at
 * most max_links links wait to be taken at once. */
ncclResult_t cudaipc_fd_listen(uint64_t secret, const char* role, int rank,
                               const struct peer_info* peers, int nranks, int max_links,
                               struct cudaipc_listener** out);
/* Close the listener and the links it holds that nobody took. */
void cudaipc_fd_listener_free(struct cudaipc_listener* l);

/* Connect to `peer`'s listener of `role` as `rank` (a hello with `tag`
 * the acceptor checks); waits, up to timeout_ms, for it to listen, and
 * fails at once when the listener is not held by peer_pid of this user. */
ncclResult_t cudaipc_fd_connect(uint64_t secret, const char* role, int rank, int peer,
                                pid_t peer_pid, int tag, int64_t timeout_ms, _Atomic int* aborted,
                                int* fd);
/* The next link a rank of the comm opened: *peer is that rank, *tag its
 * hello's. Connections are read side by side, so an idle or garbage one
 * delays nobody; one that is not a rank of the comm is closed and logged,
 * and the wait goes on. */
ncclResult_t cudaipc_fd_accept(struct cudaipc_listener* l, int64_t timeout_ms, _Atomic int* aborted,
                               int* fd, int* peer, int* tag);

/* What a link opens with: the connecting rank, the tag its role gives
 * meaning to, and a keyed hash of both under the comm's secret (the
 * secret itself never travels). */
struct cudaipc_fd_hello {
  uint64_t proof;
  int32_t rank;
  int32_t tag;
};

/* The protocol's two values derived from the secret: `rank`'s listener
 * name of `role` (into a; returns its length) and the hello of `rank`
 * with `tag`. Public for the tests that play a stranger holding the
 * secret, who must still be refused. */
socklen_t cudaipc_fd_addr(uint64_t secret, const char* role, int rank, struct sockaddr_un* a);
void cudaipc_fd_hello_make(uint64_t secret, const char* role, int rank, int tag,
                           struct cudaipc_fd_hello* h);

#endif /* BRAID_CUDAIPC_FD_LINK_H_ */
