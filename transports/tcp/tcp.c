/*
 * TCP data path: posting messages, and moving each socket's frames and
 * parts without blocking when the progress engine says it can. A message
 * below TCP_STRIPE_MIN bytes per socket travels whole on one socket (the
 * sockets take turns); a larger one is striped over all of them. Every
 * part goes behind a frame (sequence number, size, call) that the receiver
 * checks before it takes the bytes, so a receive never serves another
 * message's bytes: a size or call that differs is an error on the spot.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "socket.h"
#include "tcp.h"
#include "tcp_connect.h"

#define TCP_FRAME_BYTES sizeof(struct tcp_frame)

/* The byte range [lo, hi) of message `seq` that socket `s` carries, and
 * whether it carries a frame for it at all (a small message's one socket
 * does, even for 0 bytes). Both sides compute it from their own posted
 * size: where they disagree, the frame says so. */
static int tcp_part(const struct tcp_conn* c, uint64_t seq, size_t bytes, int s, size_t* lo,
                    size_t* hi) {
  int ns = c->nsocks;
  if (bytes < (size_t)ns * TCP_STRIPE_MIN) {
    int owner = (int)(seq % (uint64_t)ns);
    *lo = 0;
    *hi = (s == owner) ? bytes : 0;
    return s == owner;
  }
  size_t part = ALIGN_UP(DIV_UP(bytes, (size_t)ns), 64);
  *lo = MIN((size_t)s * part, bytes);
  *hi = MIN(*lo + part, bytes);
  return *hi > *lo;
}

static int tcp_nparts(const struct tcp_conn* c, uint64_t seq, size_t bytes) {
  int n = 0;
  for (int s = 0; s < c->nsocks; s++) {
    size_t lo, hi;
    n += tcp_part(c, seq, bytes, s, &lo, &hi);
  }
  return n;
}

/* A one-way sending socket never receives: readable means the receiver
 * shut it down (it failed: a message it got was not the one it posted) or
 * died. Checked before each message, so a sender hears of it at its next
 * send instead of writing on into a connection nobody reads. */
static int tcp_receiver_gone(const struct tcp_conn* c, uint64_t seq) {
  char b;
  if (!c->base.is_send || c->twin) return 0; /* duplex: the receive side sees it */
  int fd = c->socks[seq % (uint64_t)c->nsocks].fd;
  ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static ncclResult_t tcp_post(struct transport_conn* base, const struct transport_buf* b,
                             const struct transport_tag* tag) {
  struct tcp_conn* c = (struct tcp_conn*)base;
  uint64_t seq = base->posted;
  size_t bytes = b->bytes;
  struct tcp_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  if (seq - base->completed >= TRANSPORT_MAX_INFLIGHT) {
    WARN("NET/Socket : too many messages in flight to rank %d", base->peer);
    return ncclInternalError;
  }
  if (tcp_receiver_gone(c, seq)) {
    WARN("NET/Socket : rank %d closed its connection (it failed, aborted or died)", base->peer);
    return ncclRemoteError;
  }
  if (!transport_moves(base, b)) return ncclInternalError;
  m->buf = b->ptr;
  m->bytes = bytes;
  m->parts_left = tcp_nparts(c, seq, bytes);
  if (tag)
    m->tag = *tag;
  else
    memset(&m->tag, 0, sizeof(m->tag));
  base->posted++;
  return ncclSuccess;
}

/* One sendmsg() or recvmsg() of what is left of a frame and its part:
 * returns bytes moved, 0 for "would block", -1 on error (after a WARN). */
static ssize_t tcp_io(struct tcp_conn* c, struct tcp_sock* s, char* part, size_t len) {
  struct iovec iov[2];
  struct msghdr mh = {.msg_iov = iov};
  size_t done = s->done;
  int header = done < TCP_FRAME_BYTES;
  if (header) {
    iov[mh.msg_iovlen++] = (struct iovec){(char*)&s->frame + done, TCP_FRAME_BYTES - done};
    done = TCP_FRAME_BYTES;
  }
  /* A receiver takes the frame's header alone: its call is checked before
   * a byte of the payload lands in the buffer. */
  if (len > done - TCP_FRAME_BYTES && (c->base.is_send || !header))
    iov[mh.msg_iovlen++] =
        (struct iovec){part + (done - TCP_FRAME_BYTES), len - (done - TCP_FRAME_BYTES)};
  ssize_t n = c->base.is_send ? sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT)
                              : recvmsg(s->fd, &mh, MSG_DONTWAIT);
  if (n > 0) return n;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (n == 0)
    WARN("NET/Socket : connection closed by rank %d (peer died or aborted)", c->base.peer);
  else
    WARN("NET/Socket : %s rank %d failed: %s", c->base.is_send ? "send to" : "recv from",
         c->base.peer, strerror(errno));
  return -1;
}

