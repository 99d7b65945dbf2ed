/*
 * TCP transport: several sockets per peer, large messages striped across
 * them, small ones rotated. Every socket opens with a hello carrying the
 * comm's secret; non-blocking I/O is driven by the progress engine.
 *
 * The collective channel is duplex: the lower rank of a pair dials, and
 * both directions share those sockets. Collectives exchange with every
 * peer both ways (recursive doubling, trees), so each message's ACK rides
 * on the data coming back instead of being a packet of its own - half the
 * packets, and half the kernel work, per small all-reduce. Point-to-point
 * keeps one connection per direction: its two sides need not both exist.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "param.h"
#include "socket.h"
#include "transport.h"

#define TCP_MAGIC 0x50435442u /* "BTCP" */
#define TCP_VERSION 3u        /* 3: the collective channel is duplex */
#define TCP_MAX_SOCKS 64
/* Below this many bytes per socket a message travels whole on one socket:
 * striping it would cost more syscalls than it saves. */
#define TCP_STRIPE_MIN (64 * 1024)
#define TCP_HELLO_MS 2000

struct tcp_hello {
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  int32_t from;
  int32_t to;
  int32_t sock_idx;
  int32_t nsocks;
  int32_t channel;
  int32_t reserved;
};

/* An accepted socket whose hello names a peer nobody asked for yet. */
struct transport_parked {
  int fd;
  struct tcp_hello hello;
  struct transport_parked* next;
};

struct tcp_msg {
  char* buf;
  size_t bytes;
  int parts_left;
};

struct tcp_sock {
  int fd;
  uint64_t cursor; /* message this socket works on */
  size_t done;     /* bytes of its part of that message already moved */
};

struct tcp_conn {
  struct transport_conn base;
  struct transport_waits* waits; /* the comm's: a blocked conn counts itself there */
  struct tcp_conn* twin;         /* duplex: the other direction on the same sockets */
  int nsocks;
  struct tcp_sock socks[TCP_MAX_SOCKS];
  struct tcp_msg msgs[TRANSPORT_MAX_INFLIGHT];
};

/* The byte range [lo, hi) of message `seq` carried by socket `s`. Both
 * sides compute it from the same numbers, so no framing goes on the wire. */
static void tcp_part(const struct tcp_conn* c, uint64_t seq, size_t bytes, int s, size_t* lo,
                     size_t* hi) {
  int ns = c->nsocks;
  if (bytes < (size_t)ns * TCP_STRIPE_MIN) {
    int owner = (int)(seq % (uint64_t)ns);
    *lo = 0;
    *hi = (s == owner) ? bytes : 0;
    return;
  }
  size_t part = ALIGN_UP(DIV_UP(bytes, (size_t)ns), 64);
  *lo = MIN((size_t)s * part, bytes);
  *hi = MIN(*lo + part, bytes);
}

static int tcp_nparts(const struct tcp_conn* c, uint64_t seq, size_t bytes) {
  int n = 0;
  for (int s = 0; s < c->nsocks; s++) {
    size_t lo, hi;
    tcp_part(c, seq, bytes, s, &lo, &hi);
    n += hi > lo;
  }
  return n;
}

static ncclResult_t tcp_register(struct transport_ctx* ctx, int fd) {
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data = {0}};
  if (epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    WARN("NET/Socket : epoll_ctl failed: %s", strerror(errno));
    return ncclSystemError;
  }
  return ncclSuccess;
}

static ncclResult_t tcp_conn_alloc(int peer, int is_send, int nsocks, struct tcp_conn** out) {
  struct tcp_conn* c = calloc(1, sizeof(*c));
  if (c == NULL) {
    WARN("NET/Socket : out of memory");
    return ncclSystemError;
  }
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
  socket_addr_from_wire(&ctx->peers[peer].listen, &addr);
  for (int s = 0; s < ns; s++) {
    struct tcp_hello h = {TCP_MAGIC, TCP_VERSION, ctx->secret, ctx->rank, peer, s, ns, channel, 0};
    CHECK(socket_connect(&addr, deadline, ctx->aborted, &c->socks[s].fd));
    CHECK(socket_send_all(c->socks[s].fd, &h, sizeof(h), deadline, ctx->aborted));
    socket_tune_data(c->socks[s].fd, (int)param_sock_buf());
    CHECK(tcp_register(ctx, c->socks[s].fd));
  }
  *out = c;
  return ncclSuccess;
fail:
  if (c) tcp_transport.close(&c->base);
  return res;
}

