/*
 * The verbs transport (NET/IB): one RC queue pair per peer, channel and
 * direction, receiver-announced buffers, RDMA write with immediate.
 *
 * Setup: the sending side dials an out-of-band TCP socket (tcp.h) and
 * sends its QP's ib_qp_info; the receiving side answers, creates its QP,
 * connects it to the sender's, and sends its own info back; the sender
 * connects when that arrives. The socket then stays in the progress
 * engine's epoll set: its end is how a vanished peer shows.
 *
 * A message: the receiver registers its buffer (ib_mr_cache.h) and SENDs
 * an announcement (sequence, address, rkey, size, call) from a slot of
 * its own; the sender, holding the same message, RDMA-writes its bytes
 * there, the last piece with immediate (the sequence), which completes a
 * receive posted at the receiver. A message whose size or call differs
 * from its announcement is not written: the sender SENDs its size and call
 * instead, and the receiver reports it as every transport does. Both ends
 * sleep on their CQ's completion channel, also in the epoll set (poll,
 * arm, poll once more, then wait).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "ib_devices.h"
#include "ib_gdr.h"
#include "ib_gid.h"
#include "ib_mr_cache.h"
#include "ib_qp.h"
#include "mem.h"
#include "param.h"
#include "socket.h"
#include "tcp/tcp.h"

#define IB_DEPTH TRANSPORT_MAX_INFLIGHT
#define IB_PIECE ((size_t)1 << 30) /* bytes per work request at most */
#define IB_PROBE_PORTS 16
/* A peer's socket closed while a message is still out: how long its last
 * completions (already on their way on the QP) may take to show. */
#define IB_GONE_GRACE_NS 1000000000ull

/* What a rank publishes: whether it speaks verbs, and on what link. */
struct ib_blob {
  uint8_t valid;
  uint8_t link_layer;
  uint8_t pad[2];
  uint32_t mbps; /* its port's rate */
};

/* The comm's device: one port (the first NCCL_IB_HCA selects). */
struct ib_state {
  const struct ib_verbs* v;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ib_port port;
  struct ib_qp_info self; /* lid, link layer, MTU, GID: every QP's */
  struct ib_qp_knobs knobs;
  struct ib_mr_cache cache;
  enum ibv_event_type fatal; /* a fatal async event seen (0: none): every conn fails */
  int fatal_seen;
};

/* The control messages, each in a registered slot. */
struct ib_ann { /* receiver -> sender: a posted buffer */
  uint64_t seq, addr, bytes;
  uint32_t rkey, pad;
  struct transport_tag tag;
};
struct ib_fin { /* sender -> receiver: a message that did not match */
  uint64_t seq, bytes;
  struct transport_tag tag;
};
union ib_slot {
  struct ib_ann ann;
  struct ib_fin fin;
};

/* wr_id: what completed, and which slot or message. */
enum ib_wr { WR_CTRL_SEND = 1, WR_CTRL_RECV, WR_DATA_SEND, WR_DATA_RECV };
#define WR_ID(kind, i) ((uint64_t)(kind) << 56 | (uint64_t)(i))
#define WR_KIND(id) ((int)((id) >> 56))
#define WR_INDEX(id) ((id) & ((1ull << 56) - 1))

struct ib_msg {
  void* ptr;
  size_t bytes;
  struct transport_tag tag;
  struct ib_mr_ent* mr; /* held while the NIC may touch the buffer */
  int written;          /* send: its write (or fin) is posted */
};

struct ib_conn {
  struct transport_conn base;
  struct transport_ctx* tctx;
  struct ib_state* st;
  int oob;             /* the out-of-band socket */
  int ready;           /* the QP is connected */
  uint64_t gone_since; /* the socket closed with messages still out (0: not) */
  struct ibv_comp_channel* ch;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ib_qp_info self;
  /* slots [0, IB_DEPTH): what this end sends (announcements, fins);
   * [IB_DEPTH, 2 IB_DEPTH): where the other end's land */
  union ib_slot slots[2 * IB_DEPTH];
  struct ibv_mr* slots_mr;
  struct ib_msg q[IB_DEPTH];
  struct ib_ann anns[IB_DEPTH]; /* send: announcements taken in, by sequence */
  uint64_t nanns;
  uint64_t announced; /* receive: announcements posted */
};

