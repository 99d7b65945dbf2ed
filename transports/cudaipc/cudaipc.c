/*
 * The CUDA IPC transport: device buffers between ranks of one node, device
 * to device, never through host memory. It is receiver-announced: a
 * receive posts "ready to receive" (RTR) with its buffer (to a thread of
 * this process its pointer; to another process the allocation's
 * description, and a cuMem allocation's fd beside it), the sender maps
 * that buffer through the comm's import cache, copies into it with the
 * fused reduce-copy kernel, and answers FIN with its own size and tag,
 * which the receiver checks as every transport does. A size or call that
 * does not match is not copied: the receiver reports it.
 *
 * The copy runs where the call runs: a call gated on its stream gave its
 * send the kernel launch queued there (transport_buf.launch), which gets
 * the task and "go" and is watched for "ran"; a synchronous call's copy
 * runs on the device's copy stream and is waited for. No copy ever waits
 * for a peer: it starts only once the receive is announced.
 *
 * Links are the fd links of cudaipc_fd.h, one per sender, receiver and
 * channel, made by the sender; each rank listens from its first device
 * call. The links sit in the progress engine's epoll set, so a rank
 * waiting for an RTR or FIN sleeps.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "core.h"
#include "cuda/cuda_copy.h"
#include "cuda/cuda_driver.h"
#include "cuda/cudaipc_fd.h"
#include "cuda/cudaipc_fd_link.h"
#include "cuda/cudaipc_mem.h"
#include "param.h"
#include "cudaipc.h"
#include "transport.h"

#define IPC_ROLE "p2p"
#define IPC_CHANNELS 2 /* transport.h: 0 collectives, 1 point-to-point */

enum ipc_what { IPC_RTR = 1, IPC_FIN = 2 };

struct ipc_msg {
  uint64_t seq;
  uint32_t what;   /* enum ipc_what */
  uint32_t copied; /* FIN: the data was written */
  uint64_t bytes;  /* RTR: the receive's size; FIN: the send's */
  uint64_t ptr;    /* RTR: the buffer, at the receiver's address */
  struct transport_tag tag;
  struct cudaipc_desc desc; /* RTR to another process: the allocation holding ptr */
};

/* What every rank publishes: whether it takes part (NCCL_P2P_DISABLE). */
struct ipc_blob {
  uint32_t enabled;
  uint32_t pad;
};

/* Per comm: the listener, and links accepted before their receive asked. */
struct ipc_state {
  struct cudaipc_listener* listener;
  int nranks;
  int* unclaimed; /* [channel * nranks + rank]: a link, or -1 */
};

enum ipc_step { IPC_WAITING = 0, IPC_COPYING, IPC_COPIED };

struct ipc_entry {
  void* ptr;
  size_t bytes;
  struct transport_tag tag;
  const struct gpu_launch* launch; /* send: the gated call's, or NULL */
  const struct cudaipc_export* ex; /* receive: its registration's export, or NULL */
  enum ipc_step step;              /* send */
  int copied;                      /* send: the data went (sizes and calls matched) */
};

/* An RTR the sender took in, its buffer mapped here. */
struct ipc_ready {
  char* dst;
  uint64_t bytes;
  struct transport_tag tag;
};

struct ipc_conn {
  struct transport_conn base;
  struct transport_ctx* ctx;
  int link;
  int same_process;    /* the peer's pointers are ours to use */
  uint64_t announced;  /* receive: RTRs sent */
  uint64_t readies;    /* send: RTRs taken in */
  int holding;         /* receive: an RTR found no room on the link */
  struct ipc_msg held; /* that RTR */
  int held_fd;         /* and its fd, or -1 */
  struct ipc_entry q[TRANSPORT_MAX_INFLIGHT];
  struct ipc_ready ready[TRANSPORT_MAX_INFLIGHT];
};

/* ---- Which pairs ---- */

static ncclResult_t ipc_blob_make(struct transport_ctx* ctx, void* blob) {
  (void)ctx;
  struct ipc_blob b = {param_p2p_disable() ? 0u : 1u, 0};
  memcpy(blob, &b, sizeof(b));
  return ncclSuccess;
}

static int ipc_enabled(const struct transport_ctx* ctx, int rank) {
  struct ipc_blob b;
  memcpy(&b, transport_peer_blob(ctx, &cudaipc_transport, rank), sizeof(b));
  return b.enabled == 1;
}

/* Whether device ordinals a and b (as both processes number them: the
 * caller checked their views agree) can read each other's memory. */