static const char* tcp_hello_problem(const struct transport_ctx* ctx, const struct tcp_hello* h) {
  if (h->magic != TCP_MAGIC || h->version != TCP_VERSION) return "not a Braid connection";
  if (h->secret != ctx->secret) return "wrong secret";
  if (h->to != ctx->rank || h->from < 0 || h->from >= ctx->nranks) return "wrong ranks";
  if (h->nsocks < 1 || h->nsocks > TCP_MAX_SOCKS || h->sock_idx < 0 || h->sock_idx >= h->nsocks)
    return "bad socket numbering";
  if (h->channel < 0 || h->channel > 1) return "bad channel";
  return NULL;
}

/* Accept one connection; returns it parked (valid) or closes it (stranger). */
static ncclResult_t tcp_accept_one(struct transport_ctx* ctx, uint64_t deadline) {
  ncclResult_t res = ncclSuccess;
  struct transport_parked* p = NULL;
  int fd = -1;
  /* abortable: ncclCommAbort sets ctx->aborted */
  CHECK(socket_wait(ctx->listen_fd, POLLIN, deadline, ctx->aborted, "accept a peer's connection"));
  fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return ncclSuccess; /* gone before we got to it: wait again */
  p = calloc(1, sizeof(*p));
  if (p == NULL) FAIL(ncclSystemError, "NET/Socket : out of memory");
  const char* why = NULL;
  if (socket_recv_all(fd, &p->hello, sizeof(p->hello), MIN(deadline, socket_deadline(TCP_HELLO_MS)),
                      ctx->aborted))
    why = "no complete hello";
  else
    why = tcp_hello_problem(ctx, &p->hello);
  if (why) {
    WARN("NET/Socket : refused an incoming connection (%s)", why);
    close(fd);
    free(p);
    return ncclSuccess;
  }
  p->fd = fd;
  p->next = ctx->parked;
  ctx->parked = p;
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  free(p);
  return res;
}

