/*
 * Pools of slots in pinned, device-mapped host memory, where a stream and
 * the host signal each other through flags (cuda_gate.h, cuda_deferred.h).
 * Slots come in chunks added when none is free (as many as calls queued
 * on streams and not yet run), never in the steady state. Each slot has a
 * use counter kept by the host: flags carry the value of the current use
 * and only grow, so the owner tells a free slot from its flags alone.
 */
#ifndef BRAID_CUDA_SLOT_POOL_H_
#define BRAID_CUDA_SLOT_POOL_H_

#include <cuda.h>
#include <pthread.h>
#include <stdint.h>

#include "cuda_driver.h"

struct cuda_slot_chunk;

struct cuda_slot_pool {
  pthread_mutex_t lock; /* held around cuda_slot_take and the slot's arming */
  size_t slot_bytes;
  const char* what; /* for the allocation's error */
  struct cuda_slot_chunk* chunks;
};

/* A slot: its memory on both sides, and its use counter. */
struct cuda_slot {
  void* host;
  CUdeviceptr dev;
  uint64_t* issued;
};

/* Whether a slot whose last use was `issued` is free, from its flags. */
typedef int (*cuda_slot_free_fn)(const void* host, uint64_t issued);

void cuda_slot_pool_init(struct cuda_slot_pool* p, size_t slot_bytes, const char* what);
/* Frees the pinned memory (the comm's context current; no stream may
 * still wait on it). */
void cuda_slot_pool_free(struct cuda_slot_pool* p, const struct cuda_api* cu);

/* A free slot, zeroed when its chunk is new (lock held). */
ncclResult_t cuda_slot_take(struct cuda_slot_pool* p, const struct cuda_api* cu,
                            cuda_slot_free_fn is_free, struct cuda_slot* out);

#endif /* BRAID_CUDA_SLOT_POOL_H_ */
