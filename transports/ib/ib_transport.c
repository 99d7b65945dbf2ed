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
#include <sched.h>
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
#include "mem_kind.h"
#include "param.h"
#include "socket.h"
#include "tcp/tcp.h"
#include "tcp/tcp_connect.h"

#define IB_DEPTH TRANSPORT_MAX_INFLIGHT
#define IB_PIECE ((size_t)1 << 30) /* bytes per work request at most */
#define IB_PROBE_PORTS 16
#define IB_MAX_QPS 16
/* Striping: a message takes one stripe per STRIPE_MIN bytes, up to one per
 * QP, cut on STRIPE_ALIGN bytes; stripe j of message s goes on QP (s+j) %
 * nqps, so small messages still spread over the QPs. */
#define IB_STRIPE_MIN ((size_t)16 << 10)
#define IB_STRIPE_ALIGN ((size_t)128)
/* Bounce slots per connection, each a pipeline chunk (at most BOUNCE_MAX). */
#define IB_BOUNCE_SLOTS 16
#define IB_BOUNCE_MAX ((size_t)1 << 20)
/* A peer's socket closed while a message is still out: how long its last
 * completions (already on their way on the QP) may take to show. */
#define IB_GONE_GRACE_NS 1000000000ull

/* What a rank publishes: whether it speaks verbs, and on what link. */
struct ib_blob {
  uint8_t valid;
  uint8_t link_layer;
  uint8_t far; /* its port is on another NUMA node than the rank */
  uint8_t pad;
  uint32_t mbps; /* its port's rate */
};

/* What a port on the other socket is priced at, at most: the link between
 * sockets bounds its traffic. NCCL's figure for a Skylake-class link
 * (10 GB/s); no machine here has two sockets to measure one. */
#define IB_CROSS_SOCKET_MBPS 80000u

/* The comm's device: one port (the first NCCL_IB_HCA selects). */
struct ib_state {
  const struct ib_verbs* v;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ib_port port;
  int numa;               /* the rank's NUMA node when it opened the device (-1: unknown) */
  struct ib_qp_info self; /* lid, link layer, MTU, GID: every QP's */
  struct ib_qp_knobs knobs;
  int nqps; /* NCCL_IB_QPS_PER_CONNECTION: this end's, when it sends */
  struct ib_mr_cache cache;
  enum ibv_event_type fatal; /* a fatal async event seen (0: none): every conn fails */
  int fatal_seen;
};

/* A connection's queue pairs, as each end tells the other. The sending
 * end's NCCL_IB_QPS_PER_CONNECTION rules: the receiving end makes as
 * many. */
