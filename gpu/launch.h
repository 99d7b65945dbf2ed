/*
 * What the device runtime (gpu/cuda: deferred launches, gates) hands to
 * the layers above it, as plain data they may see without CUDA: below the
 * transports, so that a transport handed a gated call's launch
 * (transport_buf.launch) names a type of a layer it may see, not one of
 * src/.
 */
#ifndef BRAID_LAUNCH_H_
#define BRAID_LAUNCH_H_

#include <stdint.h>

#include "nccl.h"

/* A kernel launch queued on a stream before its task is known
 * (gpu/cuda/cuda_deferred.h): it waits at a slot of pinned memory until
 * the value that lets it go is written there. The slot, and the value of
 * its flags for this use; slot NULL: none. */
struct gpu_launch {
  void* slot;
  uint64_t value;
};

/* A device call's gate on one stream (gpu/cuda/cuda_gate.h): the stream
 * writes *ready = value, then waits until *done >= value. Host addresses
 * of pinned flags. */
struct gpu_gate {
  const volatile uint64_t* ready;
  volatile uint64_t* done;
  uint64_t value;
  /* While the wait lasts: ncclSuccess while the stream can still get there,
   * an error (the stream failed, its context is broken) once it cannot. */
  ncclResult_t (*check)(const struct gpu_gate* g);
  void* stream;
  void* ctx;
};

#endif /* BRAID_LAUNCH_H_ */
