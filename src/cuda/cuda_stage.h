/*
 * Staging device buffers through pinned host mirrors, on the caller's own
 * stream: before a call's gate the stream copies what the call reads into
 * the mirror, after it the stream copies what the call wrote back. A gated
 * call itself then runs on host memory (the schedules, transports and CPU
 * kernels as they are), and the proxy never enqueues GPU work, so no
 * stream of the comm ever waits for another stream (CUDASIM_ONE_QUEUE
 * holds it to that). A synchronous call stages only what the transports
 * move directly (send/recv buffers) and a device scalar; its collectives
 * run on the executor's device backend (cuda_exec.h).
 *
 * One mirror per (comm, stream): calls on one stream run in its order, so
 * the next call's copy-in never overtakes the last one's copy-out. A mirror
 * grows by at least doubling; the old memory is freed with the comm, not
 * during calls (a pinned free synchronizes the device, which must not
 * happen while this comm's own streams wait on its gates).
 */
#ifndef BRAID_CUDA_STAGE_H_
#define BRAID_CUDA_STAGE_H_

#include <cuda.h>

#include "cuda/cuda_driver.h"
#include "engine/work_op.h"

struct device_comm;
struct cuda_mirror;

/* Enqueue on `stream` the copy-in of every device buffer read by those of
 * ops[0..n) that are comm's and on `stream`, into the comm's mirror for the
 * stream, and point those ops at the mirror (their memory becomes host).
 * Without `colls`, collectives keep their device buffers (only a device
 * scalar is staged): they run on the executor's device backend. */
ncclResult_t cuda_stage_in(struct device_comm* cc, const struct ncclComm* comm, CUstream stream,
                           struct work_op* ops, int n, int colls);
/* Enqueue the copy-out of what the ops staged last on `stream` write, then
 * (gated) the stream's mark that it passed them; not gated, the caller
 * synchronizes the stream next and the mark is set now. */
ncclResult_t cuda_stage_out(struct device_comm* cc, CUstream stream, int gated);

/* How long freeing waits for the streams to pass their last staged call. */
#define CUDA_STAGE_DRAIN_MS 5000

/* Free the mirrors once every stream passed them (1); 0 when one has not
 * within CUDA_STAGE_DRAIN_MS: the memory is left allocated (a WARN says
 * so), and so must be what the streams' gates read. */
int cuda_mirrors_free(struct cuda_mirror** mirrors, const struct cuda_api* cu);

#endif /* BRAID_CUDA_STAGE_H_ */