/* ---- The comm's device ---- */

static ncclResult_t watch(struct transport_ctx* ctx, int fd);

static struct ib_state* ib_state_of(const struct transport_ctx* ctx) {
  return ctx->state[TRANSPORT_NET_IB];
}

static void ib_free_state(struct transport_ctx* ctx) {
  struct ib_state* st = ib_state_of(ctx);
  if (st == NULL) return;
  ib_mr_cache_free(&st->cache);
  if (st->pd) st->v->dealloc_pd(st->pd);
  if (st->ctx) st->v->close_device(st->ctx);
  free(st);
  ctx->state[TRANSPORT_NET_IB] = NULL;
}

/* Open the first selected port's device: PD, GID, the QPs' common info. */
static ncclResult_t ib_state_open(struct transport_ctx* ctx, struct ib_state** out) {
  ncclResult_t res = ncclSuccess;
  const char* why = NULL;
  struct ib_port ports[IB_PROBE_PORTS];
  struct ibv_port_attr pa;
  struct ib_state* st = NULL;
  struct ibv_device** list = NULL;
  int n = 0, nhca = 0;
  const struct ib_verbs* v = ib_verbs_get(&why);
  if (v == NULL) FAIL(ncclInvalidUsage, "NET/IB : %s", why);
  ib_ports_find(v, param_ib_hca(), ports, IB_PROBE_PORTS, &n, &nhca);
  if (n == 0) FAIL(ncclInvalidUsage, "NET/IB : no active port (%d HCAs)", nhca);
  CHECK(braid_calloc(&st, 1, sizeof(*st)));
  ctx->state[TRANSPORT_NET_IB] = st; /* ib_free_state undoes the rest */
  st->v = v;
  st->port = ports[0];
  list = v->get_device_list(&n);
  for (int i = 0; list && i < n && st->ctx == NULL; i++)
    if (strcmp(v->get_device_name(list[i]), st->port.dev) == 0) st->ctx = v->open_device(list[i]);
  if (list) v->free_device_list(list);
  if (st->ctx == NULL) FAIL(ncclSystemError, "NET/IB : cannot open %s", st->port.dev);
  if (v->query_port(st->ctx, (uint8_t)st->port.port, &pa) != 0)
    FAIL(ncclSystemError, "NET/IB : cannot query %s:%d", st->port.dev, st->port.port);
  st->pd = v->alloc_pd(st->ctx);
  if (st->pd == NULL) FAIL(ncclSystemError, "NET/IB : ibv_alloc_pd failed on %s", st->port.dev);
  st->self.lid = pa.lid;
  st->self.link_layer = pa.link_layer;
  st->self.mtu = pa.active_mtu;
  CHECK(ib_gid_select(v, st->ctx, st->port.port, pa.link_layer, pa.gid_tbl_len, &st->self.gid_index,
                      &st->self.gid));
  ib_qp_knobs_read(&st->knobs);
  ib_mr_cache_init(&st->cache, v, st->pd);
  CHECK(watch(ctx, st->ctx->async_fd)); /* fatal events wake the waiter */
  *out = st;
fail:
  return res;
}