/* Move parked sockets from `peer` into the connection; count what is there. */
static int tcp_claim_parked(struct transport_ctx* ctx, struct tcp_conn* c, int channel) {
  struct transport_parked** pp = &ctx->parked;
  while (*pp) {
    struct transport_parked* p = *pp;
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

/* Take the sockets `peer` dialled, accepting until all have come; `c` is
 * a receive conn. */
static ncclResult_t tcp_answer(struct transport_ctx* ctx, int peer, int channel,
                               struct tcp_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct tcp_conn* c = NULL;
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  CHECK(tcp_conn_alloc(peer, 0, 0, &c));
  c->waits = ctx->waits;
  /* Sockets from this peer may have arrived while we waited for another. */
  while (tcp_claim_parked(ctx, c, channel) < c->nsocks || c->nsocks == 0)
    CHECK(tcp_accept_one(ctx, deadline));
  for (int s = 0; s < c->nsocks; s++) {
    socket_tune_data(c->socks[s].fd, (int)param_sock_buf());
    CHECK(tcp_register(ctx, c->socks[s].fd));
  }
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

static ncclResult_t tcp_connect_send(struct transport_ctx* ctx, int peer, int channel,
                                     struct transport_conn** out) {
  return tcp_connect_simplex(ctx, peer, channel, 1, out);
}

static ncclResult_t tcp_connect_recv(struct transport_ctx* ctx, int peer, int channel,
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
static ncclResult_t tcp_connect_duplex(struct transport_ctx* ctx, int peer, int channel,
                                       int send_phase, struct transport_conn** send,
                                       struct transport_conn** recv) {
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

void transport_parked_free(struct transport_ctx* ctx) {
  while (ctx->parked) {
    struct transport_parked* p = ctx->parked;
    ctx->parked = p->next;
    close(p->fd);
    free(p);
  }
}

static ncclResult_t tcp_post(struct transport_conn* base, void* buf, size_t bytes) {
  struct tcp_conn* c = (struct tcp_conn*)base;
  uint64_t seq = base->posted;
  struct tcp_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  if (seq - base->completed >= TRANSPORT_MAX_INFLIGHT) {
    WARN("NET/Socket : too many messages in flight to rank %d", base->peer);
    return ncclInternalError;
  }
  m->buf = buf;
  m->bytes = bytes;
  m->parts_left = tcp_nparts(c, seq, bytes);
  base->posted++;
  return ncclSuccess;
}

/* One send() or recv() on a socket; returns bytes moved, 0 for "would
 * block", -1 on error (after a WARN). */
static ssize_t tcp_io(struct tcp_conn* c, int fd, char* p, size_t len) {
  ssize_t n = c->base.is_send ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                              : recv(fd, p, len, MSG_DONTWAIT);
  if (n > 0) return n;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (n == 0)
    WARN("NET/Socket : connection closed by rank %d (peer died or aborted)", c->base.peer);
  else
    WARN("NET/Socket : %s rank %d failed: %s", c->base.is_send ? "send to" : "recv from",
         c->base.peer, strerror(errno));
  return -1;
}

/* Drive one socket through the messages it carries until it would block. */
static ncclResult_t tcp_sock_progress(struct tcp_conn* c, struct tcp_sock* s, int idx,
                                      int* progressed) {
  while (s->cursor < c->base.posted) {
    struct tcp_msg* m = &c->msgs[s->cursor % TRANSPORT_MAX_INFLIGHT];
    size_t lo, hi;
    tcp_part(c, s->cursor, m->bytes, idx, &lo, &hi);
    if (s->done < hi - lo) {
      ssize_t n = tcp_io(c, s->fd, m->buf + lo + s->done, hi - lo - s->done);
      if (n < 0) return ncclRemoteError;
      if (n == 0) return ncclSuccess;
      s->done += (size_t)n;
      *progressed = 1;
      if (s->done < hi - lo) continue;
      m->parts_left--;
    }
    s->cursor++;
    s->done = 0;
  }
  return ncclSuccess;
}

static ncclResult_t tcp_progress(struct transport_conn* base, int* progressed) {
  struct tcp_conn* c = (struct tcp_conn*)base;
  for (int s = 0; s < c->nsocks; s++) {
    ncclResult_t res = tcp_sock_progress(c, &c->socks[s], s, progressed);
    if (res != ncclSuccess) return res;
  }
  while (base->completed < base->posted &&
         c->msgs[base->completed % TRANSPORT_MAX_INFLIGHT].parts_left == 0)
    base->completed++;
  if (base->completed < base->posted) transport_wait_on_fd(c->waits);
  return ncclSuccess;
}

static void tcp_shutdown(struct transport_conn* base) {
  struct tcp_conn* c = (struct tcp_conn*)base;
  for (int s = 0; s < TCP_MAX_SOCKS; s++)
    if (c->socks[s].fd >= 0) shutdown(c->socks[s].fd, SHUT_RDWR);
}

static void tcp_close(struct transport_conn* base) {
  struct tcp_conn* c = (struct tcp_conn*)base;
  if (c->twin) { /* duplex: the twin still uses the sockets and closes them */
    c->twin->twin = NULL;
    free(c);
    return;
  }
  for (int s = 0; s < TCP_MAX_SOCKS; s++)
    if (c->socks[s].fd >= 0) close(c->socks[s].fd);
  free(c);
}

const struct transport tcp_transport = {
    .name = "NET/Socket",
    .connect_send = tcp_connect_send,
    .connect_recv = tcp_connect_recv,
    .connect_duplex = tcp_connect_duplex,
    .post = tcp_post,
    .progress = tcp_progress,
    .shutdown = tcp_shutdown,
    .close = tcp_close,
};
