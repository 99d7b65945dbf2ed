/*
 * The loop transport: ranks of one host joined by Unix-domain stream
 * sockets in the abstract namespace, one socket per (peer, channel,
 * direction), each message behind a frame (sequence number, size, call)
 * that the receiver checks before it takes a byte of the payload.
 *
 * It exists to prove a claim of docs/architecture.md: adding a transport
 * is its own file (or folder) and one row. Everything the library needs to
 * know of it is the descriptor at the end: its id and key, its blob (where
 * its listener is), which pairs it joins, the link kind the tuner prices,
 * its operations. Nothing else in the library names it.
 */
#include "loop_transport.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "core.h"
#include "hello_pool.h"
#include "host.h"
#include "socket.h"

#define LOOP_MAGIC 0x504f4f4cu /* "LOOP" */

/* What a rank publishes: the abstract name its listener is bound to
 * (0: none, so no pair with it uses this transport). */
struct loop_blob {
  uint64_t name;
};

/* The first bytes on every socket: who dials whom, for which channel,
 * and the data secret, so a stranger's connection is refused. */
struct loop_hello {
  uint32_t magic;
  int32_t from;
  int32_t to;
  int32_t channel;
  uint64_t secret;
};

struct loop_frame {
  uint64_t seq;
  uint64_t bytes;
  struct transport_tag tag;
};

/* A connection that arrived for another (peer, channel) than the one
 * being accepted: kept until its own connect_recv. */
struct loop_parked {
  int fd;
  int peer;
  int channel;
  struct loop_parked* next;
};

/* Per comm (ctx->state[LOOP_TRANSPORT_ID]): the listener, its hellos read
 * side by side (common/hello_pool: a stranger that connects and says
 * nothing delays nobody), and the connections parked, which every thread
 * of the comm may accept. */
#define LOOP_HELLO_MS 1000  /* a hello follows the connect at once */
#define LOOP_MAX_PENDING 64 /* connections still saying hello */
struct loop_state {
  int listen_fd;
  pthread_mutex_t lock;
  struct hello_pool pool;
  const struct transport_ctx* ctx; /* the hellos' checks: while the lock is held */
  struct loop_parked* parked;
};

struct loop_msg {
  char* buf;
  size_t bytes;
  struct transport_tag tag;
};

struct loop_conn {
  struct transport_conn base;
  struct transport_waits* waits;
  int fd;
  size_t done; /* bytes of the current message's frame and payload moved */
  struct loop_frame frame;
  struct loop_msg msgs[TRANSPORT_MAX_INFLIGHT];
};

static _Atomic uint64_t g_messages; /* a test's counter, not the library's state */

uint64_t loop_transport_messages(void) {
  return atomic_load(&g_messages);
}

static socklen_t loop_address(uint64_t name, struct sockaddr_un* a) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  /* sun_path[0] is 0: the abstract namespace, no file to clean up */
  int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "braid-loop-%016llx",
                   (unsigned long long)name);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ---- setup ---- */

static ncclResult_t loop_blob_make(struct transport_ctx* ctx, void* blob) {
  ncclResult_t res = ncclSuccess;
  struct loop_blob* b = blob;
  struct loop_state* s = NULL;
  struct sockaddr_un a;
  CHECK(braid_calloc(&s, 1, sizeof(*s)));
  s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->listen_fd < 0) FAIL(ncclSystemError, "LOOP : socket failed: %s", strerror(errno));
  b->name = host_random64() | 1;
  if (bind(s->listen_fd, (struct sockaddr*)&a, loop_address(b->name, &a)) != 0 ||
      listen(s->listen_fd, 128) != 0)
    FAIL(ncclSystemError, "LOOP : cannot listen on %s: %s", a.sun_path + 1, strerror(errno));
  CHECK(hello_pool_init(&s->pool, "LOOP", s->listen_fd, sizeof(struct loop_hello), LOOP_HELLO_MS,
                        LOOP_MAX_PENDING));
  pthread_mutex_init(&s->lock, NULL);
  ctx->state[LOOP_TRANSPORT_ID] = s;
  return ncclSuccess;
fail:
  if (s && s->listen_fd >= 0) close(s->listen_fd);
  free(s);
  return res;
}

/* Pairs of one host whose ranks both listen. */
static int loop_can_connect(const struct transport_ctx* ctx, int a, int b) {
  const struct loop_blob *ba = transport_peer_blob(ctx, &loop_transport, a),
                         *bb = transport_peer_blob(ctx, &loop_transport, b);
  return ba->name != 0 && bb->name != 0 && ctx->peers[a].host_hash == ctx->peers[b].host_hash;
}

