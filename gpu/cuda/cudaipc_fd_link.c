/*
 * Making the fd links (cudaipc_fd.h): the listener's name, who may be at
 * either end, and the listener's side, which reads every connection's
 * hello side by side (hello_pool) and keeps the links of the comm's ranks
 * until someone takes them.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "peer.h"
#include "core.h"
#include "cudaipc_fd.h"
#include "cudaipc_fd_link.h"
#include "hello_pool.h"
#include "siphash.h"
#include "socket.h"

#define FD_HELLO_MS 5000  /* a rank sends its hello right after connecting */
#define FD_MAX_PENDING 64 /* connections whose hello has not come, read side by side */
#define FD_TAG_NAME 1u    /* what a keyed hash of the secret is for: the listener's name */
#define FD_TAG_HELLO 2u   /* a hello's proof that its sender holds the secret */

struct fd_ready {
  int fd, peer, tag;
};

struct cudaipc_listener {
  int fd;
  uint64_t secret;
  const char* role;
  int rank, nranks;
  pid_t* pids; /* per rank: the process whose links are taken for it */
  struct hello_pool pool;
  int nready, max_ready; /* links of the comm's ranks, not yet taken, oldest first */
  struct fd_ready* ready;
};

/* A keyed hash of (what, role, rank, tag) under the secret. */
static uint64_t fd_keyed(uint64_t secret, uint32_t what, const char* role, int rank, int tag) {
  char buf[64];
  int n = snprintf(buf, sizeof(buf), "%u/%s/%d/%d", what, role, rank, tag);
  return siphash24(secret, ~secret, buf, (size_t)MIN(n, (int)sizeof(buf) - 1));
}

/* The abstract name (leading NUL: nothing in the file system to clean):
 * public, so it holds a keyed hash of the secret, not the secret. */
socklen_t cudaipc_fd_addr(uint64_t secret, const char* role, int rank, struct sockaddr_un* a) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "braid-ipc-%s-%016llx", role,
                   (unsigned long long)fd_keyed(secret, FD_TAG_NAME, role, rank, 0));
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

void cudaipc_fd_hello_make(uint64_t secret, const char* role, int rank, int tag,
                           struct cudaipc_fd_hello* h) {
  memset(h, 0, sizeof(*h));
  h->proof = fd_keyed(secret, FD_TAG_HELLO, role, rank, tag);
  h->rank = rank;
  h->tag = tag;
}

/* Why the process at the other end of unix socket `s` is not `pid` of
 * this user; NULL when it is. `who` gets its pid and uid for the log. */
static const char* fd_stranger(int s, pid_t pid, char* who, size_t len) {
  struct ucred cred;
  socklen_t n = sizeof(cred);
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0) {
    snprintf(who, len, "unknown (%s)", strerror(errno));
    return "its credentials cannot be read";
  }
  snprintf(who, len, "pid %d uid %u", (int)cred.pid, (unsigned)cred.uid);
  if (cred.uid != geteuid()) return "another user";
  if (cred.pid != pid) return "another process than the peer table names";
  return NULL;
}

/* ---- The listener ---- */

/* A whole hello came (hello_pool's callback): keep the link when it comes
 * from the rank it names, else close it. */
static void fd_on_hello(void* arg, int fd, const void* bytes) {
  struct cudaipc_listener* l = arg;
  struct cudaipc_fd_hello h;
  char who[64] = "";
  const char* why = NULL;
  memcpy(&h, bytes, sizeof(h));
  if (h.rank < 0 || h.rank >= l->nranks || h.rank == l->rank)
    why = "a rank out of range";
  else if (h.proof != fd_keyed(l->secret, FD_TAG_HELLO, l->role, h.rank, h.tag))
    why = "not this communicator's hello";
  else if ((why = fd_stranger(fd, l->pids[h.rank], who, sizeof(who))) != NULL)
    ;
  else if (l->nready == l->max_ready)
    why = "more links than the comm's ranks open";
  if (why != NULL) {
    char line[160];
    snprintf(line, sizeof(line), "%s%s%s", why, who[0] ? ", from " : "", who);
    hello_pool_log_refusal(&l->pool, line);
    close(fd);
    return;
  }
  l->ready[l->nready++] = (struct fd_ready){fd, h.rank, h.tag};
}

static ncclResult_t fd_bind(const struct sockaddr_un* a, socklen_t len, int rank, int* out) {
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s >= 0 && bind(s, (const struct sockaddr*)a, len) == 0 && listen(s, 64) == 0) {
    *out = s;
    return ncclSuccess;
  }
  if (errno == EADDRINUSE)
    WARN(
        "CUDA IPC: rank %d's fd socket name is taken by another process (a stranger?): refusing "
        "to go on",
        rank);
  else
    WARN("CUDA IPC: cannot listen on the fd socket of rank %d: %s", rank, strerror(errno));
  if (s >= 0) close(s);
  return ncclSystemError;
}

