/*
 * Deferred launches: a kernel queued on a stream before its task is
 * known. The stream waits until the host writes "go" (a stream memory
 * operation on pinned host memory), runs the fused reduce-copy kernel on
 * the task the host wrote beside it, and writes "ran". A direct call gated
 * on the user's stream (cuda_direct.h) queues one per collective at issue;
 * the proxy, once every rank's buffers are known and mapped, writes the
 * task and "go", and waits for "ran" before telling the peers it is done.
 * No kernel waits for anything: the stream does, on a flag.
 *
 * A slot whose "go" is written without a task (cuda_deferred_skip: the
 * call failed or was cancelled) runs an empty task, so the stream drains.
 */
#ifndef BRAID_CUDA_DEFERRED_H_
#define BRAID_CUDA_DEFERRED_H_

#include <cuda.h>

#include "cuda/kern_body.h"
#include "cuda_driver.h"
#include "cuda_slot_pool.h"
#include "launch.h"

/* A comm's deferred-launch slots. */
struct cuda_deferred_pool {
  struct cuda_slot_pool pool;
};

void cuda_deferred_init(struct cuda_deferred_pool* p);
/* Frees the pinned memory (the comm's context current; no stream may
 * still wait on it: device_comm_free checks that first). */
void cuda_deferred_free(struct cuda_deferred_pool* p, const struct cuda_api* cu);

/* Take a free slot, clear its task, and enqueue on `stream` (current
 * context): wait for go, the kernel (grid for up to n_max elements),
 * write ran. *out names the slot for the calls below. */
ncclResult_t cuda_deferred_arm(struct cuda_deferred_pool* p, const struct cuda_api* cu,
                               CUstream stream, uint64_t n_max, struct gpu_launch* out);

/* Write the task, then go. */
void cuda_deferred_go(const struct gpu_launch* d, const struct kern_dev_task* task);
/* Go with an empty task, unless go was written already. */
void cuda_deferred_skip(const struct gpu_launch* d);
/* Whether the stream has run the kernel. */
int cuda_deferred_ran(const struct gpu_launch* d);

#endif /* BRAID_CUDA_DEFERRED_H_ */