static ncclResult_t ib_blob_make(struct transport_ctx* ctx, void* blob) {
  ncclResult_t res = ncclSuccess;
  struct ib_blob b = {0, 0, {0, 0}, 0};
  struct ib_state* st = NULL;
  if (ctx->net == &ib_transport) { /* only where NCCL_NET chose it */
    CHECK(ib_state_open(ctx, &st));
    b.valid = 1;
    b.link_layer = st->self.link_layer;
    b.mbps = st->port.mbps;
    char d[96];
    ib_port_describe(&st->port, d, sizeof(d));
    const char* gdr = ib_gdr_module("/");
    INFO(SUB_INIT | SUB_NET,
         "NET/IB : rank %d on %s, GID index %d; GPUDirect RDMA %s%s%s (not used yet: device "
         "buffers go through pinned host slots)",
         ctx->rank, d, st->self.gid_index, gdr ? "would be available: " : "unavailable",
         gdr ? gdr : "", gdr ? " loaded" : " (no nvidia_peermem)");
  }
  memcpy(blob, &b, sizeof(b));
fail:
  return res;
}

static uint32_t ib_link_mbps(const struct transport_ctx* ctx, int rank) {
  struct ib_blob b;
  memcpy(&b, transport_peer_blob(ctx, &ib_transport, rank), sizeof(b));
  return b.valid ? b.mbps : 0;
}

static int ib_can_connect(const struct transport_ctx* ctx, int a, int b) {
  struct ib_blob x, y;
  memcpy(&x, transport_peer_blob(ctx, &ib_transport, a), sizeof(x));
  memcpy(&y, transport_peer_blob(ctx, &ib_transport, b), sizeof(y));
  return a != b && x.valid && y.valid && x.link_layer == y.link_layer;
}

/* ---- Connections ---- */

static void conn_free(struct ib_conn* c) {
  const struct ib_verbs* v = c->st ? c->st->v : NULL;
  for (int i = 0; i < IB_DEPTH; i++) ib_mr_put(c->q[i].mr);
  if (c->qp) v->destroy_qp(c->qp);
  if (c->slots_mr) v->dereg_mr(c->slots_mr);
  if (c->cq) v->destroy_cq(c->cq);
  if (c->ch) v->destroy_comp_channel(c->ch);
  if (c->oob >= 0) close(c->oob);
  free(c);
}

static ncclResult_t post_ctrl_recv(struct ib_conn* c, int slot) {
  struct ibv_sge sge = {(uint64_t)(uintptr_t)&c->slots[slot], sizeof(union ib_slot),
                        c->slots_mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = WR_ID(c->base.is_send ? WR_CTRL_RECV : WR_DATA_RECV, slot),
                           .sg_list = &sge,
                           .num_sge = 1},
                     *bad;
  if (ibv_post_recv(c->qp, &wr, &bad) == 0) return ncclSuccess;
  WARN("NET/IB : ibv_post_recv to rank %d failed", c->base.peer);
  return ncclSystemError;
}

/* Epoll watches both fds: the CQ's channel and the out-of-band socket. */
static ncclResult_t watch(struct transport_ctx* ctx, int fd) {
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data = {0}};
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0 &&
      epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0)
    return ncclSuccess;
  WARN("NET/IB : cannot watch fd %d: %s", fd, strerror(errno));
  return ncclSystemError;
}

/* A connection's verbs objects, its QP in INIT with its receives posted
 * (the other end may send as soon as it is connected). */
static ncclResult_t conn_make(struct transport_ctx* ctx, int peer, int is_send, int oob,
                              struct ib_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ib_conn* c = NULL;
  struct ib_state* st = ib_state_of(ctx);
  if (st == NULL) {
    close(oob);
    FAIL(ncclInternalError, "NET/IB : rank %d connects without its device", ctx->rank);
  }
  if (braid_calloc(&c, 1, sizeof(*c)) != ncclSuccess) {
    close(oob);
    return ncclSystemError;
  }
  c->base.ops = &ib_transport;
  c->base.peer = peer;
  c->base.is_send = is_send;
  c->tctx = ctx;
  c->st = st;
  c->oob = oob;
  c->ch = st->v->create_comp_channel(st->ctx);
  c->cq = c->ch ? st->v->create_cq(st->ctx, 4 * IB_DEPTH, c, c->ch, 0) : NULL;
  c->slots_mr = st->v->reg_mr(st->pd, c->slots, sizeof(c->slots), IBV_ACCESS_LOCAL_WRITE);
  if (c->cq == NULL || c->slots_mr == NULL)
    FAIL(ncclSystemError, "NET/IB : cannot make the CQ or register slots for rank %d", peer);
  CHECK(ib_qp_create(st->v, st->pd, c->cq, st->port.port, 2 * IB_DEPTH, &c->qp));
  c->self = st->self;
  c->self.qpn = c->qp->qp_num;
  for (int i = IB_DEPTH; i < 2 * IB_DEPTH; i++) CHECK(post_ctrl_recv(c, i));
  CHECK(watch(ctx, c->oob));
  CHECK(watch(ctx, c->ch->fd));
  *out = c;
  return ncclSuccess;
fail:
  if (c) conn_free(c);
  return res;
}

