/*
 * Connections on demand. Before a unit of work runs, every connection its
 * operations need is made: first every missing send side (a connect lands
 * in the peer's listen backlog without the peer's help), then every missing
 * receive side (accepting what peers connected). No rank ever waits for a
 * peer that is itself waiting, even when one thread drives many comms.
 */
#include "engine/connect.h"

#include "comm/comm.h"
#include "core.h"
#include "direct.h"
#include "sched_build.h"
#include "transport_table.h"
#include "engine/work_op.h"

#define CONNECT_MAX_PEERS 64

/* peers[0..m) with the rank of index `local` on `node` added once; the
 * new count. */
static int column_add(int* peers, int m, const struct sched_topo* t, int node, int local) {
  return sched_add_peer(peers, m, CONNECT_MAX_PEERS, t->order[t->node_start[node] + local]);
}

/* Hier with direct node stages talks, beside its schedule's peers, with
 * the ranks of its index on the nodes its stage between nodes joins
 * (algorithms/direct.h, direct_stage_partners): on the device
 * (work_op.direct_between) its collective's partners, on the host a ring
 * along the column, an all-gather's. Host Hier's schedule, which the key
 * names, has those links only where nodes are of one size: on unequal
 * nodes its rings join the owners of pieces, not columns ({4, 2}: rank 5
 * meets 2 and 3, its column's rank is 1). Those added to peers[0..m);
 * the new count. An index past the columns (on a node larger than the
 * smallest) has no stage between nodes. */
static int column_peers(const struct work_op* op, int* peers, int m) {
  const struct sched_topo* t = &op->comm->layout;
  int me = op->comm->rank, local = t->local_of[me], nodes[DIRECT_MAX_PARTNERS];
  if (op->direct != WORK_DIRECT_HIER || local >= t->min_ppn) return m;
  int coll = op->direct_between ? op->args.coll : COLL_ALLGATHER;
  int k = direct_stage_partners(coll, t->nnodes, t->node_of[me], nodes);
  for (int i = 0; i < k; i++) m = column_add(peers, m, t, nodes[i], local);
  return m;
}

/* The peers an operation talks to, and whether it sends/receives to each:
 * a collective's, from the schedule work_plan chose; none for a direct
 * call on one node, whose kernels reach the peers' buffers over links of
 * its own (cuda_direct.h) and never fall back to the schedule. */
static int op_peers(struct work_op* op, int* peers, int* sends, int* recvs) {
  if (op->kind == WORK_COLL && op->direct == WORK_DIRECT_NODE) return 0;
  if (op->kind == WORK_COLL) {
    int m = sched_peers(&op->key, peers, CONNECT_MAX_PEERS);
    m = column_peers(op, peers, m);
    for (int i = 0; i < m; i++) sends[i] = recvs[i] = 1;
    return m;
  }
  if (op->peer == op->comm->rank || op->bytes == 0) return 0;
  peers[0] = op->peer;
  sends[0] = op->kind == WORK_SEND;
  recvs[0] = op->kind == WORK_RECV;
  return 1;
}

struct transport_conn** work_conn_slot(struct work_op* op, int peer, int send) {
  struct ncclComm* c = op->comm;
  if (op->kind == WORK_COLL) return send ? &c->send_conns[peer] : &c->recv_conns[peer];
  if (op->ipc) return send ? &c->p2p_send_dev[peer] : &c->p2p_recv_dev[peer];
  return send ? &c->p2p_send[peer] : &c->p2p_recv[peer];
}

/* The transport of an operation's messages to `peer`: device to device
 * for ipc operations (their dispatch checked there is one). */
static ncclResult_t op_transport(struct work_op* op, int peer, const struct transport** t) {
  struct transport_ctx* ctx = &op->comm->tctx;
  if (!op->ipc) return transport_for_peer(ctx, peer, t);
  *t = transport_for_peer_device(ctx, peer);
  if (*t) return ncclSuccess;
  WARN("Rank %d: no transport moves device memory to rank %d any more", ctx->rank, peer);
  return ncclInternalError;
}

/* A new connection enters the comm's tables with a release store: an
 * ncclCommAbort on another thread reads them (comm_conns_apply) while a
 * call connects, and must see each connection whole or not at all. */
static void conn_publish(struct transport_conn** slot, struct transport_conn* c) {
  if (c) __atomic_store_n(slot, c, __ATOMIC_RELEASE);
}

