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

#include "engine/work_op.h"

struct cuda_direct;

/* Whether the unit ops[0..n) runs direct: collectives of one comm (run in
 * turn), each on device buffers (not a PreMulSum), 2..DIRECT_MAX_RANKS
 * ranks, all on this host with their devices in reach of each other
 * (compared by UUID), and NCCL_ALGO allows Direct; where NCCL_ALGO names
 * it, always, else where the tuner's device model says it is faster
 * (tuner_device.c). Every rank decides alike: the inputs are the peer
 * table, the call and NCCL_ALGO. Threads each need one comm of their own
 * (as NCCL wants without a group): their direct calls are synchronous, and
 * block until every rank made the call. */
int cuda_direct_wanted(const struct work_op* ops, int n);

/* How op runs direct (enum work_direct): WORK_DIRECT_NODE as above;
 * WORK_DIRECT_HIER, an all-reduce, reduce-scatter or all-gather on a comm
 * of several nodes with the same number of ranks each (2..DIRECT_MAX_RANKS,
 * their devices in reach as above; for the last two, each index's ranks
 * evenly spaced across nodes, as node-major and round-robin layouts are),
 * where the host would run Hier (or NCCL_ALGO names Direct): a kernel
 * moves the node's part into pinned scratch, the ranks holding this rank's
 * index on every node run the collective there on the host (a ring over
 * the network), and a second kernel writes the node's outputs
 * (algorithms/direct.h, direct_plan_hier). */
int cuda_direct_kind(const struct work_op* op);

/* Queue op's kernel on `stream` (the comm's context current) for a call
 * gated there: it waits until device_direct_run, on the proxy, has the
 * task; then the call does not block its caller. */
ncclResult_t cuda_direct_arm(struct work_op* op, CUstream stream);

/* Close the links and (once every stream passed what was queued on it:
 * streams_passed) free Hier's pinned scratch; in the comm's context (the
 * mappings are the comm's cache's, cuda_comm.c frees them). */
void cuda_direct_free(struct cuda_direct* d, int streams_passed);

#endif /* BRAID_CUDA_DIRECT_H_ */