static ncclResult_t loop_conn_make(struct transport_ctx* ctx, int peer, int is_send, int fd,
                                   struct transport_conn** out) {
  struct loop_conn* c = NULL;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data = {0}};
  ncclResult_t res = braid_calloc(&c, 1, sizeof(*c));
  if (res != ncclSuccess) return res;
  if (epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    WARN("LOOP : epoll_ctl failed: %s", strerror(errno));
    free(c);
    return ncclSystemError;
  }
  c->base.ops = &loop_transport;
  c->base.peer = peer;
  c->base.is_send = is_send;
  c->waits = ctx->waits;
  c->fd = fd;
  *out = &c->base;
  return ncclSuccess;
}

static ncclResult_t loop_connect_send(struct transport_ctx* ctx, int peer, int channel,
                                      struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  const struct loop_blob* b = transport_peer_blob(ctx, &loop_transport, peer);
  struct loop_hello h = {LOOP_MAGIC, ctx->rank, peer, channel, ctx->secret};
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  struct sockaddr_un a;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) FAIL(ncclSystemError, "LOOP : socket failed: %s", strerror(errno));
  if (connect(fd, (struct sockaddr*)&a, loop_address(b->name, &a)) != 0)
    FAIL(ncclSystemError, "LOOP : connect to rank %d failed: %s", peer, strerror(errno));
  CHECK(socket_send_all(fd, &h, sizeof(h), deadline, ctx->aborted));
  CHECK(loop_conn_make(ctx, peer, 1, fd, out));
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  return res;
}

/* Take the parked connection of (peer, channel), -1 if none. */
static int loop_unpark(struct loop_state* s, int peer, int channel) {
  for (struct loop_parked** p = &s->parked; *p; p = &(*p)->next) {
    if ((*p)->peer != peer || (*p)->channel != channel) continue;
    struct loop_parked* hit = *p;
    int fd = hit->fd;
    *p = hit->next;
    free(hit);
    return fd;
  }
  return -1;
}

/* A whole hello (hello_pool): parked by who sent it, or, not ours (a
 * stranger, another comm's secret), closed. */
static void loop_on_hello(void* arg, int fd, const void* bytes) {
  struct loop_state* s = arg;
  const struct transport_ctx* ctx = s->ctx;
  struct loop_hello h;
  struct loop_parked* p = NULL;
  memcpy(&h, bytes, sizeof(h));
  if (h.magic != LOOP_MAGIC || h.secret != ctx->secret || h.to != ctx->rank || h.from < 0 ||
      h.from >= ctx->nranks || braid_calloc(&p, 1, sizeof(*p)) != ncclSuccess) {
    hello_pool_log_refusal(&s->pool, "not one of this comm's ranks");
    close(fd);
    return;
  }
  *p = (struct loop_parked){fd, h.from, h.channel, s->parked};
  s->parked = p;
}

/* Accept what waits and read what the pending connections sent, without
 * waiting (the lock held). */
static void loop_hear(struct transport_ctx* ctx, struct loop_state* s) {
  struct pollfd p[1 + LOOP_MAX_PENDING];
  int n = hello_pool_pollfds(&s->pool, p);
  if (poll(p, (nfds_t)n, 0) <= 0) return;
  s->ctx = ctx;
  hello_pool_service(&s->pool, p, n, loop_on_hello, s);
}

static ncclResult_t loop_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                                      struct transport_conn** out) {
  struct loop_state* s = ctx->state[LOOP_TRANSPORT_ID];
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  for (;;) {
    pthread_mutex_lock(&s->lock);
    int fd = loop_unpark(s, peer, channel);
    if (fd < 0) loop_hear(ctx, s);
    if (fd < 0) fd = loop_unpark(s, peer, channel);
    pthread_mutex_unlock(&s->lock);
    if (fd >= 0) {
      ncclResult_t res = loop_conn_make(ctx, peer, 0, fd, out);
      if (res != ncclSuccess) close(fd);
      return res;
    }
    /* nothing for us yet: wait for the listener, briefly (another thread
     * may take what arrives and park ours) */
    if (ctx->aborted && atomic_load(ctx->aborted)) {
      WARN("LOOP : communicator aborted while accepting rank %d", peer);
      return ncclSystemError;
    }
    if (braid_now_ns() >= deadline) {
      WARN("LOOP : rank %d never connected on channel %d", peer, channel);
      return ncclSystemError;
    }
    struct pollfd p = {s->listen_fd, POLLIN, 0};
    poll(&p, 1, 10);
  }
}