static ncclResult_t info_send(struct ib_conn* c) {
  if (send(c->oob, &c->self, sizeof(c->self), MSG_NOSIGNAL) == (ssize_t)sizeof(c->self))
    return ncclSuccess;
  WARN("NET/IB : cannot send QP info to rank %d", c->base.peer);
  return ncclRemoteError;
}

/* The peer's info, once whole on the socket: connect the QP. *got 0: not
 * yet. */
static ncclResult_t info_take(struct ib_conn* c, int* got) {
  ncclResult_t res = ncclSuccess;
  struct ib_qp_info peer;
  ssize_t n = recv(c->oob, &peer, sizeof(peer), MSG_PEEK | MSG_DONTWAIT);
  *got = 0;
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    FAIL(ncclRemoteError, "NET/IB : rank %d closed its connection before it was set up",
         c->base.peer);
  if (n < (ssize_t)sizeof(peer)) return ncclSuccess;
  if (recv(c->oob, &peer, sizeof(peer), 0) != (ssize_t)sizeof(peer))
    FAIL(ncclRemoteError, "NET/IB : short QP info from rank %d", c->base.peer);
  CHECK(ib_qp_connect(c->st->v, c->qp, c->st->port.port, &c->self, &peer, &c->st->knobs));
  c->ready = *got = 1;
fail:
  return res;
}

static ncclResult_t ib_connect_send(struct transport_ctx* ctx, int peer, int channel,
                                    struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ib_conn* c = NULL;
  int oob = -1;
  CHECK(tcp_oob_dial(ctx, peer, channel, &oob));
  CHECK(conn_make(ctx, peer, 1, oob, &c));
  res = info_send(c); /* its answer comes later: progress connects the QP */
  if (res != ncclSuccess) {
    conn_free(c);
    goto fail;
  }
  *out = &c->base;
fail:
  return res;
}

/* The receiving end waits for the sender's info (sent in its send phase). */
static ncclResult_t ib_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                                    struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ib_conn* c = NULL;
  int oob = -1, got = 0;
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  CHECK(tcp_oob_answer(ctx, peer, channel, &oob));
  CHECK(conn_make(ctx, peer, 0, oob, &c));
  while (res == ncclSuccess && !got) { /* sleeps in poll until the socket has bytes */
    res = socket_wait(c->oob, POLLIN, deadline, ctx->aborted, "NET/IB QP info");
    if (res == ncclSuccess) res = info_take(c, &got);
  }
  if (res == ncclSuccess) res = info_send(c);
  if (res != ncclSuccess) {
    conn_free(c);
    goto fail;
  }
  INFO(SUB_NET | SUB_INIT, "Channel %d: rank %d via NET/IB QP %u", channel, peer, c->self.qpn);
  *out = &c->base;
fail:
  return res;
}

static void ib_shutdown(struct transport_conn* conn) {
  struct ib_conn* c = (struct ib_conn*)conn;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
  shutdown(c->oob, SHUT_RDWR);
  c->st->v->modify_qp(c->qp, &a, IBV_QP_STATE);
}

static void ib_close(struct transport_conn* conn) {
  conn_free((struct ib_conn*)conn);
}