struct ib_conn_info {
  uint32_t nqps, pad;
  struct ib_qp_info qp[IB_MAX_QPS];
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

/* wr_id: what completed, on which QP, and which slot or message. */
enum ib_wr { WR_CTRL_SEND = 1, WR_CTRL_RECV, WR_DATA_SEND, WR_DATA_RECV };
#define WR_ID(kind, qp, i) ((uint64_t)(kind) << 56 | (uint64_t)(qp) << 48 | (uint64_t)(i))
#define WR_KIND(id) ((int)((id) >> 56))
#define WR_QP(id) ((int)(((id) >> 48) & 0xff))
#define WR_INDEX(id) ((id) & ((1ull << 48) - 1))

/* A message, and how the NIC reaches its buffer: through a registration
 * (ncclCommRegister's, or one made for it), or through the connection's
 * bounce slot of its sequence, copied there or from there. */
struct ib_msg {
  void* ptr;
  size_t bytes;
  struct transport_tag tag;
  struct ib_mr_ent* mr; /* held while the NIC may touch the buffer */
  int owned;            /* the comm's own memory: its registration is kept */
  int bounce;           /* a small user buffer nobody registered */
  int written;          /* send: its writes (or fin) are posted */
  int left;             /* completions still due: stripes written, or to arrive */
};

struct ib_conn {
  struct transport_conn base;
  struct transport_ctx* tctx;
  struct ib_state* st;
  int oob;             /* the out-of-band socket */
  int ready;           /* the QPs are connected */
  uint64_t gone_since; /* the socket closed with messages still out (0: not) */
  struct ibv_comp_channel* ch;
  struct ibv_cq* cq; /* every QP's */
  int nqps;
  struct ibv_qp* qps[IB_MAX_QPS]; /* qps[0] also carries the control messages */
  struct ib_conn_info self;
  /* slots [0, IB_DEPTH): what this end sends (announcements, fins);
   * [IB_DEPTH, 2 IB_DEPTH): where the other end's land */
  union ib_slot slots[2 * IB_DEPTH];
  struct ibv_mr* slots_mr;
  char* bounce; /* IB_BOUNCE_SLOTS x bounce_bytes, registered at first need */
  size_t bounce_bytes;
  struct ibv_mr* bounce_mr;
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

/* The NUMA node this rank runs on (-1: unknown): where its buffers are
 * likely to live, so the HCA it would rather use. */
static int rank_numa(void) {
  unsigned cpu, node;
  return getcpu(&cpu, &node) == 0 ? (int)node : -1;
}

/* Open the device of the selected port nearest this rank: PD, GID, the
 * QPs' common info. */
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
  st->numa = rank_numa();
  st->port = ports[ib_port_pick(ports, n, st->numa)];
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
  st->nqps = (int)param_ib_qps_per_conn();
  ib_mr_cache_init(&st->cache, v, st->pd);
  CHECK(watch(ctx, st->ctx->async_fd)); /* fatal events wake the waiter */
  *out = st;
fail:
  return res;
}

static ncclResult_t ib_blob_make(struct transport_ctx* ctx, void* blob) {
  ncclResult_t res = ncclSuccess;
  struct ib_blob b = {0, 0, 0, 0, 0};
  struct ib_state* st = NULL;
  if (ctx->net == &ib_transport) { /* only where NCCL_NET chose it */
    CHECK(ib_state_open(ctx, &st));
    b.valid = 1;
    b.link_layer = st->self.link_layer;
    b.far = (uint8_t)ib_port_far(&st->port, st->numa);
    b.mbps = st->port.mbps;
    char d[96];
    ib_port_describe(&st->port, d, sizeof(d));
    const char* gdr = ib_gdr_module("/");
    INFO(SUB_INIT | SUB_NET,
         "NET/IB : rank %d (NUMA %d) on %s%s, GID index %d; GPUDirect RDMA %s%s%s (not used yet: "
         "device buffers go through pinned host slots)",
         ctx->rank, st->numa, d, b.far ? " across sockets" : "", st->self.gid_index,
         gdr ? "would be available: " : "unavailable", gdr ? gdr : "",
         gdr ? " loaded" : " (no nvidia_peermem)");
  }
  memcpy(blob, &b, sizeof(b));
fail:
  return res;
}

static uint32_t ib_link_mbps(const struct transport_ctx* ctx, int rank) {
  struct ib_blob b;
  memcpy(&b, transport_peer_blob(ctx, TRANSPORT_NET_IB, rank), sizeof(b));
  if (!b.valid) return 0;
  return b.far ? MIN(b.mbps, IB_CROSS_SOCKET_MBPS) : b.mbps;
}

static int ib_can_connect(const struct transport_ctx* ctx, int a, int b) {
  struct ib_blob x, y;
  memcpy(&x, transport_peer_blob(ctx, TRANSPORT_NET_IB, a), sizeof(x));
  memcpy(&y, transport_peer_blob(ctx, TRANSPORT_NET_IB, b), sizeof(y));
  return a != b && x.valid && y.valid && x.link_layer == y.link_layer;
}

/* ---- Connections ---- */

static void conn_free(struct ib_conn* c) {
  const struct ib_verbs* v = c->st ? c->st->v : NULL;
  for (int i = 0; i < IB_DEPTH; i++) ib_mr_put(c->q[i].mr);
  for (int j = 0; j < c->nqps; j++)
    if (c->qps[j]) v->destroy_qp(c->qps[j]);
  if (c->slots_mr) v->dereg_mr(c->slots_mr);
  if (c->bounce_mr) v->dereg_mr(c->bounce_mr);
  free(c->bounce);
  if (c->cq) v->destroy_cq(c->cq);
  if (c->ch) v->destroy_comp_channel(c->ch);
  if (c->oob >= 0) close(c->oob);
  free(c);
}

/* A receive on QP `qp`: on QP 0 into slot `slot` (announcements at the
 * sender; fins, or nothing, at the receiver), elsewhere into nothing (the
 * immediate of a stripe's last write). */
static ncclResult_t post_recv(struct ib_conn* c, int qp, int slot) {
  struct ibv_sge sge = {(uint64_t)(uintptr_t)&c->slots[slot], sizeof(union ib_slot),
                        c->slots_mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = WR_ID(c->base.is_send ? WR_CTRL_RECV : WR_DATA_RECV, qp, slot),
                           .sg_list = &sge,
                           .num_sge = qp == 0 ? 1 : 0},
                     *bad;
  if (ibv_post_recv(c->qps[qp], &wr, &bad) == 0) return ncclSuccess;
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

/* The QPs of a connection, in INIT, with their receives posted (the other
 * end may send as soon as it is connected): announcements at the sender,
 * fins and stripes' immediates at the receiver. */
static ncclResult_t qps_make(struct ib_conn* c, int nqps) {
  ncclResult_t res = ncclSuccess;
  struct ib_state* st = c->st;
  c->self.nqps = (uint32_t)nqps;
  for (int j = 0; j < nqps; j++) {
    CHECK(ib_qp_create(st->v, st->pd, c->cq, st->port.port, 2 * IB_DEPTH, &c->qps[j]));
    c->nqps = j + 1;
    c->self.qp[j] = st->self;
    c->self.qp[j].qpn = c->qps[j]->qp_num;
  }
  for (int i = IB_DEPTH; i < 2 * IB_DEPTH; i++) CHECK(post_recv(c, 0, i));
  for (int j = 1; j < nqps && !c->base.is_send; j++)
    for (int i = 0; i < IB_DEPTH; i++) CHECK(post_recv(c, j, 0));
fail:
  return res;
}

/* A connection's verbs objects. It owns `oob` from here on. */
static ncclResult_t conn_make(struct transport_ctx* ctx, int peer, int is_send, int oob, int nqps,
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
  c->bounce_bytes = MIN((size_t)param_chunk_size(), IB_BOUNCE_MAX);
  c->ch = st->v->create_comp_channel(st->ctx);
  c->cq = c->ch ? st->v->create_cq(st->ctx, (2 + 2 * nqps) * IB_DEPTH, c, c->ch, 0) : NULL;
  c->slots_mr = st->v->reg_mr(st->pd, c->slots, sizeof(c->slots), IBV_ACCESS_LOCAL_WRITE);
  if (c->cq == NULL || c->slots_mr == NULL)
    FAIL(ncclSystemError, "NET/IB : cannot make the CQ or register slots for rank %d", peer);
  CHECK(qps_make(c, nqps));
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

/* The peer's QP info, once whole on the socket (*got 0: not yet). */
static ncclResult_t info_read(int oob, int peer, struct ib_conn_info* info, int* got) {
  ssize_t n = recv(oob, info, sizeof(*info), MSG_PEEK | MSG_DONTWAIT);
  *got = 0;
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    WARN("NET/IB : rank %d closed its connection before it was set up", peer);
    return ncclRemoteError;
  }
  if (n < (ssize_t)sizeof(*info)) return ncclSuccess;
  if (recv(oob, info, sizeof(*info), 0) != (ssize_t)sizeof(*info) || info->nqps < 1 ||
      info->nqps > IB_MAX_QPS) {
    WARN("NET/IB : bad QP info from rank %d", peer);
    return ncclRemoteError;
  }
  *got = 1;
  return ncclSuccess;
}

/* Connect QP j to the peer's QP j, every one. */
static ncclResult_t qps_connect(struct ib_conn* c, const struct ib_conn_info* peer) {
  ncclResult_t res = ncclSuccess;
  if ((int)peer->nqps != c->nqps)
    FAIL(ncclInternalError, "NET/IB : rank %d has %u QPs on our connection, %d here", c->base.peer,
         peer->nqps, c->nqps);
  for (int j = 0; j < c->nqps; j++)
    CHECK(ib_qp_connect(c->st->v, c->qps[j], c->st->port.port, &c->self.qp[j], &peer->qp[j],
                        &c->st->knobs));
  c->ready = 1;
fail:
  return res;
}

/* The sender: the receiver's answer, once whole: connect. */
static ncclResult_t info_take(struct ib_conn* c, int* got) {
  struct ib_conn_info peer;
  ncclResult_t res = info_read(c->oob, c->base.peer, &peer, got);
  if (res == ncclSuccess && *got) res = qps_connect(c, &peer);
  return res;
}

static ncclResult_t ib_connect_send(struct transport_ctx* ctx, int peer, int channel,
                                    struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ib_conn* c = NULL;
  struct ib_state* st = ib_state_of(ctx);
  int oob = -1;
  CHECK(tcp_oob_dial(ctx, peer, channel, &oob));
  CHECK(conn_make(ctx, peer, 1, oob, st ? st->nqps : 1, &c));
  res = info_send(c); /* its answer comes later: progress connects the QPs */
  if (res != ncclSuccess) {
    conn_free(c);
    goto fail;
  }
  *out = &c->base;
fail:
  return res;
}

/* The sender's info (sent in its send phase), waited for in poll. */
static ncclResult_t info_wait(struct transport_ctx* ctx, int oob, int peer,
                              struct ib_conn_info* info) {
  ncclResult_t res = ncclSuccess;
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  int got = 0;
  while (res == ncclSuccess && !got) {
    res = socket_wait(oob, POLLIN, deadline, ctx->aborted, "NET/IB QP info");
    if (res == ncclSuccess) res = info_read(oob, peer, info, &got);
  }
  return res;
}

/* The receiving end makes as many QPs as the sender, connects them, and
 * answers. */
static ncclResult_t ib_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                                    struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct ib_conn* c = NULL;
  struct ib_conn_info info;
  int oob = -1;
  CHECK(tcp_oob_answer(ctx, peer, channel, &oob));
  res = info_wait(ctx, oob, peer, &info);
  if (res != ncclSuccess) {
    close(oob);
    goto fail;
  }
  CHECK(conn_make(ctx, peer, 0, oob, (int)info.nqps, &c));
  res = qps_connect(c, &info);
  if (res == ncclSuccess) res = info_send(c);
  if (res != ncclSuccess) {
    conn_free(c);
    goto fail;
  }
  INFO(SUB_NET | SUB_INIT, "Channel %d: rank %d via NET/IB, %d QP%s (first %u)", channel, peer,
       c->nqps, c->nqps > 1 ? "s" : "", c->self.qp[0].qpn);
  *out = &c->base;
fail:
  return res;
}

static void ib_shutdown(struct transport_conn* conn) {
  struct ib_conn* c = (struct ib_conn*)conn;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
  shutdown(c->oob, SHUT_RDWR);
  for (int j = 0; j < c->nqps; j++) c->st->v->modify_qp(c->qps[j], &a, IBV_QP_STATE);
}

static void ib_close(struct transport_conn* conn) {
  conn_free((struct ib_conn*)conn);
}

/* ---- Registration ---- */

/* ncclCommRegister: a host range registered now and held until it is
 * deregistered, so messages inside it go without a copy. Device memory
 * is left alone: without GPUDirect RDMA the NIC cannot register it, and
 * its messages cross through pinned host slots. */
static ncclResult_t ib_reg(struct transport_ctx* ctx, void* base, size_t size, void** handle) {
  struct ib_state* st = ib_state_of(ctx);
  *handle = NULL;
  if (st == NULL || mem_query(base) != MEM_HOST) return ncclSuccess;
  return ib_mr_get(&st->cache, base, size, 0, (struct ib_mr_ent**)handle);
}

static void ib_dereg(struct transport_ctx* ctx, void* handle) {
  (void)ctx;
  ib_mr_put(handle);
}

/* ---- Messages ---- */

/* A user buffer nobody registered goes through a bounce slot when it fits
 * one: registering it for the message would cost more than the copy, and
 * a registration kept past the call could outlive the buffer. A larger
 * one is registered for as long as its message is out. */
static ncclResult_t ib_post(struct transport_conn* conn, const struct transport_buf* buf,
                            const struct transport_tag* tag) {
  struct ib_conn* c = (struct ib_conn*)conn;
  if (!transport_moves(conn, buf)) return ncclInternalError;
  struct ib_msg* m = &c->q[conn->posted % IB_DEPTH];
  memset(m, 0, sizeof(*m));
  m->ptr = buf->ptr;
  m->bytes = buf->bytes;
  if (tag) m->tag = *tag;
  m->owned = buf->owned;
  if (buf->reg) {
    m->mr = buf->reg;
    ib_mr_hold(m->mr);
  }
  m->bounce = !buf->reg && !buf->owned && buf->bytes > 0 && buf->bytes <= c->bounce_bytes;
  conn->posted++;
  return ncclSuccess;
}

/* Whether message `seq` may use its bounce slot: the message that used
 * it last is complete. */
static int bounce_free(const struct ib_conn* c, const struct ib_msg* m, uint64_t seq) {
  return !m->bounce || seq < c->base.completed + IB_BOUNCE_SLOTS;
}

static ncclResult_t bounce_ready(struct ib_conn* c) {
  size_t bytes = IB_BOUNCE_SLOTS * c->bounce_bytes;
  if (c->bounce_mr) return ncclSuccess;
  if (c->bounce == NULL) c->bounce = aligned_alloc(4096, bytes);
  if (c->bounce) c->bounce_mr = c->st->v->reg_mr(c->st->pd, c->bounce, bytes, IB_MR_ACCESS);
  if (c->bounce_mr) return ncclSuccess;
  WARN("NET/IB : cannot allocate or register %zu bytes of bounce slots for rank %d", bytes,
       c->base.peer);
  return ncclSystemError;
}

static char* bounce_at(const struct ib_conn* c, uint64_t seq) {
  return c->bounce + (seq % IB_BOUNCE_SLOTS) * c->bounce_bytes;
}

/* Where the NIC reads or writes message `seq`, and under which region. */
static ncclResult_t msg_mem(struct ib_conn* c, struct ib_msg* m, uint64_t seq, char** at,
                            struct ibv_mr** mr) {
  ncclResult_t res = ncclSuccess;
  *at = m->ptr;
  *mr = NULL;
  if (m->bounce) {
    CHECK(bounce_ready(c));
    *at = bounce_at(c, seq);
    *mr = c->bounce_mr;
  } else if (m->bytes) {
    if (m->mr == NULL) CHECK(ib_mr_get(&c->st->cache, m->ptr, m->bytes, m->owned, &m->mr));
    *mr = m->mr->mr;
  }
fail:
  return res;
}

/* How many stripes a message of `bytes` takes, and where stripe j starts. */
static int msg_stripes(const struct ib_conn* c, size_t bytes) {
  size_t n = bytes / IB_STRIPE_MIN;
  return n < 1 ? 1 : n > (size_t)c->nqps ? c->nqps : (int)n;
}
static size_t stripe_start(size_t bytes, int j, int n) {
  if (j == n) return bytes;
  return (size_t)((unsigned __int128)bytes * (unsigned)j / (unsigned)n) & ~(IB_STRIPE_ALIGN - 1);
}

static ncclResult_t wc_failed(struct ib_conn* c, const struct ibv_wc* wc) {
  WARN("NET/IB : work request to rank %d failed: %s (status %d)", c->base.peer,
       c->st->v->wc_status_str(wc->status), (int)wc->status);
  return wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_WR_FLUSH_ERR ? ncclRemoteError
                                                                                 : ncclSystemError;
}

/* Receiver: announce every posted receive (the slot of its sequence), in
 * order; a bounced one waits for its bounce slot. */
static ncclResult_t recv_announce(struct ib_conn* c) {
  ncclResult_t res = ncclSuccess;
  while (c->announced < c->base.posted) {
    uint64_t seq = c->announced;
    struct ib_msg* m = &c->q[seq % IB_DEPTH];
    struct ib_ann* a = &c->slots[seq % IB_DEPTH].ann;
    struct ibv_mr* mr;
    char* at;
    if (!bounce_free(c, m, seq)) break;
    CHECK(msg_mem(c, m, seq, &at, &mr));
    m->left = msg_stripes(c, m->bytes);
    *a = (struct ib_ann){seq, (uint64_t)(uintptr_t)at, m->bytes, mr ? mr->rkey : 0, 0, m->tag};
    struct ibv_sge sge = {(uint64_t)(uintptr_t)a, sizeof(*a), c->slots_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = WR_ID(WR_CTRL_SEND, 0, seq % IB_DEPTH),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED}, /* frees its queue entry */
        *bad;
    if (ibv_post_send(c->qps[0], &wr, &bad) != 0)
      FAIL(ncclSystemError, "NET/IB : announcing to rank %d failed", c->base.peer);
    c->announced++;
  }
fail:
  return res;
}

/* Receiver: complete the messages whose stripes all arrived, in order,
 * copying bounced ones out. */
static ncclResult_t recv_finish(struct ib_conn* c) {
  ncclResult_t res = ncclSuccess;
  while (c->base.completed < c->announced) {
    uint64_t seq = c->base.completed;
    struct ib_msg* m = &c->q[seq % IB_DEPTH];
    if (m->left > 0) break;
    if (m->bounce) CHECK(mem_copy(m->ptr, bounce_at(c, seq), m->bytes));
    ib_mr_put(m->mr);
    m->mr = NULL;
    c->base.completed++;
  }
fail:
  return res;
}

/* Receiver: a stripe's end arrived (its immediate is the message's
 * sequence), or the sender's size and call, when they did not match. */
static ncclResult_t recv_arrived(struct ib_conn* c, const struct ibv_wc* wc) {
  ncclResult_t res = ncclSuccess;
  uint64_t done = c->base.completed;
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    uint64_t seq = done + (uint32_t)(wc->imm_data - (uint32_t)done);
    if (seq >= c->announced || c->q[seq % IB_DEPTH].left <= 0)
      FAIL(ncclInternalError, "NET/IB : rank %d wrote message %u, not awaited (%llu done)",
           c->base.peer, wc->imm_data, (unsigned long long)done);
    c->q[seq % IB_DEPTH].left--;
  } else {
    const struct ib_fin* f = &c->slots[WR_INDEX(wc->wr_id)].fin;
    const struct ib_msg* m = &c->q[f->seq % IB_DEPTH];
    if (f->seq < done || f->seq >= c->announced)
      FAIL(ncclInternalError, "NET/IB : rank %d sent a fin for message %llu", c->base.peer,
           (unsigned long long)f->seq);
    CHECK(transport_check_message(&c->base, f->seq, f->bytes, &f->tag, f->seq, m->bytes, &m->tag));
    FAIL(ncclInternalError, "NET/IB : rank %d did not write message %llu", c->base.peer,
         (unsigned long long)f->seq);
  }
  CHECK(post_recv(c, WR_QP(wc->wr_id), (int)WR_INDEX(wc->wr_id)));
  CHECK(recv_finish(c));
fail:
  return res;
}

