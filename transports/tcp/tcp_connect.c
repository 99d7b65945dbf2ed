/*
 * TCP connection setup. The sender side dials its sockets and says hello
 * on each; the receiver side takes them from the rank's data listener,
 * whose incoming connections are read side by side (hello_pool): a socket
 * whose hello names a peer nobody asked for yet is parked until someone
 * does, a stranger is refused without delaying anyone.
 *
 * The collective channel is duplex: the lower rank of a pair dials, and
 * both directions share those sockets. Collectives exchange with every
 * peer both ways (recursive doubling, trees), so each message's ACK rides
 * on the data coming back instead of being a packet of its own - half the
 * packets, and half the kernel work, per small all-reduce. Point-to-point
 * keeps one connection per direction: its two sides need not both exist.
 */
#include "tcp_connect.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "hello_pool.h"
#include "param.h"
#include "socket.h"
#include "tcp.h"

/* A connection has this long to send its whole hello. */
#define TCP_HELLO_MS 2000
/* Incoming connections without a whole hello yet, at most. */
#define TCP_MAX_PENDING 64
/* Poll slices while answering: ncclCommAbort is seen this fast. */
#define TCP_SLICE_MS 100

/* An accepted socket whose hello names a peer nobody asked for yet. */
struct tcp_parked {
  int fd;
  struct tcp_hello hello;
  struct tcp_parked* next;
};

/* Shared by the comm's thread and the lane's (transport_ctx_fork): `lock`
 * guards the pool and the parked list; nobody holds it while polling. */
struct transport_accept {
  pthread_mutex_t lock;
  struct hello_pool pool;
  struct tcp_parked* parked;
  const struct transport_ctx* ctx; /* for the hello checks */
};

/* A connected socket joins the data path: options, then the progress
 * engine's epoll set. */
