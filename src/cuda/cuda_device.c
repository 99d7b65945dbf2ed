/*
 * The device path of a build with CUDA, as the generic engine calls it
 * (device.h): each entry hands over to the file that does the work.
 */
#include "device.h"

#include "comm.h"
#include "cuda_comm.h"
#include "cuda_deferred.h"
#include "cuda_direct.h"
#include "cuda_unit.h"
#include "stream.h"
#include "work_op.h"

int device_current(void) {
  return cuda_current_device();
}

void device_identity(int dev, uint64_t* uuid, uint64_t* view) {
  cuda_device_identity(dev, uuid, view);
}

int device_unit_wanted(const struct work_op* ops, int n) {
  return cuda_unit_wanted(ops, n);
}

ncclResult_t device_unit_dispatch(struct work_op* ops, int n) {
  return cuda_unit_dispatch(ops, n);
}

ncclResult_t device_direct_run(struct work_op* op) {
  return cuda_direct_run(op);
}

void device_launches_skip(struct work_op* ops, int n) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < WORK_MAX_LAUNCHES; k++)
      if (ops[i].deferred[k].slot) cuda_deferred_skip(&ops[i].deferred[k]);
}

ncclResult_t device_comm_flush(struct ncclComm* comm) {
  struct device_comm* dc = comm->device;
  return dc && dc->own_proxy ? stream_sync(dc->proxy) : ncclSuccess;
}

void device_comm_free(struct ncclComm* comm) {
  cuda_comm_free(comm);
}