/* Sender: [off, off + len) of a message from `at` to the receiver's
 * buffer on QP j; the last write carries the immediate and completes. */
static ncclResult_t write_stripe(struct ib_conn* c, int j, const char* at, size_t len,
                                 const struct ibv_mr* mr, const struct ib_ann* a, size_t off,
                                 uint64_t seq) {
  struct ibv_send_wr* bad;
  for (size_t done = 0;; done += IB_PIECE) {
    size_t n = MIN(IB_PIECE, len - done);
    int last = done + n >= len;
    struct ibv_sge sge = {(uint64_t)(uintptr_t)at + off + done, (uint32_t)n, mr ? mr->lkey : 0};
    struct ibv_send_wr wr = {.wr_id = WR_ID(WR_DATA_SEND, j, seq),
                             .sg_list = &sge,
                             .num_sge = n ? 1 : 0,
                             .opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                             .send_flags = last ? IBV_SEND_SIGNALED : 0,
                             .imm_data = (uint32_t)seq};
    wr.wr.rdma.remote_addr = a->addr + off + done;
    wr.wr.rdma.rkey = a->rkey;
    if (ibv_post_send(c->qps[j], &wr, &bad) != 0) {
      WARN("NET/IB : writing to rank %d failed", c->base.peer);
      return ncclSystemError;
    }
    if (last) return ncclSuccess;
  }
}

