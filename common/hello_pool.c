/*
 * Pending connections read side by side: a hello is complete when its
 * fixed number of bytes has arrived, whatever pieces they came in.
 */
#include "hello_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"

/* Refusals logged at WARN per pool; the rest at INFO. */
#define HELLO_POOL_WARN_MAX 4

ncclResult_t hello_pool_init(struct hello_pool* pool, const char* who, int listen_fd,
                             size_t hello_bytes, int64_t hello_ms, int max_pending) {
  memset(pool, 0, sizeof(*pool));
  if (hello_bytes > HELLO_POOL_MAX_BYTES || max_pending < 1) {
    WARN("%s: hello of %zu bytes or %d pending connections not supported", who, hello_bytes,
         max_pending);
    return ncclInternalError;
  }
  pool->who = who;
  pool->listen_fd = listen_fd;
  pool->hello_bytes = hello_bytes;
  pool->hello_ms = hello_ms;
  pool->max_pending = max_pending;
  return braid_calloc(&pool->pending, (size_t)max_pending, sizeof(*pool->pending));
}

static void pending_drop(struct hello_pool* pool, int i) {
  close(pool->pending[i].fd);
  pool->pending[i] = pool->pending[--pool->npending];
}

void hello_pool_free(struct hello_pool* pool) {
  while (pool->npending > 0) pending_drop(pool, pool->npending - 1);
  free(pool->pending);
  pool->pending = NULL;
}

void hello_pool_log_refusal(struct hello_pool* pool, const char* why) {
  uint64_t n = ++pool->dropped;
  if (n <= HELLO_POOL_WARN_MAX)
    WARN("%s: refused a connection (%s); still serving the others%s", pool->who, why,
         n == HELLO_POOL_WARN_MAX ? " (further refusals at INFO)" : "");
  else
    INFO(SUB_INIT | SUB_NET, "%s: refused connection %llu (%s)", pool->who, (unsigned long long)n,
         why);
}

int hello_pool_pollfds(const struct hello_pool* pool, struct pollfd* p) {
  p[0] = (struct pollfd){pool->listen_fd, POLLIN, 0};
  for (int i = 0; i < pool->npending; i++)
    p[1 + i] = (struct pollfd){pool->pending[i].fd, POLLIN, 0};
  return 1 + pool->npending;
}

int hello_pool_timeout_ms(const struct hello_pool* pool, int cap_ms) {
  uint64_t now = braid_now_ns();
  int ms = cap_ms;
  for (int i = 0; i < pool->npending; i++) {
    uint64_t d = pool->pending[i].deadline_ns;
    int left = d <= now ? 0 : (int)MIN((d - now) / 1000000ull + 1, (uint64_t)cap_ms);
    ms = MIN(ms, left);
  }
  return ms;
}

/* Read what connection i has sent; 1 when its hello is complete, -1 when it
 * closed or failed, 0 when more is to come. */
static int pending_read(struct hello_pool* pool, int i) {
  struct hello_pending* h = &pool->pending[i];
  while (h->got < pool->hello_bytes) {
    ssize_t n = recv(h->fd, h->buf + h->got, pool->hello_bytes - h->got, MSG_DONTWAIT);
    if (n > 0) {
      h->got += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return 0;
    } else {
      return -1;
    }
  }
  return 1;
}

/* Connection i's hello is whole: out of the pool, to its owner. */
static void pending_deliver(struct hello_pool* pool, int i, hello_pool_done_fn done, void* arg) {
  struct hello_pending h = pool->pending[i];
  pool->pending[i] = pool->pending[--pool->npending];
  done(arg, h.fd, h.buf);
}

/* Read connection i and deliver or drop it; returns 1 when it left the
 * pool (the slot now holds another connection). */
static int pending_serve(struct hello_pool* pool, int i, uint64_t now, hello_pool_done_fn done,
                         void* arg) {
  int r = pending_read(pool, i);
  if (r == 1) {
    pending_deliver(pool, i, done, arg);
    return 1;
  }
  if (r == 0 && now < pool->pending[i].deadline_ns) return 0;
  hello_pool_log_refusal(pool, r < 0 ? "closed before a whole hello" : "no whole hello in time");
  pending_drop(pool, i);
  return 1;
}

/* A full pool lets its oldest connection go, unless its hello has come
 * since it was last read: a flood taken in one pass must not push out a
 * real peer whose hello is waiting unread (CI, on 2 loaded cores: the
 * root's own rank 0 was let go, and the job failed). */
static void pending_make_room(struct hello_pool* pool, hello_pool_done_fn done, void* arg) {
  int oldest = 0;
  for (int i = 1; i < pool->npending; i++)
    if (pool->pending[i].deadline_ns < pool->pending[oldest].deadline_ns) oldest = i;
  if (pending_read(pool, oldest) == 1) {
    pending_deliver(pool, oldest, done, arg);
    return;
  }
  hello_pool_log_refusal(pool, "too many connections without a hello");
  pending_drop(pool, oldest);
}

/* Take the connections the listener holds, at most a pool's worth per
 * call (a flood faster than this thread must not keep it here, past its
 * deadline or an abort); a full pool lets its oldest go. */
static void accept_all(struct hello_pool* pool, uint64_t now, hello_pool_done_fn done, void* arg) {
  for (int taken = 0; taken < pool->max_pending; taken++) {
    int fd = accept4(pool->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return; /* EAGAIN: nothing more waits (or an aborted handshake) */
    const char* why = pool->admit ? pool->admit(fd) : NULL;
    if (why != NULL) {
      hello_pool_log_refusal(pool, why);
      close(fd);
      continue;
    }
    if (pool->npending == pool->max_pending) pending_make_room(pool, done, arg);
    int i = pool->npending++;
    pool->pending[i] =
        (struct hello_pending){fd, now + (uint64_t)pool->hello_ms * 1000000ull, 0, {0}};
    pending_serve(pool, i, now, done, arg); /* a real peer's hello is usually there already */
  }
}

void hello_pool_service(struct hello_pool* pool, const struct pollfd* p, int n,
                        hello_pool_done_fn done, void* arg) {
  uint64_t now = braid_now_ns();
  /* Pending connections first, by fd: the array reorders as they leave. */
  for (int k = 1; k < n; k++) {
    if (p[k].revents == 0) continue;
    for (int i = 0; i < pool->npending; i++)
      if (pool->pending[i].fd == p[k].fd) {
        pending_serve(pool, i, now, done, arg);
        break;
      }
  }
  for (int i = 0; i < pool->npending;) /* expire the silent ones */
    if (now < pool->pending[i].deadline_ns || !pending_serve(pool, i, now, done, arg)) i++;
  if (p[0].revents) accept_all(pool, now, done, arg);
}