ncclResult_t cudaipc_fd_listen(uint64_t secret, const char* role, int rank,
                               const struct peer_info* peers, int nranks, int max_links,
                               struct cudaipc_listener** out) {
  ncclResult_t res = ncclSuccess;
  struct cudaipc_listener* l = NULL;
  struct sockaddr_un a;
  socklen_t len = cudaipc_fd_addr(secret, role, rank, &a);
  CHECK(braid_calloc(&l, 1, sizeof(*l)));
  l->fd = -1;
  l->secret = secret;
  l->role = role;
  l->rank = rank;
  l->nranks = nranks;
  l->max_ready = max_links;
  CHECK(braid_calloc(&l->pids, (size_t)nranks, sizeof(*l->pids)));
  CHECK(braid_calloc(&l->ready, (size_t)max_links, sizeof(*l->ready)));
  for (int r = 0; r < nranks; r++) l->pids[r] = peers[r].pid;
  CHECK(fd_bind(&a, len, rank, &l->fd));
  CHECK(hello_pool_init(&l->pool, "CUDA IPC fd listener", l->fd, sizeof(struct cudaipc_fd_hello),
                        FD_HELLO_MS, FD_MAX_PENDING));
  *out = l;
  return ncclSuccess;
fail:
  cudaipc_fd_listener_free(l);
  return res;
}

void cudaipc_fd_listener_free(struct cudaipc_listener* l) {
  if (l == NULL) return;
  if (l->pool.pending) hello_pool_free(&l->pool);
  for (int i = 0; i < l->nready; i++) close(l->ready[i].fd);
  if (l->fd >= 0) close(l->fd);
  free(l->ready);
  free(l->pids);
  free(l);
}

/* Serve the listener until a link of the comm is ready, the deadline or
 * an abort. */
static ncclResult_t fd_serve(struct cudaipc_listener* l, uint64_t deadline, _Atomic int* aborted) {
  struct pollfd p[1 + FD_MAX_PENDING];
  while (l->nready == 0) {
    uint64_t now = braid_now_ns();
    if (aborted && atomic_load(aborted)) {
      WARN("CUDA IPC: communicator aborted while rank %d waited for its peers' links", l->rank);
      return ncclSystemError;
    }
    if (now >= deadline) {
      WARN("CUDA IPC: rank %d waited for a peer's link past BRAID_TIMEOUT_MS", l->rank);
      return ncclSystemError;
    }
    int n = hello_pool_pollfds(&l->pool, p);
    int cap = (int)MIN((deadline - now) / 1000000ull + 1, 100ull); /* an abort is seen in 0.1 s */
    int rc = poll(p, (nfds_t)n, hello_pool_timeout_ms(&l->pool, cap));
    if (rc < 0 && errno != EINTR) {
      WARN("CUDA IPC: poll on the fd listener: %s", strerror(errno));
      return ncclSystemError;
    }
    hello_pool_service(&l->pool, p, rc > 0 ? n : 1, fd_on_hello, l);
  }
  return ncclSuccess;
}

ncclResult_t cudaipc_fd_accept(struct cudaipc_listener* l, int64_t timeout_ms, _Atomic int* aborted,
                               int* fd, int* peer, int* tag) {
  ncclResult_t res = ncclSuccess;
  CHECK(fd_serve(l, socket_deadline(timeout_ms), aborted));
  *fd = l->ready[0].fd;
  *peer = l->ready[0].peer;
  *tag = l->ready[0].tag;
  memmove(l->ready, l->ready + 1, (size_t)(--l->nready) * sizeof(*l->ready));
fail:
  return res;
}

/* ---- The connecting side ---- */

/* One try: 1 connected (*s), 0 nobody listens yet, -1 an error (WARN). */
static int fd_try_connect(const struct sockaddr_un* a, socklen_t len, int peer, int* s) {
  *s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (*s < 0) {
    WARN("CUDA IPC: socket: %s", strerror(errno));
    return -1;
  }
  if (connect(*s, (const struct sockaddr*)a, len) == 0) return 1;
  int err = errno;
  close(*s);
  *s = -1;
  if (err == ECONNREFUSED || err == ENOENT || err == EAGAIN) return 0;
  WARN("CUDA IPC: connect to rank %d: %s", peer, strerror(err));
  return -1;
}

ncclResult_t cudaipc_fd_connect(uint64_t secret, const char* role, int rank, int peer,
                                pid_t peer_pid, int tag, int64_t timeout_ms, _Atomic int* aborted,
                                int* fd) {
  ncclResult_t res = ncclSuccess;
  struct sockaddr_un a;
  socklen_t len = cudaipc_fd_addr(secret, role, peer, &a);
  struct cudaipc_fd_hello hello;
  uint64_t deadline = socket_deadline(timeout_ms);
  char who[64];
  const char* why;
  int s = -1, got;
  cudaipc_fd_hello_make(secret, role, rank, tag, &hello);
  while ((got = fd_try_connect(&a, len, peer, &s)) == 0) { /* the peer may not listen yet */
    if (braid_now_ns() > deadline || (aborted && atomic_load(aborted)))
      FAIL(ncclSystemError, "CUDA IPC: rank %d's fd socket did not answer", peer);
    usleep(1000);
  }
  if (got < 0) FAIL(ncclSystemError, "CUDA IPC: no link to rank %d", peer);
  if ((why = fd_stranger(s, peer_pid, who, sizeof(who))) != NULL)
    FAIL(ncclSystemError,
         "CUDA IPC: rank %d's fd socket is held by %s (%s), not by rank %d (pid %d): nothing sent",
         peer, who, why, peer, (int)peer_pid);
  CHECK(cudaipc_fd_send(s, &hello, sizeof(hello), -1, timeout_ms, aborted));
  *fd = s;
  return ncclSuccess;
fail:
  if (s >= 0) close(s);
  return res;
}