/* Sender: a message that differs from its announcement is not written:
 * the receiver gets its size and call instead. */
static ncclResult_t send_fin(struct ib_conn* c, struct ib_msg* m, uint64_t seq) {
  struct ib_fin* f = &c->slots[seq % IB_DEPTH].fin;
  struct ibv_send_wr* bad;
  *f = (struct ib_fin){seq, m->bytes, m->tag};
  struct ibv_sge sge = {(uint64_t)(uintptr_t)f, sizeof(*f), c->slots_mr->lkey};
  struct ibv_send_wr wr = {.wr_id = WR_ID(WR_DATA_SEND, 0, seq),
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED};
  if (ibv_post_send(c->qps[0], &wr, &bad) != 0) {
    WARN("NET/IB : sending to rank %d failed", c->base.peer);
    return ncclSystemError;
  }
  m->left = 1;
  m->written = 1;
  return ncclSuccess;
}

/* Sender: write a message whose announcement came, striped over the QPs. */
static ncclResult_t send_write(struct ib_conn* c, struct ib_msg* m, const struct ib_ann* a,
                               uint64_t seq) {
  ncclResult_t res = ncclSuccess;
  struct ibv_mr* mr;
  char* at;
  if (a->bytes != m->bytes || memcmp(&a->tag, &m->tag, sizeof(m->tag)) != 0)
    return send_fin(c, m, seq);
  CHECK(msg_mem(c, m, seq, &at, &mr));
  if (m->bounce) CHECK(mem_copy(at, m->ptr, m->bytes));
  m->left = msg_stripes(c, m->bytes);
  for (int j = 0, n = m->left; j < n; j++) {
    size_t lo = stripe_start(m->bytes, j, n), hi = stripe_start(m->bytes, j + 1, n);
    CHECK(write_stripe(c, (int)((seq + (uint64_t)j) % (uint64_t)c->nqps), at, hi - lo, mr, a, lo,
                       seq));
  }
  m->written = 1;
fail:
  return res;
}

