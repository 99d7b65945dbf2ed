/*
 * Device-to-device copies for transports (transport.h, struct
 * transport_device): the fused reduce-copy kernel with one source and one
 * destination, given to a gated call's deferred launch or run on the
 * comm's copy stream and waited for.
 */
#ifndef BRAID_CUDA_COPY_H_
#define BRAID_CUDA_COPY_H_

#include "transport.h"

/* transport_device.copy and .launch_ran. */
ncclResult_t cuda_copy_device(struct transport_device* dev, const struct gpu_launch* launch,
                              void* dst, const void* src, size_t bytes);
int cuda_copy_launch_ran(const struct gpu_launch* launch);

#endif /* BRAID_CUDA_COPY_H_ */
