/*
 * The verbs transport's connection and device state, shared by its two
 * halves: ib_connect.c opens the device and sets connections up (QPs
 * exchanged over an out-of-band socket), ib_transport.c moves the
 * messages (announcements, RDMA writes, completions).
 */
#ifndef BRAID_IB_TRANSPORT_H_
#define BRAID_IB_TRANSPORT_H_

#include <stddef.h>
#include <stdint.h>

#include "ib_devices.h"
#include "ib_mr_cache.h"
#include "ib_qp.h"
#include "nccl.h"
#include "transport.h"

#define IB_DEPTH TRANSPORT_MAX_INFLIGHT
#define IB_MAX_QPS 16
/* Bounce slots per connection, each a pipeline chunk (at most BOUNCE_MAX). */
#define IB_BOUNCE_SLOTS 16
#define IB_BOUNCE_MAX ((size_t)1 << 20)

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

/* A receive on QP `qp`: on QP 0 into slot `slot` (announcements at the
 * sender; fins, or nothing, at the receiver), elsewhere into nothing (the
 * immediate of a stripe's last write). (ib_transport.c) */
ncclResult_t ib_post_recv(struct ib_conn* c, int qp, int slot);

/* Its descriptor, a row of the transport table (ib_transport.c). */
extern const struct transport ib_transport;

#endif /* BRAID_IB_TRANSPORT_H_ */
