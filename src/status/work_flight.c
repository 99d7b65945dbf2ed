/* A unit's ops in the flight recorder (work_flight.h). */
#include "status/work_flight.h"

#include "comm/comm.h"
#include "engine/connect.h"
#include "core.h"
#include "engine/exec_plan.h"
#include "status/flight.h"
#include "sched_build.h"
#include "engine/work_op.h"

void work_flight_enqueue(struct work_op* op) {
  struct flight_call c = {
      .coll = -1, .type = ncclUint8, .op = -1, .root = -1, .peer = -1, .tag = -1};
  if (op->kind == WORK_COLL) {
    size_t send, recv;
    exec_extents(&op->args, op->comm->nranks, &send, &recv);
    c.kind = FLIGHT_COLL;
    c.coll = op->args.coll;
    c.type = (int32_t)op->args.type;
    c.op = op->args.redop.op;
    c.root = op->args.root;
    c.count = op->args.count;
    c.bytes = MAX(send, recv);
  } else {
    c.kind = op->kind == WORK_SEND ? FLIGHT_SEND : FLIGHT_RECV;
    c.peer = op->peer;
    c.count = c.bytes = op->bytes;
  }
  op->flight = flight_enqueue(&op->comm->flight, &c);
}

void work_flight_start(struct work_op* op) {
  struct ncclComm* comm = op->comm;
  struct flight_link_src links[FLIGHT_LINKS];
  int n = 0, algo = -1;
  if (op->flight.entry == NULL) return;
  if (op->kind != WORK_COLL) {
    int send = op->kind == WORK_SEND;
    links[n++] = (struct flight_link_src){op->peer, send, *work_conn_slot(op, op->peer, send)};
  } else if (op->direct) {
    algo = FLIGHT_ALGO_DIRECT;
  } else {
    int peers[FLIGHT_LINKS / 2];
    int m = sched_peers(&op->key, peers, FLIGHT_LINKS / 2);
    for (int i = 0; i < m; i++) {
      if (peers[i] == comm->rank) continue;
      links[n++] = (struct flight_link_src){peers[i], 0, comm->recv_conns[peers[i]]};
      links[n++] = (struct flight_link_src){peers[i], 1, comm->send_conns[peers[i]]};
    }
    algo = op->args.algo;
  }
  flight_start(&comm->flight, op->flight, algo, links, n);
}

void work_flight_progress(struct work_op* op, int now_idle) {
  flight_progress(&op->comm->flight, op->flight, now_idle);
}

void work_flight_end(struct work_op* op, ncclResult_t status) {
  flight_end(&op->comm->flight, op->flight, status);
}
