/*
 * Deferred launches (cuda_deferred.h): slots of a task and two flags in
 * pinned, device-mapped host memory, each flag on a cache line of its own
 * (the host writes go, the GPU writes ran). Values only grow, so a slot is
 * reused once its last go was written and its stream passed it.
 */
#include "cuda_deferred.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "cuda_kernels.h"

#define DEFERRED_SLOTS 64

struct deferred_slot {
  uint64_t go; /* written by the host */
  uint64_t pad0[7];
  uint64_t ran; /* written by the stream after the kernel */
  uint64_t pad1[7];
  struct kern_dev_task task;
};

struct cuda_deferred_chunk {
  struct deferred_slot* slots; /* pinned */
  CUdeviceptr dev;             /* the same memory as the GPU addresses it */
  uint64_t issued[DEFERRED_SLOTS];
  struct cuda_deferred_chunk* next;
};

void cuda_deferred_init(struct cuda_deferred_pool* p) {
  pthread_mutex_init(&p->lock, NULL);
  p->chunks = NULL;
}

void cuda_deferred_free(struct cuda_deferred_pool* p, const struct cuda_api* cu) {
  while (p->chunks) {
    struct cuda_deferred_chunk* c = p->chunks;
    p->chunks = c->next;
    cu->cuMemFreeHost(c->slots);
    free(c);
  }
  pthread_mutex_destroy(&p->lock);
}

static ncclResult_t chunk_add(struct cuda_deferred_pool* p, const struct cuda_api* cu) {
  ncclResult_t res = ncclSuccess;
  struct cuda_deferred_chunk* c = NULL;
  void* mem = NULL;
  CHECK(braid_calloc(&c, 1, sizeof(*c)));
  /* zeroed: every slot free, go == ran == issued == 0 */
  CHECK(cuda_flags_alloc(cu, DEFERRED_SLOTS * sizeof(struct deferred_slot),
                         "cuMemHostAlloc(deferred launches)", &mem, &c->dev));
  c->slots = mem;
  c->next = p->chunks;
  p->chunks = c;
  return ncclSuccess;
fail:
  free(c);
  return res;
}

/* A slot whose last use is over, or -1 (lock held). */
static int slot_find(struct cuda_deferred_pool* p, struct cuda_deferred_chunk** chunk) {
  for (struct cuda_deferred_chunk* c = p->chunks; c; c = c->next)
    for (int i = 0; i < DEFERRED_SLOTS; i++)
      if (__atomic_load_n(&c->slots[i].go, __ATOMIC_ACQUIRE) == c->issued[i] &&
          __atomic_load_n(&c->slots[i].ran, __ATOMIC_ACQUIRE) == c->issued[i]) {
        *chunk = c;
        return i;
      }
  return -1;
}

ncclResult_t cuda_deferred_arm(struct cuda_deferred_pool* p, const struct cuda_api* cu,
                               CUstream stream, uint64_t n_max, struct work_deferred* out) {
  ncclResult_t res = ncclSuccess;
  struct cuda_deferred_chunk* c = NULL;
  pthread_mutex_lock(&p->lock);
  int i = slot_find(p, &c);
  if (i < 0) {
    CHECK(chunk_add(p, cu));
    c = p->chunks;
    i = 0;
  }
  struct deferred_slot* s = &c->slots[i];
  uint64_t value = c->issued[i] + 1;
  CUdeviceptr go = c->dev + (CUdeviceptr)i * sizeof(struct deferred_slot);
  memset(&s->task, 0, sizeof(s->task)); /* n = 0 until the host writes the real one */
  CHECK(cuda_check(cu->cuStreamWaitValue64(stream, go, value, CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue64(deferred go)"));
  c->issued[i] = value; /* the stream waits on it: the slot is in use */
  *out = (struct work_deferred){s, value};
  res = cuda_reduce_copy_at(go + offsetof(struct deferred_slot, task), n_max, stream);
  if (res == ncclSuccess)
    res = cuda_check(
        cu->cuStreamWriteValue64(stream, go + offsetof(struct deferred_slot, ran), value, 0),
        "cuStreamWriteValue64(deferred ran)");
  if (res != ncclSuccess) { /* the stream must not wait forever; the slot stays taken */
    cuda_deferred_skip(out);
    *out = (struct work_deferred){NULL, 0};
  }
fail:
  pthread_mutex_unlock(&p->lock);
  return res;
}

void cuda_deferred_go(const struct work_deferred* d, const struct kern_dev_task* task) {
  struct deferred_slot* s = d->slot;
  s->task = *task;
  __atomic_store_n(&s->go, d->value, __ATOMIC_RELEASE); /* the task is visible first */
}

void cuda_deferred_skip(const struct work_deferred* d) {
  struct deferred_slot* s = d->slot;
  if (s == NULL || __atomic_load_n(&s->go, __ATOMIC_ACQUIRE) == d->value) return;
  memset(&s->task, 0, sizeof(s->task));
  __atomic_store_n(&s->go, d->value, __ATOMIC_RELEASE);
}

int cuda_deferred_ran(const struct work_deferred* d) {
  const struct deferred_slot* s = d->slot;
  return (int64_t)(__atomic_load_n(&s->ran, __ATOMIC_ACQUIRE) - d->value) >= 0;
}