/* Move one socket's frames until it would block or has none left. */
static ncclResult_t tcp_sock_write_read(struct tcp_conn* c, struct tcp_sock* s, int idx,
                                        int* progressed) {
  while (s->cursor < c->base.posted) {
    struct tcp_msg* m = &c->msgs[s->cursor % TRANSPORT_MAX_INFLIGHT];
    size_t lo, hi;
    if (!tcp_part(c, s->cursor, m->bytes, idx, &lo, &hi)) {
      s->cursor++;
      continue;
    }
    if (s->done == 0 && c->base.is_send) s->frame = (struct tcp_frame){s->cursor, m->bytes, m->tag};
    size_t before = s->done, total = TCP_FRAME_BYTES + (hi - lo);
    ssize_t n = tcp_io(c, s, m->buf + lo, hi - lo);
    if (n < 0) return ncclRemoteError;
    if (n == 0) return ncclSuccess;
    s->done += (size_t)n;
    *progressed = 1;
    if (!c->base.is_send && before < TCP_FRAME_BYTES && s->done >= TCP_FRAME_BYTES) {
      ncclResult_t res = transport_check_message(&c->base, s->frame.seq, s->frame.msg_bytes,
                                                 &s->frame.tag, s->cursor, m->bytes, &m->tag);
      if (res != ncclSuccess) return res;
    }
    if (s->done < total) continue;
    m->parts_left--;
    s->cursor++;
    s->done = 0;
    s->unpushed = c->base.is_send;
  }
  return ncclSuccess;
}

/* Drive one socket through the messages it carries until it would block.
 * A sender that wrote the last byte of everything posted pushes it out:
 * nothing follows soon to fill the segment the kernel holds back
 * (socket_push), so only then is a push worth its system call. */
static ncclResult_t tcp_sock_progress(struct tcp_conn* c, struct tcp_sock* s, int idx,
                                      int* progressed) {
  ncclResult_t res = tcp_sock_write_read(c, s, idx, progressed);
  if (res == ncclSuccess && c->base.is_send && s->done == 0 && s->unpushed &&
      s->cursor == c->base.posted) {
    socket_push(s->fd);
    s->unpushed = 0;
  }
  return res;
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

/* Sockets reach every rank: each announced where its listener accepts. */
static int tcp_can_connect(const struct transport_ctx* ctx, int a, int b) {
  (void)ctx, (void)a, (void)b;
  return 1;
}

const struct transport tcp_transport = {
    .name = "NET/Socket",
    .key = "tcp",
    .id = 3,
    .net_name = "Socket",
    .link = TRANSPORT_LINK_NETWORK,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_WAKE_FD,
    .can_connect = tcp_can_connect,
    .blob_bytes = sizeof(struct tcp_blob),
    .blob_make = tcp_blob_make,
    .connect_send = tcp_connect_send,
    .connect_recv = tcp_connect_recv,
    .connect_recv_try = tcp_connect_recv_try,
    .connect_duplex = tcp_connect_duplex,
    .post = tcp_post,
    .progress = tcp_progress,
    .shutdown = tcp_shutdown,
    .close = tcp_close,
};
