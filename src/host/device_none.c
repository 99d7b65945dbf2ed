/*
 * The device path of a build without CUDA (device.h): there is none. No
 * pointer is device memory there (gpu/host/mem_host.c), so no unit is
 * ever handed here; calls that would be are refused as the internal errors
 * they would be.
 */
#include "engine/device.h"

#include "core.h"

void device_kernels_preload(void) {}

int device_current(void) {
  return -1;
}

void device_identity(int dev, uint64_t* uuid, uint64_t* view) {
  (void)dev;
  *uuid = *view = 0;
}

int device_unit_wanted(const struct work_op* ops, int n) {
  (void)ops, (void)n;
  return 0;
}

static ncclResult_t no_device(const char* what) {
  WARN("%s in a build without CUDA", what);
  return ncclInternalError;
}

ncclResult_t device_unit_dispatch(struct work_op* ops, int n) {
  (void)ops, (void)n;
  return no_device("a device unit");
}

ncclResult_t device_direct_run(struct work_op* op) {
  (void)op;
  return no_device("a direct call on device buffers");
}

void device_launches_skip(struct work_op* ops, int n) {
  (void)ops, (void)n; /* nothing was ever queued on a stream */
}

ncclResult_t device_comm_flush(struct ncclComm* comm) {
  (void)comm;
  return ncclSuccess;
}

void device_comm_free(struct ncclComm* comm) {
  (void)comm;
}