/* ---- Registration ---- */

/* ncclCommRegister: a host range registered now and held until it is
 * deregistered, so messages inside it find it in the cache. Device memory
 * is left alone: without GPUDirect RDMA the NIC cannot register it, and
 * its messages cross through pinned host slots. */
static ncclResult_t ib_reg(struct transport_ctx* ctx, void* base, size_t size, void** handle) {
  struct ib_state* st = ib_state_of(ctx);
  *handle = NULL;
  if (st == NULL || mem_query(base) != MEM_HOST) return ncclSuccess;
  return ib_mr_get(&st->cache, base, size, (struct ib_mr_ent**)handle);
}

static void ib_dereg(struct transport_ctx* ctx, void* handle) {
  (void)ctx;
  ib_mr_put(handle);
}

/* ---- Messages ---- */

static ncclResult_t ib_post(struct transport_conn* conn, const struct transport_buf* buf,
                            const struct transport_tag* tag) {
  struct ib_conn* c = (struct ib_conn*)conn;
  if (!transport_moves(conn, buf)) return ncclInternalError;
  struct ib_msg* m = &c->q[conn->posted % IB_DEPTH];
  memset(m, 0, sizeof(*m));
  m->ptr = buf->ptr;
  m->bytes = buf->bytes;
  if (tag) m->tag = *tag;
  conn->posted++;
  return ncclSuccess;
}

static ncclResult_t wc_failed(struct ib_conn* c, const struct ibv_wc* wc) {
  WARN("NET/IB : work request to rank %d failed: %s (status %d)", c->base.peer,
       c->st->v->wc_status_str(wc->status), (int)wc->status);
  return wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_WR_FLUSH_ERR ? ncclRemoteError
                                                                                 : ncclSystemError;
}

/* Receiver: announce every posted receive (the slot of its sequence). */
static ncclResult_t recv_announce(struct ib_conn* c) {
  ncclResult_t res = ncclSuccess;
  while (c->announced < c->base.posted) {
    uint64_t seq = c->announced;
    struct ib_msg* m = &c->q[seq % IB_DEPTH];
    struct ib_ann* a = &c->slots[seq % IB_DEPTH].ann;
    if (m->bytes) CHECK(ib_mr_get(&c->st->cache, m->ptr, m->bytes, &m->mr));
    *a = (struct ib_ann){
        seq, (uint64_t)(uintptr_t)m->ptr, m->bytes, m->mr ? m->mr->mr->rkey : 0, 0, m->tag};
    struct ibv_sge sge = {(uint64_t)(uintptr_t)a, sizeof(*a), c->slots_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = WR_ID(WR_CTRL_SEND, seq % IB_DEPTH),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED}, /* frees its queue entry */
        *bad;
    if (ibv_post_send(c->qp, &wr, &bad) != 0)
      FAIL(ncclSystemError, "NET/IB : announcing to rank %d failed", c->base.peer);
    c->announced++;
  }
fail:
  return res;
}

/* Receiver: a message's end arrived: the data (with immediate), or the
 * sender's size and call when they did not match. */
static ncclResult_t recv_done(struct ib_conn* c, const struct ibv_wc* wc) {
  ncclResult_t res = ncclSuccess;
  int slot = (int)WR_INDEX(wc->wr_id);
  uint64_t want = c->base.completed;
  struct ib_msg* m = &c->q[want % IB_DEPTH];
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    if (wc->imm_data != (uint32_t)want)
      FAIL(ncclInternalError, "NET/IB : rank %d completed message %u, %llu expected", c->base.peer,
           wc->imm_data, (unsigned long long)want);
  } else {
    const struct ib_fin* f = &c->slots[slot].fin;
    CHECK(transport_check_message(&c->base, f->seq, f->bytes, &f->tag, want, m->bytes, &m->tag));
    FAIL(ncclInternalError, "NET/IB : rank %d did not write message %llu", c->base.peer,
         (unsigned long long)want);
  }
  ib_mr_put(m->mr);
  m->mr = NULL;
  c->base.completed++;
  CHECK(post_ctrl_recv(c, slot));
