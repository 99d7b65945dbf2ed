/*
 * Pinned slot pools (cuda_slot_pool.h).
 */
#include "cuda_slot_pool.h"

#include <stdlib.h>

#include "core.h"

#define POOL_CHUNK_SLOTS 64

struct cuda_slot_chunk {
  char* host; /* pinned, zeroed at allocation: every slot free */
  CUdeviceptr dev;
  uint64_t issued[POOL_CHUNK_SLOTS];
  struct cuda_slot_chunk* next;
};

void cuda_slot_pool_init(struct cuda_slot_pool* p, size_t slot_bytes, const char* what) {
  pthread_mutex_init(&p->lock, NULL);
  p->slot_bytes = slot_bytes;
  p->what = what;
  p->chunks = NULL;
}

void cuda_slot_pool_free(struct cuda_slot_pool* p, const struct cuda_api* cu) {
  while (p->chunks) {
    struct cuda_slot_chunk* c = p->chunks;
    p->chunks = c->next;
    cu->cuMemFreeHost(c->host);
    free(c);
  }
  pthread_mutex_destroy(&p->lock);
}

static ncclResult_t chunk_add(struct cuda_slot_pool* p, const struct cuda_api* cu) {
  ncclResult_t res = ncclSuccess;
  struct cuda_slot_chunk* c = NULL;
  void* mem = NULL;
  CHECK(braid_calloc(&c, 1, sizeof(*c)));
  CHECK(cuda_flags_alloc(cu, POOL_CHUNK_SLOTS * p->slot_bytes, p->what, &mem, &c->dev));
  c->host = mem;
  c->next = p->chunks;
  p->chunks = c;
  return ncclSuccess;
fail:
  free(c);
  return res;
}

static void slot_at(const struct cuda_slot_pool* p, struct cuda_slot_chunk* c, int i,
                    struct cuda_slot* out) {
  out->host = c->host + (size_t)i * p->slot_bytes;
  out->dev = c->dev + (CUdeviceptr)((size_t)i * p->slot_bytes);
  out->issued = &c->issued[i];
}

ncclResult_t cuda_slot_take(struct cuda_slot_pool* p, const struct cuda_api* cu,
                            cuda_slot_free_fn is_free, struct cuda_slot* out) {
  ncclResult_t res = ncclSuccess;
  for (struct cuda_slot_chunk* c = p->chunks; c; c = c->next)
    for (int i = 0; i < POOL_CHUNK_SLOTS; i++)
      if (is_free(c->host + (size_t)i * p->slot_bytes, c->issued[i])) {
        slot_at(p, c, i, out);
        return ncclSuccess;
      }
  CHECK(chunk_add(p, cu));
  slot_at(p, p->chunks, 0, out);
fail:
  return res;
}