/* Sender: a stripe (or fin) is out; complete the messages done, in order. */
static ncclResult_t send_done(struct ib_conn* c, const struct ibv_wc* wc) {
  uint64_t seq = WR_INDEX(wc->wr_id);
  struct ib_msg* m = &c->q[seq % IB_DEPTH];
  if (seq < c->base.completed || seq >= c->base.posted || !m->written || m->left <= 0) {
    WARN("NET/IB : message %llu to rank %d completed unexpectedly", (unsigned long long)seq,
         c->base.peer);
    return ncclInternalError;
  }
  m->left--;
  while (c->base.completed < c->base.posted) {
    m = &c->q[c->base.completed % IB_DEPTH];
    if (!m->written || m->left > 0) break;
    ib_mr_put(m->mr);
    m->mr = NULL;
    c->base.completed++;
  }
  return ncclSuccess;
}

/* Sender: an announcement, in order. */
static ncclResult_t ann_arrived(struct ib_conn* c, const struct ibv_wc* wc) {
  int slot = (int)WR_INDEX(wc->wr_id);
  if (c->slots[slot].ann.seq != c->nanns) {
    WARN("NET/IB : rank %d announced %llu, %llu expected", c->base.peer,
         (unsigned long long)c->slots[slot].ann.seq, (unsigned long long)c->nanns);
    return ncclInternalError;
  }
  c->anns[c->nanns % IB_DEPTH] = c->slots[slot].ann;
  c->nanns++;
  return post_recv(c, 0, slot);
}

