/*
 * The executor's device backend: a call on device memory runs its tasks as
 * fused reduce-copy kernels (kernels/cuda) on a stream of the comm's own,
 * each completion seen by an event, while the executor moves the staging
 * slots (pinned here, so kernels read and write them) over the transports.
 *
 * Only calls whose user streams the host has already synchronized use it
 * (cuda_unit.c): the internal stream must never queue behind a user stream
 * that waits on a gate this call opens.
 */
#ifndef BRAID_CUDA_EXEC_H_
#define BRAID_CUDA_EXEC_H_

#include "engine/executor.h"

struct device_comm;
struct cuda_exec;

/* Pin the executor's slots, make the stream and events in the comm's
 * context, and attach the backend to `ex` (idle). */
ncclResult_t cuda_exec_attach(const struct device_comm* cc, struct exec_ctx* ex,
                              struct cuda_exec** out);
/* Wait for what is queued, detach from `ex`, unpin, free. */
void cuda_exec_detach(struct cuda_exec* ce, struct exec_ctx* ex);

#endif /* BRAID_CUDA_EXEC_H_ */
