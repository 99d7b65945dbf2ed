/*
 * Stream gates: how a device call is ordered on a CUDA stream without a
 * host thread or a kernel ever blocking on it. A gate is a pair of flags in
 * pinned host memory: the stream writes "ready" (a stream memory operation,
 * after the earlier work on the stream and the call's copy-in), the comm's
 * proxy thread runs the call and writes "done", and the stream waits for
 * "done" before its later work. Values only grow, so a slot is reused once
 * the host wrote its "done" and its stream its "ready": a stream still to
 * pass an older wait finds it already satisfied.
 */
#ifndef BRAID_CUDA_GATE_H_
#define BRAID_CUDA_GATE_H_

#include <cuda.h>
#include <stdint.h>

#include "cuda_driver.h"
#include "cuda_slot_pool.h"
#include "launch.h"

/* A comm's gates. */
struct cuda_gates {
  struct cuda_slot_pool pool;
};

void cuda_gates_init(struct cuda_gates* g);
/* Frees the pinned memory (the comm's context current). */
void cuda_gates_free(struct cuda_gates* g, const struct cuda_api* cu);

/* A gate being armed on a stream, between cuda_gate_begin and
 * cuda_gate_end: what the caller queues in between (a direct call's
 * kernels, cuda_deferred.h) is held by the gate too, and the proxy lets it
 * go while it runs the call. The gates stay locked in between, so that the
 * ready, what follows it and the wait go on the stream as one. */
struct cuda_gate_arming {
  struct cuda_gates* gates;
  void* slot;
  CUdeviceptr done;
  uint64_t value;
};

/* Take a free slot and enqueue "write ready" on `stream`; every success
 * is followed by cuda_gate_end. On an error nothing was enqueued. */
ncclResult_t cuda_gate_begin(struct cuda_gates* g, const struct cuda_api* cu, CUstream stream,
                             struct cuda_gate_arming* a);
/* Enqueue "wait for done" after what was queued since begin, unless that
 * failed (`between`, returned then). *out is what the proxy waits on and
 * opens; on an error nothing waits on the gate. */
ncclResult_t cuda_gate_end(const struct cuda_api* cu, CUstream stream,
                           const struct cuda_gate_arming* a, ncclResult_t between,
                           struct gpu_gate* out);

/* A proxy's look at a stream it waits for (in context ctx, made current
 * on this thread): ncclSuccess while the stream can still get there,
 * ncclUnhandledCudaError with a WARN once it hit an error after which its
 * context runs nothing more. Queries in relaxed capture mode, so that a
 * graph being captured by another thread is neither refused to us nor
 * spoiled by us. */
ncclResult_t cuda_stream_check(void* ctx, void* stream);

#endif /* BRAID_CUDA_GATE_H_ */
