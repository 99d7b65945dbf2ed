/*
 * Memory registrations of a comm's verbs transport, cached by page range
 * with reference counts: a buffer used again (every call of a training
 * loop reuses its buffers) is registered once. A message takes a
 * reference for as long as the NIC may touch its buffer; the least
 * recently used region nobody holds goes when the cache is full.
 */
#ifndef BRAID_IB_MR_CACHE_H_
#define BRAID_IB_MR_CACHE_H_

#include <stddef.h>
#include <stdint.h>

#include "ib_verbs.h"
#include "nccl.h"

#define IB_MR_CACHE_SIZE 64

struct ib_mr_ent {
  uintptr_t base, end; /* whole pages */
  struct ibv_mr* mr;
  int refs;
  uint64_t last_use;
};

struct ib_mr_cache {
  const struct ib_verbs* v;
  struct ibv_pd* pd;
  struct ib_mr_ent ents[IB_MR_CACHE_SIZE];
  uint64_t clock, registrations; /* registrations: for tests and the log */
};

void ib_mr_cache_init(struct ib_mr_cache* c, const struct ib_verbs* v, struct ibv_pd* pd);
/* Deregister everything (nothing may be held). */
void ib_mr_cache_free(struct ib_mr_cache* c);

/* A held registration covering [ptr, ptr + bytes): found, or made for the
 * pages it spans. ncclSystemError with a WARN when the NIC refuses it
 * (memlock limits) or every entry is held. */
ncclResult_t ib_mr_get(struct ib_mr_cache* c, const void* ptr, size_t bytes,
                       struct ib_mr_ent** out);
void ib_mr_put(struct ib_mr_ent* e);

#endif /* BRAID_IB_MR_CACHE_H_ */