static int devices_peer(int a, int b) {
  const struct cuda_api* cu = cuda_driver();
  CUdevice x, y;
  int ab = 0, ba = 0;
  if (cu == NULL || cu->cuDeviceGet(&x, a < 0 ? 0 : a) != CUDA_SUCCESS ||
      cu->cuDeviceGet(&y, b < 0 ? 0 : b) != CUDA_SUCCESS)
    return 0;
  return cu->cuDeviceCanAccessPeer(&ab, x, y) == CUDA_SUCCESS &&
         cu->cuDeviceCanAccessPeer(&ba, y, x) == CUDA_SUCCESS && ab && ba;
}

/* One host, both with a device and taking part, the same device or two
 * that reach each other; from the peer table only, so both ends agree. */
static int ipc_can_connect(const struct transport_ctx* ctx, int a, int b) {
  const struct peer_info *x = &ctx->peers[a], *y = &ctx->peers[b];
  if (a == b || x->host_hash != y->host_hash || x->cuda_uuid == 0 || y->cuda_uuid == 0 ||
      !ipc_enabled(ctx, a) || !ipc_enabled(ctx, b))
    return 0;
  if (x->cuda_uuid == y->cuda_uuid) return 1;
  return x->cuda_view == y->cuda_view && devices_peer(x->cuda_dev, y->cuda_dev);
}

/* ---- The comm's listener ---- */

static void ipc_free_state(struct transport_ctx* ctx) {
  struct ipc_state* st = ctx->state[cudaipc_transport.id];
  if (st == NULL) return;
  cudaipc_fd_listener_free(st->listener);
  for (int i = 0; st->unclaimed && i < IPC_CHANNELS * st->nranks; i++)
    if (st->unclaimed[i] >= 0) close(st->unclaimed[i]);
  free(st->unclaimed);
  free(st);
  ctx->state[cudaipc_transport.id] = NULL;
}

/* Listen from the comm's first device call on (src/cuda/cuda_comm.c), so
 * that a peer's sender, which waits for the listener, waits no longer
 * than for this rank to reach device work. */
static ncclResult_t ipc_device_attach(struct transport_ctx* ctx) {
  ncclResult_t res = ncclSuccess;
  struct ipc_state* st = NULL;
  if (ctx->state[cudaipc_transport.id] || !ipc_enabled(ctx, ctx->rank)) return ncclSuccess;
  CHECK(braid_calloc(&st, 1, sizeof(*st)));
  st->nranks = ctx->nranks;
  ctx->state[cudaipc_transport.id] = st; /* ipc_free_state undoes the rest */
  CHECK(braid_calloc(&st->unclaimed, (size_t)(IPC_CHANNELS * ctx->nranks), sizeof(int)));
  for (int i = 0; i < IPC_CHANNELS * ctx->nranks; i++) st->unclaimed[i] = -1;
  CHECK(cudaipc_fd_listen(ctx->secret, IPC_ROLE, ctx->rank, ctx->peers, ctx->nranks,
                          IPC_CHANNELS * ctx->nranks, &st->listener));
fail:
  return res;
}

/* ---- Connections ---- */

static ncclResult_t conn_make(struct transport_ctx* ctx, int peer, int is_send, int link,
                              struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ipc_conn* c = NULL;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data = {0}};
  if (epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, link, &ev) != 0) {
    close(link);
    FAIL(ncclSystemError, "CUDA IPC : epoll_ctl failed: %s", strerror(errno));
  }
  if (braid_calloc(&c, 1, sizeof(*c)) != ncclSuccess) {
    close(link);
    return ncclSystemError;
  }
  c->base.ops = &cudaipc_transport;
  c->base.peer = peer;
  c->base.is_send = is_send;
  c->ctx = ctx;
  c->link = link;
  c->held_fd = -1;
  c->same_process = ctx->peers[peer].pid == ctx->peers[ctx->rank].pid;
  *out = &c->base;
  INFO(SUB_INIT, "Rank %d: CUDA IPC %s rank %d", ctx->rank, is_send ? "send to" : "receive from",
       peer);
fail:
  return res;
}

static ncclResult_t ipc_state_get(struct transport_ctx* ctx, struct ipc_state** out) {
  *out = ctx->state[cudaipc_transport.id];
  if (*out) return ncclSuccess;
  WARN("CUDA IPC : rank %d connects before its first device call made its listener", ctx->rank);
  return ncclInternalError;
}

