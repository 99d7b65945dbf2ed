/*
 * The device path as the generic engine sees it. A build with CUDA
 * implements these in src/cuda/ (cuda_comm.c, cuda_unit.c, cuda_direct.c),
 * one without in src/host/device_none.c: the build picks the folder, as
 * libuv picks its platform files, and the engine names no device path.
 * Units of work reach the device path here; the executor reaches it
 * through its device backend (executor.h), transports through their
 * device hooks (transport.h).
 */
#ifndef BRAID_DEVICE_H_
#define BRAID_DEVICE_H_

#include <stdint.h>

#include "nccl.h"

struct ncclComm;
struct work_op;

/* The caller's current device ordinal (as cudaGetDevice), -1 if none. */
int device_current(void);
/* Device `dev`'s UUID, hashed (0: none), and the order in which this
 * process sees every device, hashed: what the peer table says of it. */
void device_identity(int dev, uint64_t* uuid, uint64_t* view);

/* Whether a unit (ops[0..n), no host stream) goes to the device path: its
 * buffers are device memory; and hand it there (it runs stream-ordered). */
int device_unit_wanted(const struct work_op* ops, int n);
ncclResult_t device_unit_dispatch(struct work_op* ops, int n);
/* Run a collective the device path marked direct (op->direct). */
ncclResult_t device_direct_run(struct work_op* op);
/* A unit that will not run: let the kernels its ops queued on their
 * streams go, empty, so the streams drain. */
void device_launches_skip(struct work_op* ops, int n);

/* Wait for the work queued on the comm's device proxy (comm_flush). */
ncclResult_t device_comm_flush(struct ncclComm* comm);
/* Free the comm's device state, its proxy's queued work finished first. */
void device_comm_free(struct ncclComm* comm);

#endif /* BRAID_DEVICE_H_ */
