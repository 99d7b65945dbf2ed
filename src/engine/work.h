/*
 * Running a unit of work (work.c): the operations of one group (or one
 * ungrouped call), run together. Collectives of a comm run one after
 * another on its executor; its point-to-point operations all run at once
 * beside them, on their own connections. A unit runs in three steps: plan
 * (plan.h: the tuner picks each collective's algorithm and chunk, which
 * fixes its schedule and so the peers it talks to), connect (connect.h:
 * every connection those need), drive (here: the executor and the p2p
 * lane, work_p2p.h, until every op is done).
 */
#ifndef BRAID_WORK_H_
#define BRAID_WORK_H_

#include "nccl.h"
#include "engine/work_op.h"

struct braid_stream;

/* Take the unit's turn on each of its comms, at issue time: units then run
 * in issue order per comm, whatever thread or stream runs them. */
ncclResult_t work_issue(struct work_op* ops, int n);

/* Wait for the unit's turn, run `n` operations to completion (or the first
 * error), pass the turn on. */
ncclResult_t work_run(struct work_op* ops, int n);

/* An issued unit that will not run (its stream failed earlier): wait for
 * its turns and pass them on, so later work on its comms is not stuck. */
ncclResult_t work_cancel(struct work_op* ops, int n);

/* Queue the unit on host stream s (issued: work_issue), to run once every
 * gate is ready, or at once without gates (ngates 0). The gates are opened
 * after the run whatever its outcome, so their streams drain. */
ncclResult_t work_submit(struct braid_stream* s, const struct work_op* ops, int n,
                         const struct gpu_gate* gates, int ngates);

#endif /* BRAID_WORK_H_ */