fail:
  return res;
}

/* Sender: write the oldest message whose announcement came, or, if they
 * differ, tell the receiver so. */
static ncclResult_t send_write(struct ib_conn* c, struct ib_msg* m, const struct ib_ann* a,
                               uint64_t seq) {
  ncclResult_t res = ncclSuccess;
  struct ibv_send_wr* bad;
  if (a->bytes != m->bytes || memcmp(&a->tag, &m->tag, sizeof(m->tag)) != 0) {
    struct ib_fin* f = &c->slots[seq % IB_DEPTH].fin;
    *f = (struct ib_fin){seq, m->bytes, m->tag};
    struct ibv_sge sge = {(uint64_t)(uintptr_t)f, sizeof(*f), c->slots_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = WR_ID(WR_DATA_SEND, seq),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED};
    if (ibv_post_send(c->qp, &wr, &bad) != 0)
      FAIL(ncclSystemError, "NET/IB : sending to rank %d failed", c->base.peer);
    m->written = 1;
    return ncclSuccess;
  }
  if (m->bytes) CHECK(ib_mr_get(&c->st->cache, m->ptr, m->bytes, &m->mr));
  for (size_t off = 0; off < m->bytes || off == 0; off += IB_PIECE) {
    size_t len = MIN(IB_PIECE, m->bytes - off);
    int last = off + len >= m->bytes;
    struct ibv_sge sge = {(uint64_t)(uintptr_t)m->ptr + off, (uint32_t)len,
                          m->mr ? m->mr->mr->lkey : 0};
    struct ibv_send_wr wr = {.wr_id = WR_ID(WR_DATA_SEND, seq),
                             .sg_list = &sge,
                             .num_sge = len ? 1 : 0,
                             .opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                             .send_flags = last ? IBV_SEND_SIGNALED : 0,
                             .imm_data = (uint32_t)seq};
    wr.wr.rdma.remote_addr = a->addr + off;
    wr.wr.rdma.rkey = a->rkey;
    if (ibv_post_send(c->qp, &wr, &bad) != 0)
      FAIL(ncclSystemError, "NET/IB : writing to rank %d failed", c->base.peer);
    if (last) break;
  }
  m->written = 1;
fail:
  return res;
}

/* One completion. */
static ncclResult_t on_wc(struct ib_conn* c, const struct ibv_wc* wc, int* progressed) {
  ncclResult_t res = ncclSuccess;
  *progressed = 1;
  if (wc->status != IBV_WC_SUCCESS) return wc_failed(c, wc);
  switch (WR_KIND(wc->wr_id)) {
    case WR_CTRL_RECV: { /* sender: an announcement, in order */
      int slot = (int)WR_INDEX(wc->wr_id);
      if (c->slots[slot].ann.seq != c->nanns)
        FAIL(ncclInternalError, "NET/IB : rank %d announced %llu, %llu expected", c->base.peer,
             (unsigned long long)c->slots[slot].ann.seq, (unsigned long long)c->nanns);
      c->anns[c->nanns % IB_DEPTH] = c->slots[slot].ann;
      c->nanns++;
      CHECK(post_ctrl_recv(c, slot));
      break;
    }
    case WR_DATA_SEND: { /* sender: the message is out */
      struct ib_msg* m = &c->q[c->base.completed % IB_DEPTH];
      if (WR_INDEX(wc->wr_id) != c->base.completed)
        FAIL(ncclInternalError, "NET/IB : message %llu completed out of order",
             (unsigned long long)WR_INDEX(wc->wr_id));
      ib_mr_put(m->mr);
      m->mr = NULL;
      c->base.completed++;
      break;
    }
    case WR_DATA_RECV:
      CHECK(recv_done(c, wc));
      break;
    default: /* an announcement went out */
      break;
  }
fail:
  return res;
}