static ncclResult_t connect_phase(struct work_op* ops, int n, int send) {
  ncclResult_t res = ncclSuccess;
  int peers[CONNECT_MAX_PEERS], sends[CONNECT_MAX_PEERS], recvs[CONNECT_MAX_PEERS];
  for (int i = 0; i < n; i++) {
    int m = op_peers(&ops[i], peers, sends, recvs);
    for (int j = 0; j < m; j++) {
      struct transport_ctx* ctx = &ops[i].comm->tctx;
      const struct transport* t;
      CHECK(op_transport(&ops[i], peers[j], &t));
      if (t->connect_duplex && sends[j] && recvs[j]) {
        struct transport_conn **s = work_conn_slot(&ops[i], peers[j], 1),
                              **r = work_conn_slot(&ops[i], peers[j], 0);
        struct transport_conn *got_s = NULL, *got_r = NULL;
        if (*s == NULL && *r == NULL)
          res = t->connect_duplex(ctx, peers[j], ops[i].kind != WORK_COLL, send, &got_s, &got_r);
        conn_publish(s, got_s);
        conn_publish(r, got_r);
        CHECK(res);
        continue;
      }
      if (!(send ? sends[j] : recvs[j])) continue;
      struct transport_conn** slot = work_conn_slot(&ops[i], peers[j], send);
      struct transport_conn* got = NULL;
      if (*slot) continue;
      if (send)
        res = t->connect_send(ctx, peers[j], ops[i].kind != WORK_COLL, &got);
      else
        res = t->connect_recv(ctx, peers[j], ops[i].kind != WORK_COLL, &got);
      conn_publish(slot, got);
      CHECK(res);
    }
  }
fail:
  return res;
}

/* Move conn on until this end is whole, the timeout or an abort. */
static ncclResult_t connect_finish(struct ncclComm* comm, struct transport_conn* c) {
  ncclResult_t res = ncclSuccess;
  uint64_t deadline = braid_now_ns() + (uint64_t)comm->tctx.timeout_ms * 1000000ull;
  long nap_ns = 0;
  while (c->ops->connecting(c)) {
    int progressed = 0;
    CHECK(c->ops->progress(c, &progressed)); /* a connect that failed says so here */
    if (progressed) /* the peer may take a while to accept: do not spin meanwhile */
      nap_ns = 0;
    else
      braid_backoff(&nap_ns);
    if (atomic_load(&comm->aborted))
      FAIL(ncclSystemError, "Rank %d: aborted while connecting to rank %d", comm->rank, c->peer);
    if (braid_now_ns() > deadline)
      FAIL(ncclSystemError, "Rank %d: %s could not connect to rank %d within BRAID_TIMEOUT_MS",
           comm->rank, c->ops->name, c->peer);
  }
fail:
  return res;
}

/* A send connection still being made (a net plugin's, which connects only
 * as this rank moves it on once the peer's offer came) must not be left
 * alone while the peer waits to accept it: a direct collective's run
 * blocks on its node links, outside the progress engine (cuda_direct.h),
 * and a schedule may never send on a connection its peers list names (a
 * ring reduce's root: its successor waited to accept until the timeout,
 * found with two hosts of two ranks, root 3). Receivers accept in the
 * phase before this and move their own senders on while they wait, so
 * before any collective runs this rank's sends are made whole. */
static ncclResult_t connect_settle(struct work_op* ops, int n) {
  ncclResult_t res = ncclSuccess;
  int peers[CONNECT_MAX_PEERS], sends[CONNECT_MAX_PEERS], recvs[CONNECT_MAX_PEERS];
  for (int i = 0; i < n; i++) {
    if (ops[i].kind != WORK_COLL) continue;
    int m = op_peers(&ops[i], peers, sends, recvs);
    for (int j = 0; j < m; j++) {
      struct transport_conn* c = sends[j] ? *work_conn_slot(&ops[i], peers[j], 1) : NULL;
      if (c && c->ops->connecting) CHECK(connect_finish(ops[i].comm, c));
    }
  }
fail:
  return res;
}

ncclResult_t work_connect(struct work_op* ops, int n) {
  ncclResult_t res = ncclSuccess;
  CHECK(connect_phase(ops, n, 1));
  CHECK(connect_phase(ops, n, 0));
  CHECK(connect_settle(ops, n));
fail:
  return res;
}
