/*
 * Messages on the Unix-socket links between ranks of a node (cudaipc_fd.h):
 * SOCK_SEQPACKET, so a message and its fd arrive whole, in order, or not
 * at all. Making the links is cudaipc_fd_link.c's.
 */
#include "cudaipc_fd.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core.h"
#include "socket.h"

/* Room for one SCM_RIGHTS fd, aligned as a cmsghdr. */
union fd_ctl {
  char buf[CMSG_SPACE(sizeof(int))];
  struct cmsghdr align;
};

/* recvmsg without blocking. A peer that closed its end with our messages
 * unread resets the link, and the kernel reports that once, ahead of what
 * the peer sent before it went (its last word: a "fail" that names it),
 * which is still queued: so read on once past the reset, to those messages
 * and then the end of the link. */
static ssize_t fd_recvmsg(int link, struct msghdr* m) {
  ssize_t n = recvmsg(link, m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && errno == ECONNRESET) n = recvmsg(link, m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  return n;
}

static ncclResult_t fd_io(int link, struct msghdr* m, int sending, uint64_t deadline,
                          _Atomic int* aborted, ssize_t* got) {
  ncclResult_t res = ncclSuccess;
  for (;;) {
    ssize_t n = sending ? sendmsg(link, m, MSG_DONTWAIT | MSG_NOSIGNAL) : fd_recvmsg(link, m);
    if (n >= 0) {
      *got = n;
      return ncclSuccess;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      FAIL(ncclSystemError, "CUDA IPC: %s on the fd link: %s", sending ? "sendmsg" : "recvmsg",
           strerror(errno));
    CHECK(socket_wait(link, sending ? POLLOUT : POLLIN, deadline, aborted, "CUDA IPC fd link"));
  }
fail:
  return res;
}

/* A message of one iovec, with fd (unless < 0) in ctl beside it. */
static void fd_msg_out(struct msghdr* m, struct iovec* iov, union fd_ctl* ctl, int fd) {
  memset(m, 0, sizeof(*m));
  m->msg_iov = iov;
  m->msg_iovlen = 1;
  if (fd < 0) return;
  memset(ctl, 0, sizeof(*ctl));
  m->msg_control = ctl->buf;
  m->msg_controllen = sizeof(ctl->buf);
  struct cmsghdr* c = CMSG_FIRSTHDR(m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
}

static ncclResult_t fd_send_at(int link, const void* msg, size_t bytes, int fd, uint64_t deadline,
                               _Atomic int* aborted) {
  ncclResult_t res = ncclSuccess;
  union fd_ctl ctl;
  struct iovec iov = {(void*)msg, bytes};
  struct msghdr m;
  ssize_t n = 0;
  fd_msg_out(&m, &iov, &ctl, fd);
  CHECK(fd_io(link, &m, 1, deadline, aborted, &n));
  if ((size_t)n != bytes) FAIL(ncclSystemError, "CUDA IPC: a short send on the fd link");
fail:
  return res;
}

ncclResult_t cudaipc_fd_send(int link, const void* msg, size_t bytes, int fd, int64_t timeout_ms,
                             _Atomic int* aborted) {
  return fd_send_at(link, msg, bytes, fd, socket_deadline(timeout_ms), aborted);
}

int cudaipc_fd_try_send(int link, const void* msg, size_t bytes) {
  return send(link, msg, bytes, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)bytes ? 0 : -1;
}

int cudaipc_fd_closed(int link) {
  char c;
  ssize_t n = recv(link, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE));
}

/* What recvmsg got (n bytes of `bytes` expected): the fd beside it into
 * *fd; a closed link or a message of another size is an error. */
static ncclResult_t fd_msg_in(struct msghdr* m, ssize_t n, size_t bytes, int* fd) {
  ncclResult_t res = ncclSuccess;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      memcpy(fd, CMSG_DATA(c), sizeof(int));
  if (n == 0) FAIL(ncclSystemError, "CUDA IPC: the peer closed its fd link");
  if ((size_t)n != bytes || (m->msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    if (*fd >= 0) close(*fd), *fd = -1;
    FAIL(ncclSystemError, "CUDA IPC: a message of %zd bytes on the fd link, %zu expected", n,
         bytes);
  }
fail:
  return res;
}

ncclResult_t cudaipc_fd_recv(int link, void* msg, size_t bytes, int* fd, int64_t timeout_ms,
                             _Atomic int* aborted) {
  ncclResult_t res = ncclSuccess;
  union fd_ctl ctl;
  struct iovec iov = {msg, bytes};
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
  ssize_t n = 0;
  *fd = -1;
  CHECK(fd_io(link, &m, 0, socket_deadline(timeout_ms), aborted, &n));
  CHECK(fd_msg_in(&m, n, bytes, fd));
fail:
  return res;
}

int cudaipc_fd_post(int link, const void* msg, size_t bytes, int fd) {
  union fd_ctl ctl;
  struct iovec iov = {(void*)msg, bytes};
  struct msghdr m;
  fd_msg_out(&m, &iov, &ctl, fd);
  ssize_t n = sendmsg(link, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n == (ssize_t)bytes) return 1;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  WARN("CUDA IPC: sendmsg on the fd link: %s", n < 0 ? strerror(errno) : "short send");
  return -1;
}

int cudaipc_fd_poll(int link, void* msg, size_t bytes, int* fd) {
  union fd_ctl ctl;
  struct iovec iov = {msg, bytes};
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
  *fd = -1;
  ssize_t n = fd_recvmsg(link, &m);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (n < 0) {
    WARN("CUDA IPC: recvmsg on the fd link: %s", strerror(errno));
    return -1;
  }
  return fd_msg_in(&m, n, bytes, fd) == ncclSuccess ? 1 : -1;
}
