/*
 * A kernel launch queued on a stream before its task is known (the
 * device runtime's deferred launches, src/cuda/cuda_deferred.h): it waits
 * at a slot of pinned memory until the value that lets it go is written
 * there. Below the transports, so that a transport handed a gated call's
 * launch (transport_buf.launch, transport_device.copy) names a type of a
 * layer it may see, not one of src/.
 */
#ifndef BRAID_LAUNCH_H_
#define BRAID_LAUNCH_H_

#include <stdint.h>

/* The slot, and the value of its flags for this use. slot NULL: none. */
struct gpu_launch {
  void* slot;
  uint64_t value;
};

#endif /* BRAID_LAUNCH_H_ */
