/*
 * Deferred launches (cuda_deferred.h): slots of a task and two flags in
 * pinned, device-mapped host memory, each flag on a cache line of its own
 * (the host writes go, the GPU writes ran). Values only grow, so a slot is
 * reused once its last go was written and its stream passed it.
 */
#include "cuda_deferred.h"

#include <string.h>

#include "core.h"
#include "cuda_kernels.h"

struct deferred_slot {
  uint64_t go; /* written by the host */
  uint64_t pad0[7];
  uint64_t ran; /* written by the stream after the kernel */
  uint64_t pad1[7];
  struct kern_dev_task task;
};

void cuda_deferred_init(struct cuda_deferred_pool* p) {
  cuda_slot_pool_init(&p->pool, sizeof(struct deferred_slot), "cuMemHostAlloc(deferred launches)");
}

void cuda_deferred_free(struct cuda_deferred_pool* p, const struct cuda_api* cu) {
  cuda_slot_pool_free(&p->pool, cu);
}

/* Whether a slot's last use is over: go written and passed by its stream. */
static int slot_free(const void* host, uint64_t issued) {
  const struct deferred_slot* s = host;
  return __atomic_load_n(&s->go, __ATOMIC_ACQUIRE) == issued &&
         __atomic_load_n(&s->ran, __ATOMIC_ACQUIRE) == issued;
}

ncclResult_t cuda_deferred_arm(struct cuda_deferred_pool* p, const struct cuda_api* cu,
                               CUstream stream, uint64_t n_max, struct gpu_launch* out) {
  ncclResult_t res = ncclSuccess;
  struct cuda_slot slot;
  pthread_mutex_lock(&p->pool.lock);
  CHECK(cuda_slot_take(&p->pool, cu, slot_free, &slot));
  struct deferred_slot* s = slot.host;
  uint64_t value = *slot.issued + 1;
  CUdeviceptr go = slot.dev;
  memset(&s->task, 0, sizeof(s->task)); /* n = 0 until the host writes the real one */
  CHECK(cuda_check(cu->cuStreamWaitValue64(stream, go, value, CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue64(deferred go)"));
  *slot.issued = value; /* the stream waits on it: the slot is in use */
  *out = (struct gpu_launch){s, value};
  res = cuda_reduce_copy_at(go + offsetof(struct deferred_slot, task), n_max, stream);
  if (res == ncclSuccess)
    res = cuda_check(
        cu->cuStreamWriteValue64(stream, go + offsetof(struct deferred_slot, ran), value, 0),
        "cuStreamWriteValue64(deferred ran)");
  if (res != ncclSuccess) { /* the stream must not wait forever; the slot stays taken */
    cuda_deferred_skip(out);
    *out = (struct gpu_launch){NULL, 0};
  }
fail:
  pthread_mutex_unlock(&p->pool.lock);
  return res;
}

void cuda_deferred_go(const struct gpu_launch* d, const struct kern_dev_task* task) {
  struct deferred_slot* s = d->slot;
  s->task = *task;
  __atomic_store_n(&s->go, d->value, __ATOMIC_RELEASE); /* the task is visible first */
}

void cuda_deferred_skip(const struct gpu_launch* d) {
  struct deferred_slot* s = d->slot;
  if (s == NULL || (int64_t)(__atomic_load_n(&s->go, __ATOMIC_ACQUIRE) - d->value) >= 0) return;
  memset(&s->task, 0, sizeof(s->task));
  __atomic_store_n(&s->go, d->value, __ATOMIC_RELEASE);
}

int cuda_deferred_ran(const struct gpu_launch* d) {
  const struct deferred_slot* s = d->slot;
  return (int64_t)(__atomic_load_n(&s->ran, __ATOMIC_ACQUIRE) - d->value) >= 0;
}