static ncclResult_t cq_drain(struct ib_conn* c, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct ibv_wc wc[16];
  int n;
  while ((n = ibv_poll_cq(c->cq, 16, wc)) > 0)
    for (int i = 0; i < n; i++) CHECK(on_wc(c, &wc[i], progressed));
  if (n < 0) FAIL(ncclSystemError, "NET/IB : ibv_poll_cq failed");
fail:
  return res;
}

/* The peer's socket closed: it died, aborted or failed - or finished,
 * its last acknowledgements still on their way: they get a grace period
 * (the waiter naps meanwhile: nothing wakes it). */
static ncclResult_t oob_check(struct ib_conn* c) {
  char b;
  ssize_t n = recv(c->oob, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
    return ncclSuccess;
  if (c->gone_since == 0) c->gone_since = braid_now_ns();
  if (braid_now_ns() - c->gone_since < IB_GONE_GRACE_NS) {
    transport_wait_nap(c->tctx->waits);
    return ncclSuccess;
  }
  WARN("NET/IB : rank %d closed its connection (it failed, aborted or died)", c->base.peer);
  return ncclRemoteError;
}

/* Fatal async events of the device (read by whichever conn looks first,
 * then every conn of the comm fails on them). */
static ncclResult_t async_check(struct ib_state* st) {
  struct ibv_async_event ev;
  while (!st->fatal_seen && st->v->get_async_event(st->ctx, &ev) == 0) {
    enum ibv_event_type t = ev.event_type;
    st->v->ack_async_event(&ev);
    if (t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_CQ_ERR ||
        t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_QP_ACCESS_ERR) {
      st->fatal = t;
      st->fatal_seen = 1;
    }
  }
  if (!st->fatal_seen) return ncclSuccess;
  WARN("NET/IB : %s:%d reported fatal async event %d", st->port.dev, st->port.port, (int)st->fatal);
  return ncclSystemError;
}

static ncclResult_t ib_progress(struct transport_conn* conn, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct ib_conn* c = (struct ib_conn*)conn;
  struct ibv_cq* cq;
  void* cq_ctx;
  int got = 0;
  CHECK(async_check(c->st));
  if (!c->ready) {
    CHECK(info_take(c, &got));
    if (!got) {
      transport_wait_on_fd(c->tctx->waits);
      return ncclSuccess;
    }
    *progressed = 1;
  }
  while (c->st->v->get_cq_event(c->ch, &cq, &cq_ctx) == 0) c->st->v->ack_cq_events(cq, 1);
  if (!conn->is_send) CHECK(recv_announce(c));
  CHECK(cq_drain(c, progressed));
  for (uint64_t k = conn->completed; conn->is_send && k < conn->posted && k < c->nanns; k++)
    if (!c->q[k % IB_DEPTH].written)
      CHECK(send_write(c, &c->q[k % IB_DEPTH], &c->anns[k % IB_DEPTH], k));
  if (conn->completed == conn->posted) return ncclSuccess;
  ibv_req_notify_cq(c->cq, 0); /* arm, then look once more before sleeping */
  CHECK(cq_drain(c, progressed));
  if (conn->completed < conn->posted) {
    CHECK(oob_check(c));
    transport_wait_on_fd(c->tctx->waits);
  }
fail:
  return res;
}

const struct transport ib_transport = {
    .name = "NET/IB",
    .id = TRANSPORT_NET_IB,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_WAKE_FD,
    .can_connect = ib_can_connect,
    .blob_bytes = sizeof(struct ib_blob),
    .blob_make = ib_blob_make,
    .connect_send = ib_connect_send,
    .connect_recv = ib_connect_recv,
    .reg = ib_reg,
    .dereg = ib_dereg,
    .post = ib_post,
    .progress = ib_progress,
    .shutdown = ib_shutdown,
    .close = ib_close,
    .free_state = ib_free_state,
    .link_mbps = ib_link_mbps,
};