static ncclResult_t tcp_sock_ready(struct transport_ctx* ctx, int fd) {
  socket_tune_data(fd, (int)param_sock_buf());
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data = {0}};
  if (epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    WARN("NET/Socket : epoll_ctl failed: %s", strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t tcp_conn_alloc(int peer, int is_send, int nsocks, struct tcp_conn** out) {
  struct tcp_conn* c = NULL;
  ncclResult_t res = braid_calloc(&c, 1, sizeof(*c));
  if (res != ncclSuccess) return res;
  c->base.ops = &tcp_transport;
  c->base.peer = peer;
  c->base.is_send = is_send;
  c->nsocks = nsocks;
  for (int s = 0; s < TCP_MAX_SOCKS; s++) c->socks[s].fd = -1;
  *out = c;
  return ncclSuccess;
}

static int tcp_nsocks(void) {
  int64_t n = param_socket_nthreads() * param_nsocks_perthread();
  return (int)MAX(1, MIN(n, TCP_MAX_SOCKS));
}

/* The address our data listener is bound to: what peers dial. */
ncclResult_t tcp_blob_make(struct transport_ctx* ctx, void* blob) {
  struct tcp_blob* b = blob;
  union socket_addr addr;
  socklen_t len = sizeof(addr);
  memset(&addr, 0, sizeof(addr));
  if (getsockname(ctx->listen_fd, &addr.sa, &len) != 0) {
    WARN("NET/Socket : getsockname on the data listener failed: %s", strerror(errno));
    return ncclSystemError;
  }
  socket_addr_to_wire(&addr, &b->listen);
  return ncclSuccess;
}

/* Open the sockets to `peer` and say hello on each; `c` is a send conn. */
static ncclResult_t tcp_dial(struct transport_ctx* ctx, int peer, int channel,
                             struct tcp_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct tcp_conn* c = NULL;
  union socket_addr addr;
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  int ns = tcp_nsocks();
  CHECK(tcp_conn_alloc(peer, 1, ns, &c));
  c->waits = ctx->waits;
  const struct tcp_blob* b = transport_peer_blob(ctx, &tcp_transport, peer);
  socket_addr_from_wire(&b->listen, &addr);
  for (int s = 0; s < ns; s++) {
    struct tcp_hello h = {TCP_MAGIC, TCP_VERSION, ctx->secret, ctx->rank, peer, s, ns, channel, 0};
    CHECK(socket_connect(&addr, deadline, ctx->aborted, &c->socks[s].fd));
    CHECK(socket_send_all(c->socks[s].fd, &h, sizeof(h), deadline, ctx->aborted));
    CHECK(tcp_sock_ready(ctx, c->socks[s].fd));
  }
  *out = c;
  return ncclSuccess;
fail:
  if (c) tcp_transport.close(&c->base);
  return res;
}

const char* tcp_hello_problem(const struct transport_ctx* ctx, const struct tcp_hello* h) {
  if (h->magic != TCP_MAGIC) return "not a Braid connection";
  if (h->version != TCP_VERSION) return "another Braid TCP protocol version";
  if (h->secret != ctx->secret) return "wrong secret";
  if (h->to != ctx->rank || h->from < 0 || h->from >= ctx->nranks) return "wrong ranks";
  if (h->nsocks < 1 || h->nsocks > TCP_MAX_SOCKS || h->sock_idx < 0 || h->sock_idx >= h->nsocks)
    return "bad socket numbering";
  if ((h->channel < 0 || h->channel > 1 + TCP_OOB_CHANNELS) && h->channel != TRANSPORT_CHANNEL_LANE)
    return "bad channel";
  return NULL;
}

/* A whole hello arrived (hello_pool's callback): park the socket or refuse it. */
static void tcp_on_hello(void* arg, int fd, const void* bytes) {
  struct transport_accept* a = arg;
  struct tcp_parked* p = NULL;
  const char* why = braid_calloc(&p, 1, sizeof(*p)) == ncclSuccess ? NULL : "out of memory";
  if (p) memcpy(&p->hello, bytes, sizeof(p->hello));
  if (why == NULL) why = tcp_hello_problem(a->ctx, &p->hello);
  if (why) {
    hello_pool_log_refusal(&a->pool, why);
    close(fd);
    free(p);
    return;
  }
  p->fd = fd;
  p->next = a->parked;
  a->parked = p;
}

static ncclResult_t tcp_accept_get(struct transport_ctx* ctx, struct transport_accept** out) {
  ncclResult_t res = ncclSuccess;
  struct transport_accept* a = ctx->accept;
  if (a == NULL) {
    CHECK(braid_calloc(&a, 1, sizeof(*a)));
    pthread_mutex_init(&a->lock, NULL);
    a->ctx = ctx;
    res = hello_pool_init(&a->pool, "NET/Socket", ctx->listen_fd, sizeof(struct tcp_hello),
                          TCP_HELLO_MS, TCP_MAX_PENDING);
    if (res != ncclSuccess) {
      free(a);
      return res;
    }
    ctx->accept = a;
  }
  *out = a;
fail:
  return res;
}

/* Read what incoming connections have sent by now (under a->lock): a
 * fresh poll, so that what another thread took meanwhile is not taken. */
static ncclResult_t tcp_accept_now(struct transport_accept* a) {
  struct pollfd p[1 + TCP_MAX_PENDING];
  int n = hello_pool_pollfds(&a->pool, p);
  if (poll(p, (nfds_t)n, 0) < 0 && errno != EINTR) {
    WARN("NET/Socket : poll failed: %s", strerror(errno));
    return ncclSystemError;
  }
  hello_pool_service(&a->pool, p, n, tcp_on_hello, a);
  return ncclSuccess;
}

/* Wait (one slice at most) for incoming connections and read their hellos.
 * The wait holds no lock: the lane's thread claims its own meanwhile. */
static ncclResult_t tcp_accept_some(struct transport_ctx* ctx, struct transport_accept* a,
                                    uint64_t deadline, int peer) {
  struct pollfd p[1 + TCP_MAX_PENDING];
  if (ctx->aborted && atomic_load(ctx->aborted)) {
    WARN("NET/Socket : communicator aborted while waiting for rank %d's connection", peer);
    return ncclSystemError;
  }
  if (braid_now_ns() >= deadline) {
    WARN("NET/Socket : timeout waiting for rank %d's connection (BRAID_TIMEOUT_MS=%lld)", peer,
         (long long)ctx->timeout_ms);
    return ncclSystemError;
  }
  pthread_mutex_lock(&a->lock);
  int n = hello_pool_pollfds(&a->pool, p);
  int timeout = hello_pool_timeout_ms(&a->pool, TCP_SLICE_MS);
  pthread_mutex_unlock(&a->lock);
  if (poll(p, (nfds_t)n, timeout) < 0 && errno != EINTR) { /* a closed fd is only POLLNVAL */
    WARN("NET/Socket : poll failed: %s", strerror(errno));
    return ncclSystemError;
  }
  pthread_mutex_lock(&a->lock);
  ncclResult_t res = tcp_accept_now(a);
  pthread_mutex_unlock(&a->lock);
  return res;
}

/* Move parked sockets from `peer` into the connection; count what is there
 * (under a->lock). */
static int tcp_claim_parked(struct transport_accept* a, struct tcp_conn* c, int channel) {
  struct tcp_parked** pp = &a->parked;
  while (*pp) {
    struct tcp_parked* p = *pp;
    if (p->hello.from == c->base.peer && p->hello.channel == channel &&
        (c->nsocks == 0 || p->hello.nsocks == c->nsocks) && c->socks[p->hello.sock_idx].fd < 0) {
      c->nsocks = p->hello.nsocks;
      c->socks[p->hello.sock_idx].fd = p->fd;
      *pp = p->next;
      free(p);
    } else {
      pp = &p->next;
    }
  }
  int have = 0;
  for (int s = 0; s < TCP_MAX_SOCKS; s++) have += c->socks[s].fd >= 0;
  return have;
}

/* Whether every socket `peer` dialled on `channel` is in c now. */
static int tcp_claimed_all(struct transport_accept* a, struct tcp_conn* c, int channel) {
  pthread_mutex_lock(&a->lock);
  int have = tcp_claim_parked(a, c, channel);
  pthread_mutex_unlock(&a->lock);
  return c->nsocks > 0 && have >= c->nsocks;
}

/* Take the sockets `peer` dialled on hello channel `channel`, accepting
 * until all have come, into a receive conn. */
static ncclResult_t tcp_gather(struct transport_ctx* ctx, int peer, int channel,
                               struct tcp_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct tcp_conn* c = NULL;
  struct transport_accept* a = NULL;
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  CHECK(tcp_accept_get(ctx, &a));
  CHECK(tcp_conn_alloc(peer, 0, 0, &c));
  c->waits = ctx->waits;
  /* Sockets from this peer may have arrived while we waited for another. */
  while (!tcp_claimed_all(a, c, channel)) CHECK(tcp_accept_some(ctx, a, deadline, peer));
  *out = c;
  return ncclSuccess;
fail:
  if (c) tcp_transport.close(&c->base);
  return res;
}

ncclResult_t tcp_connect_recv_try(struct transport_ctx* ctx, int peer, int channel,
                                  struct transport_conn** inout) {
  ncclResult_t res = ncclSuccess;
  struct tcp_conn* c = (struct tcp_conn*)*inout;
  struct transport_accept* a = NULL;
  CHECK(tcp_accept_get(ctx, &a));
  if (c == NULL) {
    CHECK(tcp_conn_alloc(peer, 0, 0, &c));
    c->waits = ctx->waits;
    *inout = &c->base;
  }
  pthread_mutex_lock(&a->lock);
  res = tcp_accept_now(a);
  pthread_mutex_unlock(&a->lock);
  if (res != ncclSuccess) goto fail;
  if (!tcp_claimed_all(a, c, channel)) return ncclInProgress;
  for (int s = 0; s < c->nsocks; s++) CHECK(tcp_sock_ready(ctx, c->socks[s].fd));
  INFO(SUB_NET | SUB_INIT, "Channel %d: accepted rank %d via NET/Socket with %d sockets", channel,
       peer, c->nsocks);
  return ncclSuccess;
fail:
  if (*inout) tcp_transport.close(*inout);
  *inout = NULL;
  return res;
}

/* The receive side's sockets, in the progress engine's epoll set. */
static ncclResult_t tcp_answer(struct transport_ctx* ctx, int peer, int channel,
                               struct tcp_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct tcp_conn* c = NULL;
  CHECK(tcp_gather(ctx, peer, channel, &c));
  for (int s = 0; s < c->nsocks; s++) CHECK(tcp_sock_ready(ctx, c->socks[s].fd));
  *out = c;
  return ncclSuccess;
fail:
  if (c) tcp_transport.close(&c->base);
  return res;
}

/* Dial (send side) or answer (receive side) the sockets with `peer`. */
static ncclResult_t tcp_open(struct transport_ctx* ctx, int peer, int channel, int dial, int duplex,
                             struct tcp_conn** out) {
  ncclResult_t res = dial ? tcp_dial(ctx, peer, channel, out) : tcp_answer(ctx, peer, channel, out);
  if (res != ncclSuccess) return res;
  INFO(SUB_NET | SUB_INIT, "Channel %d: %s rank %d via NET/Socket with %d%s sockets", channel,
       dial ? "connected to" : "accepted", peer, (*out)->nsocks, duplex ? " duplex" : "");
  return ncclSuccess;
}

static ncclResult_t tcp_connect_simplex(struct transport_ctx* ctx, int peer, int channel, int dial,
                                        struct transport_conn** out) {
  struct tcp_conn* c = NULL;
  ncclResult_t res = tcp_open(ctx, peer, channel, dial, 0, &c);
  if (res == ncclSuccess) *out = &c->base;
  return res;
}

ncclResult_t tcp_connect_send(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out) {
  return tcp_connect_simplex(ctx, peer, channel, 1, out);
}

ncclResult_t tcp_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out) {
  return tcp_connect_simplex(ctx, peer, channel, 0, out);
}

/* The other direction over c's sockets; the pair closes them once. */
static ncclResult_t tcp_twin(struct tcp_conn* c, struct tcp_conn** out) {
  struct tcp_conn* t = NULL;
  if (tcp_conn_alloc(c->base.peer, !c->base.is_send, c->nsocks, &t) != ncclSuccess)
    return ncclSystemError;
  t->waits = c->waits;
  for (int s = 0; s < c->nsocks; s++) t->socks[s].fd = c->socks[s].fd;
  t->twin = c;
  c->twin = t;
  *out = t;
  return ncclSuccess;
}

/* Both directions with `peer` over one set of sockets. The lower rank
 * dials in the send phase (never waits); the higher answers in the receive
 * phase; in the other phase this returns with nothing made. */
ncclResult_t tcp_connect_duplex(struct transport_ctx* ctx, int peer, int channel, int send_phase,
                                struct transport_conn** send, struct transport_conn** recv) {
  ncclResult_t res = ncclSuccess;
  struct tcp_conn *c = NULL, *t = NULL;
  int dial = ctx->rank < peer;
  if (dial != send_phase) return ncclSuccess;
  CHECK(tcp_open(ctx, peer, channel, dial, 1, &c));
  CHECK(tcp_twin(c, &t));
  *send = dial ? &c->base : &t->base;
  *recv = dial ? &t->base : &c->base;
  return ncclSuccess;
fail:
  if (c) tcp_transport.close(&c->base);
  return res;
}

/* ---- Out-of-band sockets for other transports (tcp.h) ---- */

ncclResult_t tcp_oob_dial(struct transport_ctx* ctx, int peer, int channel, int* fd) {
  ncclResult_t res = ncclSuccess;
  union socket_addr addr;
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  struct tcp_hello h = {
      TCP_MAGIC, TCP_VERSION, ctx->secret, ctx->rank, peer, 0, 1, TCP_OOB_CHANNEL(channel), 0};
  const struct tcp_blob* b = transport_peer_blob(ctx, &tcp_transport, peer);
  *fd = -1;
  socket_addr_from_wire(&b->listen, &addr);
  CHECK(socket_connect(&addr, deadline, ctx->aborted, fd));
  res = socket_send_all(*fd, &h, sizeof(h), deadline, ctx->aborted);
  if (res != ncclSuccess) close(*fd), *fd = -1;
fail:
  return res;
}

ncclResult_t tcp_oob_answer(struct transport_ctx* ctx, int peer, int channel, int* fd) {
  ncclResult_t res = ncclSuccess;
  struct tcp_conn* c = NULL;
  CHECK(tcp_gather(ctx, peer, TCP_OOB_CHANNEL(channel), &c));
  *fd = c->socks[0].fd; /* the dialler sent one socket (nsocks 1) */
  c->socks[0].fd = -1;
  tcp_transport.close(&c->base);
fail:
  return res;
}

ncclResult_t transport_accept_share(struct transport_ctx* ctx) {
  struct transport_accept* a = NULL;
  return ctx->listen_fd >= 0 ? tcp_accept_get(ctx, &a) : ncclSuccess;
}

void transport_accept_free(struct transport_ctx* ctx) {
  struct transport_accept* a = ctx->accept;
  if (a == NULL) return;
  while (a->parked) {
    struct tcp_parked* p = a->parked;
    a->parked = p->next;
    close(p->fd);
    free(p);
  }
  hello_pool_free(&a->pool);
  pthread_mutex_destroy(&a->lock);
  free(a);
  ctx->accept = NULL;
}
