/*
 * The executor's device backend (cuda_exec.h). A task is one kernel
 * launch; its ticket names the event recorded after it. The stream runs
 * tasks in order, so an event that another ticket has taken over since
 * only ever answers "done" later than its own would have: the executor
 * may wait a little longer, never see a task done too early.
 */
#include "cuda_exec.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "cuda/cuda_driver.h"
#include "device_comm.h"
#include "cuda/cuda_kernels.h"

#define CUDA_EXEC_EVENTS EXEC_MAX_WINDOW /* no more tasks are ever pending */

struct cuda_exec {
  const struct device_comm* cc; /* its context is where everything here lives */
  CUstream stream;
  CUevent events[CUDA_EXEC_EVENTS];
  int nevents;
  uint64_t next_ticket;
  /* the executor's slots: host range, and where kernels reach it */
  char* slots;
  size_t slots_bytes;
  CUdeviceptr slots_dev;
  int pinned;
};

/* Where a kernel reaches p: the slots' device mapping, else p itself
 * (device memory, or host memory the user pinned or mapped). */
static const void* dev_ptr(const struct cuda_exec* ce, const void* p) {
  const char* c = p;
  if (c >= ce->slots && c < ce->slots + ce->slots_bytes)
    return (const void*)(uintptr_t)(ce->slots_dev + (CUdeviceptr)(c - ce->slots));
  return p;
}

/* The task in the kernel's form, the slots at their device mapping. */
static void dev_task(const struct cuda_exec* ce, const struct kern_task* t,
                     struct kern_dev_task* d) {
  cuda_task_to_dev(t, d);
  for (int k = 0; k < t->nsrcs; k++) d->srcs[k] = dev_ptr(ce, t->srcs[k]);
  for (int j = 0; j < t->ndsts; j++) d->dsts[j] = (void*)dev_ptr(ce, t->dsts[j]);
}

static ncclResult_t cuda_post(void* state, const struct kern_task* t, uint64_t* ticket, int* done) {
  ncclResult_t res = ncclSuccess;
  struct cuda_exec* ce = state;
  const struct cuda_api* cu = cuda_driver();
  struct kern_dev_task d;
  CUcontext saved;
  if (t->swap) /* the executor folds chains on host memory only (exec_chain.h) */
    FAIL(ncclInternalError, "A device task with swapped steps: the device kernels have none");
  CHECK(cuda_ctx_enter(ce->cc->ctx, &saved));
  dev_task(ce, t, &d);
  *ticket = ce->next_ticket++;
  *done = 0;
  res = cuda_reduce_copy(&d, ce->stream);
  if (res == ncclSuccess)
    res = cuda_check(cu->cuEventRecord(ce->events[*ticket % CUDA_EXEC_EVENTS], ce->stream),
                     "cuEventRecord");
  cuda_ctx_restore(saved);
fail:
  return res;
}

static ncclResult_t cuda_test(void* state, uint64_t ticket, int* done) {
  struct cuda_exec* ce = state;
  CUresult r = cuda_driver()->cuEventQuery(ce->events[ticket % CUDA_EXEC_EVENTS]);
  *done = r == CUDA_SUCCESS;
  return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY ? ncclSuccess
                                                        : cuda_check(r, "cuEventQuery(task)");
}

static const struct exec_backend exec_backend_cuda = {"cuda", cuda_post, cuda_test};

/* Free what attach made, in the comm's context (current). */
static void exec_release(struct cuda_exec* ce, const struct cuda_api* cu) {
  if (ce->stream) cu->cuStreamSynchronize(ce->stream);
  for (int i = 0; i < ce->nevents; i++) cu->cuEventDestroy(ce->events[i]);
  if (ce->stream) cu->cuStreamDestroy(ce->stream);
  if (ce->pinned) cu->cuMemHostUnregister(ce->slots);
  free(ce);
}

/* The internal stream does not synchronize with the legacy stream: a user
 * stream blocked on anything never holds a task back. */
static ncclResult_t exec_make(struct cuda_exec* ce, const struct cuda_api* cu) {
  ncclResult_t res = ncclSuccess;
  CHECK(
      cuda_check(cu->cuMemHostRegister(ce->slots, ce->slots_bytes,
                                       CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
                 "cuMemHostRegister(staging slots)"));
  ce->pinned = 1;
  CHECK(cuda_check(cu->cuMemHostGetDevicePointer(&ce->slots_dev, ce->slots, 0),
                   "cuMemHostGetDevicePointer(staging slots)"));
  CHECK(cuda_check(cu->cuStreamCreate(&ce->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  for (; ce->nevents < CUDA_EXEC_EVENTS; ce->nevents++)
    CHECK(cuda_check(cu->cuEventCreate(&ce->events[ce->nevents], CU_EVENT_DISABLE_TIMING),
                     "cuEventCreate"));
fail:
  return res;
}

ncclResult_t cuda_exec_attach(const struct device_comm* cc, struct exec_ctx* ex,
                              struct cuda_exec** out) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  struct cuda_exec* ce = NULL;
  CUcontext saved;
  void* slots;
  CHECK(braid_calloc(&ce, 1, sizeof(*ce)));
  ce->cc = cc;
  exec_slots(ex, &slots, &ce->slots_bytes);
  ce->slots = slots;
  CHECK(cuda_ctx_enter(cc->ctx, &saved));
  res = exec_make(ce, cu);
  if (res != ncclSuccess) exec_release(ce, cu);
  cuda_ctx_restore(saved);
  if (res != ncclSuccess) return res;
  exec_set_device_backend(ex, &exec_backend_cuda, ce);
  *out = ce;
fail:
  return res;
}

void cuda_exec_detach(struct cuda_exec* ce, struct exec_ctx* ex) {
  CUcontext saved;
  if (ce == NULL) return;
  exec_set_device_backend(ex, NULL, NULL);
  if (cuda_ctx_enter(ce->cc->ctx, &saved) != ncclSuccess)
    return; /* a dead context: left as it is */
  exec_release(ce, cuda_driver());
  cuda_ctx_restore(saved);
}