/* The sender makes the link: it waits at most for the peer to listen. */
static ncclResult_t ipc_connect_send(struct transport_ctx* ctx, int peer, int channel,
                                     struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ipc_state* st;
  int link = -1;
  CHECK(ipc_state_get(ctx, &st));
  CHECK(cudaipc_fd_connect(ctx->secret, IPC_ROLE, ctx->rank, peer, ctx->peers[peer].pid, channel,
                           ctx->timeout_ms, ctx->aborted, &link));
  CHECK(conn_make(ctx, peer, 1, link, out));
fail:
  return res;
}

/* Links come in any order: one for another peer or channel waits in
 * `unclaimed` for its own receive. */
static ncclResult_t ipc_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                                     struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ipc_state* st;
  int link = -1;
  CHECK(ipc_state_get(ctx, &st));
  while (st->unclaimed[channel * st->nranks + peer] < 0) {
    int from, tag;
    CHECK(cudaipc_fd_accept(st->listener, ctx->timeout_ms, ctx->aborted, &link, &from, &tag));
    if (from < 0 || from >= st->nranks || from == ctx->rank || tag < 0 || tag >= IPC_CHANNELS ||
        st->unclaimed[tag * st->nranks + from] >= 0) {
      close(link);
      FAIL(ncclSystemError,
           "CUDA IPC : rank %d got a link from rank %d channel %d twice or out of range", ctx->rank,
           from, tag);
    }
    st->unclaimed[tag * st->nranks + from] = link;
  }
  link = st->unclaimed[channel * st->nranks + peer];
  st->unclaimed[channel * st->nranks + peer] = -1;
  CHECK(conn_make(ctx, peer, 0, link, out));
fail:
  return res;
}

static void ipc_shutdown(struct transport_conn* conn) {
  struct ipc_conn* c = (struct ipc_conn*)conn;
  shutdown(c->link, SHUT_RDWR);
}

static void ipc_close(struct transport_conn* conn) {
  struct ipc_conn* c = (struct ipc_conn*)conn;
  close(c->link);
  if (c->held_fd >= 0) close(c->held_fd);
  free(c);
}

/* ---- Registration: a device buffer's export, made once ---- */

static ncclResult_t ipc_reg(struct transport_ctx* ctx, void* base, size_t size, void** handle) {
  (void)ctx, (void)size;
  cudaipc_export_make(base, (struct cudaipc_export**)handle); /* NULL where none */
  return ncclSuccess;
}

static void ipc_dereg(struct transport_ctx* ctx, void* handle) {
  (void)ctx;
  cudaipc_export_free(handle);
}

/* ---- Messages ---- */

static ncclResult_t ipc_post(struct transport_conn* conn, const struct transport_buf* buf,
                             const struct transport_tag* tag) {
  struct ipc_conn* c = (struct ipc_conn*)conn;
  if (!transport_moves(conn, buf)) return ncclInternalError;
  struct ipc_entry* e = &c->q[conn->posted % TRANSPORT_MAX_INFLIGHT];
  memset(e, 0, sizeof(*e));
  e->ptr = buf->ptr;
  e->bytes = buf->bytes;
  if (tag) e->tag = *tag;
  e->launch = conn->is_send ? buf->launch : NULL;
  e->ex = conn->is_send ? NULL : buf->reg; /* lives until deregistration, after the call */
  conn->posted++;
  return ncclSuccess;
}

/* The comm's context current while CUDA is called (the thread driving
 * the call may have none, or another). */
static ncclResult_t ctx_enter(const struct ipc_conn* c, CUcontext* saved) {
  if (c->ctx->device == NULL || cuda_driver() == NULL) {
    WARN("CUDA IPC : rank %d moves device memory without a device", c->ctx->rank);
    return ncclInternalError;
  }
  return cuda_ctx_enter(c->ctx->device->context, saved);
}

/* A link that failed or closed: the peer is gone or gave up. */
static ncclResult_t link_lost(const struct ipc_conn* c) {
  WARN("CUDA IPC : rank %d closed its link (it failed, aborted or died)", c->base.peer);
  return ncclRemoteError;
}

/* The RTR of receive `seq`: to a thread, the pointer; to another process
 * also the allocation (the registration's export where it still holds). */
