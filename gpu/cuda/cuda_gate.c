/*
 * Stream gates (cuda_gate.h): slots of two flags in pinned, device-mapped
 * host memory, each flag on a cache line of its own (the GPU writes one,
 * the host the other).
 */
#include "cuda_gate.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

struct gate_slot {
  uint64_t ready; /* written by the stream */
  uint64_t pad0[7];
  uint64_t done; /* written by the proxy */
  uint64_t pad1[7];
};

void cuda_gates_init(struct cuda_gates* g) {
  cuda_slot_pool_init(&g->pool, sizeof(struct gate_slot), "cuMemHostAlloc(stream gates)");
}

void cuda_gates_free(struct cuda_gates* g, const struct cuda_api* cu) {
  cuda_slot_pool_free(&g->pool, cu);
}

/* Whether a slot's last use is over: the proxy opened it and its stream
 * wrote "ready". A gate opened early (abort, a cancelled unit) stays
 * taken until its stream writes, or that late write could land over the
 * next use's and stall its proxy. */
static int slot_free(const void* host, uint64_t issued) {
  const struct gate_slot* s = host;
  return __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) == issued &&
         __atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) == issued;
}

/* Errors after which a context runs nothing more (sticky): a stream that
 * hit one never reaches its gate. Any other answer (a destroyed stream's
 * handle, a capture elsewhere) is not a reason to give up on it. */
static int error_is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return 1;
    default:
      return 0;
  }
}

ncclResult_t cuda_stream_check(void* ctx, void* stream) {
  const struct cuda_api* cu = cuda_driver();
  static __thread int relaxed;
  CUcontext now = NULL;
  if (!relaxed) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    relaxed = cu->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  }
  if (cu->cuCtxGetCurrent(&now) == CUDA_SUCCESS && now != (CUcontext)ctx)
    cu->cuCtxSetCurrent((CUcontext)ctx);
  CUresult r = cu->cuStreamQuery((CUstream)stream);
  if (!error_is_sticky(r)) return ncclSuccess;
  const char* name = "?";
  cu->cuGetErrorName(r, &name);
  WARN("CUDA stream %p failed (%s) before reaching a call queued on it: the call is cancelled",
       stream, name);
  return ncclUnhandledCudaError;
}

static ncclResult_t cuda_gate_check(const struct gpu_gate* g) {
  return cuda_stream_check(g->ctx, g->stream);
}

ncclResult_t cuda_gate_begin(struct cuda_gates* g, const struct cuda_api* cu, CUstream stream,
                             struct cuda_gate_arming* a) {
  ncclResult_t res = ncclSuccess;
  struct cuda_slot slot;
  pthread_mutex_lock(&g->pool.lock);
  CHECK(cuda_slot_take(&g->pool, cu, slot_free, &slot));
  uint64_t value = *slot.issued + 1;
  CHECK(cuda_check(cu->cuStreamWriteValue64(stream, slot.dev, value, 0), "cuStreamWriteValue64"));
  *slot.issued = value; /* the stream will write it: the slot is in use */
  *a = (struct cuda_gate_arming){g, slot.host, slot.dev + offsetof(struct gate_slot, done), value};
  return ncclSuccess; /* the pool stays locked until cuda_gate_end */
fail:
  pthread_mutex_unlock(&g->pool.lock);
  return res;
}

ncclResult_t cuda_gate_end(const struct cuda_api* cu, CUstream stream,
                           const struct cuda_gate_arming* a, ncclResult_t between,
                           struct gpu_gate* out) {
  struct gate_slot* gs = a->slot;
  ncclResult_t res = between;
  if (res == ncclSuccess)
    res = cuda_check(cu->cuStreamWaitValue64(stream, a->done, a->value, CU_STREAM_WAIT_VALUE_GEQ),
                     "cuStreamWaitValue64");
  if (res != ncclSuccess) /* nobody waits on it: free once the stream wrote ready */
    __atomic_store_n(&gs->done, a->value, __ATOMIC_RELEASE);
  else
    *out = (struct gpu_gate){&gs->ready, &gs->done, a->value, cuda_gate_check, (void*)stream, NULL};
  pthread_mutex_unlock(&a->gates->pool.lock);
  return res;
}
