/*
 * Memory registrations of a comm's verbs transport, by exact range with
 * reference counts. A registration pins the pages it covers as they are
 * now: once the program frees them and maps others at the same address,
 * the NIC would still reach the old ones. So only the comm's own memory
 * (executor slots, kept for the comm's life) stays registered when nobody
 * holds it, ready for the next message; a user range is registered while
 * something holds it - ncclCommRegister until its deregistration, a
 * message while the NIC may touch it - and deregistered with its last
 * holder. When the table is full, the least recently used kept region
 * nobody holds goes.
 */
#ifndef BRAID_IB_MR_CACHE_H_
#define BRAID_IB_MR_CACHE_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ib_verbs.h"
#include "nccl.h"

#define IB_MR_CACHE_SIZE 64
/* What every data region allows: the NIC writes into it from either end. */
#define IB_MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

struct ib_mr_cache;

struct ib_mr_ent {
  uintptr_t base, end; /* the range registered, exactly */
  struct ibv_mr* mr;
  int refs;
  int keep; /* the comm's own memory: registered until evicted or the comm ends */
  uint64_t last_use;
  struct ib_mr_cache* cache;
};

/* ncclCommRegister runs in the user's thread while messages take and drop
 * registrations in the comm's: the lock covers the table. */
struct ib_mr_cache {
  pthread_mutex_t lock;
  const struct ib_verbs* v;
  struct ibv_pd* pd;
  struct ib_mr_ent ents[IB_MR_CACHE_SIZE];
  uint64_t clock, registrations; /* registrations: for tests and the log */
};

void ib_mr_cache_init(struct ib_mr_cache* c, const struct ib_verbs* v, struct ibv_pd* pd);
/* Deregister everything (nothing may be held). */
void ib_mr_cache_free(struct ib_mr_cache* c);

/* A held registration covering [ptr, ptr + bytes): found, or made for
 * exactly that range; `keep` for the comm's own memory (above). ncclSystemError
 * with a WARN when the NIC refuses it (memlock limits) or every entry is
 * held. */
ncclResult_t ib_mr_get(struct ib_mr_cache* c, const void* ptr, size_t bytes, int keep,
                       struct ib_mr_ent** out);
/* One more holder of a held registration. */
void ib_mr_hold(struct ib_mr_ent* e);
/* Drop a hold (NULL: nothing); a user range's last one deregisters it. */
void ib_mr_put(struct ib_mr_ent* e);

#endif /* BRAID_IB_MR_CACHE_H_ */
