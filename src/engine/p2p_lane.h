/*
 * The tagged point-to-point lane (p2p_lane.c): braidTaggedSend and
 * braidTaggedRecv (braid.h), sends and receives that run on their own,
 * beside the comm's ordered work and whatever order the ranks post them in.
 */
#ifndef BRAID_P2P_LANE_H_
#define BRAID_P2P_LANE_H_

#include <stddef.h>

#include "braid.h"
#include "nccl.h"

struct ncclComm;
struct p2p_lane;

enum { LANE_SEND = 0, LANE_RECV = 1 };

/* Queue a tagged send (kind LANE_SEND) or receive of `bytes` of host memory
 * at buf with `peer` (this rank too; a receive: -1 for any source, whose
 * rank then goes to *source); done(arg, status) runs once, on the lane's
 * thread, when it completed or failed. The arguments are checked by the
 * caller. Starts the comm's lane at its first use. */
ncclResult_t lane_post(struct ncclComm* comm, int kind, void* buf, size_t bytes, int peer, int tag,
                       int* source, braidHostFn_t done, void* arg);

/* Stop the lane (NULL: none): what it still holds fails, its thread is
 * joined, its connections closed. Part of the comm's teardown. */
void lane_destroy(struct p2p_lane* lane);

#endif /* BRAID_P2P_LANE_H_ */