/* One completion. */
static ncclResult_t on_wc(struct ib_conn* c, const struct ibv_wc* wc, int* progressed) {
  *progressed = 1;
  if (wc->status != IBV_WC_SUCCESS) return wc_failed(c, wc);
  switch (WR_KIND(wc->wr_id)) {
    case WR_CTRL_RECV:
      return ann_arrived(c, wc);
    case WR_DATA_SEND:
      return send_done(c, wc);
    case WR_DATA_RECV:
      return recv_arrived(c, wc);
    default: /* an announcement went out */
      return ncclSuccess;
  }
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

/* What this end can start now: announcements, or writes of announced
 * messages (in order; a bounced one waits for its slot). */
static ncclResult_t start_moves(struct ib_conn* c) {
  struct transport_conn* conn = &c->base;
  if (!conn->is_send) return recv_announce(c);
  for (uint64_t k = conn->completed; k < conn->posted && k < c->nanns; k++) {
    struct ib_msg* m = &c->q[k % IB_DEPTH];
    if (m->written) continue;
    if (!bounce_free(c, m, k)) break;
    ncclResult_t res = send_write(c, m, &c->anns[k % IB_DEPTH], k);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
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
  CHECK(cq_drain(c, progressed));
  CHECK(start_moves(c));
  if (conn->completed == conn->posted) return ncclSuccess;
  ibv_req_notify_cq(c->cq, 0); /* arm, then look once more before sleeping */
  CHECK(cq_drain(c, progressed));
  CHECK(start_moves(c)); /* what those completions freed */
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