static ncclResult_t rtr_make(struct ipc_conn* c, uint64_t seq, struct ipc_msg* m, int* fd) {
  ncclResult_t res = ncclSuccess;
  const struct ipc_entry* e = &c->q[seq % TRANSPORT_MAX_INFLIGHT];
  memset(m, 0, sizeof(*m));
  m->seq = seq;
  m->what = IPC_RTR;
  m->bytes = e->bytes;
  m->ptr = (uint64_t)(uintptr_t)e->ptr;
  m->tag = e->tag;
  *fd = -1;
  if (c->same_process || e->bytes == 0) return ncclSuccess;
  if (cudaipc_export_covers(e->ex, e->ptr)) {
    m->desc = e->ex->desc;
    if (e->ex->fd >= 0 && (*fd = dup(e->ex->fd)) < 0)
      FAIL(ncclSystemError, "CUDA IPC : dup: %s", strerror(errno));
    return ncclSuccess;
  }
  CHECK(cudaipc_describe(e->ptr, &m->desc, fd));
fail:
  return res;
}

/* Announce every posted receive the link has room for. */
static ncclResult_t recv_announce(struct ipc_conn* c, int* progressed) {
  ncclResult_t res = ncclSuccess;
  while (c->holding || c->announced < c->base.posted) {
    if (!c->holding) {
      CUcontext saved;
      CHECK(ctx_enter(c, &saved));
      res = rtr_make(c, c->announced, &c->held, &c->held_fd);
      cuda_ctx_restore(saved);
      if (res != ncclSuccess) goto fail;
      c->holding = 1;
    }
    int sent = cudaipc_fd_post(c->link, &c->held, sizeof(c->held), c->held_fd);
    if (sent < 0) return link_lost(c);
    if (sent == 0) { /* no room: nothing wakes us for room, so the waiter naps */
      transport_wait_nap(c->ctx->waits);
      break;
    }
    if (c->held_fd >= 0) close(c->held_fd);
    c->held_fd = -1;
    c->holding = 0;
    c->announced++;
    *progressed = 1;
  }
fail:
  return res;
}

/* A FIN for the oldest receive: the sender's size and call against ours. */
static ncclResult_t recv_finish(struct ipc_conn* c, const struct ipc_msg* m) {
  uint64_t want = c->base.completed;
  const struct ipc_entry* e = &c->q[want % TRANSPORT_MAX_INFLIGHT];
  if (m->what != IPC_FIN || want >= c->announced) {
    WARN("CUDA IPC : rank %d sent message %u for receive %llu, which was not announced",
         c->base.peer, m->what, (unsigned long long)m->seq);
    return ncclInternalError;
  }
  ncclResult_t res =
      transport_check_message(&c->base, m->seq, m->bytes, &m->tag, want, e->bytes, &e->tag);
  if (res != ncclSuccess) return res;
  if (!m->copied) {
    WARN("CUDA IPC : rank %d did not write receive %llu", c->base.peer, (unsigned long long)want);
    return ncclInternalError;
  }
  c->base.completed++;
  return ncclSuccess;
}

/* Take in what the link holds: RTRs on a send, FINs on a receive. */
static ncclResult_t link_drain(struct ipc_conn* c, int* progressed);

static ncclResult_t ipc_recv_progress(struct ipc_conn* c, int* progressed) {
  ncclResult_t res = ncclSuccess;
  CHECK(recv_announce(c, progressed));
  CHECK(link_drain(c, progressed));
  if (c->base.completed < c->base.posted) transport_wait_on_fd(c->ctx->waits);
fail:
  return res;
}

/* An RTR: map the receiver's buffer now (its fd comes with it, once). */
static ncclResult_t send_ready(struct ipc_conn* c, const struct ipc_msg* m, int fd) {
  ncclResult_t res = ncclSuccess;
  struct ipc_ready* r = &c->ready[c->readies % TRANSPORT_MAX_INFLIGHT];
  void* base = NULL;
  size_t mapped = 0;
  if (m->what != IPC_RTR || m->seq != c->readies ||
      c->readies - c->base.completed >= TRANSPORT_MAX_INFLIGHT)
    FAIL(ncclInternalError, "CUDA IPC : rank %d announced receive %llu out of turn", c->base.peer,
         (unsigned long long)m->seq);
  r->bytes = m->bytes;
  r->tag = m->tag;
  r->dst = (char*)(uintptr_t)m->ptr;
  if (!c->same_process && m->bytes > 0) {
    CUcontext saved;
    CHECK(ctx_enter(c, &saved));
    res = cudaipc_cache_map(c->ctx->device->cache, c->base.peer, &m->desc, fd, &base, &mapped);
    cuda_ctx_restore(saved);
    if (res != ncclSuccess) goto fail;
    CHECK(cudaipc_translate(&m->desc, base, mapped, m->ptr, m->bytes, c->base.peer, &r->dst));
  }
  c->readies++;
fail:
  return res;
}

