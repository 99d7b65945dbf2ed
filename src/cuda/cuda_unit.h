/*
 * Device calls: a unit of work (one call, or one group) that names CUDA
 * streams or device buffers is ordered on its streams (docs/architecture.md 4). At
 * issue, each stream gets the copy-in of the device buffers the unit reads,
 * a gate (write "ready", wait for "done"), and the copy-out of what it
 * writes; the comm's proxy thread runs the unit on the pinned mirrors once
 * every stream reached its gate, then opens the gates. A direct unit
 * stages nothing: between its gate's ready and done the stream holds its
 * kernels, which the proxy lets go (cuda_direct.h). Nothing blocks the
 * caller. Without stream memory operations (or where a gate could hold
 * back a stream the unit needs: unit_gated) the caller waits instead: its
 * streams are synchronized and the unit runs before the call returns, its
 * collectives direct or as fused kernels on the executor's device backend
 * (cuda_exec.h), only send/recv buffers staged.
 */
#ifndef BRAID_CUDA_UNIT_H_
#define BRAID_CUDA_UNIT_H_

#include "work.h"


#endif /* BRAID_CUDA_UNIT_H_ */
