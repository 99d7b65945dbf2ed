/*
 * Device-to-device copies for the transports (cuda_copy.h).
 */
#include "cuda_copy.h"

#include <string.h>

#include "core.h"
#include "cuda_deferred.h"
#include "cuda_driver.h"
#include "cuda_kernels.h"
#include "kernels.h"

/* Bytes as uint8: one source without flags is a plain copy (kernels.h). */
static void copy_task(void* dst, const void* src, size_t bytes, struct kern_dev_task* dt) {
  struct kern_task t;
  memset(&t, 0, sizeof(t));
  t.redop.type = ncclUint8;
  t.redop.op = KERN_SUM;
  t.nsrcs = t.ndsts = 1;
  t.n = bytes;
  t.srcs[0] = src;
  t.dsts[0] = dst;
  cuda_task_to_dev(&t, dt);
}

/* On the copy stream in the comm's context, waited for: a synchronous
 * call's caller blocks anyway, and no stream of it waits on a gate. */
static ncclResult_t copy_now(CUcontext ctx, CUstream s, const struct kern_dev_task* dt) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  CUcontext saved = NULL;
  CHECK(cuda_check(cu->cuCtxGetCurrent(&saved), "cuCtxGetCurrent"));
  if (saved != ctx) CHECK(cuda_check(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
  res = cuda_reduce_copy(dt, s);
  if (res == ncclSuccess)
    res = cuda_check(cu->cuStreamSynchronize(s), "cuStreamSynchronize(device copy)");
  if (saved != ctx) cu->cuCtxSetCurrent(saved);
fail:
  return res;
}

ncclResult_t cuda_copy_device(void* context, void* copy_stream, const struct gpu_launch* launch,
                              void* dst, const void* src, size_t bytes) {
  struct kern_dev_task dt;
  if (launch && bytes == 0) {
    cuda_deferred_skip(launch);
    return ncclSuccess;
  }
  if (bytes == 0) return ncclSuccess;
  copy_task(dst, src, bytes, &dt);
  if (launch == NULL) return copy_now((CUcontext)context, (CUstream)copy_stream, &dt);
  cuda_deferred_go(launch, &dt); /* the task is read when the kernel starts */
  return ncclSuccess;
}

int cuda_copy_ran(const struct gpu_launch* launch) {
  return cuda_deferred_ran(launch);
}