static ncclResult_t link_drain(struct ipc_conn* c, int* progressed) {
  ncclResult_t res = ncclSuccess;
  for (;;) {
    struct ipc_msg m;
    int fd = -1;
    int got = cudaipc_fd_poll(c->link, &m, sizeof(m), &fd);
    if (got == 0) break;
    if (got < 0) /* a peer done with this link may close it: wrong only while we wait on it */
      return c->base.completed < c->base.posted ? link_lost(c) : ncclSuccess;
    *progressed = 1;
    res = c->base.is_send ? send_ready(c, &m, fd) : recv_finish(c, &m);
    if (fd >= 0) close(fd);
    if (res != ncclSuccess) return res;
  }
  return res;
}

/* Start the oldest send's copy (or skip it: sizes or calls differ, and
 * the receiver will say so): on the gated call's own launch, else on
 * the copy stream, waited for. */
static ncclResult_t send_copy_start(struct ipc_conn* c, struct ipc_entry* e,
                                    const struct ipc_ready* r) {
  ncclResult_t res = ncclSuccess;
  struct transport_device* dev = c->ctx->device;
  e->copied = r->bytes == e->bytes && memcmp(&r->tag, &e->tag, sizeof(e->tag)) == 0;
  /* a launch not copying still goes (empty): later ones on its stream wait on it */
  CHECK(cuda_copy_device(dev->context, dev->copy_stream, e->launch, r->dst, e->ptr,
                         e->copied ? e->bytes : 0));
  e->step = e->launch && e->copied ? IPC_COPYING : IPC_COPIED;
fail:
  return res;
}

/* Sends finish in order: copy once announced, FIN once copied. */
static ncclResult_t ipc_send_progress(struct ipc_conn* c, int* progressed) {
  ncclResult_t res = ncclSuccess;
  CHECK(link_drain(c, progressed));
  while (c->base.completed < c->base.posted && c->base.completed < c->readies) {
    uint64_t k = c->base.completed;
    struct ipc_entry* e = &c->q[k % TRANSPORT_MAX_INFLIGHT];
    const struct ipc_ready* r = &c->ready[k % TRANSPORT_MAX_INFLIGHT];
    if (e->step == IPC_WAITING) CHECK(send_copy_start(c, e, r));
    if (e->step == IPC_COPYING && cuda_copy_ran(e->launch)) e->step = IPC_COPIED;
    if (e->step == IPC_COPYING) { /* a kernel's end wakes nobody: the waiter naps */
      transport_wait_nap(c->ctx->waits);
      return ncclSuccess;
    }
    struct ipc_msg fin = {k, IPC_FIN, (uint32_t)e->copied, e->bytes, 0, e->tag, {0}};
    int sent = cudaipc_fd_post(c->link, &fin, sizeof(fin), -1);
    if (sent < 0) return link_lost(c);
    if (sent == 0) {
      transport_wait_nap(c->ctx->waits);
      return ncclSuccess;
    }
    c->base.completed++;
    *progressed = 1;
  }
  if (c->base.completed < c->base.posted) transport_wait_on_fd(c->ctx->waits);
fail:
  return res;
}

static ncclResult_t ipc_progress(struct transport_conn* conn, int* progressed) {
  struct ipc_conn* c = (struct ipc_conn*)conn;
  return conn->is_send ? ipc_send_progress(c, progressed) : ipc_recv_progress(c, progressed);
}

const struct transport cudaipc_transport = {
    .name = "CUDA IPC",
    .key = "cudaipc",
    .id = 0,
    .link = TRANSPORT_LINK_DEVICE,
    .caps = TRANSPORT_CAP_DEVICE_MEM | TRANSPORT_CAP_DEVICE_COPY | TRANSPORT_CAP_WAKE_FD,
    .can_connect = ipc_can_connect,
    .blob_bytes = sizeof(struct ipc_blob),
    .blob_make = ipc_blob_make,
    .connect_send = ipc_connect_send,
    .connect_recv = ipc_connect_recv,
    .reg = ipc_reg,
    .dereg = ipc_dereg,
    .post = ipc_post,
    .progress = ipc_progress,
    .shutdown = ipc_shutdown,
    .close = ipc_close,
    .device_attach = ipc_device_attach,
    .free_state = ipc_free_state,
};
