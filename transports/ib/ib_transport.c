/*
 * The verbs transport (NET/IB): one RC queue pair per peer, channel and
 * direction (or several, striped), receiver-announced buffers, RDMA write
 * with immediate. Setup is ib_connect.c's.
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
#include "ib_transport.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "ib_connect.h"
#include "ib_probe.h"
#include "mem_kind.h"
#include "param.h"
#include "tcp/tcp.h"

#define IB_PIECE ((size_t)1 << 30) /* bytes per work request at most */
/* Striping: a message takes one stripe per STRIPE_MIN bytes, up to one per
 * QP, cut on STRIPE_ALIGN bytes; stripe j of message s goes on QP (s+j) %
 * nqps, so small messages still spread over the QPs. */
#define IB_STRIPE_MIN ((size_t)16 << 10)
#define IB_STRIPE_ALIGN ((size_t)128)
/* A peer's socket closed while a message is still out: how long its last
 * completions (already on their way on the QP) may take to show. */
#define IB_GONE_GRACE_NS 1000000000ull

/* A receive on QP `qp`: on QP 0 into slot `slot` (announcements at the
 * sender; fins, or nothing, at the receiver), elsewhere into nothing (the
 * immediate of a stripe's last write). */
ncclResult_t ib_post_recv(struct ib_conn* c, int qp, int slot) {
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
  CHECK(ib_post_recv(c, WR_QP(wc->wr_id), (int)WR_INDEX(wc->wr_id)));
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
  return ib_post_recv(c, 0, slot);
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
    CHECK(ib_info_take(c, &got));
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
    .key = "ib",
    .id = 2,
    .net_name = "IB",
    .link = TRANSPORT_LINK_NETWORK,
    .net_check = ib_probe,
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
    .describe = ib_describe,
};