static void loop_free_state(struct transport_ctx* ctx) {
  struct loop_state* s = ctx->state[LOOP_TRANSPORT_ID];
  while (s->parked) close(loop_unpark(s, s->parked->peer, s->parked->channel));
  hello_pool_free(&s->pool);
  close(s->listen_fd);
  pthread_mutex_destroy(&s->lock);
  free(s);
  ctx->state[LOOP_TRANSPORT_ID] = NULL;
}

/* ---- data path ---- */

static ncclResult_t loop_post(struct transport_conn* base, const struct transport_buf* b,
                              const struct transport_tag* tag) {
  struct loop_conn* c = (struct loop_conn*)base;
  struct loop_msg* m = &c->msgs[base->posted % TRANSPORT_MAX_INFLIGHT];
  if (base->posted - base->completed >= TRANSPORT_MAX_INFLIGHT) {
    WARN("LOOP : too many messages in flight to rank %d", base->peer);
    return ncclInternalError;
  }
  if (!transport_moves(base, b)) return ncclInternalError;
  m->buf = b->ptr;
  m->bytes = b->bytes;
  memset(&m->tag, 0, sizeof(m->tag));
  if (tag) m->tag = *tag;
  base->posted++;
  return ncclSuccess;
}

/* One sendmsg or recvmsg of what is left of the current message: bytes
 * moved, 0 for "would block", -1 on error (after a WARN). A receiver reads
 * the frame alone first, so the call is checked before the payload lands. */
static ssize_t loop_io(struct loop_conn* c, struct loop_msg* m) {
  struct iovec iov[2];
  struct msghdr mh = {.msg_iov = iov};
  size_t fb = sizeof(c->frame);
  if (c->done < fb) iov[mh.msg_iovlen++] = (struct iovec){(char*)&c->frame + c->done, fb - c->done};
  if (c->done >= fb || c->base.is_send)
    iov[mh.msg_iovlen++] = (struct iovec){m->buf + (c->done > fb ? c->done - fb : 0),
                                          m->bytes - (c->done > fb ? c->done - fb : 0)};
  ssize_t n = c->base.is_send ? sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT)
                              : recvmsg(c->fd, &mh, MSG_DONTWAIT);
  if (n > 0) return n;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  WARN("LOOP : %s rank %d failed: %s", c->base.is_send ? "send to" : "recv from", c->base.peer,
       n == 0 ? "connection closed" : strerror(errno));
  return -1;
}

static ncclResult_t loop_progress(struct transport_conn* base, int* progressed) {
  struct loop_conn* c = (struct loop_conn*)base;
  size_t fb = sizeof(c->frame);
  while (base->completed < base->posted) {
    struct loop_msg* m = &c->msgs[base->completed % TRANSPORT_MAX_INFLIGHT];
    if (c->done == 0 && base->is_send)
      c->frame = (struct loop_frame){base->completed, m->bytes, m->tag};
    size_t before = c->done;
    ssize_t n = loop_io(c, m);
    if (n < 0) return ncclRemoteError;
    if (n == 0) break;
    c->done += (size_t)n;
    *progressed = 1;
    if (!base->is_send && before < fb && c->done >= fb) {
      ncclResult_t res = transport_check_message(base, c->frame.seq, c->frame.bytes, &c->frame.tag,
                                                 base->completed, m->bytes, &m->tag);
      if (res != ncclSuccess) return res;
    }
    if (c->done < fb + m->bytes) continue;
    c->done = 0;
    base->completed++;
    atomic_fetch_add(&g_messages, 1);
  }
  if (base->completed < base->posted) transport_wait_on_fd(c->waits);
  return ncclSuccess;
}

static void loop_shutdown(struct transport_conn* base) {
  shutdown(((struct loop_conn*)base)->fd, SHUT_RDWR);
}

static void loop_close(struct transport_conn* base) {
  close(((struct loop_conn*)base)->fd); /* closing drops it from the epoll set */
  free(base);
}

const struct transport loop_transport = {
    .name = "LOOP",
    .key = "loop",
    .id = LOOP_TRANSPORT_ID,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_WAKE_FD,
    .link = TRANSPORT_LINK_MEMORY,
    .can_connect = loop_can_connect,
    .blob_bytes = sizeof(struct loop_blob),
    .blob_make = loop_blob_make,
    .connect_send = loop_connect_send,
    .connect_recv = loop_connect_recv,
    .post = loop_post,
    .progress = loop_progress,
    .shutdown = loop_shutdown,
    .close = loop_close,
    .free_state = loop_free_state,
};
