/*
 * The device path as the generic engine sees it. A build with CUDA
 * implements these in src/cuda/ (cuda_comm.c, cuda_unit.c, cuda_direct.c,
 * cuda_deferred.c), one without in src/host/device_none.c: the build picks the folder, as
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

/* The device the calling thread's current context is on, else 0; -1
 * without a driver. What ncclCommCuDevice reports for a comm made here. */
int device_current(void);
/* The device kernels into the calling thread's current context, if it has
 * one, at comm init as NCCL loads its own: a kernel's first (lazy) load
 * may wait for every stream of the context, which must never happen while
 * a stream waits at one of Braid's gates, nor behind a user's stream held
 * by the user's next step. Best effort: a device comm loads them anyway. */
void device_kernels_preload(void);
/* What names device `dev` across processes: a hash of its UUID, and one
 * of the UUIDs of every device this process sees, in ordinal order (two
 * processes number devices alike when theirs agree: not so under
 * different CUDA_VISIBLE_DEVICES). Zeros without a driver. */
void device_identity(int dev, uint64_t* uuid, uint64_t* view);

/* Whether a unit (ops[0..n), no host stream) goes to the device path: a
 * driver is there, and an op names a stream other than NULL or device
 * memory; and issue it there, ordered on its streams (ncclInProgress when
 * a non-blocking comm's own stream runs it). */
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
