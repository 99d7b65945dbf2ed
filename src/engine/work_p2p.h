/*
 * The point-to-point lane of a unit of work (work_p2p.c).
 */
#ifndef BRAID_WORK_P2P_H_
#define BRAID_WORK_P2P_H_

#include <stdint.h>

#include "nccl.h"
#include "engine/work_op.h"

/* Sends to self meet receives from self of the same comm in call order: a
 * copy, no connection. Empty transfers complete at once. */
ncclResult_t p2p_match_self(struct work_op* ops, int n);
/* Post what op's connection has room for, check completion (pass: the
 * drive loop's pass number). */
ncclResult_t p2p_step(struct work_op* op, uint64_t pass, int* progressed);

#endif /* BRAID_WORK_P2P_H_ */
