/*
 * Connecting a unit (connect.c): the second of its three steps (work.h).
 */
#ifndef BRAID_CONNECT_H_
#define BRAID_CONNECT_H_

#include "nccl.h"
#include "transport.h"
#include "engine/work_op.h"

/* Make every connection the operations need, all
 * sends first, then all receives, so that ranks (or one thread driving many
 * comms) never wait on each other. */
ncclResult_t work_connect(struct work_op* ops, int n);
/* Where op's connection with `peer` (send or receive side) is kept. */
struct transport_conn** work_conn_slot(struct work_op* op, int peer, int send);

#endif /* BRAID_CONNECT_H_ */
