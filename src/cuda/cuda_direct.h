/*
 * The direct algorithm (algorithms/direct.h) on device buffers, for a comm
 * whose ranks all live on this node, as processes or threads. At each
 * call the ranks describe their buffers to each other over Unix-socket
 * links (to another process, a cuMem allocation's fd beside its
 * description, transports/cudaipc; a thread's pointer is used as it is),
 * map the other processes' through the comm's IPC cache, run their one
 * fused task as a kernel, and tell each other they are done: no rank's
 * stream goes on while a peer may still read its input or write its
 * output. Each input byte is read once and each output byte written once,
 * device to device.
 *
 * Two ways to run, chosen per rank (the messages are the same):
 *  - gated (a process's call on one stream with stream memory
 *    operations): the call returns at once. Its stream writes the gate's
 *    "ready", then waits for the kernel's "go" (cuda_deferred.h), runs the
 *    kernel, writes "ran", waits for the gate's "done". The proxy, at
 *    ready, sends this rank's buffers and maps the peers' (they sent
 *    theirs at their ready, so their inputs are complete), writes the
 *    task and go, waits for ran, exchanges "done" with the peers and opens
 *    the gate. No kernel waits for another rank; streams wait on flags.
 *  - synchronous (ranks as threads, several streams, no memory
 *    operations): the unit's streams were synchronized first
 *    (cuda_unit.c), the kernel runs on a stream of the direct state, and the
 *    call blocks until every rank's task is done.
 * Either way a peer's failure (its link closes, or it says "fail"),
 * BRAID_TIMEOUT_MS or an abort ends the call with an error, and a gated
 * stream is let go with an empty task (work.c).
 */
#ifndef BRAID_CUDA_DIRECT_H_
#define BRAID_CUDA_DIRECT_H_

#include <cuda.h>

#include "cuda_direct_policy.h"
#include "engine/work_op.h"

/* Queue op's kernel on `stream` (the comm's context current) for a call
 * gated there: it waits until device_direct_run, on the proxy, has the
 * task; then the call does not block its caller. */
ncclResult_t cuda_direct_arm(struct work_op* op, CUstream stream);

#endif /* BRAID_CUDA_DIRECT_H_ */
