/*
 * Verbs setup (ib_connect.h): the comm's device and connections; a
 * connection's messages are ib_transport.c's.
 */
#include "ib_connect.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "ib_gdr.h"
#include "ib_gid.h"
#include "param.h"
#include "socket.h"
#include "tcp/tcp_connect.h"

#define IB_PROBE_PORTS 16

/* What a port on the other socket is priced at, at most: the link between
 * sockets bounds its traffic. NCCL's figure for a Skylake-class link
 * (10 GB/s); no machine here has two sockets to measure one. */
#define IB_CROSS_SOCKET_MBPS 80000u

/* ---- The comm's device ---- */

static ncclResult_t watch(struct transport_ctx* ctx, int fd);

struct ib_state* ib_state_of(const struct transport_ctx* ctx) {
  return ctx->state[ib_transport.id];
}

void ib_free_state(struct transport_ctx* ctx) {
  struct ib_state* st = ib_state_of(ctx);
  if (st == NULL) return;
  ib_mr_cache_free(&st->cache);
  if (st->pd) st->v->dealloc_pd(st->pd);
  if (st->ctx) st->v->close_device(st->ctx);
  free(st);
  ctx->state[ib_transport.id] = NULL;
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
  ctx->state[ib_transport.id] = st; /* ib_free_state undoes the rest */
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

ncclResult_t ib_blob_make(struct transport_ctx* ctx, void* blob) {
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

uint32_t ib_link_mbps(const struct transport_ctx* ctx, int rank) {
  struct ib_blob b;
  memcpy(&b, transport_peer_blob(ctx, &ib_transport, rank), sizeof(b));
  if (!b.valid) return 0;
  return b.far ? MIN(b.mbps, IB_CROSS_SOCKET_MBPS) : b.mbps;
}

/* The topology's report: the port this rank's comm uses, as the probe
 * lists the ports (its NUMA node against the rank's says if it is far). */
void ib_describe(const struct transport_ctx* ctx, char* out, size_t len) {
  const struct ib_state* st = ib_state_of(ctx);
  char port[96];
  if (st == NULL) return;
  ib_port_describe(&st->port, port, sizeof(port));
  snprintf(out, len, "%s, rank %d (NUMA %d) on %s", ib_transport.name, ctx->rank, st->numa, port);
}

int ib_can_connect(const struct transport_ctx* ctx, int a, int b) {
  struct ib_blob x, y;
  memcpy(&x, transport_peer_blob(ctx, &ib_transport, a), sizeof(x));
  memcpy(&y, transport_peer_blob(ctx, &ib_transport, b), sizeof(y));
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
  for (int i = IB_DEPTH; i < 2 * IB_DEPTH; i++) CHECK(ib_post_recv(c, 0, i));
  for (int j = 1; j < nqps && !c->base.is_send; j++)
    for (int i = 0; i < IB_DEPTH; i++) CHECK(ib_post_recv(c, j, 0));
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

ncclResult_t ib_info_take(struct ib_conn* c, int* got) {
  struct ib_conn_info peer;
  ncclResult_t res = info_read(c->oob, c->base.peer, &peer, got);
  if (res == ncclSuccess && *got) res = qps_connect(c, &peer);
  return res;
}

ncclResult_t ib_connect_send(struct transport_ctx* ctx, int peer, int channel,
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
ncclResult_t ib_connect_recv(struct transport_ctx* ctx, int peer, int channel,
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

void ib_shutdown(struct transport_conn* conn) {
  struct ib_conn* c = (struct ib_conn*)conn;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
  shutdown(c->oob, SHUT_RDWR);
  for (int j = 0; j < c->nqps; j++) c->st->v->modify_qp(c->qps[j], &a, IBV_QP_STATE);
}

void ib_close(struct transport_conn* conn) {
  conn_free((struct ib_conn*)conn);
}
